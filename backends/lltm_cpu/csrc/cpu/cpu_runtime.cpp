// What lltm-cpu reads from the process it runs in: symbols of torch's
// libraries, torch's thread pool, and the CPU's instruction sets.
#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "kernel_common.h"

namespace lltm_cpu {

namespace detail {
thread_local int parallel_depth = 0;
}

namespace {
// LLTM_CPU_TEST_MISSING_SYMBOLS (tests only): a comma-separated list of
// symbols find_symbol does not find, as on a torch that does not export them.
bool hidden_for_tests(const char* name) {
  static const std::string hidden = [] {
    const char* env = std::getenv("LLTM_CPU_TEST_MISSING_SYMBOLS");
    return env == nullptr ? std::string() : "," + std::string(env) + ",";
  }();
  return !hidden.empty() && hidden.find("," + std::string(name) + ",") != std::string::npos;
}
}  // namespace

void* find_symbol(const char* name) {
  if (hidden_for_tests(name)) {
    return nullptr;
  }
  // libtorch_cpu is loaded (this library links it), so RTLD_NOLOAD finds it
  // by soname; dlsym then searches it and what it loaded.  Python loads it
  // RTLD_LOCAL, so the global scope alone would not see its symbols.
  static void* const torch_cpu = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
  void* symbol = torch_cpu != nullptr ? dlsym(torch_cpu, name) : nullptr;
  return symbol != nullptr ? symbol : dlsym(RTLD_DEFAULT, name);
}

namespace {
using OmpInParallel = int (*)();

// OpenMP's omp_in_parallel, where torch's pool is OpenMP's (its Linux
// builds): torch loads that runtime, so its own symbol answers.
OmpInParallel omp_in_parallel_function() {
  static const auto function = reinterpret_cast<OmpInParallel>(find_symbol("omp_in_parallel"));
  return function;
}
}  // namespace

namespace {
using GlobalContext = void* (*)();
using ContextFlag = bool (*)(const void*);  // a const member function: `this` comes first

// at::globalContext() and at::Context::deterministicAlgorithms() const.
constexpr const char* kGlobalContext = "_ZN2at13globalContextEv";
constexpr const char* kDeterministicAlgorithms = "_ZNK2at7Context23deterministicAlgorithmsEv";

struct DeterministicFlag {
  GlobalContext context = nullptr;
  ContextFlag read = nullptr;
};

const DeterministicFlag& deterministic_flag() {
  static const DeterministicFlag flag{reinterpret_cast<GlobalContext>(find_symbol(kGlobalContext)),
                                      reinterpret_cast<ContextFlag>(find_symbol(kDeterministicAlgorithms))};
  return flag;
}
}  // namespace

std::string deterministic_flag_problem() {
  const DeterministicFlag& flag = deterministic_flag();
  if (flag.context != nullptr && flag.read != nullptr) {
    return "";
  }
  const std::string missing = flag.context == nullptr && flag.read == nullptr ? std::string(kGlobalContext) + " and " +
                                                                                    kDeterministicAlgorithms
                              : flag.context == nullptr ? kGlobalContext
                                                        : kDeterministicAlgorithms;
  return "this torch does not export " + missing +
         ", through which lltm-cpu reads torch.use_deterministic_algorithms(), so lltm-cpu cannot see that flag: "
         "under it lltm-cpu still times its GEMM routes and time-loop split, and two processes may choose, and "
         "round, differently.  For reproducible runs set LLTM_CPU_GEMM=aten and LLTM_CPU_SPLIT=rows, which fix "
         "the choice without timing";
}

bool deterministic_algorithms() {
  const DeterministicFlag& flag = deterministic_flag();
  return flag.context != nullptr && flag.read != nullptr && flag.read(flag.context());
}

bool openmp_pool() { return omp_in_parallel_function() != nullptr; }

bool in_parallel_region() {
  const OmpInParallel in_parallel = omp_in_parallel_function();
  return detail::parallel_depth > 0 || (in_parallel != nullptr && in_parallel() != 0);
}

const char* cpu_capability() {
  static const char* const capability = [] {
#if defined(__x86_64__)
    const char* env = std::getenv("ATEN_CPU_CAPABILITY");
    const std::string wanted = env == nullptr ? "" : env;
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    if (wanted == "default") {
      return "DEFAULT";
    }
    if (avx512 && wanted != "avx2") {
      return "AVX512";
    }
    return avx2 ? "AVX2" : "DEFAULT";
#else
    return "DEFAULT";
#endif
  }();
  return capability;
}

}  // namespace lltm_cpu
