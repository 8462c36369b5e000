// The sequence kernels' GEMMs: MKL or oneDNN called directly where torch
// exports them, ATen otherwise, each shape's route chosen by timing it once.
// See blas.h for why.
#include "blas.h"

#include "gemm_bf16.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/Version.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/CPUBlas.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace at::native {
// oneDNN's matmul, result = beta * result + alpha * mat1 @ mat2, on strided
// CPU tensors (aten/src/ATen/native/mkldnn/Matmul.h, which torch exports but
// does not install).  The package pins the torch it was built against.
TORCH_API void mkldnn_matmul(const Tensor& mat1, const Tensor& mat2, const Tensor& result, float beta, float alpha);
}  // namespace at::native

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
    found.gemm_bf16 = reinterpret_cast<GemmBf16>(find_symbol("cblas_gemm_bf16bf16f32"));
    found.set_num_threads_local = reinterpret_cast<SetNumThreadsLocal>(find_symbol("MKL_Set_Num_Threads_Local"));
    return found;
  }();
  return functions;
}

// oneDNN's matmul: where torch has it and the user has not turned it off
// (torch.backends.mkldnn.enabled, read at each call).
bool onednn_enabled() { return at::hasMKLDNN() && at::globalContext().userEnabledMkldnn(); }

// LLTM_CPU_GEMM, read once: the route asked for, or nullopt to measure.
std::optional<Route> requested_route() {
  static const std::optional<Route> route = []() -> std::optional<Route> {
    const char* env = std::getenv("LLTM_CPU_GEMM");
    const std::string wanted = env == nullptr ? "" : env;
    for (const Route candidate : {Route::kBrgemm, Route::kAvx512Bf16, Route::kMklPacked, Route::kMkl, Route::kAten}) {
      if (wanted == route_name(candidate)) {
        return candidate;
      }
    }
    TORCH_CHECK(wanted.empty(),
                "lltm_cpu: LLTM_CPU_GEMM must be brgemm, avx512-bf16, mkl-packed, mkl or aten (or unset), got '", wanted,
                "'");
    return std::nullopt;
  }();
  return route;
}

bool fits_int(std::initializer_list<int64_t> sizes) {
  return std::all_of(sizes.begin(), sizes.end(), [](int64_t v) { return v <= INT_MAX; });
}

template <typename scalar_t>
at::Tensor wrap(const scalar_t* data, int64_t rows, int64_t cols, int64_t ld) {
  return at::from_blob(const_cast<scalar_t*>(data), {rows, cols}, {ld, 1},
                       at::TensorOptions().dtype(c10::CppTypeToScalarType<scalar_t>::value));
}

// op(A) and op(B) as tensors over the same memory.
template <typename scalar_t>
std::pair<at::Tensor, at::Tensor> wrap_operands(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                                const scalar_t* a, int64_t lda, const scalar_t* b, int64_t ldb) {
  return {trans_a ? wrap(a, k, m, lda).t() : wrap(a, m, k, lda), trans_b ? wrap(b, n, k, ldb).t() : wrap(b, k, n, ldb)};
}

template <typename scalar_t>
void aten_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const scalar_t* a, int64_t lda,
               const scalar_t* b, int64_t ldb, bool accumulate, scalar_t* c, int64_t ldc) {
  const auto [A, B] = wrap_operands(trans_a, trans_b, m, n, k, a, lda, b, ldb);
  at::Tensor C = wrap(c, m, n, ldc);
  if (accumulate) {
    C.addmm_(A, B);
  } else {
    at::mm_out(C, A, B);
  }
}

template <typename scalar_t>
void onednn_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const scalar_t* a, int64_t lda,
                 const scalar_t* b, int64_t ldb, bool accumulate, scalar_t* c, int64_t ldc) {
  const auto [A, B] = wrap_operands(trans_a, trans_b, m, n, k, a, lda, b, ldb);
  at::native::mkldnn_matmul(A, B, wrap(c, m, n, ldc), accumulate ? 1.0f : 0.0f, 1.0f);
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

const char* dtype_name(c10::ScalarType dtype) {
  return dtype == c10::kFloat ? "float32" : dtype == c10::kDouble ? "float64" : "bfloat16";
}

// ---- Tuning: which route is fastest for a key, measured once per process.

struct Tuning {
  std::mutex mutex;  // held while a key is measured, and to read or add a choice
  std::map<std::string, int> chosen;  // the index of the option chosen
  std::vector<std::string> report;
};

Tuning& tuning() {
  static Tuning* const state = new Tuning;  // never destroyed: other threads may tune at exit
  return *state;
}

// Microseconds per call of `run`: after a warm-up call, the fastest of up to
// 10 calls, timed one by one until 1 ms has passed (at least 2).  The fastest,
// not the mean: on a shared machine a call that lost its core to another
// process measures the other process.
template <typename Run>
double time_us(const Run& run) {
  using clock = std::chrono::steady_clock;
  run();  // first-use costs: packing caches, oneDNN primitive creation
  double best = 0, total = 0;
  for (int call = 0; call < 10 && (call < 2 || total < 1000.0); ++call) {
    const auto start = clock::now();
    run();
    const double us = std::chrono::duration<double, std::micro>(clock::now() - start).count();
    best = call == 0 ? us : std::min(best, us);
    total += us;
  }
  return best;
}

// `measure()` run as the time loop runs its GEMMs: on one thread of a
// parallel region, where ATen's and oneDNN's GEMMs run on that thread alone
// (and MKL's, under SingleThreaded).  The region's other threads return at
// once.  Timing on one thread also keeps the measurement clear of other
// processes on a shared machine, which delay every multi-threaded call.
// MKL's one-thread setting is made inside the region only: an
// at::parallel_for started while it holds on the calling thread leaves that
// thread's torch at one thread for good, where torch.set_num_threads was
// never called (measured with torch 2.13's OpenMP build: every call after
// the first sequence call of a process then ran on one thread).
template <typename Measure>
double on_one_thread(const Measure& measure) {
  if (at::in_parallel_region() || at::get_num_threads() == 1) {
    const SingleThreaded single_threaded(true);
    return measure();
  }
  double us = 0;
  const at::ThreadLocalState caller_state;
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t first, int64_t) {
    if (first == 0) {
      const at::ThreadLocalStateGuard guard(caller_state);
      const SingleThreaded single_threaded_here(true);
      us = measure();
    }
  });
  return us;
}

// The option for `key`: the cached choice, or the fastest of `names`, each
// timed by `time_option(index)` -> us, with the tuning mutex held: `rounds`
// times in turn, each option's fastest kept (so that a burst of noise on a
// shared machine, which lasts longer than one timing, is less likely to
// land on one option alone).  A single option is reported with `single_note`.
template <typename TimeOption>
int tuned_index(const std::string& key, const std::vector<const char*>& names, const TimeOption& time_option,
                const char* single_note, int rounds = 1) {
  TORCH_INTERNAL_ASSERT(!names.empty());
  Tuning& state = tuning();
  const std::lock_guard<std::mutex> lock(state.mutex);
  if (const auto found = state.chosen.find(key); found != state.chosen.end()) {
    return found->second;
  }
  int best = 0;
  std::ostringstream line;
  line.precision(3);
  if (names.size() > 1) {
    std::vector<double> fastest(names.size(), 0);
    for (int round = 0; round < rounds; ++round) {
      for (int index = 0; index < static_cast<int>(names.size()); ++index) {
        const double us = time_option(index);
        fastest[index] = round == 0 ? us : std::min(fastest[index], us);
      }
    }
    std::ostringstream times;
    times.precision(3);
    for (int index = 0; index < static_cast<int>(names.size()); ++index) {
      times << (index == 0 ? "" : ", ") << names[index] << ' ' << fastest[index] << " us";
      if (fastest[index] < fastest[best]) {
        best = index;
      }
    }
    line << key << ": " << names[best] << " (measured: " << times.str() << ')';
  } else {
    line << key << ": " << names[0] << ' ' << single_note;
  }
  state.chosen.emplace(key, best);
  state.report.push_back(line.str());
  return best;
}

// The route for `key`: the cached choice, or the fastest of `candidates`,
// each timed by `time_route(route)` -> us, with the tuning mutex held.
template <typename TimeRoute>
Route tuned(const std::string& key, const std::vector<Route>& candidates, const TimeRoute& time_route) {
  std::vector<const char*> names;
  for (const Route route : candidates) {
    names.push_back(route_name(route));
  }
  const int index = tuned_index(key, names, [&](int i) { return time_route(candidates[i]); },
                                requested_route().has_value() ? "(LLTM_CPU_GEMM)" : "(the only one)");
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

template <typename scalar_t>
void gemm_on(Route route, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const scalar_t* a, int64_t lda,
             const scalar_t* b, int64_t ldb, bool accumulate, scalar_t* c, int64_t ldc) {
  if constexpr (!std::is_same_v<scalar_t, c10::BFloat16>) {
    if (route == Route::kMkl && fits_int({m, n, k, lda, ldb, ldc})) {
      mkl_gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
      return;
    }
  }
  if (route == Route::kOnednn && onednn_enabled()) {
    onednn_gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
    return;
  }
  aten_gemm(trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
}

template <typename scalar_t>
Route all_steps_route(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const scalar_t* a, int64_t lda,
                      const scalar_t* b, int64_t ldb) {
  constexpr c10::ScalarType dtype = c10::CppTypeToScalarType<scalar_t>::value;
  std::vector<Route> candidates;
  if (requested_route() != Route::kAten && !std::is_same_v<scalar_t, c10::BFloat16>) {
    if (mkl().has_gemm() && fits_int({m, n, k, lda, ldb})) {
      candidates.push_back(Route::kMkl);
    }
    if (std::is_same_v<scalar_t, float> && onednn_enabled()) {
      candidates.push_back(Route::kOnednn);
    }
  }
  if (candidates.empty()) {
    return Route::kAten;  // bfloat16's at::mm is oneDNN's already
  }
  std::ostringstream key;
  key << "all steps " << dtype_name(dtype) << ' ' << (trans_a ? 'T' : 'N') << (trans_b ? 'T' : 'N') << " M" << m
      << " N" << n << " K" << k << " threads " << at::get_num_threads() << " (timed on one)";
  return tuned(key.str(), candidates, [&](Route route) {
    // A corner of the problem of at most about 16M multiply-adds (0.1-0.3
    // ms): the first rows, columns and reduction terms, the same strides.
    // Smaller corners would overstate oneDNN's fixed cost per call (~15 us),
    // which the whole GEMM spreads over far more work.
    // Its output stays under 2^18 elements (1 MiB of float32), so that tuning
    // adds little to a call's peak memory (contract v3's inference bound).
    int64_t mm = m, nn = n, kk = k;
    while (std::max({mm, nn, kk}) > 256) {
      if (mm * nn > (int64_t{1} << 18) && std::max(mm, nn) > 256) {
        int64_t& wider = mm >= nn ? mm : nn;
        wider = std::max<int64_t>(256, wider / 2);
      } else if (mm * nn * kk > (int64_t{1} << 24)) {
        int64_t& largest = mm >= nn && mm >= kk ? mm : nn >= kk ? nn : kk;
        largest = std::max<int64_t>(256, largest / 2);
      } else {
        break;
      }
    }
    // Timed on one thread: what differs between the libraries is their
    // kernels (AVX2 or AVX-512, say); both spread over threads alike.
    std::vector<scalar_t> c(mm * nn);
    return on_one_thread([&] {
      return time_us([&] { gemm_on(route, trans_a, trans_b, mm, nn, kk, a, lda, b, ldb, false, c.data(), nn); });
    });
  });
}

// ---- The recurrent GEMMs.

// lltm-cpu's own bfloat16 kernel: where it was compiled (x86-64), the CPU has
// AVX512_BF16, and ATen runs its AVX-512 kernels (ATEN_CPU_CAPABILITY=avx2
// lowers both, to measure an AVX2 machine on this one).
bool has_avx512_bf16() {
#if defined(LLTM_CPU_AVX512_BF16)
  static const bool has = __builtin_cpu_supports("avx512bf16") && at::get_cpu_capability() == "AVX512";
  return has;
#else
  return false;
#endif
}

template <typename scalar_t>
std::vector<Route> recurrent_candidates() {
  std::vector<Route> routes;
  if constexpr (!std::is_same_v<scalar_t, double>) {
    routes.push_back(Route::kBrgemm);  // torch's, with its own fallback inside
  }
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    if (has_avx512_bf16()) {
      routes.push_back(Route::kAvx512Bf16);
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

// bfloat16 brgemm runs torch's bfloat16 micro-kernel where torch can pack B
// for it (AMX, or oneDNN's AVX-512 bfloat16 kernels); elsewhere torch's
// bfloat16 brgemm is a plain loop, so A is widened and the float one runs.
bool native_bf16_brgemm() {
  static const bool packs = at::native::cpublas::could_pack(c10::kBFloat16);
  return packs;
}

}  // namespace

const char* route_name(Route route) {
  switch (route) {
    case Route::kBrgemm:
      return "brgemm";
    case Route::kAvx512Bf16:
      return "avx512-bf16";
    case Route::kMklPacked:
      return "mkl-packed";
    case Route::kMkl:
      return "mkl";
    case Route::kOnednn:
      return "onednn";
    case Route::kAten:
      return "aten";
  }
  return "?";
}

const char* split_name(Split split) { return split == Split::kRows ? "rows" : "columns"; }

std::optional<Split> requested_split() {
  static const std::optional<Split> split = []() -> std::optional<Split> {
    const char* env = std::getenv("LLTM_CPU_SPLIT");
    const std::string wanted = env == nullptr ? "" : env;
    for (const Split candidate : {Split::kRows, Split::kColumns}) {
      if (wanted == split_name(candidate)) {
        return candidate;
      }
    }
    TORCH_CHECK(wanted.empty(), "lltm_cpu: LLTM_CPU_SPLIT must be rows or columns (or unset), got '", wanted, "'");
    return std::nullopt;
  }();
  return split;
}

Split tuned_split(const std::string& key, const std::function<double(Split)>& time_split) {
  if (const std::optional<Split> forced = requested_split()) {
    tuned_index(key, {split_name(*forced)}, [](int) { return 0.0; }, "(LLTM_CPU_SPLIT)");
    return *forced;
  }
  const Split options[] = {Split::kRows, Split::kColumns};
  // Three rounds in turn: the two splits often measure within a few per
  // cent, closer than this machine's noise from one timing to the next.
  return options[tuned_index(key, {split_name(Split::kRows), split_name(Split::kColumns)},
                             [&](int index) { return time_split(options[index]); }, "", /*rounds=*/3)];
}

std::vector<std::string> gemm_routes() {
  Tuning& state = tuning();
  const std::lock_guard<std::mutex> lock(state.mutex);
  return state.report;
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
  const Route route = all_steps_route(trans_a, trans_b, m, n, k, a, lda, b, ldb);
  gemm_on(route, trans_a, trans_b, m, n, k, a, lda, b, ldb, accumulate, c, ldc);
}

template <typename scalar_t>
Route recurrent_route(bool trans_b, int64_t max_m, int64_t n, int64_t k, const scalar_t* b, int64_t ldb,
                      bool threaded) {
  using acc_t = at::opmath_type<scalar_t>;
  const std::vector<Route> available = recurrent_candidates<scalar_t>();
  std::vector<Route> candidates = available;
  if (const std::optional<Route> requested = requested_route()) {
    const bool has = std::find(available.begin(), available.end(), *requested) != available.end();
    // A dtype without the route asked for (float64: brgemm, mkl-packed) takes MKL's GEMM.
    const Route fallback = mkl().has_gemm() && *requested != Route::kAten ? Route::kMkl : Route::kAten;
    candidates = {has ? *requested : fallback};
  }
  if (max_m == 0 || n == 0 || k == 0) {
    return candidates.front();
  }
  std::ostringstream key;
  key << "recurrent " << dtype_name(c10::CppTypeToScalarType<scalar_t>::value) << " M" << max_m << " N" << n << " K"
      << k << (trans_b ? " B^T" : "") << " threads " << (threaded ? at::get_num_threads() : 1) << " of "
      << at::get_num_threads();
  return tuned(key.str(), candidates, [&](Route route) {
    const auto measure = [&] {
      const SingleThreaded single_threaded(!threaded);
      const RightOperand<scalar_t> operand(route, trans_b, max_m, n, k, b, ldb);
      const std::vector<scalar_t> a = filled<scalar_t>(max_m * k);
      std::vector<acc_t> c = filled<acc_t>(max_m * n);
      return time_us([&] { operand.multiply(max_m, a.data(), k, true, c.data(), n); });
    };
    return threaded ? measure() : on_one_thread(measure);
  });
}

// The float brgemm routes lay op(B) out in panels of this many columns,
// each a contiguous k x 64 block (the last panel narrower), and call brgemm
// once per panel: its C tile's columns then take their B values from one
// small panel, which stays in L2 while every row of A passes over it,
// rather than from a k x n matrix too large for L2 (3 MB at S512).  The
// time loop's steps at T32 B64 I256 S512, both threads at once (AMD EPYC
// Zen 5, 1 MB L2 a core), per step: h W_h^T for 32 rows a thread 377 us
// unpanelled, 207 us in panels of 64; d_gates W_h 387 us and 205 us; at
// T64 B16 I32 S128 (W_h 196 KB, in L2 either way) 4.2 us and 3.5 us.
// Panels of 32 measured the same as 64; 128 and wider lost part of it.
constexpr int64_t kPanelColumns = 64;

template <typename scalar_t>
RightOperand<scalar_t>::RightOperand(Route route, bool trans_b, int64_t max_m, int64_t n, int64_t k,
                                     const scalar_t* b, int64_t ldb)
    : route_(route), trans_b_(trans_b), max_m_(max_m), n_(n), k_(k), b_(b), ldb_(ldb) {
  if (max_m == 0 || n == 0 || k == 0) {
    return;
  }
  // op(B) as k x n rows of `T`, for brgemm.
  const auto transposed_copy = [&](auto* out) {
    constexpr int64_t kTile = 16;  // tiles keep both sides' cache lines in use
    for (int64_t row0 = 0; row0 < k; row0 += kTile) {
      for (int64_t col0 = 0; col0 < n; col0 += kTile) {
        for (int64_t row = row0; row < std::min(row0 + kTile, k); ++row) {
          for (int64_t col = col0; col < std::min(col0 + kTile, n); ++col) {
            using T = std::remove_pointer_t<decltype(out)>;
            out[row * n + col] = static_cast<T>(trans_b ? b[col * ldb + row] : b[row * ldb + col]);
          }
        }
      }
    }
  };
  // The same in panels (kPanelColumns): op(B)'s columns [first, first +
  // width) as a k x width block at element first * k.  Panel by panel, so
  // that the copy reads whole cache lines of B and writes a small block at a
  // time: at S512 laying out the forward's W_h^T took ~0.9 ms a thread a
  // call element by element in 16 x 16 tiles, against a step's ~0.2 ms.
  const auto panelled_copy = [&](float* out) {
    constexpr int64_t kStrip = 16;  // rows of op(B) (elements of a row of B, where trans_b) at a time
    for (int64_t first = 0; first < n; first += kPanelColumns) {
      const int64_t width = std::min(kPanelColumns, n - first);
      float* panel = out + first * k;
      if (trans_b) {  // op(B)[row][col] = b[col * ldb + row]
        for (int64_t row0 = 0; row0 < k; row0 += kStrip) {
          const int64_t rows = std::min(kStrip, k - row0);
          for (int64_t col = 0; col < width; ++col) {
            const scalar_t* source = b + (first + col) * ldb + row0;
            for (int64_t row = 0; row < rows; ++row) {
              panel[(row0 + row) * width + col] = static_cast<float>(source[row]);
            }
          }
        }
      } else {
        for (int64_t row = 0; row < k; ++row) {
          const scalar_t* source = b + row * ldb + first;
          for (int64_t col = 0; col < width; ++col) {
            panel[row * width + col] = static_cast<float>(source[col]);
          }
        }
      }
    }
  };
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (route_ == Route::kBrgemm) {
      auto* laid_out = static_cast<float*>(c10::alloc_cpu(n * k * sizeof(float)));
      panelled_copy(laid_out);
      buffer_ = laid_out;
    } else if (route_ == Route::kMklPacked && fits_int({max_m, n, k, ldb})) {
      const Mkl& f = mkl();
      const size_t bytes = f.sgemm_pack_get_size(kBMatrix, static_cast<int>(max_m), static_cast<int>(n),
                                                 static_cast<int>(k));
      buffer_ = c10::alloc_cpu(bytes);
      f.sgemm_pack(kRowMajor, kBMatrix, trans_b ? kTrans : kNoTrans, static_cast<int>(max_m), static_cast<int>(n),
                   static_cast<int>(k), 1.0f, b, static_cast<int>(ldb), static_cast<float*>(buffer_));
    }
  } else if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    if (route_ == Route::kAvx512Bf16) {
      buffer_ = c10::alloc_cpu(gemm_bf16::packed_elements(n, k) * sizeof(uint16_t));
      gemm_bf16::pack(trans_b, n, k, reinterpret_cast<const uint16_t*>(b), ldb, static_cast<uint16_t*>(buffer_));
    } else if (route_ == Route::kBrgemm && native_bf16_brgemm()) {
      // torch's packed (VNNI) layout of the k x n rows.
      std::vector<c10::BFloat16> rows(n * k);
      transposed_copy(rows.data());
      buffer_ = c10::alloc_cpu(n * k * sizeof(c10::BFloat16));
      at::native::cpublas::pack(k, n, n, n, c10::kBFloat16, c10::kBFloat16, rows.data(), buffer_);
    } else if (route_ == Route::kBrgemm) {
      auto* widened = static_cast<float*>(c10::alloc_cpu(n * k * sizeof(float)));
      panelled_copy(widened);
      buffer_ = widened;
      scratch_ = c10::alloc_cpu(max_m * k * sizeof(float));  // A widened
    } else if (route_ == Route::kAten) {
      scratch_ = c10::alloc_cpu(max_m * n * sizeof(c10::BFloat16));  // the product, before widening
    }
  }
}

template <typename scalar_t>
RightOperand<scalar_t>::~RightOperand() {
  for (void* memory : {buffer_, scratch_}) {
    if (memory != nullptr) {
      c10::free_cpu(memory);
    }
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
  // A micro-kernel: a few dozen rows at a time keep its C tile in registers and cache.
  constexpr int64_t kRowsPerCall = 64;
  // brgemm on the float panels: each panel over all rows, then the next.
  const auto panelled_brgemm = [&](const float* a_float, int64_t lda_float, auto* c_float) {
    const auto* panels = static_cast<const float*>(buffer_);
    for (int64_t first = 0; first < n_; first += kPanelColumns) {
      const int64_t width = std::min(kPanelColumns, n_ - first);
      for (int64_t row = 0; row < m; row += kRowsPerCall) {
        at::native::cpublas::brgemm(std::min(kRowsPerCall, m - row), width, k_, lda_float, width, ldc, accumulate,
                                    a_float + row * lda_float, panels + first * k_, c_float + row * ldc + first);
      }
    }
  };
  if constexpr (std::is_same_v<scalar_t, float>) {
    if (route_ == Route::kBrgemm) {
      panelled_brgemm(a, lda, c);
      return;
    }
    if (route_ == Route::kMklPacked && buffer_ != nullptr && fits_int({lda, ldc})) {
      mkl().sgemm_compute(kRowMajor, kNoTrans, kPacked, static_cast<int>(m), static_cast<int>(n_),
                          static_cast<int>(k_), a, static_cast<int>(lda), static_cast<const float*>(buffer_),
                          static_cast<int>(n_), accumulate ? 1.0f : 0.0f, c, static_cast<int>(ldc));
      return;
    }
  }
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16>) {
    if (route_ == Route::kAvx512Bf16) {
      gemm_bf16::multiply(m, n_, k_, reinterpret_cast<const uint16_t*>(a), lda, static_cast<const uint16_t*>(buffer_),
                          accumulate, c, ldc);
      return;
    }
    if (route_ == Route::kBrgemm && scratch_ == nullptr) {
      for (int64_t row = 0; row < m; row += kRowsPerCall) {
        at::native::cpublas::brgemm(std::min(kRowsPerCall, m - row), n_, k_, lda, n_, ldc, accumulate, a + row * lda,
                                    static_cast<const c10::BFloat16*>(buffer_), c + row * ldc, /*is_vnni=*/true);
      }
      at::native::cpublas::brgemm_release(/*is_vnni=*/true);  // AMX: give back the tile configuration
      return;
    }
    if (route_ == Route::kBrgemm) {
      auto* widened = static_cast<float*>(scratch_);
      for (int64_t row = 0; row < m; ++row) {
        for (int64_t col = 0; col < k_; ++col) {
          widened[row * k_ + col] = static_cast<float>(a[row * lda + col]);
        }
      }
      panelled_brgemm(widened, k_, c);
      return;
    }
    if (route_ == Route::kMkl && fits_int({m, n_, k_, lda, ldb_, ldc})) {
      mkl().gemm_bf16(kRowMajor, kNoTrans, trans_b_ ? kTrans : kNoTrans, static_cast<int>(m), static_cast<int>(n_),
                      static_cast<int>(k_), 1.0f, a, static_cast<int>(lda), b_, static_cast<int>(ldb_),
                      accumulate ? 1.0f : 0.0f, c, static_cast<int>(ldc));
      return;
    }
    // ATen's bfloat16 GEMM (oneDNN), rounded to bfloat16, then widened into C.
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
