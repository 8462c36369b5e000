// lltm-cpu's own float32 micro-kernel for the recurrent GEMMs on AVX2 and FMA:
// fused multiply-adds on a packed B, for float32 and bfloat16 (gemm_f32.h; the
// body, shared with the AVX-512 build, is gemm_f32_kernel.h).
//
// Why its own: MKL's small GEMMs run a generic path on AMD CPUs (one step's
// recurrent product at under a third of an AMD core's peak), and torch's mm
// pays a dispatcher call per step; the stable ABI leaves out ATen's brgemm,
// which was the fast route there (benchmarks/results/cpu_sequence.md).
// gemm_routes.cpp offers this kernel as the route "avx2-fma" where the CPU has AVX2
// and FMA, and times it against the others like any route.
#if !defined(__AVX2__) || !defined(__FMA__)
#error "gemm_f32_avx2.cpp must be compiled with -mavx2 -mfma"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "gemm_f32.h"
#include "cache_sizes.h"

namespace lltm_cpu {
namespace gemm_f32 {
namespace {

// Rows of B per slice: 3 blocks x 256 x 4 bytes = 24 KiB.  Also where the L1
// is 32 KiB: there a 168-row slice missed L1 less often but ran the
// as-stored GEMMs slower (benchmarks/results/cpu_sequence.md).
constexpr int64_t kDepth = 256;
// The next slice is not asked for ahead (gemm_f32_kernel.h): no gain measured where two slices
// fit the L1 (benchmarks/results/cpu_sequence.md), and none tried on the AMD CPUs that run it.
constexpr bool kAskAhead = false;

// A block cut by the matrix's edge: its first `count` lanes.
struct Masked {
  static __m256i first(int64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static __m256 load_first(const float* p, int64_t count) { return _mm256_maskload_ps(p, first(count)); }
  static void store_first(float* p, __m256 v, int64_t count) { _mm256_maskstore_ps(p, first(count), v); }
};

}  // namespace

// 4 rows x 3 blocks of 8 (gemm_f32.h): 12 accumulators of the 16 vector registers.
#define LLTM_GEMM_F32_INTRINSIC(name) _mm256_##name
#include "gemm_f32_kernel.h"

}  // namespace gemm_f32
}  // namespace lltm_cpu
