// The GEMMs of the sequence kernels, on raw row-major pointers.
//
// A sequence runs T small recurrent GEMMs forward and T backward, and at the
// tutorial's size each is ~10 us of arithmetic: ATen's at::mm adds its
// dispatcher round trip, argument checks and output handling to every one,
// and MKL, torch's BLAS on x86-64, runs its AVX2 kernels on AMD CPUs.  So:
//
// * the recurrent GEMMs of float32 call at::native::cpublas::brgemm, which
//   torch exports: oneDNN's batch-reduce GEMM micro-kernel (AVX-512 where the
//   CPU has it), and torch's own GEMM where oneDNN's is unavailable
//   (torch.backends.mkldnn disabled, or a build without it).  Measured at
//   B8 N384 K128 on one core here: 6.9 us against MKL's 11.2 us;
// * every other GEMM calls MKL directly where torch's BLAS is MKL (torch's
//   x86-64 builds link it statically into libtorch_cpu and export its
//   symbols, found at run time with dlsym): sgemm_/dgemm_, and on request
//   MKL's packed-weight GEMM (cblas_sgemm_pack / cblas_sgemm_compute) for
//   the recurrent weights.  Where MKL is missing, at::mm_out / addmm_ on
//   tensors wrapping the same memory, which is always correct.  bfloat16
//   always takes that route (ATen's bfloat16 GEMMs accumulate in float).
//
// LLTM_CPU_GEMM=brgemm|mkl-packed|mkl|aten chooses the recurrent GEMMs' route
// by hand (read once, at first use); "aten" also sends the other GEMMs to
// ATen.  Unset: the fastest the platform has, as measured in
// benchmarks/results/cpu_sequence.md.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace lltm_cpu {
namespace blas {

enum class Route { kBrgemm, kMklPacked, kMkl, kAten };

// The route the recurrent GEMMs of this dtype take here (after LLTM_CPU_GEMM).
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
// and at most `max_m` rows: the recurrent weights of the time loop.  Laid
// out once for its route: transposed into a buffer of its own for brgemm
// (which takes B as k x n rows), packed for kMklPacked, else only its
// pointer is kept.  Build and use it on one thread, with the same MKL thread
// setting (MKL asks for that of its packed format).  `threaded`: the GEMMs
// may use MKL's threads (a single block of rows with large GEMMs), so the
// single-threaded micro-kernel is not used.
template <typename scalar_t>
class RightOperand {
 public:
  RightOperand(bool trans_b, int64_t max_m, int64_t n, int64_t k, const scalar_t* b, int64_t ldb, bool threaded);
  RightOperand(const RightOperand&) = delete;  // MKL's packed data must not move
  RightOperand& operator=(const RightOperand&) = delete;
  ~RightOperand();

  // C (m x n) = A op(B) (+ C if accumulate), m <= max_m.
  void multiply(int64_t m, const scalar_t* a, int64_t lda, bool accumulate, scalar_t* c, int64_t ldc) const;

 private:
  Route route_;
  bool trans_b_;
  int64_t n_, k_;
  const scalar_t* b_;
  int64_t ldb_;
  void* buffer_ = nullptr;  // op(B) transposed for brgemm, MKL's packed op(B), or nullptr
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
