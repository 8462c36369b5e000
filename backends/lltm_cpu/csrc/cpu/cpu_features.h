// Which of lltm-cpu's own GEMM kernels can run in this process: each needs
// its macro (the build has the kernel: lltm_cpu/_build_config.py), the CPU's
// instructions, and the pointwise passes' instruction set (ATEN_CPU_CAPABILITY
// lowers both, to measure a smaller CPU on a larger one).
#pragma once

#include "blas.h"

namespace lltm_cpu {
namespace blas {
namespace detail {

bool has_avx2_fma();
bool has_avx512_fma();
bool has_avx512_bf16();
bool has_amx_bf16();  // also: Linux grants this process the tiles

bool is_f32_kernel(Route route);  // avx2-fma or avx512-fma
bool is_own_kernel(Route route);  // one of lltm-cpu's own, which a build may lack

// Why `route` runs for no dtype in this process, or nullptr where it runs for some.
const char* never_runs_here(Route route);

}  // namespace detail
}  // namespace blas
}  // namespace lltm_cpu
