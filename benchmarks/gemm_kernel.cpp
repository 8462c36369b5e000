// lltm-cpu's float32 GEMM kernel alone (gemm_f32_avx2.cpp, or with
// -DLLTM_GEMM_F32_KERNEL=lltm_cpu::gemm_f32::avx512 gemm_f32_avx512.cpp, compiled beside
// this): GFLOP/s of multiply() on one thread, the fastest of `reps` calls,
// for one shape given as m n k trans_a (B packed once, untimed, as the
// library does).  Also checks the product against a plain loop, so that a
// faster kernel that computes something else fails here.  Built and run by
// gemm_kernel.py.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "gemm_f32.h"

#if !defined(LLTM_GEMM_F32_KERNEL)
#define LLTM_GEMM_F32_KERNEL lltm_cpu::gemm_f32
#endif
namespace kernel = LLTM_GEMM_F32_KERNEL;

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s m n k trans_a reps\n", argv[0]);
    return 2;
  }
  const int64_t m = std::atoll(argv[1]), n = std::atoll(argv[2]), k = std::atoll(argv[3]);
  const bool trans_a = std::atoi(argv[4]) != 0;
  const int reps = std::atoi(argv[5]);
  std::mt19937 generator(0);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> a(m * k), b(k * n), c(m * n), packed(kernel::packed_elements(n, k));
  for (float& value : a) value = normal(generator);
  for (float& value : b) value = normal(generator);
  const int64_t lda = trans_a ? m : k;  // A stored k x m where trans_a
  kernel::pack(false, n, k, b.data(), n, packed.data());

  double best = 1e30;
  for (int rep = 0; rep <= reps; ++rep) {  // the first call touches the memory, and is not counted
    const auto start = std::chrono::steady_clock::now();
    kernel::multiply(trans_a, m, n, k, a.data(), lda, packed.data(), false, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = rep == 0 ? best : std::min(best, s);
  }

  // A few rows and columns against a plain double-precision loop.
  double worst = 0;
  for (int64_t row = 0; row < m; row += std::max<int64_t>(1, m / 7)) {
    for (int64_t col = 0; col < n; col += std::max<int64_t>(1, n / 5)) {
      double sum = 0, magnitude = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double product = double(trans_a ? a[p * lda + row] : a[row * lda + p]) * b[p * n + col];
        sum += product;
        magnitude += std::fabs(product);
      }
      worst = std::max(worst, std::fabs(c[row * n + col] - sum) / (magnitude + 1e-30));
    }
  }
  if (!(worst < 1e-5)) {
    std::fprintf(stderr, "gemm_kernel: M%lld N%lld K%lld%s differs from the plain loop (relative %g)\n",
                 static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                 trans_a ? " A^T" : "", worst);
    return 1;
  }
  std::printf("%.3f\n", 2.0 * m * n * k / best / 1e9);
  return 0;
}
