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
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <iterator>
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

std::vector<at::Tensor> as_tensors(const c10::IValue& value) {
  if (value.isTensor()) return {value.toTensor()};
  std::vector<at::Tensor> tensors;
  const auto items = value.isTuple() ? value.toTupleRef().elements().vec() : value.toListRef().vec();
  for (const auto& item : items) tensors.push_back(item.toTensor());
  return tensors;
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
  if (argc != 5 && !(argc == 7 && std::string(argv[5]) == "--repeat")) {
    std::cerr << "usage: " << argv[0] << " OPERATOR_LIBRARY MODEL.pt2 INPUTS.pt OUTPUTS.pt [--repeat N]\n";
    return 2;
  }
  // RTLD_NOW: every symbol the library needs must resolve here, without Python.
  if (std::string(argv[1]) != "-" && dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    std::cerr << "cannot load the operator library: " << dlerror() << "\n";
    return 1;
  }
  try {
    torch::NoGradGuard no_grad;
    torch::inductor::AOTIModelPackageLoader loader(argv[2]);
    const std::vector<at::Tensor> inputs = as_tensors(torch::pickle_load(read_file(argv[3])));
    std::vector<at::Tensor> outputs = loader.run(inputs);
    // A tuple: Python's torch.load reads it with weights_only=True (a typed list would need an allowlist).
    const std::vector<c10::IValue> items(outputs.begin(), outputs.end());
    const std::vector<char> bytes = torch::pickle_save(c10::ivalue::Tuple::create(items));
    std::ofstream(argv[4], std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::cout << "ran " << argv[2] << ": " << outputs.size() << " output(s), the first of shape "
              << outputs.at(0).sizes() << "; libpython mapped: " << (python_mapped() ? "yes" : "no") << "\n";
    if (argc == 7) {
      const int repeat = std::max(1, std::stoi(argv[6]));
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
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
