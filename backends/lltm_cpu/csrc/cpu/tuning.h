// Measure-once tuning, shared by the GEMM routes (gemm_routes.cpp) and the time
// loop's splits (partition.h): for each key, the options are timed at its
// first use and the fastest is kept for the rest of the process.
//
// Tuning holds one process-wide mutex, so concurrent first calls neither
// time each other's work nor tune one key twice; every later call reads the
// cached choice.  Each choice is also a record of the report that
// lltm_cpu.gemm_routes() reads (report_json(), through the C function
// lltm_cpu_gemm_routes_json in lltm.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace lltm_cpu {
namespace tuning {

// How a choice was made, as the report says it.
constexpr const char* kMeasured = "measured";
constexpr const char* kOnlyOne = "the only one";
constexpr const char* kDeterministic = "deterministic";

// Rounds for a choice whose options take microseconds or measure within a
// few per cent (the recurrent GEMM's routes, the time loop's splits): one
// burst of a neighbour's work can cover all of one option's calls, and did
// (benchmarks/results/cpu_sequence.md).
constexpr int kCloseCallRounds = 3;

// Under torch.use_deterministic_algorithms(True) nothing is timed: the choice
// is the first of `names`, the same in every process on a machine (the
// options depend on the CPU, the build and the key only), under a key of its
// own, so that a measured choice never stands in for it.  Callers list their
// options in the order they prefer them then (lltm-cpu's own kernels first:
// their results do not depend on the thread count).  What that costs:
// docs/backends/cpu.md, "Reproducible runs".
//
// The option for `key`: the cached choice, or the fastest of `names`, each
// timed by `time_option(index)` -> us, with the tuning mutex held: `rounds`
// times in turn, each option's fastest kept (so that a burst of noise on a
// shared machine, which lasts longer than one timing, is less likely to land
// on one option alone).  Option i competes with its time divided by
// `within[i]` (empty: all 1, whichever is fastest): an option with
// within < 1 is chosen only by measuring at most that share of the others'
// times.  A single option is recorded with `single_source`.  `what`: what
// the choice is for, as the report gives it.  time_option must not tune
// another key (the mutex is held).
struct Record;
int tuned_index(const std::string& key, const Record& what, const std::vector<const char*>& names,
                const std::function<double(int)>& time_option, const char* single_source, int rounds = 1,
                const std::vector<double>& within = {});

// What lltm_cpu.gemm_routes() reports of a choice besides its outcome, as
// fields that tests and benchmarks read (lltm_cpu/_library.py documents
// them); report_json() is their one serialization, and leaves out a field
// still at its unset value.
struct Record {
  const char* kind = "";  // "recurrent", "all steps" or "time loop"
  const char* dtype = "";
  // A GEMM's (recurrent, all steps): its shape as timed, and for all steps
  // the [M, N, K] size class the choice serves.
  int64_t m = -1, n = -1, k = -1;
  std::vector<int64_t> size_class;
  std::optional<bool> a_transposed, b_transposed;
  int64_t threads = -1, torch_threads = -1;
  // The time loop's: the problem, the direction, the blocks each split runs.
  int64_t batch = -1, state_size = -1, row_blocks = -1, column_blocks = -1;
  const char* direction = "";
};

// The records so far, a JSON array of objects: "key", the Record's fields,
// "chosen", "source" and "measured_us" ({option: us}, empty unless measured).
std::string report_json();

// Microseconds per call of `run`: after a warm-up call, the fastest of up to
// 10 calls, timed one by one until 1 ms has passed (at least 2).  The fastest,
// not the mean: on a shared machine a call that lost its core to another
// process measures the other process.
template <typename Run>
double time_us(const Run& run) {
  using clock = std::chrono::steady_clock;
  run();  // first-use costs: packing caches
  double best = 0, total = 0;
  for (int call = 0; call < 10 && (call < 2 || total < 1000.0); ++call) {
    const auto start = clock::now();
    run();
    const double us = std::chrono::duration<double, std::micro>(clock::now() - start).count();
    best = call == 0 ? us : (us < best ? us : best);
    total += us;
  }
  return best;
}

// A JSON string literal of `text` (quotes and backslashes escaped).
std::string quoted(const std::string& text);

}  // namespace tuning
}  // namespace lltm_cpu
