// Measure-once tuning, shared by the GEMM routes (blas.cpp) and the time
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
#include <functional>
#include <string>
#include <vector>

namespace lltm_cpu {
namespace tuning {

// How a choice was made, as the report says it.
constexpr const char* kMeasured = "measured";
constexpr const char* kOnlyOne = "the only one";

// Rounds for a choice whose options take microseconds or measure within a
// few per cent (the recurrent GEMM's routes, the time loop's splits): one
// burst of a neighbour's work can cover all of one option's calls, and did
// (benchmarks/results/cpu_sequence.md, 2026-12-03).
constexpr int kCloseCallRounds = 3;

// The option for `key`: the cached choice, or the fastest of `names`, each
// timed by `time_option(index)` -> us, with the tuning mutex held: `rounds`
// times in turn, each option's fastest kept (so that a burst of noise on a
// shared machine, which lasts longer than one timing, is less likely to land
// on one option alone).  A single option is recorded with `single_source`.
// `fields`: the record's other members, as JSON ("\"kind\": ..., ...").
// time_option must not tune another key (the mutex is held).
int tuned_index(const std::string& key, const std::string& fields, const std::vector<const char*>& names,
                const std::function<double(int)>& time_option, const char* single_source, int rounds = 1);

// The records so far, a JSON array of objects: key, the fields, "chosen",
// "source" and "measured_us" ({option: us}, empty unless measured).
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
