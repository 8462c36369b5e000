// The sequence kernels' GEMMs: MKL called directly where torch links it,
// lltm-cpu's own kernels, or torch's mm through the stable C shim, each
// shape's route chosen by timing it once.  See blas.h for why.
#include "blas.h"

#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include "check.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gemm_bf16.h"
#include "gemm_f32.h"
#include "kernel_common.h"
#include "tuning.h"

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

const Mkl& mkl() {
  static const Mkl functions = [] {
    Mkl found;
    // Only a torch built with MKL (its own thread-setting entry point is
    // there): another BLAS may export sgemm_ with other integer sizes.
    if (find_symbol("MKL_Set_Num_Threads_Local") == nullptr) {
      return found;
    }
    found.sgemm = reinterpret_cast<FortranGemm>(find_symbol("sgemm_"));
    found.dgemm = reinterpret_cast<FortranGemm>(find_symbol("dgemm_"));
    found.sgemm_pack_get_size = reinterpret_cast<PackGetSize>(find_symbol("cblas_sgemm_pack_get_size"));
    found.sgemm_pack = reinterpret_cast<Pack>(find_symbol("cblas_sgemm_pack"));
    found.sgemm_compute = reinterpret_cast<Compute>(find_symbol("cblas_sgemm_compute"));
    found.gemm_bf16 = reinterpret_cast<GemmBf16>(find_symbol("cblas_gemm_bf16bf16f32"));
    found.set_num_threads_local = reinterpret_cast<SetNumThreadsLocal>(find_symbol("MKL_Set_Num_Threads_Local"));
    return found;
  }();
  return functions;
}

bool fits_int(std::initializer_list<int64_t> sizes) {
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

// The route for `key`: the cached choice, or the fastest of `candidates`,
// each timed by `time_route(route)` -> us, `rounds` times in turn (tuning.h).
template <typename TimeRoute>
Route tuned(const std::string& key, const std::string& fields, const std::vector<Route>& candidates,
            const TimeRoute& time_route, int rounds = 1) {
  std::vector<const char*> names;
  for (const Route route : candidates) {
    names.push_back(route_name(route));
  }
  const int index = tuning::tuned_index(key, fields, names, [&](int i) { return time_route(candidates[i]); },
                                        single_route_source(), rounds);
  return candidates[index];
}

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

// lltm-cpu's own AVX2 FMA kernel: where it was compiled (x86-64), the CPU has
// AVX2 and FMA, and the pointwise passes do not run their portable build
// (ATEN_CPU_CAPABILITY=default lowers both).
bool has_avx2_fma() {
#if defined(LLTM_CPU_AVX2_FMA)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          std::string(cpu_capability()) != "DEFAULT";
  return has;
#else
  return false;
#endif
}

// lltm-cpu's float32 kernel over all steps: op(B) packed once, its column
// blocks split among torch's threads, then C's row tiles split among them (or
// its column tiles, where C is wider than tall); all on the calling thread if
// `one_thread`.
void own_gemm(bool one_thread, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
              int64_t lda, const float* b, int64_t ldb, bool accumulate, float* c, int64_t ldc) {
  using gemm_f32::kBlock, gemm_f32::kTileColumns, gemm_f32::kTileRows;
  const auto split = [one_thread](int64_t parts, const auto& body) {
    if (one_thread) {
      body(int64_t{0}, parts);
    } else {
      parallel_for(0, parts, 1, body);
    }
  };
  std::vector<float> packed(gemm_f32::packed_elements(n, k));
  split((n + kBlock - 1) / kBlock, [&](int64_t first, int64_t last) {
    const int64_t col = first * kBlock, cols = std::min(n, last * kBlock) - col;
    gemm_f32::pack(trans_b, cols, k, trans_b ? b + col * ldb : b + col, ldb, packed.data() + col * k);
  });
  if (m >= n) {
    split((m + kTileRows - 1) / kTileRows, [&](int64_t first, int64_t last) {
      const int64_t row = first * kTileRows, rows = std::min(m, last * kTileRows) - row;
      gemm_f32::multiply(trans_a, rows, n, k, trans_a ? a + row : a + row * lda, lda, packed.data(), accumulate,
                         c + row * ldc, ldc);
    });
  } else {
    split((n + kTileColumns - 1) / kTileColumns, [&](int64_t first, int64_t last) {
      const int64_t col = first * kTileColumns, cols = std::min(n, last * kTileColumns) - col;
      gemm_f32::multiply(trans_a, m, cols, k, a, lda, packed.data() + col * k, accumulate, c + col, ldc);
    });
  }
}

// A GEMM size's class: the smallest of 1, 2, 3, 4, 6, 8, 12, 16, ... (each at most 1.5x the one
// before) that holds it.  Shapes of one class share a route choice, so that a new sequence length
// (M or K = T*B) is timed only when it reaches a new class: timing one takes 25x the call at T64 B16
// (benchmarks/results/cpu_sequence.md, 2026-12-05).
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
    if (choice.route == Route::kAvx2Fma) {
      own_gemm(choice.one_thread, trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
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
    if (has_avx2_fma() && (!requested || requested == Route::kAvx2Fma)) {
      // The threads the GEMM can use: inside a parallel region, its own only.
      const int64_t threads = in_parallel_region() ? 1 : num_threads();
      // This thread's choices by shape, read before the key is formatted and the tuning mutex
      // taken: the per-step cell makes one such GEMM per call.
      thread_local std::map<std::tuple<int64_t, int64_t, int64_t, bool, bool, int64_t>, AllStepsRoute> chosen;
      const auto shape = std::make_tuple(m, n, k, trans_a, trans_b, threads);
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
      std::vector<AllStepsRoute> candidates = {{Route::kAvx2Fma}};
      std::vector<const char*> names = {route_name(Route::kAvx2Fma)};
      if (one_thread_too) {
        candidates.push_back({Route::kAvx2Fma, true});
        names.push_back("avx2-fma 1 thread");
      }
      if (mkl_here && !requested) {
        candidates.push_back({Route::kMkl});
        names.push_back(route_name(Route::kMkl));
        if (one_thread_too) {
          candidates.push_back({Route::kMkl, true});
          names.push_back("mkl 1 thread");
        }
      }
      std::ostringstream key, fields;
      key << "all steps float32 M" << class_range(m_class) << " N" << class_range(n_class) << " K" << class_range(k_class)
          << (trans_a ? " A^T" : "") << (trans_b ? " B^T" : "") << " threads " << threads << (mkl_here ? "" : " no MKL");
      fields << "\"kind\": \"all steps\", \"dtype\": \"float32\", \"m\": " << m << ", \"n\": " << n
             << ", \"k\": " << k << ", \"size_class\": [" << m_class << ", " << n_class << ", " << k_class
             << "], \"a_transposed\": " << (trans_a ? "true" : "false")
             << ", \"b_transposed\": " << (trans_b ? "true" : "false") << ", \"threads\": " << threads
             << ", \"torch_threads\": " << num_threads();
      const int index = tuning::tuned_index(key.str(), fields.str(), names, [&](int i) {
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

// lltm-cpu's own bfloat16 kernel: where it was compiled (x86-64), the CPU has
// AVX512_BF16, and the pointwise passes run their AVX-512 build
// (ATEN_CPU_CAPABILITY=avx2 lowers both, to measure an AVX2 machine on this one).
bool has_avx512_bf16() {
#if defined(LLTM_CPU_AVX512_BF16)
  static const bool has = __builtin_cpu_supports("avx512bf16") && std::string(cpu_capability()) == "AVX512";
  return has;
#else
  return false;
#endif
}

// lltm-cpu's AMX kernel: where it was compiled (x86-64 with a compiler that
// has AMX), the CPU has AVX512_BF16 and AMX-BF16 as above, and Linux grants
// this process the tiles.
bool has_amx_bf16() {
#if defined(LLTM_CPU_AMX_BF16)
  static const bool has = has_avx512_bf16() && gemm_bf16::amx::usable();
  return has;
#else
  return false;
#endif
}

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

// Aligned memory for packed operands, freed with std::free.
void* allocate(size_t bytes) {
  void* memory = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  LLTM_CHECK(memory != nullptr, "lltm_cpu: out of memory (", bytes, " bytes for a GEMM operand)");
  return memory;
}

}  // namespace

const char* route_name(Route route) {
  switch (route) {
    case Route::kAmxBf16:
      return "amx-bf16";
    case Route::kAvx512Bf16:
      return "avx512-bf16";
    case Route::kAvx2Fma:
      return "avx2-fma";
    case Route::kMklPacked:
      return "mkl-packed";
    case Route::kMkl:
      return "mkl";
    case Route::kAten:
      return "aten";
  }
  return "?";
}

namespace {

// One of lltm-cpu's own GEMM kernels, which a build may lack (lltm_cpu/_build_config.py).
bool is_own_kernel(Route route) {
  return route == Route::kAmxBf16 || route == Route::kAvx512Bf16 || route == Route::kAvx2Fma;
}

}  // namespace

std::optional<Route> requested_route() {
  static const std::optional<Route> route = []() -> std::optional<Route> {
    const char* env = std::getenv("LLTM_CPU_GEMM");
    const std::string wanted = env == nullptr ? "" : env;
    for (const Route candidate : {Route::kAmxBf16, Route::kAvx512Bf16, Route::kAvx2Fma, Route::kMklPacked, Route::kMkl, Route::kAten}) {
      if (wanted == route_name(candidate)) {
        return candidate;
      }
    }
    LLTM_CHECK(wanted.empty(),
                    "lltm_cpu: LLTM_CPU_GEMM must be amx-bf16, avx512-bf16, avx2-fma, mkl-packed, mkl or aten (or unset), got '", wanted,
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
  std::ostringstream key, fields;
  key << "recurrent " << dtype_name<scalar_t>() << " M" << max_m << " N" << n << " K" << k << (trans_b ? " B^T" : "")
      << " threads " << threads << " of " << num_threads();
  fields << "\"kind\": \"recurrent\", \"dtype\": \"" << dtype_name<scalar_t>() << "\", \"m\": " << max_m
         << ", \"n\": " << n << ", \"k\": " << k << ", \"b_transposed\": " << (trans_b ? "true" : "false")
         << ", \"threads\": " << threads << ", \"torch_threads\": " << num_threads();
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
  // One of these GEMMs takes microseconds: several rounds (tuning.h).  The
  // all-steps GEMMs run long enough for one.
  return tuned(key.str(), fields.str(), candidates, time_route, tuning::kCloseCallRounds);
}

template <typename scalar_t>
RightOperand<scalar_t>::RightOperand(Route route, bool trans_b, int64_t max_m, int64_t n, int64_t k,
                                     const scalar_t* b, int64_t ldb)
    : route_(route), trans_b_(trans_b), max_m_(max_m), n_(n), k_(k), b_(b), ldb_(ldb) {
  if (max_m == 0 || n == 0 || k == 0) {
    return;
  }
  if constexpr (!std::is_same_v<scalar_t, double>) {
    if (route_ == Route::kAvx2Fma) {
      using bits_t = std::conditional_t<std::is_same_v<scalar_t, float>, float, uint16_t>;
      buffer_ = allocate(gemm_f32::packed_elements(n, k) * sizeof(float));
      gemm_f32::pack(trans_b, n, k, reinterpret_cast<const bits_t*>(b), ldb, static_cast<float*>(buffer_));
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
    if (route_ == Route::kAvx2Fma) {
      using bits_t = std::conditional_t<std::is_same_v<scalar_t, float>, float, uint16_t>;
      gemm_f32::multiply(false, m, n_, k_, reinterpret_cast<const bits_t*>(a), lda, static_cast<const float*>(buffer_),
                         accumulate, c, ldc);
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

#define LLTM_INSTANTIATE(scalar_t)                                                                                   \
  template void gemm<scalar_t>(bool, bool, int64_t, int64_t, int64_t, const scalar_t*, int64_t, const scalar_t*,     \
                               int64_t, bool, scalar_t*, int64_t);                                                   \
  template Route recurrent_route<scalar_t>(bool, int64_t, int64_t, int64_t, const scalar_t*, int64_t, bool);         \
  template class RightOperand<scalar_t>;
LLTM_INSTANTIATE(float)
LLTM_INSTANTIATE(double)
LLTM_INSTANTIATE(c10::BFloat16)
#undef LLTM_INSTANTIATE

}  // namespace blas
}  // namespace lltm_cpu
