// lltm-cpu's own bfloat16 micro-kernel for the recurrent GEMMs: AVX512_BF16
// dot products (vdpbf16ps), accumulating in float.
//
// Why its own: torch's bfloat16 brgemm runs only where torch can pack B for
// it (AMX), MKL's bfloat16 GEMM runs AVX2 code on AMD CPUs, and at::mm pays a
// dispatcher call and a oneDNN primitive lookup per step, which outweighs a
// small step's arithmetic (benchmarks/results/cpu_sequence.md).  gemm_routes.cpp offers this kernel as the
// route "avx512-bf16" where the CPU has AVX512_BF16, and times it against
// the others like any route.
//
// B (k x n) is packed once per sequence into blocks of 16 columns; within a
// block, row pair p holds the 32 values (B[2p][j], B[2p+1][j]) for its 16
// columns j, interleaved, which is the operand layout vdpbf16ps takes; odd k
// and partial blocks are padded with zeros.  Each call then computes 4 rows
// by 64 columns at a time in 16 float accumulators.
#if !defined(__AVX512F__) || !defined(__AVX512BF16__)
#error "gemm_bf16_avx512.cpp must be compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gemm_bf16.h"

namespace lltm_cpu {
namespace gemm_bf16 {
namespace {

constexpr int64_t kRows = 4;    // rows per micro-tile
constexpr int64_t kBlocks = 4;  // column blocks per micro-tile (64 columns)

// One micro-tile: rows [0, rows) (rows <= kRows) by column blocks [0, blocks)
// (blocks <= kBlocks) of C, the last block `last_cols` wide.
template <int64_t R, int64_t NB>
void tile(int64_t k, const uint16_t* a, int64_t lda, const uint16_t* packed, int64_t stride, bool accumulate,
          float* c, int64_t ldc, int64_t last_cols) {
  __m512 acc[R][NB];
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t q = 0; q < NB; ++q) {
      acc[r][q] = _mm512_setzero_ps();
    }
  }
  const int64_t pairs = k / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i b[NB];
    for (int64_t q = 0; q < NB; ++q) {
      b[q] = _mm512_loadu_si512(packed + q * stride + p * 2 * kBlock);
    }
    for (int64_t r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + 2 * p, sizeof(pair));
      const __m512i a_pair = _mm512_set1_epi32(pair);
      for (int64_t q = 0; q < NB; ++q) {
        acc[r][q] = _mm512_dpbf16_ps(acc[r][q], (__m512bh)a_pair, (__m512bh)b[q]);
      }
    }
  }
  if (k % 2 != 0) {  // the last row of B, paired with zeros in the packing and here
    __m512i b[NB];
    for (int64_t q = 0; q < NB; ++q) {
      b[q] = _mm512_loadu_si512(packed + q * stride + pairs * 2 * kBlock);
    }
    for (int64_t r = 0; r < R; ++r) {
      const __m512i a_pair = _mm512_set1_epi32(static_cast<int32_t>(a[r * lda + k - 1]));
      for (int64_t q = 0; q < NB; ++q) {
        acc[r][q] = _mm512_dpbf16_ps(acc[r][q], (__m512bh)a_pair, (__m512bh)b[q]);
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t q = 0; q < NB; ++q) {
      const __mmask16 mask = q == NB - 1 && last_cols < kBlock ? static_cast<__mmask16>((1u << last_cols) - 1)
                                                                : static_cast<__mmask16>(0xFFFF);
      float* out = c + r * ldc + q * kBlock;
      __m512 value = acc[r][q];
      if (accumulate) {
        value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(mask, out));
      }
      _mm512_mask_storeu_ps(out, mask, value);
    }
  }
}

using Tile = void (*)(int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, bool, float*, int64_t, int64_t);

template <int64_t R>
Tile tile_for_blocks(int64_t blocks) {
  switch (blocks) {
    case 1:
      return tile<R, 1>;
    case 2:
      return tile<R, 2>;
    case 3:
      return tile<R, 3>;
    default:
      return tile<R, 4>;
  }
}

Tile tile_for(int64_t rows, int64_t blocks) {
  switch (rows) {
    case 1:
      return tile_for_blocks<1>(blocks);
    case 2:
      return tile_for_blocks<2>(blocks);
    case 3:
      return tile_for_blocks<3>(blocks);
    default:
      return tile_for_blocks<4>(blocks);
  }
}

}  // namespace

// Each packed pair (B[2p][j], B[2p+1][j]) is one 32-bit word, the even row's
// value in its low half; both loops run along B's memory.  Called once per
// sequence and thread, on up to all of W_h: its cost shows at small T
// (benchmarks/results/cpu_sequence.md).
void pack(bool trans_b, int64_t n, int64_t k, const uint16_t* b, int64_t ldb, uint16_t* packed,
          int64_t depth_multiple) {
  const int64_t stride = block_stride(k, depth_multiple), pairs = k / 2;
  std::fill(packed, packed + packed_elements(n, k, depth_multiple), uint16_t{0});
  const auto put = [&](int64_t pair, int64_t col, uint32_t value) {
    std::memcpy(packed + (col / kBlock) * stride + pair * 2 * kBlock + (col % kBlock) * 2, &value, sizeof(value));
  };
  if (trans_b) {  // B stored n x k: row `col` of the storage holds column col of op(B)
    for (int64_t col = 0; col < n; ++col) {
      const uint16_t* source = b + col * ldb;
      for (int64_t pair = 0; pair < pairs; ++pair) {
        uint32_t value;
        std::memcpy(&value, source + 2 * pair, sizeof(value));
        put(pair, col, value);
      }
      if (k % 2 != 0) {
        put(pairs, col, source[k - 1]);
      }
    }
  } else {
    for (int64_t pair = 0; pair < (k + 1) / 2; ++pair) {
      const uint16_t* even = b + 2 * pair * ldb;
      const uint16_t* odd = 2 * pair + 1 < k ? even + ldb : nullptr;
      for (int64_t col = 0; col < n; ++col) {
        put(pair, col, even[col] | (odd != nullptr ? uint32_t{odd[col]} << 16 : 0u));
      }
    }
  }
}

void multiply(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* packed,
              bool accumulate, float* c, int64_t ldc) {
  const int64_t stride = block_stride(k, 2);
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  // Column tiles outside, rows inside: a tile's packed B (64 columns x k)
  // stays in cache while every row block passes over it.
  for (int64_t block = 0; block < blocks; block += kBlocks) {
    const int64_t tile_blocks = std::min(kBlocks, blocks - block);
    const int64_t last_cols = std::min(kBlock, n - (block + tile_blocks - 1) * kBlock);
    for (int64_t row = 0; row < m; row += kRows) {
      const int64_t tile_rows = std::min(kRows, m - row);
      tile_for(tile_rows, tile_blocks)(k, a + row * lda, lda, packed + block * stride, stride, accumulate,
                                       c + row * ldc + block * kBlock, ldc, last_cols);
    }
  }
}

}  // namespace gemm_bf16
}  // namespace lltm_cpu
