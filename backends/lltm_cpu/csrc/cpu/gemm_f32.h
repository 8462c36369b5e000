// lltm-cpu's float32 micro-kernel, in two builds: gemm_f32_avx2.cpp (AVX2 and
// FMA, the namespace gemm_f32) and gemm_f32_avx512.cpp (AVX-512, gemm_f32::avx512),
// each called only where the CPU has its instructions (see cpu_features.cpp).  It serves the
// recurrent GEMMs of float32 and of bfloat16: a bfloat16 B is widened to float
// once, when packed, and a bfloat16 A as it is read, so every product is exact
// and summed in float, as a bfloat16 GEMM with float accumulation does.
// bfloat16 values are passed as their 16 bits.
#pragma once

#include <cstdint>

namespace lltm_cpu {
namespace gemm_f32 {

// The packing's and the micro-tile's sizes, for a caller that splits a GEMM
// among threads (gemm_routes.cpp): split on these and every part keeps whole tiles.
constexpr int64_t kBlock = 8;         // columns per packed block: one vector of floats
constexpr int64_t kTileRows = 4;      // rows per micro-tile
constexpr int64_t kTileColumns = 24;  // columns per micro-tile: 3 blocks

// Each build's entry points:
// * packed_elements: the length, in floats, of pack()'s output for a k x n operand;
// * pack: op(B) (k x n; B stored n x k if trans_b) into the kernel's layout: blocks
//   of kBlock columns, each k rows long, so that columns [kBlock j, n) of a packed B
//   start at packed + kBlock j k (a caller may split the columns among threads);
// * multiply: C (m x n, float) = op(A) (m x k; A stored k x m if trans_a) times the
//   packed B, plus C if accumulate.
#define LLTM_GEMM_F32_ENTRY_POINTS                                                                              \
  int64_t packed_elements(int64_t n, int64_t k);                                                                \
  void pack(bool trans_b, int64_t n, int64_t k, const float* b, int64_t ldb, float* packed);                     \
  void pack(bool trans_b, int64_t n, int64_t k, const uint16_t* b, int64_t ldb, float* packed);                  \
  void multiply(bool trans_a, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* packed, \
                bool accumulate, float* c, int64_t ldc);                                                         \
  void multiply(bool trans_a, int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda,                   \
                const float* packed, bool accumulate, float* c, int64_t ldc);

LLTM_GEMM_F32_ENTRY_POINTS

namespace avx512 {
constexpr int64_t kBlock = 16;        // columns per packed block: one vector of floats
constexpr int64_t kTileRows = 8;      // rows per micro-tile
constexpr int64_t kTileColumns = 48;  // columns per micro-tile: 3 blocks

LLTM_GEMM_F32_ENTRY_POINTS
}  // namespace avx512

}  // namespace gemm_f32
}  // namespace lltm_cpu
