// The sequence kernels' GEMMs: MKL called directly where torch exports it,
// ATen otherwise.  See blas.h for why.
#include "blas.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <dlfcn.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

namespace lltm_cpu {
namespace blas {
namespace {

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
  // The C entry point is MKL_Set_Num_Threads_Local; the lower-case
  // mkl_set_num_threads_local exported beside it is the Fortran one, which
  // takes a pointer.
  SetNumThreadsLocal set_num_threads_local = nullptr;

  bool has_gemm() const { return sgemm && dgemm && set_num_threads_local; }
  bool has_packed() const { return has_gemm() && sgemm_pack_get_size && sgemm_pack && sgemm_compute; }
};

void* find_symbol(const char* name) {
  // libtorch_cpu is loaded (this library links it), so RTLD_NOLOAD finds it
  // by soname; dlsym then searches it and what it loaded.  Python loads it
  // RTLD_LOCAL, so the global scope alone would not see its symbols.
  static void* const torch_cpu = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
  void* symbol = torch_cpu != nullptr ? dlsym(torch_cpu, name) : nullptr;
  return symbol != nullptr ? symbol : dlsym(RTLD_DEFAULT, name);
}

const Mkl& mkl() {
  static const Mkl functions = [] {
    Mkl found;
    // Only a torch built with MKL: another BLAS may export sgemm_ with other
    // integer sizes.
    if (!at::hasMKL()) {
      return found;
    }
    found.sgemm = reinterpret_cast<FortranGemm>(find_symbol("sgemm_"));
    found.dgemm = reinterpret_cast<FortranGemm>(find_symbol("dgemm_"));
    found.sgemm_pack_get_size = reinterpret_cast<PackGetSize>(find_symbol("cblas_sgemm_pack_get_size"));
    found.sgemm_pack = reinterpret_cast<Pack>(find_symbol("cblas_sgemm_pack"));
    found.sgemm_compute = reinterpret_cast<Compute>(find_symbol("cblas_sgemm_compute"));
    found.set_num_threads_local = reinterpret_cast<SetNumThreadsLocal>(find_symbol("MKL_Set_Num_Threads_Local"));
    return found;
  }();
  return functions;
}

// LLTM_CPU_GEMM: the recurrent GEMMs' route asked for, before the platform
// and the dtype narrow it.
Route requested_route() {
  static const Route route = [] {
    const char* env = std::getenv("LLTM_CPU_GEMM");
    const std::string wanted = env == nullptr ? "" : env;
    for (const Route candidate : {Route::kBrgemm, Route::kMklPacked, Route::kMkl, Route::kAten}) {
      if (wanted == route_name(candidate)) {
        return candidate;
      }
    }
    TORCH_CHECK(wanted.empty(), "lltm_cpu: LLTM_CPU_GEMM must be brgemm, mkl-packed, mkl or aten (or unset), got '",
                wanted, "'");
    return Route::kBrgemm;
  }();
  return route;
}

// The other GEMMs (over all steps at once) use MKL unless the route is ATen's.
bool big_gemms_use_mkl(c10::ScalarType dtype) {
  return dtype != c10::kBFloat16 && requested_route() != Route::kAten && mkl().has_gemm();
}

bool fits_int(std::initializer_list<int64_t> sizes) {
  return std::all_of(sizes.begin(), sizes.end(), [](int64_t v) { return v <= INT_MAX; });
}

template <typename scalar_t>
at::Tensor wrap(const scalar_t* data, int64_t rows, int64_t cols, int64_t ld) {
  return at::from_blob(const_cast<scalar_t*>(data), {rows, cols}, {ld, 1},
                       at::TensorOptions().dtype(c10::CppTypeToScalarType<scalar_t>::value));
}

template <typename scalar_t>
void aten_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const scalar_t* a, int64_t lda,
               const scalar_t* b, int64_t ldb, bool accumulate, scalar_t* c, int64_t ldc) {
  const at::Tensor A = trans_a ? wrap(a, k, m, lda).t() : wrap(a, m, k, lda);
  const at::Tensor B = trans_b ? wrap(b, n, k, ldb).t() : wrap(b, k, n, ldb);
  at::Tensor C = wrap(c, m, n, ldc);
  if (accumulate) {
    C.addmm_(A, B);
  } else {
    at::mm_out(C, A, B);
  }
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

}  // namespace

Route route_for(c10::ScalarType dtype) {
  const Route requested = requested_route();
  if (dtype == c10::kBFloat16 || requested == Route::kAten) {
    return Route::kAten;
  }
  if (dtype == c10::kFloat && requested == Route::kBrgemm) {
    return Route::kBrgemm;  // torch's own, with torch's fallback inside
  }
  if (dtype == c10::kFloat && requested == Route::kMklPacked && mkl().has_packed()) {
    return Route::kMklPacked;
  }
  // float64 has no brgemm or packed GEMM in torch: MKL's dgemm.
  return mkl().has_gemm() ? Route::kMkl : Route::kAten;
}

const char* route_name(Route route) {
  switch (route) {
    case Route::kBrgemm:
      return "brgemm";
    case Route::kMklPacked:
      return "mkl-packed";
    case Route::kMkl:
      return "mkl";
    case Route::kAten:
      return "aten";
  }
  return "?";
}

template <typename scalar_t>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const scalar_t* a, int64_t lda,
          const scalar_t* b, int64_t ldb, bool accumulate, scalar_t* c, int64_t ldc) {
  if (m == 0 || n == 0) {
    return;
  }
  if (k == 0) {
    zero_or_keep(m, n, accumulate, c, ldc);
    return;
  }
  constexpr c10::ScalarType dtype = c10::CppTypeToScalarType<scalar_t>::value;
  if constexpr (!std::is_same_v<scalar_t, c10::BFloat16>) {
    if (big_gemms_use_mkl(dtype) && fits_int({m, n, k, lda, ldb, ldc})) {
      mkl_gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
      return;
    }
  }
  aten_gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
}

template <typename scalar_t>
RightOperand<scalar_t>::RightOperand(bool trans_b, int64_t max_m, int64_t n, int64_t k, const scalar_t* b,
                                     int64_t ldb, bool threaded)
    : route_(route_for(c10::CppTypeToScalarType<scalar_t>::value)), trans_b_(trans_b), n_(n), k_(k), b_(b), ldb_(ldb) {
  if (route_ == Route::kBrgemm && threaded) {
    route_ = mkl().has_gemm() ? Route::kMkl : Route::kAten;
  }
  if (max_m == 0 || n == 0 || k == 0) {
    return;
  }
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (route_ == Route::kBrgemm && trans_b) {
      // B is stored n x k; brgemm reads k x n rows.
      auto* transposed = static_cast<float*>(c10::alloc_cpu(n * k * sizeof(float)));
      constexpr int64_t kTile = 16;  // tiles keep both sides' cache lines in use
      for (int64_t row0 = 0; row0 < n; row0 += kTile) {
        for (int64_t col0 = 0; col0 < k; col0 += kTile) {
          for (int64_t row = row0; row < std::min(row0 + kTile, n); ++row) {
            for (int64_t col = col0; col < std::min(col0 + kTile, k); ++col) {
              transposed[col * n + row] = b[row * ldb + col];
            }
          }
        }
      }
      buffer_ = transposed;
      b_ = transposed;
      ldb_ = n;
      trans_b_ = false;
    } else if (route_ == Route::kMklPacked && fits_int({max_m, n, k, ldb})) {
      const Mkl& f = mkl();
      const size_t bytes = f.sgemm_pack_get_size(kBMatrix, static_cast<int>(max_m), static_cast<int>(n),
                                                 static_cast<int>(k));
      buffer_ = c10::alloc_cpu(bytes);
      f.sgemm_pack(kRowMajor, kBMatrix, trans_b ? kTrans : kNoTrans, static_cast<int>(max_m), static_cast<int>(n),
                   static_cast<int>(k), 1.0f, b, static_cast<int>(ldb), static_cast<float*>(buffer_));
    }
  }
}

template <typename scalar_t>
RightOperand<scalar_t>::~RightOperand() {
  if (buffer_ != nullptr) {
    c10::free_cpu(buffer_);
  }
}

template <typename scalar_t>
void RightOperand<scalar_t>::multiply(int64_t m, const scalar_t* a, int64_t lda, bool accumulate, scalar_t* c,
                                      int64_t ldc) const {
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (m > 0 && n_ > 0 && k_ > 0) {
      if (route_ == Route::kBrgemm && !trans_b_) {
        // A micro-kernel: a few dozen rows at a time keep its C tile in registers and cache.
        constexpr int64_t kRowsPerCall = 64;
        for (int64_t row = 0; row < m; row += kRowsPerCall) {
          at::native::cpublas::brgemm(std::min(kRowsPerCall, m - row), n_, k_, lda, ldb_, ldc, accumulate,
                                      a + row * lda, b_, c + row * ldc);
        }
        return;
      }
      if (route_ == Route::kMklPacked && buffer_ != nullptr && fits_int({lda, ldc})) {
        mkl().sgemm_compute(kRowMajor, kNoTrans, kPacked, static_cast<int>(m), static_cast<int>(n_),
                            static_cast<int>(k_), a, static_cast<int>(lda), static_cast<const float*>(buffer_),
                            static_cast<int>(n_), accumulate ? 1.0f : 0.0f, c, static_cast<int>(ldc));
        return;
      }
    }
  }
  gemm(false, trans_b_, m, n_, k_, a, lda, b_, ldb_, accumulate, c, ldc);
}

SingleThreaded::SingleThreaded(bool enable) {
  const SetNumThreadsLocal set = mkl().set_num_threads_local;
  if (enable && set != nullptr) {
    previous_ = set(1);
    active_ = true;
  }
}

SingleThreaded::~SingleThreaded() {
  if (active_) {
    mkl().set_num_threads_local(previous_);  // 0: back to MKL's global setting
  }
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, bool,
                          float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t, const double*, int64_t,
                           bool, double*, int64_t);
template void gemm<c10::BFloat16>(bool, bool, int64_t, int64_t, int64_t, const c10::BFloat16*, int64_t,
                                  const c10::BFloat16*, int64_t, bool, c10::BFloat16*, int64_t);
template class RightOperand<float>;
template class RightOperand<double>;
template class RightOperand<c10::BFloat16>;

}  // namespace blas
}  // namespace lltm_cpu
