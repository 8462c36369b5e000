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

void* find_symbol(const char* name) {
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

struct DeterministicFlag {
  GlobalContext context = nullptr;
  ContextFlag read = nullptr;
};

const DeterministicFlag& deterministic_flag() {
  static const DeterministicFlag flag{
      reinterpret_cast<GlobalContext>(find_symbol("_ZN2at13globalContextEv")),
      reinterpret_cast<ContextFlag>(find_symbol("_ZNK2at7Context23deterministicAlgorithmsEv"))};
  return flag;
}
}  // namespace

bool deterministic_flag_readable() { return deterministic_flag().context && deterministic_flag().read; }

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
