// The float32 kernel behind a route, avx2-fma (gemm_f32::) or avx512-fma
// (gemm_f32::avx512::): its packing's and tile's sizes and its entry points
// (gemm_f32.h), for the routes' own GEMMs and the packed right operand.
#pragma once

#include <cstdint>

#include "blas.h"
#include "gemm_f32.h"

namespace lltm_cpu {
namespace blas {
namespace detail {

// The float32 kernel of `route` (avx2-fma or avx512-fma): its packing's and
// tile's sizes, and its entry points (gemm_f32.h).
struct F32Sizes {
  int64_t block, tile_rows, tile_columns;
};

inline F32Sizes f32_sizes(Route route) {
  if (route == Route::kAvx512Fma) {
    return {gemm_f32::avx512::kBlock, gemm_f32::avx512::kTileRows, gemm_f32::avx512::kTileColumns};
  }
  return {gemm_f32::kBlock, gemm_f32::kTileRows, gemm_f32::kTileColumns};
}

inline int64_t f32_packed_elements(Route route, int64_t n, int64_t k) {
  return route == Route::kAvx512Fma ? gemm_f32::avx512::packed_elements(n, k) : gemm_f32::packed_elements(n, k);
}

template <typename bits_t>
void f32_pack(Route route, bool trans_b, int64_t n, int64_t k, const bits_t* b, int64_t ldb, float* packed) {
  if (route == Route::kAvx512Fma) {
    gemm_f32::avx512::pack(trans_b, n, k, b, ldb, packed);
  } else {
    gemm_f32::pack(trans_b, n, k, b, ldb, packed);
  }
}

template <typename bits_t>
void f32_multiply(Route route, bool trans_a, int64_t m, int64_t n, int64_t k, const bits_t* a, int64_t lda,
                  const float* packed, bool accumulate, float* c, int64_t ldc) {
  if (route == Route::kAvx512Fma) {
    gemm_f32::avx512::multiply(trans_a, m, n, k, a, lda, packed, accumulate, c, ldc);
  } else {
    gemm_f32::multiply(trans_a, m, n, k, a, lda, packed, accumulate, c, ldc);
  }
}

}  // namespace detail
}  // namespace blas
}  // namespace lltm_cpu
