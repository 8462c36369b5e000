// The body of lltm-cpu's float32 micro-kernel (gemm_f32.h), written once for
// every vector width: gemm_f32_avx2.cpp and gemm_f32_avx512.cpp each include
// it inside the namespace whose entry points it defines (and whose kBlock,
// kTileRows and kTileColumns it reads), after defining in an anonymous
// namespace kDepth, kAskAhead and a struct `Masked` (a partial vector's loads
// and stores), and the macro LLTM_GEMM_F32_INTRINSIC(name), the width's
// intrinsic `name` (_mm256_##name or _mm512_##name).  It includes nothing
// itself: each includer has included <immintrin.h>, <cstdint>, <cstring> and
// cache_sizes.h.
//
// B (k x n) is packed once per sequence into blocks of kBlock columns (one
// vector), each holding its k rows one after another, the last block padded
// with zeros.  A call runs over k in slices of kDepth rows, so that a
// micro-tile's slice of B (kBlocks blocks) stays in the L1 cache while the
// row tiles of a panel of A (kPanelRows rows, kept in L2) pass over it; a
// micro-tile is kRows rows by kBlocks blocks of accumulators.  Where the width
// sets kAskAhead, B will not stay in L2 (the recurrent step's W_h at large
// sizes) and two slices fit the L1, the i-th row tile over a slice asks for
// block i of the next slice, a cache line an iteration, so that B arrives
// spread over the passes, not all at the first one
// (benchmarks/results/cpu_sequence.md, "the next slice asked for ahead").  A
// transposed A (the weight gradients: A stored k x m, a row of it thousands of
// bytes long) is first copied into a panel of its own, each row tile's kRows
// values of a row of B next to each other: read in place, a tile's every step
// touched a new cache line, all of them a multiple of the row length apart and
// so in a few of the L1 cache's sets (benchmarks/results/cpu_sequence.md).

namespace {

// The width's vector and operations.
struct Isa : Masked {
  using Vec = decltype(LLTM_GEMM_F32_INTRINSIC(setzero_ps)());
  static Vec zero() { return LLTM_GEMM_F32_INTRINSIC(setzero_ps)(); }
  static Vec load(const float* p) { return LLTM_GEMM_F32_INTRINSIC(loadu_ps)(p); }
  static Vec broadcast(float value) { return LLTM_GEMM_F32_INTRINSIC(set1_ps)(value); }
  static Vec fma(Vec a, Vec b, Vec c) { return LLTM_GEMM_F32_INTRINSIC(fmadd_ps)(a, b, c); }
  static Vec add(Vec a, Vec b) { return LLTM_GEMM_F32_INTRINSIC(add_ps)(a, b); }
  static void store(float* p, Vec v) { LLTM_GEMM_F32_INTRINSIC(storeu_ps)(p, v); }
};

constexpr int64_t kRows = kTileRows;
constexpr int64_t kBlocks = kTileColumns / kBlock;
constexpr int64_t kLanes = kBlock;
constexpr int64_t kPanelRows = 96;  // rows of A per pass over B's column tiles, in L2
constexpr int64_t kRowsPerLine = 64 / (kLanes * 4);  // rows of a packed block in a 64-byte cache line
static_assert(kRowsPerLine >= 1, "a block's row is at most a cache line");

// Plain helpers of this file's own (no std:: templates): an inline function
// shared with another object could be linked in from a build for another ISA.
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
// `ahead`: a block of the next slice to ask for, or null.
template <int64_t R, int64_t NB, bool TransA, typename A>
void tile(int64_t depth, const A* a, int64_t lda, const float* packed, int64_t block_stride, bool accumulate,
          float* c, int64_t ldc, int64_t last_cols, const float* ahead) {
  typename Isa::Vec acc[R][NB];
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t q = 0; q < NB; ++q) {
      acc[r][q] = Isa::zero();
    }
  }
  const auto step = [&](int64_t p) {
    typename Isa::Vec b[NB];
    for (int64_t q = 0; q < NB; ++q) {
      b[q] = Isa::load(packed + q * block_stride + p * kLanes);
    }
    for (int64_t r = 0; r < R; ++r) {
      const typename Isa::Vec a_value = Isa::broadcast(widened(TransA ? a[p * lda + r] : a[r * lda + p]));
      for (int64_t q = 0; q < NB; ++q) {
        acc[r][q] = Isa::fma(a_value, b[q], acc[r][q]);
      }
    }
  };
  if (ahead == nullptr) {  // two loops, so that the usual one tests nothing an iteration
    for (int64_t p = 0; p < depth; ++p) {
      step(p);
    }
  } else {
    for (int64_t p = 0; p < depth; ++p) {
      if (p % kRowsPerLine == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead + p * kLanes), _MM_HINT_T0);
      }
      step(p);
    }
  }
  for (int64_t q = 0; q < NB; ++q) {
    // Only a block cut by the matrix's edge is masked (AVX2's masked store is
    // microcoded on AMD: benchmarks/results/cpu_sequence.md).
    const bool whole = q < NB - 1 || last_cols == kLanes;
    for (int64_t r = 0; r < R; ++r) {
      float* out = c + r * ldc + q * kLanes;
      if (whole) {
        Isa::store(out, accumulate ? Isa::add(acc[r][q], Isa::load(out)) : acc[r][q]);
      } else {
        Isa::store_first(out, accumulate ? Isa::add(acc[r][q], Isa::load_first(out, last_cols)) : acc[r][q],
                         last_cols);
      }
    }
  }
}

template <typename A>
using Tile = void (*)(int64_t, const A*, int64_t, const float*, int64_t, bool, float*, int64_t, int64_t,
                      const float*);

template <int64_t R, int64_t NB, bool TransA, typename A>
Tile<A> tile_for_blocks(int64_t blocks) {
  if constexpr (NB == 1) {
    return tile<R, 1, TransA, A>;
  } else {
    return blocks >= NB ? tile<R, NB, TransA, A> : tile_for_blocks<R, NB - 1, TransA, A>(blocks);
  }
}

template <int64_t R, bool TransA, typename A>
Tile<A> tile_for(int64_t rows, int64_t blocks) {
  if constexpr (R == 1) {
    return tile_for_blocks<1, kBlocks, TransA, A>(blocks);
  } else {
    return rows >= R ? tile_for_blocks<R, kBlocks, TransA, A>(blocks) : tile_for<R - 1, TransA, A>(rows, blocks);
  }
}

// The first k / 4 * 4 rows of a whole block of a float B stored n x k (b at its first column's
// row), into `packed` (the block's first row), by 4 x 4 transposes: read one value at a time,
// 16 rows of B apart, the forward's layout of W_h was a visible share of a short sequence's
// forward (benchmarks/results/cpu_sequence.md, "the operators' rest taken apart").  SSE, which
// every x86-64 CPU has.  Returns the rows it packed; a bfloat16 B is left to the loop below.
static_assert(kLanes % 4 == 0, "whole blocks are packed in quads of columns");
inline int64_t pack_transposed_whole(const float* b, int64_t ldb, int64_t k, float* packed) {
  const int64_t quads = k / 4 * 4;
  for (int64_t j = 0; j < kLanes; j += 4) {
    const float* rows = b + j * ldb;
    for (int64_t p = 0; p < quads; p += 4) {
      __m128 r0 = _mm_loadu_ps(rows + p), r1 = _mm_loadu_ps(rows + ldb + p);
      __m128 r2 = _mm_loadu_ps(rows + 2 * ldb + p), r3 = _mm_loadu_ps(rows + 3 * ldb + p);
      _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
      _mm_storeu_ps(packed + p * kLanes + j, r0);
      _mm_storeu_ps(packed + (p + 1) * kLanes + j, r1);
      _mm_storeu_ps(packed + (p + 2) * kLanes + j, r2);
      _mm_storeu_ps(packed + (p + 3) * kLanes + j, r3);
    }
  }
  return quads;
}

inline int64_t pack_transposed_whole(const uint16_t*, int64_t, int64_t, float*) { return 0; }

template <typename B>
void pack_any(bool trans_b, int64_t n, int64_t k, const B* b, int64_t ldb, float* packed) {
  const int64_t blocks = (n + kLanes - 1) / kLanes;
  for (int64_t block = 0; block < blocks; ++block) {
    const bool whole = (block + 1) * kLanes <= n;
    const int64_t done =
        trans_b && whole ? pack_transposed_whole(b + block * kLanes * ldb, ldb, k, packed + block * k * kLanes) : 0;
    for (int64_t row = done; row < k; ++row) {
      for (int64_t j = 0; j < kLanes; ++j) {
        const int64_t col = block * kLanes + j;
        const float value = col < n ? widened(trans_b ? b[col * ldb + row] : b[row * ldb + col]) : 0.0f;
        packed[(block * k + row) * kLanes + j] = value;
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
      for (int64_t r = 0; r < kRows; ++r) {
        out[row * depth + r] = widened(source[row + r]);
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
  const int64_t block_stride = k * kLanes;
  const int64_t blocks = (n + kLanes - 1) / kLanes;
  // B more than half the L2: with what else a step reads (the rows split's other slice of W_h, A, C,
  // the gates) it is not there when the next step multiplies by it again.  And the next slice must fit
  // in L1 beside the current one, which a 32 KiB L1 does not hold.
  constexpr int64_t kSliceBytes = kBlocks * kDepth * kLanes * static_cast<int64_t>(sizeof(float));
  const bool ask_ahead = kAskAhead && beyond_l2(2 * blocks * block_stride * static_cast<int64_t>(sizeof(float))) &&
                         fits_l1(2 * kSliceBytes);
  // A transposed A's panel, copied (on the calling thread's stack).
  alignas(64) float a_panel[TransA ? kPanelRows * kDepth : 1];
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
        const int64_t last_cols = smaller(kLanes, n - (block + tile_blocks - 1) * kLanes);
        const float* slice = packed + block * block_stride + first * kLanes;
        const int64_t next_blocks = smaller(kBlocks, blocks - block - kBlocks);  // <= 0 in the last tile
        for (int64_t row = panel; row < panel_end; row += kRows) {
          const int64_t rows = smaller(kRows, panel_end - row);
          const int64_t pass = (row - panel) / kRows;
          const float* ahead = ask_ahead && pass < next_blocks ? slice + (kBlocks + pass) * block_stride : nullptr;
          float* c_tile = c + row * ldc + block * kLanes;
          if constexpr (TransA) {
            tile_for<kRows, true, float>(rows, tile_blocks)(depth, a_panel + (row - panel) * depth, kRows, slice,
                                                            block_stride, add, c_tile, ldc, last_cols, ahead);
          } else {
            tile_for<kRows, false, A>(rows, tile_blocks)(depth, a + row * lda + first, lda, slice, block_stride,
                                                         add, c_tile, ldc, last_cols, ahead);
          }
        }
      }
    }
  }
}

}  // namespace

int64_t packed_elements(int64_t n, int64_t k) { return (n + kLanes - 1) / kLanes * kLanes * k; }

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
