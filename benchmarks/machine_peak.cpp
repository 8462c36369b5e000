// The machine's multiply-add peak, for the roofline column of bench_cpu_sequence.py: every thread
// runs independent chains of one multiply-add instruction, long enough that the chains' latency is
// hidden (12 chains: 4 cycles of latency times 2 FMA units, with room), and the total rate over all
// threads is returned.  Each function is compiled for its own instruction set (target attributes), and
// bench_cpu_sequence.py calls only those the CPU has.  Built by bench_cpu_sequence.py as a shared
// library and called through ctypes; it links nothing of torch.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#if defined(MACHINE_PEAK_AMX)
#include "../backends/lltm_cpu/csrc/cpu/amx_tiles.h"  // the tiles as lltm-cpu configures them
#endif

namespace {

constexpr int kChains = 12;
std::atomic<float> sink{0.f};  // keeps each chain's result alive

// A kernel `name` for `isa`: kChains chains of `op(acc, a, b)` on vectors of type Vec, `lanes`
// multiply-adds each; `total` reduces a vector to a float for the sink.
#define PEAK_KERNEL(name, isa, Vec, Operand, init, a_value, b_value, op, total, lanes) \
  __attribute__((target(isa))) int64_t name(int64_t iterations) {                       \
    Vec acc[kChains];                                                                   \
    for (int i = 0; i < kChains; ++i) acc[i] = init(0.001f * i);                        \
    const Operand a = a_value, b = b_value;                                             \
    for (int64_t it = 0; it < iterations; ++it) {                                       \
      _Pragma("GCC unroll 12") for (int i = 0; i < kChains; ++i) acc[i] = op(acc[i], a, b); \
    }                                                                                   \
    float sum = 0;                                                                      \
    for (int i = 0; i < kChains; ++i) sum += total(acc[i]);                             \
    sink.store(sum);                                                                    \
    return iterations * kChains * (lanes);                                              \
  }

__attribute__((target("avx2,fma"))) inline __m256 fma256(__m256 acc, __m256 a, __m256 b) {
  return _mm256_fmadd_ps(acc, a, b);
}
__attribute__((target("avx512f"))) inline __m512 fma512(__m512 acc, __m512 a, __m512 b) {
  return _mm512_fmadd_ps(acc, a, b);
}

PEAK_KERNEL(fma_avx2, "avx2,fma", __m256, __m256, _mm256_set1_ps, _mm256_set1_ps(0.999f), _mm256_set1_ps(0.0001f),
            fma256, _mm256_cvtss_f32, 8)
PEAK_KERNEL(fma_avx512, "avx512f", __m512, __m512, _mm512_set1_ps, _mm512_set1_ps(0.999f), _mm512_set1_ps(0.0001f),
            fma512, _mm512_reduce_add_ps, 16)
// vdpbf16ps: 16 float lanes, each the sum of two bfloat16 products (1.0 times about 0.0005).
PEAK_KERNEL(dot_avx512_bf16, "avx512f,avx512bf16", __m512, __m512bh, _mm512_set1_ps,
            (__m512bh)_mm512_set1_epi16(0x3f80), (__m512bh)_mm512_set1_epi16(0x3a00), _mm512_dpbf16_ps,
            _mm512_reduce_add_ps, 32)

#if defined(MACHINE_PEAK_AMX)
// tdpbf16ps on 16 x 16 float tiles, 16 x 32 bfloat16 operands: 8192 multiply-adds each.  Four
// accumulator tiles, two operand tiles, all from cache.
__attribute__((target("amx-tile,amx-bf16"))) int64_t dot_amx_bf16(int64_t iterations) {
  alignas(64) static thread_local uint16_t operand[16 * 32];
  alignas(64) static thread_local float result[16 * 16];
  for (auto& value : operand) value = 0x3a00;
  lltm_cpu::amx_tiles::configure();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  for (int64_t it = 0; it < iterations; ++it) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, result, 64);
  _tile_release();
  sink.store(result[0]);
  return iterations * 4 * 8192;
}

#endif

using Kernel = int64_t (*)(int64_t);

Kernel kernel_named(int which) {
  switch (which) {
    case 0:
      return fma_avx2;
    case 1:
      return fma_avx512;
    case 2:
      return dot_avx512_bf16;
#if defined(MACHINE_PEAK_AMX)
    case 3:
      return lltm_cpu::amx_tiles::request_permission() ? dot_amx_bf16 : nullptr;
#endif
    default:
      return nullptr;
  }
}

}  // namespace

// Multiply-adds a second over `threads` threads running kernel `which` (0 AVX2 FMA, 1 AVX-512 FMA,
// 2 AVX512_BF16 dot products, 3 AMX-BF16 tiles) together: the best of `repeats` runs of about
// `iterations` loop trips each.  0 where the kernel is not in this build or not granted.
extern "C" double machine_peak(int which, int threads, int64_t iterations, int repeats) {
  const Kernel kernel = kernel_named(which);
  if (kernel == nullptr) {
    return 0;
  }
  double best = 0;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    std::vector<std::thread> workers;
    std::vector<int64_t> done(threads, 0);
    const auto start = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] { done[t] = kernel(iterations); });
    }
    for (auto& worker : workers) worker.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    int64_t total = 0;
    for (const int64_t count : done) total += count;
    best = std::max(best, static_cast<double>(total) / seconds);
  }
  return best;
}
