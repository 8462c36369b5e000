// lltm-cpu's AMX bfloat16 kernel for the recurrent GEMMs: tile products
// (tdpbf16ps), accumulating in float.
//
// Why: on a CPU with AMX, nn.LSTM's oneDNN runs its bfloat16 GEMMs on tiles,
// and no stable route comes close at the time loop's shapes (MKL's bfloat16
// GEMM repacks B at every call: benchmarks/results/cpu_sequence.md).  B is
// packed once per sequence (gemm_bf16.h), so each step streams it from cache.
//
// Eight tiles of 16 rows x 64 bytes: C in tiles 0-3 (32 x 32 floats), A in 4
// and 5 (16 rows x 32 bfloat16 each), B in 6 and 7 (16 row pairs x 16
// columns each).  A is read in place where it holds whole tiles, else from a
// zero-padded copy; C tiles that overhang C's edge go through a buffer.
#if !defined(__AMX_TILE__) || !defined(__AMX_BF16__)
#error "gemm_bf16_amx.cpp must be compiled with -mamx-tile -mamx-bf16"
#endif

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "amx_tiles.h"
#include "gemm_bf16.h"

namespace lltm_cpu {
namespace gemm_bf16 {
namespace amx {
namespace {

constexpr int64_t kTile = amx_tiles::kTileRows;  // rows of every tile, float columns of a C tile

// Claims the tiles for this thread (another library on it may have set
// other shapes) and gives them back when done, so that the thread's saved
// state shrinks again.
class Tiles {
 public:
  Tiles() {
    amx_tiles::configure();
  }
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
  ~Tiles() { _tile_release(); }
};

// C's R x Q tiles at rows 16 r, columns 16 q (R, Q in {1, 2}) over `steps`
// tile depths; C is loaded first where `load_c`, else starts at zero.
template <int R, int Q>
void block(int64_t steps, const uint16_t* a, int64_t lda, const uint16_t* b, int64_t stride, bool load_c, float* c,
           int64_t ldc) {
  const int64_t a_bytes = lda * 2, c_bytes = ldc * 4;
  if (load_c) {
    _tile_loadd(0, c, c_bytes);
    if constexpr (Q == 2) _tile_loadd(1, c + kTile, c_bytes);
    if constexpr (R == 2) _tile_loadd(2, c + kTile * ldc, c_bytes);
    if constexpr (R == 2 && Q == 2) _tile_loadd(3, c + kTile * ldc + kTile, c_bytes);
  } else {
    _tile_zero(0);
    if constexpr (Q == 2) _tile_zero(1);
    if constexpr (R == 2) _tile_zero(2);
    if constexpr (R == 2 && Q == 2) _tile_zero(3);
  }
  for (int64_t step = 0; step < steps; ++step) {
    const uint16_t* a_step = a + step * kDepth;
    const uint16_t* b_step = b + step * kDepth * kBlock;  // 16 row pairs of kBlock columns
    _tile_loadd(4, a_step, a_bytes);
    _tile_loadd(6, b_step, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (Q == 2) {
      _tile_loadd(7, b_step + stride, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (R == 2) {
      _tile_loadd(5, a_step + kTile * lda, a_bytes);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (Q == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, c_bytes);
  if constexpr (Q == 2) _tile_stored(1, c + kTile, c_bytes);
  if constexpr (R == 2) _tile_stored(2, c + kTile * ldc, c_bytes);
  if constexpr (R == 2 && Q == 2) _tile_stored(3, c + kTile * ldc + kTile, c_bytes);
}

using Block = void (*)(int64_t, const uint16_t*, int64_t, const uint16_t*, int64_t, bool, float*, int64_t);

Block block_for(int64_t row_tiles, int64_t column_tiles) {
  if (row_tiles == 2) {
    return column_tiles == 2 ? block<2, 2> : block<2, 1>;
  }
  return column_tiles == 2 ? block<1, 2> : block<1, 1>;
}

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace

bool usable() {
  static const bool granted = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) {
      return false;
    }
    const bool amx_bf16 = (edx >> 22) & 1, amx_tile = (edx >> 24) & 1;
    return amx_bf16 && amx_tile && amx_tiles::request_permission();
  }();
  return granted;
}

int64_t scratch_elements(int64_t max_m, int64_t k) { return round_up(max_m, kTile) * round_up(k, kDepth); }

void multiply(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* packed,
              bool accumulate, float* c, int64_t ldc, uint16_t* scratch) {
  const int64_t depth = round_up(k, kDepth), steps = depth / kDepth, stride = block_stride(k, kDepth);
  const int64_t row_tiles = (m + kTile - 1) / kTile, column_tiles = (n + kBlock - 1) / kBlock;
  if (m % kTile != 0 || k % kDepth != 0) {  // a tile load would read past A's rows or their ends
    std::memset(scratch, 0, row_tiles * kTile * depth * sizeof(uint16_t));
    for (int64_t row = 0; row < m; ++row) {
      std::memcpy(scratch + row * depth, a + row * lda, k * sizeof(uint16_t));
    }
    a = scratch;
    lda = depth;
  }
  const Tiles tiles;
  alignas(64) float overhang[2 * kTile * 2 * kTile];
  // Column pairs outside, rows inside: a pair's packed B (32 columns x k) is
  // read from cache by every row pair.
  for (int64_t q = 0; q < column_tiles; q += 2) {
    const int64_t q_tiles = std::min<int64_t>(2, column_tiles - q);
    const int64_t col = q * kTile, cols = std::min(n - col, q_tiles * kTile);
    for (int64_t r = 0; r < row_tiles; r += 2) {
      const int64_t r_tiles = std::min<int64_t>(2, row_tiles - r);
      const int64_t row = r * kTile, rows = std::min(m - row, r_tiles * kTile);
      const Block run = block_for(r_tiles, q_tiles);
      const uint16_t* a_rows = a + row * lda;
      const uint16_t* b_cols = packed + q * stride;
      if (rows == r_tiles * kTile && cols == q_tiles * kTile) {
        run(steps, a_rows, lda, b_cols, stride, accumulate, c + row * ldc + col, ldc);
        continue;
      }
      run(steps, a_rows, lda, b_cols, stride, false, overhang, 2 * kTile);
      for (int64_t i = 0; i < rows; ++i) {
        float* out = c + (row + i) * ldc + col;
        const float* value = overhang + i * 2 * kTile;
        for (int64_t j = 0; j < cols; ++j) {
          out[j] = accumulate ? out[j] + value[j] : value[j];
        }
      }
    }
  }
}

}  // namespace amx
}  // namespace gemm_bf16
}  // namespace lltm_cpu
