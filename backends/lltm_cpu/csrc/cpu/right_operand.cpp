// The recurrent weights laid out once per call for their route (blas.h's
// RightOperand): packed for MKL's packed GEMM and for lltm-cpu's kernels, then
// multiplied at every step.
#include <cstdlib>
#include <type_traits>

#include "blas.h"
#include "cpu_features.h"
#include "gemm_bf16.h"
#include "gemm_f32_route.h"
#include "mkl_binding.h"

namespace lltm_cpu {
namespace blas {
namespace {

using namespace detail;

// Aligned memory for packed operands, freed with std::free.
void* allocate(size_t bytes) {
  void* memory = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  LLTM_CHECK(memory != nullptr, "lltm_cpu: out of memory (", bytes, " bytes for a GEMM operand)");
  return memory;
}

}  // namespace

template <typename scalar_t>
RightOperand<scalar_t>::RightOperand(Route route, bool trans_b, int64_t max_m, int64_t n, int64_t k,
                                     const scalar_t* b, int64_t ldb)
    : route_(route), trans_b_(trans_b), max_m_(max_m), n_(n), k_(k), b_(b), ldb_(ldb) {
  if (max_m == 0 || n == 0 || k == 0) {
    return;
  }
  if constexpr (!std::is_same_v<scalar_t, double>) {
    if (is_f32_kernel(route_)) {
      using bits_t = std::conditional_t<std::is_same_v<scalar_t, float>, float, uint16_t>;
      buffer_ = allocate(f32_packed_elements(route_, n, k) * sizeof(float));
      f32_pack(route_, trans_b, n, k, reinterpret_cast<const bits_t*>(b), ldb, static_cast<float*>(buffer_));
      return;
    }
  }
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (route_ == Route::kMklPacked && fits_int({max_m, n, k, ldb})) {
      const Mkl& f = mkl();
      const size_t bytes = f.sgemm_pack_get_size(kBMatrix, static_cast<int>(max_m), static_cast<int>(n),
                                                 static_cast<int>(k));
      buffer_ = allocate(bytes);
      f.sgemm_pack(kRowMajor, kBMatrix, trans_b ? kTrans : kNoTrans, static_cast<int>(max_m), static_cast<int>(n),
                   static_cast<int>(k), 1.0f, b, static_cast<int>(ldb), static_cast<float*>(buffer_));
    }
  } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    if (route_ == Route::kAvx512Bf16 || route_ == Route::kAmxBf16) {
      const int64_t depth_multiple = route_ == Route::kAmxBf16 ? gemm_bf16::amx::kDepth : 2;
      buffer_ = allocate(gemm_bf16::packed_elements(n, k, depth_multiple) * sizeof(uint16_t));
      gemm_bf16::pack(trans_b, n, k, reinterpret_cast<const uint16_t*>(b), ldb, static_cast<uint16_t*>(buffer_),
                      depth_multiple);
      if (route_ == Route::kAmxBf16) {
        scratch_ = allocate(gemm_bf16::amx::scratch_elements(max_m, k) * sizeof(uint16_t));
      }
    } else if (route_ == Route::kAten) {
      scratch_ = allocate(max_m * n * sizeof(c10::BFloat16));  // the product, before widening
    }
  }
}

template <typename scalar_t>
bool RightOperand<scalar_t>::lays_out(Route route) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    return route == Route::kMklPacked || is_f32_kernel(route);
  } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    return route == Route::kAvx512Bf16 || route == Route::kAmxBf16 || is_f32_kernel(route);
  }
  return false;
}

template <typename scalar_t>
bool RightOperand<scalar_t>::shared_layout(Route route) {
  return lays_out(route) && route != Route::kAmxBf16;
}

template <typename scalar_t>
RightOperand<scalar_t>::~RightOperand() {
  for (void* memory : {buffer_, scratch_}) {
    std::free(memory);
  }
}

template <typename scalar_t>
void RightOperand<scalar_t>::multiply(int64_t m, const scalar_t* a, int64_t lda, bool accumulate, acc_t* c,
                                      int64_t ldc) const {
  if (m == 0 || n_ == 0) {
    return;
  }
  if (k_ == 0) {
    zero_or_keep(m, n_, accumulate, c, ldc);
    return;
  }
  if constexpr (!std::is_same_v<scalar_t, double>) {
    if (is_f32_kernel(route_)) {
      using bits_t = std::conditional_t<std::is_same_v<scalar_t, float>, float, uint16_t>;
      f32_multiply(route_, false, m, n_, k_, reinterpret_cast<const bits_t*>(a), lda,
                   static_cast<const float*>(buffer_), accumulate, c, ldc);
      return;
    }
  }
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (route_ == Route::kMklPacked && buffer_ != nullptr && fits_int({lda, ldc})) {
      mkl().sgemm_compute(kRowMajor, kNoTrans, kPacked, static_cast<int>(m), static_cast<int>(n_),
                          static_cast<int>(k_), a, static_cast<int>(lda), static_cast<const float*>(buffer_),
                          static_cast<int>(n_), accumulate ? 1.0f : 0.0f, c, static_cast<int>(ldc));
      return;
    }
  }
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    if (route_ == Route::kAmxBf16) {
      gemm_bf16::amx::multiply(m, n_, k_, reinterpret_cast<const uint16_t*>(a), lda,
                               static_cast<const uint16_t*>(buffer_), accumulate, c, ldc,
                               static_cast<uint16_t*>(scratch_));
      return;
    }
    if (route_ == Route::kAvx512Bf16) {
      gemm_bf16::multiply(m, n_, k_, reinterpret_cast<const uint16_t*>(a), lda, static_cast<const uint16_t*>(buffer_),
                          accumulate, c, ldc);
      return;
    }
    if (route_ == Route::kMkl && fits_int({m, n_, k_, lda, ldb_, ldc})) {
      mkl().gemm_bf16(kRowMajor, kNoTrans, trans_b_ ? kTrans : kNoTrans, static_cast<int>(m), static_cast<int>(n_),
                      static_cast<int>(k_), 1.0f, a, static_cast<int>(lda), b_, static_cast<int>(ldb_),
                      accumulate ? 1.0f : 0.0f, c, static_cast<int>(ldc));
      return;
    }
    // torch's bfloat16 mm, rounded to bfloat16, then widened into C.
    auto* product = static_cast<c10::BFloat16*>(scratch_);
    aten_gemm(false, trans_b_, m, n_, k_, a, lda, b_, ldb_, false, product, n_);
    for (int64_t row = 0; row < m; ++row) {
      for (int64_t col = 0; col < n_; ++col) {
        const float value = static_cast<float>(product[row * n_ + col]);
        c[row * ldc + col] = accumulate ? c[row * ldc + col] + value : value;
      }
    }
    return;
  } else {
    if (route_ == Route::kMkl && fits_int({m, n_, k_, lda, ldb_, ldc})) {
      mkl_gemm(false, trans_b_, m, n_, k_, a, lda, b_, ldb_, accumulate, c, ldc);
      return;
    }
    aten_gemm(false, trans_b_, m, n_, k_, a, lda, b_, ldb_, accumulate, c, ldc);
  }
}

template class RightOperand<float>;
template class RightOperand<double>;
template class RightOperand<c10::BFloat16>;

}  // namespace blas
}  // namespace lltm_cpu
