// The CPU features and builds lltm-cpu's own GEMM kernels need: see cpu_features.h.
#include "cpu_features.h"

#include <string>

#include "gemm_bf16.h"
#include "kernel_common.h"
#include "mkl_binding.h"

namespace lltm_cpu {
namespace blas {
namespace detail {

// lltm-cpu's own AVX2 FMA kernel: where it was compiled (x86-64), the CPU has
// AVX2 and FMA, and the pointwise passes do not run their portable build
// (ATEN_CPU_CAPABILITY=default lowers both).
bool has_avx2_fma() {
#if defined(LLTM_CPU_AVX2_FMA)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          std::string(cpu_capability()) != "DEFAULT";
  return has;
#else
  return false;
#endif
}

// lltm-cpu's float32 kernel on AVX-512: where it was compiled, the CPU has
// AVX-512F, and the pointwise passes run their AVX-512 build
// (ATEN_CPU_CAPABILITY=avx2 lowers both).
bool has_avx512_fma() {
#if defined(LLTM_CPU_AVX512_FMA)
  static const bool has = __builtin_cpu_supports("avx512f") && std::string(cpu_capability()) == "AVX512";
  return has;
#else
  return false;
#endif
}


// lltm-cpu's own bfloat16 kernel: where it was compiled (x86-64), the CPU has
// AVX512_BF16, and the pointwise passes run their AVX-512 build
// (ATEN_CPU_CAPABILITY=avx2 lowers both, to measure an AVX2 machine on this one).
bool has_avx512_bf16() {
#if defined(LLTM_CPU_AVX512_BF16)
  static const bool has = __builtin_cpu_supports("avx512bf16") && std::string(cpu_capability()) == "AVX512";
  return has;
#else
  return false;
#endif
}

// lltm-cpu's AMX kernel: where it was compiled (x86-64 with a compiler that
// has AMX), the CPU has AVX512_BF16 and AMX-BF16 as above, and Linux grants
// this process the tiles.
bool has_amx_bf16() {
#if defined(LLTM_CPU_AMX_BF16)
  static const bool has = has_avx512_bf16() && gemm_bf16::amx::usable();
  return has;
#else
  return false;
#endif
}

// One of lltm-cpu's own GEMM kernels, which a build may lack (lltm_cpu/_build_config.py).
bool is_own_kernel(Route route) {
  return route == Route::kAmxBf16 || route == Route::kAvx512Bf16 || is_f32_kernel(route);
}

// Why `route` runs for no dtype in this process, or nullptr where it runs for some.
const char* never_runs_here(Route route) {
  switch (route) {
    case Route::kAmxBf16:
      return has_amx_bf16() ? nullptr
                            : "lltm-cpu's AMX kernel needs a CPU with AMX-BF16 and AVX512_BF16, a Linux that grants "
                              "the process its tiles, ATEN_CPU_CAPABILITY unset or avx512, and a build that has "
                              "the kernel (lltm_cpu.kernels_left_out())";
    case Route::kAvx512Bf16:
      return has_avx512_bf16() ? nullptr
                               : "lltm-cpu's AVX512_BF16 kernel needs a CPU with AVX512_BF16, ATEN_CPU_CAPABILITY "
                                 "unset or avx512, and a build that has the kernel (lltm_cpu.kernels_left_out())";
    case Route::kAvx512Fma:
      return has_avx512_fma() ? nullptr
                              : "lltm-cpu's AVX-512 float32 kernel needs a CPU with AVX-512, ATEN_CPU_CAPABILITY "
                                "unset or avx512, and a build that has the kernel (lltm_cpu.kernels_left_out())";
    case Route::kAvx2Fma:
      return has_avx2_fma() ? nullptr
                            : "lltm-cpu's AVX2 float32 kernel needs a CPU with AVX2 and FMA, ATEN_CPU_CAPABILITY "
                              "not default, and a build that has the kernel (lltm_cpu.kernels_left_out())";
    case Route::kMklPacked:
    case Route::kMkl:
      return mkl().has_gemm() ? nullptr : "this torch has no MKL";
    case Route::kAten:
      return nullptr;
  }
  return nullptr;
}

bool is_f32_kernel(Route route) { return route == Route::kAvx2Fma || route == Route::kAvx512Fma; }

}  // namespace detail
}  // namespace blas
}  // namespace lltm_cpu
