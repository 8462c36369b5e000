// The GEMMs of the sequence kernels, on raw row-major pointers.
//
// A sequence runs T small recurrent GEMMs forward and T backward, and at the
// tutorial's size each is a few us of arithmetic: ATen's at::mm adds its
// dispatcher round trip, argument checks and output handling to every one.
// Which library is fastest depends on the CPU and on the shape: MKL, torch's
// BLAS on x86-64, runs its AVX2 kernels on AMD CPUs and its AVX-512 or AMX
// ones on Intel; torch's brgemm (oneDNN's batch-reduce micro-kernel) uses
// AVX-512 on both, and AMX tiles for bfloat16 where present.  So each GEMM
// shape's route is chosen by measurement, once per process:
//
// * the recurrent GEMMs (RightOperand) of a (dtype, rows, N, K, layout,
//   threads) key: at the first sequence call with that key, every route this
//   torch offers for the dtype runs that GEMM on the real weights for about
//   a millisecond, and the fastest is kept (recurrent_route);
// * the GEMMs over all steps (gemm): MKL called directly (torch's x86-64
//   builds link it statically into libtorch_cpu and export its symbols, found
//   at run time with dlsym) or oneDNN's matmul (at::native::mkldnn_matmul,
//   which torch exports), timed the same way on a corner of the problem of
//   about 4M multiply-adds.  bfloat16 ones go to at::mm (oneDNN).
//
// Tuning holds one process-wide mutex, so concurrent first calls neither
// time each other's GEMMs nor tune one key twice; every later call reads the
// cached choice.  gemm_routes() lists the choices made so far.
//
// LLTM_CPU_GEMM=brgemm|avx512-bf16|mkl-packed|mkl|aten forces the recurrent
// GEMMs' route (read once, at first use) for every dtype that has it; a dtype
// without it takes MKL's GEMM (float64 has no brgemm or packed GEMM; only
// bfloat16 has avx512-bf16, lltm-cpu's own kernel, gemm_bf16_avx512.cpp);
// "aten" also sends the GEMMs over all steps to ATen.
//
// The time loop's partition between threads (lltm_sequence.cpp: blocks of
// batch rows, or blocks of state columns) is chosen the same way, per
// (dtype, B, S, threads, direction), under the same mutex, and reported in
// gemm_routes() as "time loop ...".  LLTM_CPU_SPLIT=rows|columns forces it
// (read once, at first use), for every problem that more than one thread
// can run, even one small enough that lltm-cpu would otherwise keep it on
// one thread (so tests reach both partitions at any size).
#pragma once

#include <ATen/OpMathType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace lltm_cpu {
namespace blas {

enum class Route { kBrgemm, kAvx512Bf16, kMklPacked, kMkl, kOnednn, kAten };

const char* route_name(Route route);

// The choices made so far in this process, one line per key:
// "<what> <dtype> M.. N.. K.. threads..: <route> (<route> <us>, ...)".
std::vector<std::string> gemm_routes();

// How the time loop divides its work between threads: each thread a block
// of batch rows (all state columns), or a block of state columns (all rows).
enum class Split { kRows, kColumns };

const char* split_name(Split split);

// LLTM_CPU_SPLIT, read once: the partition asked for, or nullopt to measure.
std::optional<Split> requested_split();

// The partition for `key`: LLTM_CPU_SPLIT's, else the cached choice, else
// the faster of the two as time_split(split) measures them (us per step),
// with the tuning mutex held: concurrent first calls neither time each
// other nor measure one key twice.  time_split must not choose a GEMM route
// (recurrent_route takes the same mutex): choose those first.
Split tuned_split(const std::string& key, const std::function<double(Split)>& time_split);

// C (m x n) = op(A) op(B), plus C's old contents if `accumulate` (else they
// are never read).  Row-major; op(X) is X^T where trans_x; lda, ldb and ldc are
// the row strides of A, B and C as stored.  scalar_t: float, double or
// c10::BFloat16.  Uses all of torch's threads.
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
// once for its route (transposed for brgemm, which takes B as k x n rows;
// packed for MKL's packed GEMM; widened to float where bfloat16 runs a float
// kernel).  The product accumulates in acc_t, float for bfloat16, so C is
// acc_t.  Build and use it on one thread, with the same MKL thread setting
// (MKL asks for that of its packed format).
template <typename scalar_t>
class RightOperand {
 public:
  using acc_t = at::opmath_type<scalar_t>;

  RightOperand(Route route, bool trans_b, int64_t max_m, int64_t n, int64_t k, const scalar_t* b, int64_t ldb);
  RightOperand(const RightOperand&) = delete;  // MKL's packed data must not move
  RightOperand& operator=(const RightOperand&) = delete;
  ~RightOperand();

  // C (m x n) = A op(B) (+ C if accumulate), m <= max_m.
  void multiply(int64_t m, const scalar_t* a, int64_t lda, bool accumulate, acc_t* c, int64_t ldc) const;

 private:
  Route route_;
  bool trans_b_;
  int64_t max_m_, n_, k_;
  const scalar_t* b_;
  int64_t ldb_;
  void* buffer_ = nullptr;   // op(B) laid out for the route, or nullptr
  void* scratch_ = nullptr;  // bfloat16: A widened to float, or the product before widening
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
