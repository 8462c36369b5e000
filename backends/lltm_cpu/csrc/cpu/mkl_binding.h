// The libraries lltm-cpu's GEMM routes call: MKL, through its own C and
// Fortran symbols, found in the process at run time (torch's x86-64 builds
// link MKL and export them: MKL's ABI, not torch's), and torch's mm through
// the stable C shim, which every torch has (the "aten" route, and the
// fallback where MKL is absent or a size exceeds its 32-bit integers).
#pragma once

#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "check.h"
#include "kernel_common.h"

namespace lltm_cpu {
namespace blas {
namespace detail {

// MKL's LP64 interface, which torch links: 32-bit integers.  The CBLAS enums
// are C enums (ints); their values are fixed by the CBLAS standard and MKL.
using FortranGemm = void (*)(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                             const void* alpha, const void* a, const int* lda, const void* b, const int* ldb,
                             const void* beta, void* c, const int* ldc);
using PackGetSize = size_t (*)(int identifier, int m, int n, int k);
using Pack = void (*)(int layout, int identifier, int trans, int m, int n, int k, float alpha, const float* src,
                      int ld, float* dest);
using Compute = void (*)(int layout, int transa, int transb, int m, int n, int k, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc);
// bfloat16 inputs (MKL_BF16 is uint16), float accumulation and output.
using GemmBf16 = void (*)(int layout, int transa, int transb, int m, int n, int k, float alpha, const void* a, int lda,
                          const void* b, int ldb, float beta, float* c, int ldc);
using SetNumThreadsLocal = int (*)(int);

constexpr int kRowMajor = 101;
constexpr int kNoTrans = 111;
constexpr int kTrans = 112;
constexpr int kPacked = 151;
constexpr int kBMatrix = 162;

struct Mkl {
  FortranGemm sgemm = nullptr;
  FortranGemm dgemm = nullptr;
  PackGetSize sgemm_pack_get_size = nullptr;
  Pack sgemm_pack = nullptr;
  Compute sgemm_compute = nullptr;
  GemmBf16 gemm_bf16 = nullptr;
  // The C entry point is MKL_Set_Num_Threads_Local; the lower-case
  // mkl_set_num_threads_local exported beside it is the Fortran one, which
  // takes a pointer.
  SetNumThreadsLocal set_num_threads_local = nullptr;

  bool has_gemm() const { return sgemm && dgemm && set_num_threads_local; }
  bool has_packed() const { return has_gemm() && sgemm_pack_get_size && sgemm_pack && sgemm_compute; }
  bool has_bf16() const { return has_gemm() && gemm_bf16; }
};

// The MKL functions found in this process (all null where torch has no MKL).
const Mkl& mkl();

inline bool fits_int(std::initializer_list<int64_t> sizes) {
  return std::all_of(sizes.begin(), sizes.end(), [](int64_t v) { return v <= INT_MAX; });
}

// op(X) as a tensor over the same memory: X stored rows x cols (row stride
// ld), transposed where `trans`.
template <typename scalar_t>
Tensor wrap(bool trans, const scalar_t* data, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t sizes[] = {trans ? cols : rows, trans ? rows : cols};
  const int64_t strides[] = {trans ? 1 : ld, trans ? ld : 1};
  return torch::stable::from_blob(const_cast<scalar_t*>(data), sizes, strides,
                                  torch::stable::Device(torch::headeronly::DeviceType::CPU),
                                  scalar_type_of<scalar_t>());
}

// torch's mm through the stable C shim: always there, whatever BLAS torch has.
template <typename scalar_t>
void aten_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const scalar_t* a, int64_t lda,
               const scalar_t* b, int64_t ldb, bool accumulate, scalar_t* c, int64_t ldc) {
  const Tensor A = wrap(trans_a, a, trans_a ? k : m, trans_a ? m : k, lda);
  const Tensor B = wrap(trans_b, b, trans_b ? n : k, trans_b ? k : n, ldb);
  const Tensor C = wrap(false, c, m, n, ldc);
  const AOTITorchError error = accumulate ? aoti_torch_cpu_addmm_out(C.get(), C.get(), A.get(), B.get(), 1.0, 1.0)
                                          : aoti_torch_cpu_mm_out(C.get(), A.get(), B.get());
  LLTM_CHECK(error == AOTI_TORCH_SUCCESS, "lltm_cpu: torch's mm failed on a ", m, " x ", k, " x ", n, " ",
                  dtype_name<scalar_t>(), " GEMM");
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, and a
// row-major matrix is its transpose column-major: so B goes first, and each
// keeps its own transpose flag.
template <typename scalar_t>
void mkl_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const scalar_t* a, int64_t lda,
              const scalar_t* b, int64_t ldb, bool accumulate, scalar_t* c, int64_t ldc) {
  const FortranGemm gemm = std::is_same_v<scalar_t, float> ? mkl().sgemm : mkl().dgemm;
  const int M = static_cast<int>(n), N = static_cast<int>(m), K = static_cast<int>(k);
  const int LDA = static_cast<int>(ldb), LDB = static_cast<int>(lda), LDC = static_cast<int>(ldc);
  const scalar_t one = 1, beta = accumulate ? 1 : 0;
  gemm(trans_b ? "T" : "N", trans_a ? "T" : "N", &M, &N, &K, &one, b, &LDA, a, &LDB, &beta, c, &LDC);
}

template <typename scalar_t>
void zero_or_keep(int64_t m, int64_t n, bool accumulate, scalar_t* c, int64_t ldc) {
  if (!accumulate) {  // a GEMM with k = 0: C = 0 (+ C)
    for (int64_t row = 0; row < m; ++row) {
      std::fill(c + row * ldc, c + row * ldc + n, scalar_t(0));
    }
  }
}

}  // namespace detail
}  // namespace blas
}  // namespace lltm_cpu
