// Runs an AOTInductor package of an LLTM model from C++, with no Python in the process.
//
//   lltm_deploy_runner OPERATOR_LIBRARY MODEL.pt2 INPUTS.pt OUTPUTS.pt [--repeat N]
//
// OPERATOR_LIBRARY is the backend's operator library (`python -m lltm_cpu --library` prints its
// path): AOTInductor calls the lltm operators the package holds through the dispatcher, so they
// must be registered first ("-" for a package of ATen operators alone, as one exported on
// lltm-ref is).  INPUTS.pt is what Python's torch.save wrote (a tensor, or a list or
// tuple of them); OUTPUTS.pt is written for Python's torch.load, as a tuple of tensors.  With
// --repeat N the package runs N more times and the median time of one run is printed.
//
// The package checks its inputs against what it was exported for (AOTI_RUNTIME_CHECK_INPUTS,
// which this sets unless the caller did): without that check a wrong feature count, dtype, rank,
// layout or a time dimension of 0 runs on and returns garbage, or crashes.
#include <dlfcn.h>
#include <stdlib.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<at::Tensor> as_tensors(const c10::IValue& value, const std::string& path) {
  const std::string expected = path + " must hold a tensor, or a list or tuple of tensors (what torch.save([x], path) "
                               "writes), got ";
  if (value.isTensor()) return {value.toTensor()};
  if (!value.isTuple() && !value.isList()) throw std::runtime_error(expected + "a " + value.tagKind());
  std::vector<at::Tensor> tensors;
  const auto items = value.isTuple() ? value.toTupleRef().elements().vec() : value.toListRef().vec();
  for (const auto& item : items) {
    if (!item.isTensor()) throw std::runtime_error(expected + "a sequence holding a " + item.tagKind());
    tensors.push_back(item.toTensor());
  }
  return tensors;
}

// What the inputs are, for an error: the package's own message names them only by position.
std::string describe(const std::vector<at::Tensor>& inputs) {
  std::ostringstream text;
  for (size_t i = 0; i < inputs.size(); ++i)
    text << "\n  input " << i << ": shape " << inputs[i].sizes() << ", dtype " << inputs[i].scalar_type()
         << ", strides " << inputs[i].strides() << (inputs[i].is_contiguous() ? "" : " (not contiguous)");
  return text.str();
}

// A c10::Error's what() carries a C++ backtrace, of no use to the runner's user.
std::string message_of(const std::exception& e) {
  const auto* error = dynamic_cast<const c10::Error*>(&e);
  return error ? error->what_without_backtrace() : e.what();
}

// N of --repeat: a whole positive integer, read before anything runs.
int parse_repeat(const std::string& text) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 1)
    throw std::invalid_argument("--repeat takes a whole number of runs >= 1, got '" + text + "'");
  return value;
}

// Whether libpython is mapped into this process: the point of the runner is that it is not.
bool python_mapped() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find("libpython") != std::string::npos) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = std::string("usage: ") + argv[0] + " OPERATOR_LIBRARY MODEL.pt2 INPUTS.pt OUTPUTS.pt [--repeat N]\n";
  if (argc != 5 && !(argc == 7 && std::string(argv[5]) == "--repeat")) {
    std::cerr << usage;
    return 2;
  }
  int repeat = 0;
  if (argc == 7) {
    try {
      repeat = parse_repeat(argv[6]);
    } catch (const std::invalid_argument& e) {
      std::cerr << "error: " << e.what() << "\n" << usage;
      return 2;
    }
  }
  // Opened (and emptied) before the run: a path that cannot be written fails now, not after it.
  std::ofstream output_file(argv[4], std::ios::binary | std::ios::trunc);
  if (!output_file) {
    std::cerr << "error: cannot write " << argv[4] << ": " << std::strerror(errno) << "\n";
    return 1;
  }
  setenv("AOTI_RUNTIME_CHECK_INPUTS", "1", /*overwrite=*/0);
  // RTLD_NOW: every symbol the library needs must resolve here, without Python.
  if (std::string(argv[1]) != "-" && dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::cerr << "cannot load the operator library: " << dlerror() << "\n";
    return 1;
  }
  try {
    torch::NoGradGuard no_grad;
    torch::inductor::AOTIModelPackageLoader loader(argv[2]);
    const std::vector<at::Tensor> inputs = as_tensors(torch::pickle_load(read_file(argv[3])), argv[3]);
    for (size_t i = 0; i < inputs.size(); ++i)  // no package of a sequence model runs on nothing
      if (inputs[i].numel() == 0)
        throw std::runtime_error("input " + std::to_string(i) + " is empty (a dimension of size 0)" +
                                 describe(inputs));
    std::vector<at::Tensor> outputs;
    try {
      outputs = loader.run(inputs);
    } catch (const std::exception& e) {
      throw std::runtime_error(message_of(e) + "\n  (the inputs differ from what the package was exported for?)" +
                               describe(inputs));
    }
    // A tuple: Python's torch.load reads it with weights_only=True (a typed list would need an allowlist).
    const std::vector<c10::IValue> items(outputs.begin(), outputs.end());
    const std::vector<char> bytes = torch::pickle_save(c10::ivalue::Tuple::create(items));
    output_file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    output_file.close();
    if (!output_file) throw std::runtime_error(std::string("cannot write ") + argv[4] + ": " + std::strerror(errno));
    std::cout << "ran " << argv[2] << ": " << outputs.size() << " output(s), the first of shape "
              << outputs.at(0).sizes() << "; libpython mapped: " << (python_mapped() ? "yes" : "no") << "\n";
    if (repeat > 0) {
      std::vector<double> us;
      for (int i = 0; i < repeat; ++i) {
        const auto start = std::chrono::steady_clock::now();
        outputs = loader.run(inputs);
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
      }
      std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
      std::cout << "median us per run: " << us[us.size() / 2] << " (" << repeat << " runs)\n";
    }
  } catch (const std::exception& e) {
    const std::string message = message_of(e);
    std::cerr << "error: " << message << "\n";
    if (message.find("Could not find schema") != std::string::npos)
      std::cerr << "  the package calls an operator that no loaded library registers: pass the backend's operator "
                   "library (python -m lltm_cpu --library prints lltm-cpu's)\n";
    return 1;
  }
  return 0;
}
