// The GEMMs of the sequence kernels, on raw row-major pointers.
//
// A sequence runs T small recurrent GEMMs forward and T backward, and at the
// tutorial's size each is ~10 us of arithmetic: ATen's at::mm adds its
// dispatcher round trip, argument checks and output handling to every one.
// So where torch's BLAS is MKL (torch's x86-64 builds link it statically
// into libtorch_cpu and export its symbols), these call MKL directly, found
// at run time with dlsym: sgemm_/dgemm_, and for float32 MKL's packed-weight
// GEMM (cblas_sgemm_pack / cblas_sgemm_compute), which packs the recurrent
// weights once per sequence instead of once per step.  Where those symbols
// are missing (another BLAS, another platform) every GEMM goes through
// at::mm_out / addmm_ on tensors wrapping the same memory, which is always
// correct.  bfloat16 always takes that route (ATen's bfloat16 GEMMs
// accumulate in float).
//
// LLTM_CPU_GEMM=packed|blas|aten chooses the route by hand (read once, at
// first use): "blas" keeps MKL but does not pack, "aten" uses at::mm only.
// The default is the fastest the platform has.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace lltm_cpu {
namespace blas {

enum class Route { kMklPacked, kMkl, kAten };

// The route GEMMs of this dtype take here (after LLTM_CPU_GEMM).
Route route_for(c10::ScalarType dtype);
const char* route_name(Route route);

// C (m x n) = op(A) op(B), plus C's old contents if `accumulate` (else they
// are never read).  Row-major; op(X) is X^T where trans_x; lda, ldb and ldc are
// the row strides of A, B and C as stored.  scalar_t: float, double or
// c10::BFloat16.
template <typename scalar_t>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const scalar_t* a, int64_t lda,
          const scalar_t* b, int64_t ldb, bool accumulate, scalar_t* c, int64_t ldc);

// The right-hand operand op(B) (k x n) of many GEMMs with the same n and k
// and at most `max_m` rows: the recurrent weights of the time loop.  Packed
// once where the route is kMklPacked, otherwise only its pointer is kept.
// Build and use it on one thread, with the same MKL thread setting (MKL asks
// for that of its packed format).
template <typename scalar_t>
class RightOperand {
 public:
  RightOperand(bool trans_b, int64_t max_m, int64_t n, int64_t k, const scalar_t* b, int64_t ldb);
  RightOperand(const RightOperand&) = delete;  // MKL's packed data must not move
  RightOperand& operator=(const RightOperand&) = delete;
  ~RightOperand();

  // C (m x n) = A op(B) (+ C if accumulate), m <= max_m.
  void multiply(int64_t m, const scalar_t* a, int64_t lda, bool accumulate, scalar_t* c, int64_t ldc) const;

 private:
  bool trans_b_;
  int64_t n_, k_;
  const scalar_t* b_;
  int64_t ldb_;
  void* packed_ = nullptr;  // MKL's packed op(B), or nullptr
};

// While it lives, MKL calls made on this thread run on this thread alone
// (where `enable` and MKL is in use): the time loop runs one block of batch
// rows per thread, each with its own single-threaded GEMMs.
class SingleThreaded {
 public:
  explicit SingleThreaded(bool enable);
  SingleThreaded(const SingleThreaded&) = delete;
  SingleThreaded& operator=(const SingleThreaded&) = delete;
  ~SingleThreaded();

 private:
  bool active_ = false;
  int previous_ = 0;
};

}  // namespace blas
}  // namespace lltm_cpu
