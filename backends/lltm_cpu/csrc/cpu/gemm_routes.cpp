// The GEMM routes: the candidates for each GEMM on this CPU and torch, their
// timing at a shape's first call, and the GEMMs over all steps on the chosen
// one.  See blas.h for why; the libraries are mkl_binding.h, the CPU checks
// cpu_features.h, the recurrent weights' layout right_operand.cpp.
#include "blas.h"

#include "check.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cpu_features.h"
#include "gemm_f32_route.h"
#include "kernel_common.h"
#include "mkl_binding.h"
#include "tuning.h"

namespace lltm_cpu {
namespace blas {
namespace {

using namespace detail;


// `measure()` run as the time loop runs its GEMMs: on one thread of a
// parallel region, where MKL's GEMMs run on that thread alone (under
// SingleThreaded).  The region's other threads return at once.  Timing on
// one thread also keeps the measurement clear of other processes on a shared
// machine, which delay every multi-threaded call.  MKL's one-thread setting
// is made inside the region only: a parallel region started while it holds
// on the calling thread leaves that thread's torch at one thread for good
// (torch's OpenMP build: every later call ran on one thread).
template <typename Measure>
double on_one_thread(const Measure& measure) {
  if (in_parallel_region() || num_threads() == 1) {
    const SingleThreaded single_threaded(true);
    return measure();
  }
  double us = 0;
  parallel_for(0, num_threads(), 1, [&](int64_t first, int64_t) {
    if (first == 0) {
      const SingleThreaded single_threaded_here(true);
      us = measure();
    }
  });
  return us;
}

// How a GEMM's choice with one candidate was made, as gemm_routes() reports it.
const char* single_route_source() { return requested_route().has_value() ? "LLTM_CPU_GEMM" : tuning::kOnlyOne; }

// Test data for timing: small values, never denormal.
template <typename T>
std::vector<T> filled(int64_t count) {
  std::vector<T> data(std::max<int64_t>(count, 1));
  for (int64_t i = 0; i < count; ++i) {
    data[i] = static_cast<T>(0.01f * static_cast<float>(i % 13) - 0.05f);
  }
  return data;
}

// ---- The GEMMs over all steps.

// lltm-cpu's float32 kernel over all steps: op(B) packed once, its column
// blocks split among torch's threads, then C's row tiles split among them (or
// its column tiles, where C is wider than tall); all on the calling thread if
// `one_thread`.
void own_gemm(Route route, bool one_thread, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
              const float* a, int64_t lda, const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  const auto [kBlock, kTileRows, kTileColumns] = f32_sizes(route);
  const auto split = [one_thread](int64_t parts, const auto& body) {
    if (one_thread) {
      body(int64_t{0}, parts);
    } else {
      parallel_for(0, parts, 1, body);
    }
  };
  std::vector<float> packed(f32_packed_elements(route, n, k));
  split((n + kBlock - 1) / kBlock, [&](int64_t first, int64_t last) {
    const int64_t col = first * kBlock, cols = std::min(n, last * kBlock) - col;
    f32_pack(route, trans_b, cols, k, trans_b ? b + col * ldb : b + col, ldb, packed.data() + col * k);
  });
  if (m >= n) {
    split((m + kTileRows - 1) / kTileRows, [&](int64_t first, int64_t last) {
      const int64_t row = first * kTileRows, rows = std::min(m, last * kTileRows) - row;
      f32_multiply(route, trans_a, rows, n, k, trans_a ? a + row : a + row * lda, lda, packed.data(), accumulate,
                   c + row * ldc, ldc);
    });
  } else {
    split((n + kTileColumns - 1) / kTileColumns, [&](int64_t first, int64_t last) {
      const int64_t col = first * kTileColumns, cols = std::min(n, last * kTileColumns) - col;
      f32_multiply(route, trans_a, m, cols, k, a, lda, packed.data() + col * k, accumulate, c + col, ldc);
    });
  }
}

// A GEMM size's class: the smallest of 1, 2, 3, 4, 6, 8, 12, 16, ... (each at most 1.5x the one
// before) that holds it.  Shapes of one class share a route choice, so that a new sequence length
// (M or K = T*B) is timed only when it reaches a new class: timing one costs many calls
// (benchmarks/results/cpu_sequence.md, "sequences of many lengths").
int64_t size_class(int64_t size) {
  for (int64_t power = 1;; power *= 2) {
    if (size <= power) {
      return power;
    }
    if (power >= 2 && size <= power / 2 * 3) {
      return power / 2 * 3;
    }
  }
}

// The sizes of the class whose largest is `upper`, as the key shows them: "769-1024", or "1" for a
// class of one.
std::string class_range(int64_t upper) {
  const int64_t lower = upper <= 2 ? upper : (upper & (upper - 1)) == 0 ? upper / 4 * 3 + 1 : upper / 3 * 2 + 1;
  return lower == upper ? std::to_string(upper) : std::to_string(lower) + "-" + std::to_string(upper);
}

// A GEMM over all steps: the route, and whether it keeps to the calling thread.
struct AllStepsRoute {
  Route route;
  bool one_thread = false;
};

template <typename scalar_t>
void gemm_on(AllStepsRoute choice, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const scalar_t* a,
             int64_t lda, const scalar_t* b, int64_t ldb, bool accumulate, scalar_t* c, int64_t ldc) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (is_f32_kernel(choice.route)) {
      own_gemm(choice.route, choice.one_thread, trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
      return;
    }
  }
  if constexpr (!std::is_same_v<scalar_t, c10::BFloat16>) {
    if (choice.route == Route::kMkl && fits_int({m, n, k, lda, ldb, ldc})) {
      const SingleThreaded single_threaded(choice.one_thread);
      mkl_gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
      return;
    }
  }
  aten_gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
}

// float32: lltm-cpu's kernel or MKL, each on all of torch's threads or, for a
// small GEMM, on the calling thread alone, whichever is fastest at this shape
// (on AMD CPUs MKL runs a generic path at some shapes; the per-step cell's
// GEMM is too small to share between threads on some CPUs:
// benchmarks/results/cpu_sequence.md and cpu.md).  float64: MKL.  Where torch
// has no MKL, and for bfloat16, torch's mm (the shim's mm is MKL for float32
// and float64, so there is nothing more to time; oneDNN's matmul, outside the
// stable ABI, lost to MKL).  LLTM_CPU_GEMM=aten or avx2-fma sends these GEMMs
// there too (avx2-fma on all threads).
template <typename scalar_t>
AllStepsRoute all_steps_route(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const scalar_t* a,
                              int64_t lda, const scalar_t* b, int64_t ldb, bool accumulate, scalar_t* c, int64_t ldc) {
  const std::optional<Route> requested = requested_route();
  const bool mkl_here = !std::is_same_v<scalar_t, c10::BFloat16> && mkl().has_gemm() && fits_int({m, n, k, lda, ldb});
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (has_avx2_fma() && (!requested || is_f32_kernel(*requested))) {
      // The threads the GEMM can use: inside a parallel region, its own only.
      const int64_t threads = in_parallel_region() ? 1 : num_threads();
      // This thread's choices by shape, read before the key is formatted and the tuning mutex
      // taken: the per-step cell makes one such GEMM per call.
      thread_local std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool, int64_t, bool>, AllStepsRoute> chosen;
      const auto shape = std::make_tuple(m, n, k, trans_a, trans_b, threads, deterministic_algorithms());
      if (const auto found = chosen.find(shape); found != chosen.end()) {
        return found->second;
      }
      // The choice itself is made per shape class: everything the candidates depend on is a
      // function of the key, so that a choice's index means the same route for every shape of it.
      const int64_t m_class = size_class(m), n_class = size_class(n), k_class = size_class(k);
      // One thread is offered only below this many multiply-adds: a larger GEMM always gains from
      // more threads, and timing it on one would add tens of ms to its first call.  Those small
      // GEMMs take microseconds, so they are timed in kCloseCallRounds rounds.
      constexpr int64_t kOneThreadMacs = int64_t{1} << 24;
      const bool one_thread_too = !requested && threads > 1 && m_class * n_class * k_class <= kOneThreadMacs;
      std::vector<AllStepsRoute> candidates;
      std::vector<const char*> names;
      for (const Route own : {Route::kAvx512Fma, Route::kAvx2Fma}) {
        if ((own == Route::kAvx512Fma && !has_avx512_fma()) || (requested && requested != own)) {
          continue;
        }
        candidates.push_back({own});
        names.push_back(route_name(own));
        if (one_thread_too) {
          candidates.push_back({own, true});
          names.push_back(own == Route::kAvx512Fma ? "avx512-fma 1 thread" : "avx2-fma 1 thread");
        }
      }
      if (mkl_here && !requested) {
        candidates.push_back({Route::kMkl});
        names.push_back(route_name(Route::kMkl));
        if (one_thread_too) {
          candidates.push_back({Route::kMkl, true});
          names.push_back("mkl 1 thread");
        }
      }
      if (candidates.empty()) {  // LLTM_CPU_GEMM=avx512-fma on a CPU without it: lltm_cpu refuses to load
        return chosen[shape] = {mkl_here ? Route::kMkl : Route::kAten};
      }
      std::ostringstream key;
      key << "all steps float32 M" << class_range(m_class) << " N" << class_range(n_class) << " K" << class_range(k_class)
          << (trans_a ? " A^T" : "") << (trans_b ? " B^T" : "") << " threads " << threads << (mkl_here ? "" : " no MKL");
      tuning::Record what;
      what.kind = "all steps";
      what.dtype = "float32";
      what.m = m, what.n = n, what.k = k;
      what.size_class = {m_class, n_class, k_class};
      what.a_transposed = trans_a, what.b_transposed = trans_b;
      what.threads = threads, what.torch_threads = num_threads();
      const int index = tuning::tuned_index(key.str(), what, names, [&](int i) {
        // Timed into C itself where the call overwrites it anyway: a scratch C would raise the peak
        // memory of an inference forward by the gates of a whole chunk.
        std::vector<float> scratch(accumulate ? std::max<int64_t>(m * n, 1) : 0);
        float* out = accumulate ? scratch.data() : c;
        const int64_t ld_out = accumulate ? n : ldc;
        return tuning::time_us(
            [&] { gemm_on(candidates[i], trans_a, trans_b, m, n, k, a, lda, b, ldb, false, out, ld_out); });
      }, single_route_source(), one_thread_too ? tuning::kCloseCallRounds : 1);
      return chosen[shape] = candidates[index];
    }
  }
  return {requested != Route::kAten && mkl_here ? Route::kMkl : Route::kAten};
}

// ---- The recurrent GEMMs.

// The routes offered for the dtype's recurrent GEMMs on this CPU and torch.
template <typename scalar_t>
std::vector<Route> recurrent_candidates() {
  std::vector<Route> routes;
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    if (has_amx_bf16()) {
      routes.push_back(Route::kAmxBf16);
    }
    if (has_avx512_bf16()) {
      routes.push_back(Route::kAvx512Bf16);
    }
  }
  if constexpr (!std::is_same_v<scalar_t, double>) {
    if (has_avx512_fma()) {
      routes.push_back(Route::kAvx512Fma);
    }
    if (has_avx2_fma()) {
      routes.push_back(Route::kAvx2Fma);
    }
  }
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (mkl().has_packed()) {
      routes.push_back(Route::kMklPacked);
    }
  }
  if (std::is_same_v<scalar_t, c10::BFloat16> ? mkl().has_bf16() : mkl().has_gemm()) {
    routes.push_back(Route::kMkl);
  }
  routes.push_back(Route::kAten);
  return routes;
}

// The candidates' names, "a, b or c".
std::string route_list(const std::vector<Route>& routes) {
  std::string out;
  for (size_t i = 0; i < routes.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == routes.size() ? " or " : ", ");
    out += route_name(routes[i]);
  }
  return out;
}

}  // namespace

const char* route_name(Route route) {
  // In the order of Route's values.
  static constexpr const char* kNames[] = {"amx-bf16", "avx512-bf16", "avx512-fma", "avx2-fma",
                                           "mkl-packed", "mkl", "aten"};
  static_assert(std::size(kNames) == static_cast<size_t>(Route::kAten) + 1, "a name for every route");
  return kNames[static_cast<size_t>(route)];
}

std::optional<Route> requested_route() {
  static const std::optional<Route> route = []() -> std::optional<Route> {
    const char* env = std::getenv("LLTM_CPU_GEMM");
    const std::string wanted = env == nullptr ? "" : env;
    for (const Route candidate : {Route::kAmxBf16, Route::kAvx512Bf16, Route::kAvx512Fma, Route::kAvx2Fma,
                                  Route::kMklPacked, Route::kMkl, Route::kAten}) {
      if (wanted == route_name(candidate)) {
        // Said once, when lltm_cpu loads (lltm_cpu_settings_error), not at every call.
        const char* why_not = never_runs_here(candidate);
        LLTM_CHECK(why_not == nullptr, "lltm_cpu: LLTM_CPU_GEMM=", wanted, " cannot run in this process: ", why_not,
                   ". Unset LLTM_CPU_GEMM to choose by measurement, or set a route this CPU has");
        return candidate;
      }
    }
    LLTM_CHECK(wanted.empty(),
                    "lltm_cpu: LLTM_CPU_GEMM must be amx-bf16, avx512-bf16, avx512-fma, avx2-fma, mkl-packed, mkl or aten "
               "(or unset), got '", wanted,
                    "'");
    return std::nullopt;
  }();
  return route;
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
  const AllStepsRoute route = all_steps_route<scalar_t>(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
  gemm_on(route, trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
}

// A route that lays out a copy of W_h is chosen for the recurrent GEMMs only
// where it measures at most this share of the time of every route that
// reads W_h as it is: its timing leaves out the layout, which the time loop
// repeats every call, and where it measured about even it ran the loop
// slower (benchmarks/results/cpu_sequence.md, "the recurrent route's margin
// for a layout").
constexpr double kLaidOutWithin = 0.90;

template <typename scalar_t>
Route recurrent_route(bool trans_b, int64_t max_m, int64_t n, int64_t k, const scalar_t* b, int64_t ldb,
                      bool threaded) {
  using acc_t = opmath_type<scalar_t>;
  const std::vector<Route> available = recurrent_candidates<scalar_t>();
  std::vector<Route> candidates = available;
  if (const std::optional<Route> requested = requested_route()) {
    // What was asked for, or an error: a quiet substitute would be measured as the route asked for.
    LLTM_CHECK(std::find(available.begin(), available.end(), *requested) != available.end(),
                    "lltm_cpu: LLTM_CPU_GEMM=", route_name(*requested), " has no route for ", dtype_name<scalar_t>(),
                    " tensors on this CPU (", dtype_name<scalar_t>(), " takes ", route_list(available),
                    *requested == Route::kAmxBf16 ? "; amx-bf16 is lltm-cpu's bfloat16 kernel for CPUs with AMX-BF16 "
                                                    "(and a Linux that grants the process its tiles)"
                    : *requested == Route::kAvx512Bf16 ? "; avx512-bf16 is lltm-cpu's bfloat16 kernel, for CPUs with "
                                                         "AVX512_BF16"
                    : *requested == Route::kAvx2Fma ? "; avx2-fma is lltm-cpu's float32 kernel, for float32 and "
                                                      "bfloat16 on CPUs with AVX2 and FMA"
                    : *requested == Route::kAvx512Fma ? "; avx512-fma is lltm-cpu's float32 kernel, for float32 and "
                                                        "bfloat16 on CPUs with AVX-512"
                                                     : "",
                    is_own_kernel(*requested) ? ", in a build that has it, which lltm_cpu.kernels_left_out() "
                                                "tells"
                                              : "",
                    "): unset LLTM_CPU_GEMM to choose by measurement, or set one of those");
    candidates = {*requested};
  }
  if (max_m == 0 || n == 0 || k == 0) {
    return candidates.front();
  }
  const int64_t threads = threaded ? num_threads() : 1;
  std::ostringstream key;
  key << "recurrent " << dtype_name<scalar_t>() << " M" << max_m << " N" << n << " K" << k << (trans_b ? " B^T" : "")
      << " threads " << threads << " of " << num_threads();
  tuning::Record what;
  what.kind = "recurrent";
  what.dtype = dtype_name<scalar_t>();
  what.m = max_m, what.n = n, what.k = k;
  what.b_transposed = trans_b;
  what.threads = threads, what.torch_threads = num_threads();
  const auto time_route = [&](Route route) {
    const auto measure = [&] {
      const SingleThreaded single_threaded(!threaded);
      const RightOperand<scalar_t> operand(route, trans_b, max_m, n, k, b, ldb);
      const std::vector<scalar_t> a = filled<scalar_t>(max_m * k);
      std::vector<acc_t> c = filled<acc_t>(max_m * n);
      return tuning::time_us([&] { operand.multiply(max_m, a.data(), k, true, c.data(), n); });
    };
    return threaded ? measure() : on_one_thread(measure);
  };
  std::vector<const char*> names;
  std::vector<double> within;
  for (const Route route : candidates) {
    names.push_back(route_name(route));
    within.push_back(RightOperand<scalar_t>::lays_out(route) ? kLaidOutWithin : 1.0);
  }
  // One of these GEMMs takes microseconds: several rounds (tuning.h).  The
  // all-steps GEMMs run long enough for one.
  const int index = tuning::tuned_index(key.str(), what, names, [&](int i) { return time_route(candidates[i]); },
                                        single_route_source(), tuning::kCloseCallRounds, within);
  return candidates[index];
}

#define LLTM_INSTANTIATE(scalar_t)                                                                                   \
  template void gemm<scalar_t>(bool, bool, int64_t, int64_t, int64_t, const scalar_t*, int64_t, const scalar_t*,     \
                               int64_t, bool, scalar_t*, int64_t);                                                   \
  template Route recurrent_route<scalar_t>(bool, int64_t, int64_t, int64_t, const scalar_t*, int64_t, bool);
LLTM_INSTANTIATE(float)
LLTM_INSTANTIATE(double)
LLTM_INSTANTIATE(c10::BFloat16)
#undef LLTM_INSTANTIATE

}  // namespace blas
}  // namespace lltm_cpu
