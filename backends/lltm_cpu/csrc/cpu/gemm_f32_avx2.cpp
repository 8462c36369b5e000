// lltm-cpu's own float32 micro-kernel for the recurrent GEMMs: AVX2 fused
// multiply-adds on a packed B, for float32 and bfloat16 (gemm_f32.h).
//
// Why its own: MKL's small GEMMs run a generic path on AMD CPUs (M8 N384 K128,
// one step's recurrent product, at under a third of an AMD core's peak), and
// torch's mm pays a dispatcher call per step; the stable ABI leaves out ATen's
// brgemm, which was the fast route there (benchmarks/results/cpu_sequence.md).
// blas.cpp offers this kernel as the route "avx2-fma" where the CPU has AVX2
// and FMA, and times it against the others like any route.
//
// B (k x n) is packed once per sequence into blocks of 8 columns (one vector),
// each holding its k rows one after another, the last block padded with zeros.
// A call runs over k in slices of kDepth rows, so that a micro-tile's
// slice of B (kBlocks blocks) stays in the L1 cache while the row tiles of a
// panel of A (kPanelRows rows, kept in L2) pass over it;
// a micro-tile is kRows rows by kBlocks blocks, 12 accumulators of the 16
// vector registers.  A transposed A (the weight gradients: A stored k x m, a
// row of it thousands of bytes long) is first copied into a panel of its own,
// each row tile's kRows values of a row of B next to each other: read in place,
// a tile's every step touched a new cache line, all of them a multiple of the
// row length apart and so in a few of the L1 cache's sets
// (benchmarks/results/cpu_sequence.md).
#if !defined(__AVX2__) || !defined(__FMA__)
#error "gemm_f32_avx2.cpp must be compiled with -mavx2 -mfma"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "gemm_f32.h"

namespace lltm_cpu {
namespace gemm_f32 {
namespace {

constexpr int64_t kRows = kTileRows;
constexpr int64_t kBlocks = kTileColumns / kBlock;  // column blocks per micro-tile
// Rows of B per slice: 3 blocks x 256 x 4 bytes = 24 KiB.  Also where the L1
// is 32 KiB (Zen 3): there a 168-row slice missed L1 less often but ran the
// as-stored GEMMs 5-7% slower (benchmarks/results/cpu_sequence.md).
constexpr int64_t kDepth = 256;
constexpr int64_t kPanelRows = 96;  // rows of A per pass over B's column tiles: 96 KiB of a slice, in L2

// Plain helpers of this file's own (no std:: templates): an inline function
// shared with another object could be linked in from this AVX2 build.
inline int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }

inline float widened(float value) { return value; }
inline float widened(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// One micro-tile over a slice of `depth` rows of B: C rows [0, R) by column
// blocks [0, NB), the last block `last_cols` wide.  A is m x k, stored k x m
// where TransA.
template <int64_t R, int64_t NB, bool TransA, typename A>
void tile(int64_t depth, const A* a, int64_t lda, const float* packed, int64_t block_stride, bool accumulate,
          float* c, int64_t ldc, int64_t last_cols) {
  __m256 acc[R][NB];
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t q = 0; q < NB; ++q) {
      acc[r][q] = _mm256_setzero_ps();
    }
  }
  for (int64_t p = 0; p < depth; ++p) {
    __m256 b[NB];
    for (int64_t q = 0; q < NB; ++q) {
      b[q] = _mm256_loadu_ps(packed + q * block_stride + p * kBlock);
    }
    for (int64_t r = 0; r < R; ++r) {
      const __m256 a_value = _mm256_set1_ps(widened(TransA ? a[p * lda + r] : a[r * lda + p]));
      for (int64_t q = 0; q < NB; ++q) {
        acc[r][q] = _mm256_fmadd_ps(a_value, b[q], acc[r][q]);
      }
    }
  }
  for (int64_t q = 0; q < NB; ++q) {
    if (q < NB - 1 || last_cols == kBlock) {
      for (int64_t r = 0; r < R; ++r) {
        float* out = c + r * ldc + q * kBlock;
        _mm256_storeu_ps(out, accumulate ? _mm256_add_ps(acc[r][q], _mm256_loadu_ps(out)) : acc[r][q]);
      }
      continue;
    }
    // Only a block cut by the matrix's edge is masked: AVX2's masked store is
    // microcoded on AMD Zen 2 to 4 (42 micro-ops, one per 12 cycles on Zen 3
    // by uops.info), so that a tile's 12 cost as much as 24 of its steps of k.
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(last_cols)), lanes);
    for (int64_t r = 0; r < R; ++r) {
      float* out = c + r * ldc + q * kBlock;
      __m256 value = acc[r][q];
      if (accumulate) {
        value = _mm256_add_ps(value, _mm256_maskload_ps(out, mask));
      }
      _mm256_maskstore_ps(out, mask, value);
    }
  }
}

template <typename A>
using Tile = void (*)(int64_t, const A*, int64_t, const float*, int64_t, bool, float*, int64_t, int64_t);

template <int64_t R, bool TransA, typename A>
Tile<A> tile_for_blocks(int64_t blocks) {
  switch (blocks) {
    case 1:
      return tile<R, 1, TransA, A>;
    case 2:
      return tile<R, 2, TransA, A>;
    default:
      return tile<R, 3, TransA, A>;
  }
}

template <bool TransA, typename A>
Tile<A> tile_for(int64_t rows, int64_t blocks) {
  switch (rows) {
    case 1:
      return tile_for_blocks<1, TransA, A>(blocks);
    case 2:
      return tile_for_blocks<2, TransA, A>(blocks);
    case 3:
      return tile_for_blocks<3, TransA, A>(blocks);
    default:
      return tile_for_blocks<4, TransA, A>(blocks);
  }
}

template <typename B>
void pack_any(bool trans_b, int64_t n, int64_t k, const B* b, int64_t ldb, float* packed) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  for (int64_t block = 0; block < blocks; ++block) {
    for (int64_t row = 0; row < k; ++row) {
      for (int64_t j = 0; j < kBlock; ++j) {
        const int64_t col = block * kBlock + j;
        const float value = col < n ? widened(trans_b ? b[col * ldb + row] : b[row * ldb + col]) : 0.0f;
        packed[(block * k + row) * kBlock + j] = value;
      }
    }
  }
}

// Rows [0, rows) and k-slice rows [0, depth) of A stored k x m (a points at
// the first), into `panel`: row tile t's values of slice row p at
// panel[(t * depth + p) * kRows], so that a tile reads them as an A stored
// k x kRows.  A last tile's missing rows are never read, and stay unwritten.
template <typename A>
void pack_transposed_panel(int64_t rows, int64_t depth, const A* a, int64_t lda, float* panel) {
  const int64_t whole = rows / kRows * kRows;
  for (int64_t p = 0; p < depth; ++p) {
    const A* source = a + p * lda;
    float* out = panel + p * kRows;
    for (int64_t row = 0; row < whole; row += kRows) {
      if constexpr (sizeof(A) == sizeof(float)) {  // a tile's 4 floats at once
        _mm_store_ps(out + row * depth, _mm_loadu_ps(reinterpret_cast<const float*>(source + row)));
      } else {
        for (int64_t r = 0; r < kRows; ++r) {
          out[row * depth + r] = widened(source[row + r]);
        }
      }
    }
    for (int64_t row = whole; row < rows; ++row) {
      out[whole * depth + row - whole] = widened(source[row]);
    }
  }
}

template <bool TransA, typename A>
void multiply_any(int64_t m, int64_t n, int64_t k, const A* a, int64_t lda, const float* packed, bool accumulate,
                  float* c, int64_t ldc) {
  const int64_t block_stride = k * kBlock;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  // A transposed A's panel, copied (96 KiB of the calling thread's stack).
  alignas(32) float a_panel[TransA ? kPanelRows * kDepth : 1];
  for (int64_t first = 0; first < k; first += kDepth) {
    const int64_t depth = smaller(kDepth, k - first);
    const bool add = accumulate || first > 0;  // later slices add to the earlier ones
    for (int64_t panel = 0; panel < m; panel += kPanelRows) {
      const int64_t panel_end = smaller(m, panel + kPanelRows);
      if constexpr (TransA) {
        pack_transposed_panel(panel_end - panel, depth, a + first * lda + panel, lda, a_panel);
      }
      for (int64_t block = 0; block < blocks; block += kBlocks) {
        const int64_t tile_blocks = smaller(kBlocks, blocks - block);
        const int64_t last_cols = smaller(kBlock, n - (block + tile_blocks - 1) * kBlock);
        const float* slice = packed + block * block_stride + first * kBlock;
        for (int64_t row = panel; row < panel_end; row += kRows) {
          const int64_t rows = smaller(kRows, panel_end - row);
          float* c_tile = c + row * ldc + block * kBlock;
          if constexpr (TransA) {
            tile_for<true, float>(rows, tile_blocks)(depth, a_panel + (row - panel) * depth, kRows, slice,
                                                     block_stride, add, c_tile, ldc, last_cols);
          } else {
            tile_for<false, A>(rows, tile_blocks)(depth, a + row * lda + first, lda, slice, block_stride, add,
                                                  c_tile, ldc, last_cols);
          }
        }
      }
    }
  }
}

}  // namespace

int64_t packed_elements(int64_t n, int64_t k) { return (n + kBlock - 1) / kBlock * kBlock * k; }

void pack(bool trans_b, int64_t n, int64_t k, const float* b, int64_t ldb, float* packed) {
  pack_any(trans_b, n, k, b, ldb, packed);
}

void pack(bool trans_b, int64_t n, int64_t k, const uint16_t* b, int64_t ldb, float* packed) {
  pack_any(trans_b, n, k, b, ldb, packed);
}

void multiply(bool trans_a, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* packed,
              bool accumulate, float* c, int64_t ldc) {
  (trans_a ? multiply_any<true, float> : multiply_any<false, float>)(m, n, k, a, lda, packed, accumulate, c, ldc);
}

void multiply(bool trans_a, int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const float* packed,
              bool accumulate, float* c, int64_t ldc) {
  (trans_a ? multiply_any<true, uint16_t> : multiply_any<false, uint16_t>)(m, n, k, a, lda, packed, accumulate, c,
                                                                           ldc);
}

}  // namespace gemm_f32
}  // namespace lltm_cpu
