// lltm-cpu's float32 micro-kernel on AVX-512 (the route "avx512-fma"): the
// same kernel as gemm_f32_avx2.cpp (its body is gemm_f32_kernel.h) with
// 16-float vectors and a larger tile.  Cores with two 512-bit FMA units do
// twice the multiply-adds of AVX2 a cycle; cores that split AVX-512 into
// halves gain nothing, so gemm_routes.cpp times it against avx2-fma and
// the others like any route (benchmarks/results/cpu_sequence.md).
#if !defined(__AVX512F__) || !defined(__FMA__)
#error "gemm_f32_avx512.cpp must be compiled with -mavx512f -mfma"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "gemm_f32.h"
#include "cache_sizes.h"

namespace lltm_cpu {
namespace gemm_f32 {
namespace avx512 {
namespace {

// Rows of B per slice: 3 blocks x 128 x 4 bytes = 24 KiB, as AVX2's slice.
constexpr int64_t kDepth = 128;
// The row tiles ask for the next slice ahead where B will not stay in L2 (gemm_f32_kernel.h):
// the recurrent steps of large sizes run faster.
constexpr bool kAskAhead = true;

// A block cut by the matrix's edge: its first `count` lanes.
struct Masked {
  static __mmask16 first(int64_t count) { return static_cast<__mmask16>((1u << count) - 1); }
  static __m512 load_first(const float* p, int64_t count) { return _mm512_maskz_loadu_ps(first(count), p); }
  static void store_first(float* p, __m512 v, int64_t count) { _mm512_mask_storeu_ps(p, first(count), v); }
};

}  // namespace

// 8 rows x 3 blocks of 16 (gemm_f32.h): 24 accumulators of the 32 vector registers, and
// a tile of 8 rows is a whole thread's block of a batch of 16 on two threads.
#define LLTM_GEMM_F32_INTRINSIC(name) _mm512_##name
#include "gemm_f32_kernel.h"

}  // namespace avx512
}  // namespace gemm_f32
}  // namespace lltm_cpu
