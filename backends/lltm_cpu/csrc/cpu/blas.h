// The GEMMs of the sequence kernels, on raw row-major pointers.
//
// A sequence runs T small recurrent GEMMs forward and T backward, and at the
// tutorial's size each is a little arithmetic: a tensor operator adds its
// dispatcher round trip, argument checks and output handling to every one.
// Which library is fastest depends on the CPU and on the shape, so each GEMM
// shape's route is chosen by measurement, once per process (tuning.h):
//
// * the recurrent GEMMs (RightOperand) of a (dtype, rows, N, K, layout,
//   threads) key: at the first sequence call with that key, every route
//   offered for the dtype runs that GEMM on the real weights for about a
//   millisecond, and the fastest is kept, one that lays out a copy of the
//   weights only by a margin (recurrent_route).  The routes:
//   MKL's packed and plain GEMMs, called directly (torch's x86-64 builds link
//   MKL and export its C and Fortran symbols, found at run time with dlsym:
//   MKL's ABI, not torch's), lltm-cpu's own kernels (AVX2 FMA for float32
//   and bfloat16, gemm_f32_avx2.cpp, and its AVX-512 build, gemm_f32_avx512.cpp;
//   AVX512_BF16, gemm_bf16_avx512.cpp;
//   AMX tiles for bfloat16, gemm_bf16_amx.cpp),
//   and torch's mm through the stable C shim
//   (aoti_torch_cpu_mm_out), which every torch has;
// * the GEMMs over all steps (gemm), and the per-step cell's: in float32,
//   lltm-cpu's AVX2 FMA kernel or MKL, each on all of torch's threads or, for
//   a small GEMM, on the calling thread alone, the fastest measured at the
//   shape's first use; MKL in float64; else the shim.
//
// torch's brgemm and oneDNN matmul are ATen internals, outside the stable
// ABI: what they were worth on each CPU measured is in
// benchmarks/results/cpu_sequence.md.
//
// LLTM_CPU_GEMM=amx-bf16|avx512-bf16|avx512-fma|avx2-fma|mkl-packed|mkl|aten forces the
// recurrent GEMMs' route (read once, at first use); a dtype without that route
// (float64 has neither packed GEMM nor own kernel, only bfloat16 has amx-bf16
// and avx512-bf16) is an
// error, not a quiet
// substitute; "aten" also sends the GEMMs over all steps to the shim.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pointwise.h"

namespace lltm_cpu {
namespace blas {

// The table of routes, in the order they are offered and reported.
enum class Route { kAmxBf16, kAvx512Bf16, kAvx512Fma, kAvx2Fma, kMklPacked, kMkl, kAten };

const char* route_name(Route route);

// LLTM_CPU_GEMM, read once: the route asked for, or nullopt to measure.
// Throws for a value that names no route.
std::optional<Route> requested_route();

// C (m x n) = op(A) op(B), plus C's old contents if `accumulate` (else they
// are never read).  Row-major; op(X) is X^T where trans_x; lda, ldb and ldc are
// the row strides of A, B and C as stored.  scalar_t: float, double or
// c10::BFloat16.  Uses all of torch's threads, or one where that measured faster.
// Throws for a dtype LLTM_CPU_GEMM has no route for.
template <typename scalar_t>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const scalar_t* a, int64_t lda,
          const scalar_t* b, int64_t ldb, bool accumulate, scalar_t* c, int64_t ldc);

// The route for the recurrent GEMMs A op(B) with this B (the recurrent
// weights), at most `max_m` rows of A per call, run on one thread each
// (`threaded` false) or on MKL's threads (a single block of rows with large
// GEMMs): LLTM_CPU_GEMM's, or the fastest measured for the key.  Call it on
// the caller's thread, outside a parallel region.
template <typename scalar_t>
Route recurrent_route(bool trans_b, int64_t max_m, int64_t n, int64_t k, const scalar_t* b, int64_t ldb,
                      bool threaded);

// The right-hand operand op(B) (k x n) of many GEMMs with the same n and k
// and at most `max_m` rows: the recurrent weights of the time loop, laid out
// once for its route (packed for MKL's packed GEMM and for lltm-cpu's
// kernels).  The product accumulates in acc_t, float for bfloat16, so C is
// acc_t.  Build and use it on one thread, with the same MKL thread setting
// (MKL asks for that of its packed format).
template <typename scalar_t>
class RightOperand {
 public:
  using acc_t = opmath_type<scalar_t>;

  RightOperand(Route route, bool trans_b, int64_t max_m, int64_t n, int64_t k, const scalar_t* b, int64_t ldb);
  RightOperand(const RightOperand&) = delete;  // MKL's packed data must not move
  RightOperand& operator=(const RightOperand&) = delete;
  ~RightOperand();

  // Whether the route lays out a copy of B (MKL's packed format, lltm-cpu's
  // kernels), which the time loop does once per call.
  static bool lays_out(Route route);

  // Whether one operand of `route` is worth sharing between threads: the
  // route lays out a copy of B, and multiply writes no scratch of the
  // operand's, so that several threads may multiply by it at once (not
  // amx-bf16).
  static bool shared_layout(Route route);

  // C (m x n) = A op(B) (+ C if accumulate), m <= max_m.
  void multiply(int64_t m, const scalar_t* a, int64_t lda, bool accumulate, acc_t* c, int64_t ldc) const;

 private:
  Route route_;
  bool trans_b_;
  int64_t max_m_, n_, k_;
  const scalar_t* b_;
  int64_t ldb_;
  void* buffer_ = nullptr;   // op(B) laid out for the route, or nullptr
  void* scratch_ = nullptr;  // bfloat16: A padded to whole tiles (amx-bf16), or the product before widening (aten)
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
