// The entry points of lltm-cpu's own GEMM kernels that this build left out,
// because its compiler lacks their instructions (lltm_cpu/_build_config.py
// checks).  gemm_routes.cpp never offers such a route (has_avx2_fma() and the others
// are false without the kernel's macro), so these exist only so that the
// library links and loads; each throws if it is ever reached.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "gemm_bf16.h"
#include "gemm_f32.h"

namespace lltm_cpu {
namespace {

[[maybe_unused]] [[noreturn]] void absent(const char* route) {
  throw std::logic_error(std::string("lltm_cpu: this build has no ") + route +
                         " kernel (its compiler lacked the instructions), yet it was called");
}

}  // namespace

// gemm_f32.h's entry points, each throwing for `route`.
#define LLTM_ABSENT_GEMM_F32(route)                                                                               \
  int64_t packed_elements(int64_t, int64_t) { absent(route); }                                                    \
  void pack(bool, int64_t, int64_t, const float*, int64_t, float*) { absent(route); }                             \
  void pack(bool, int64_t, int64_t, const uint16_t*, int64_t, float*) { absent(route); }                          \
  void multiply(bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, bool, float*, int64_t) {    \
    absent(route);                                                                                                \
  }                                                                                                               \
  void multiply(bool, int64_t, int64_t, int64_t, const uint16_t*, int64_t, const float*, bool, float*, int64_t) { \
    absent(route);                                                                                                \
  }

#if !defined(LLTM_CPU_AVX2_FMA)
namespace gemm_f32 {
LLTM_ABSENT_GEMM_F32("avx2-fma")
}  // namespace gemm_f32
#endif

#if !defined(LLTM_CPU_AVX512_FMA)
namespace gemm_f32::avx512 {
LLTM_ABSENT_GEMM_F32("avx512-fma")
}  // namespace gemm_f32::avx512
#endif

#if !defined(LLTM_CPU_AVX512_BF16)
namespace gemm_bf16 {
void pack(bool, int64_t, int64_t, const uint16_t*, int64_t, uint16_t*, int64_t) { absent("avx512-bf16"); }
void multiply(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, bool, float*, int64_t) {
  absent("avx512-bf16");
}
}  // namespace gemm_bf16
#endif

#if !defined(LLTM_CPU_AMX_BF16)
namespace gemm_bf16::amx {
int64_t scratch_elements(int64_t, int64_t) { absent("amx-bf16"); }
void multiply(int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*, bool, float*, int64_t,
              uint16_t*) {
  absent("amx-bf16");
}
}  // namespace gemm_bf16::amx
#endif

}  // namespace lltm_cpu
