// The time loop's partition between threads (lltm_sequence.cpp): blocks of
// batch rows, or blocks of state columns, and the column split's barrier.
//
// Which split is faster is chosen by measurement per (dtype, B, S, threads,
// direction), by tuning.h (partition_choice.h times both on the real weights
// and chooses), and reported in lltm_cpu.gemm_routes() as a record of
// kind "time loop".  LLTM_CPU_SPLIT=rows|columns forces it (read once, at
// first use), for every problem that more than one thread can run, even one
// small enough that lltm-cpu would otherwise keep it on one thread (so tests
// reach both partitions at any size).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <thread>

#include "blas.h"
#include "kernel_common.h"
#include "tuning.h"

namespace lltm_cpu {

// How the time loop divides its work between threads: each thread a block
// of batch rows (all state columns), or a block of state columns (all rows).
enum class Split { kRows, kColumns };

inline const char* split_name(Split split) { return split == Split::kRows ? "rows" : "columns"; }

// LLTM_CPU_SPLIT, read once: the partition asked for, or nullopt to measure.
// Throws for a value that names no split.
inline std::optional<Split> requested_split() {
  static const std::optional<Split> split = []() -> std::optional<Split> {
    const char* env = std::getenv("LLTM_CPU_SPLIT");
    const std::string wanted = env == nullptr ? "" : env;
    for (const Split candidate : {Split::kRows, Split::kColumns}) {
      if (wanted == split_name(candidate)) {
        return candidate;
      }
    }
    LLTM_CHECK(wanted.empty(), "lltm_cpu: LLTM_CPU_SPLIT must be rows or columns (or unset), got '", wanted,
                    "'");
    return std::nullopt;
  }();
  return split;
}

// The columns are chosen only where they measure at most this share of the
// rows' time: the first call's timing of the two varies between processes by
// more than their difference in the loop, and where it chose the columns by
// less, the loop ran slower than on the rows (benchmarks/results/
// cpu_sequence.md, "the split's timing and its margin").
constexpr double kColumnsWithin = 0.90;

// The partition for `key`: LLTM_CPU_SPLIT's, else the cached choice, else
// the rows unless time_split(split) (us per step) measures the columns
// within kColumnsWithin of them.
// time_split must not choose a GEMM route (tuning's mutex is held): choose
// those first.
template <typename TimeSplit>
Split tuned_split(const std::string& key, const tuning::Record& what, const TimeSplit& time_split) {
  if (const std::optional<Split> forced = requested_split()) {
    tuning::tuned_index(key, what, {split_name(*forced)}, [](int) { return 0.0; }, "LLTM_CPU_SPLIT");
    return *forced;
  }
  const Split options[] = {Split::kRows, Split::kColumns};
  // The two splits often measure within a few per cent: several rounds (tuning.h).
  return options[tuning::tuned_index(key, what, {split_name(Split::kRows), split_name(Split::kColumns)},
                                     [&](int index) { return time_split(options[index]); }, tuning::kOnlyOne,
                                     tuning::kCloseCallRounds, {1.0, kColumnsWithin})];
}

// A block of rows gets a thread of its own only with at least this much
// recurrent-GEMM work over the whole sequence (a parallel region costs a few
// us to start; this is ~10-20 us of one core's work).
constexpr int64_t kMinMacsPerThread = int64_t{1} << 18;
// With a single block, its step GEMMs may still use MKL's threads from this
// size on (a batch of one row with a large state).
constexpr int64_t kThreadedStepGemmMacs = int64_t{1} << 22;

// How the time loop splits the batch: `count` blocks of consecutive rows,
// at most one per thread.  blas_threads: a single block whose GEMMs are large
// enough to use MKL's threads; otherwise each block's GEMMs run on its thread
// alone.
struct RowBlocks {
  int64_t batch = 0;
  int64_t count = 0;
  bool blas_threads = false;

  int64_t begin(int64_t block) const { return block * batch / count; }
  int64_t end(int64_t block) const { return (block + 1) * batch / count; }
  int64_t max_rows() const { return count == 0 ? 0 : divup(batch, count); }
};

// `macs_per_row`: the recurrent GEMMs' work for one row, all steps;
// `step_gemm_macs`: one step's GEMM for the whole batch.  `forced`
// (LLTM_CPU_SPLIT): a block per thread whatever the work.
inline RowBlocks split_rows(int64_t batch, int64_t macs_per_row, int64_t step_gemm_macs, bool forced) {
  RowBlocks blocks;
  blocks.batch = batch;
  if (batch == 0) {
    return blocks;
  }
  const int64_t rows_per_thread =
      forced ? 1 : std::max<int64_t>(1, divup(kMinMacsPerThread, std::max<int64_t>(macs_per_row, 1)));
  blocks.count = in_parallel_region() ? 1
                                          : std::clamp<int64_t>(batch / rows_per_thread, 1, num_threads());
  blocks.blas_threads = blocks.count == 1 && step_gemm_macs >= kThreadedStepGemmMacs;
  return blocks;
}

// The other way to split the time loop: `count` blocks of consecutive state
// columns, at most one per thread, each for every batch row.  Block
// boundaries are multiples of `align` (32 elements where the state is wide
// enough, so that each block's pointwise pass runs whole vectors): block b
// begins at b S / count rounded down to a multiple of `align`.
struct ColumnBlocks {
  int64_t state_size = 0;
  int64_t count = 0;
  int64_t align = 1;

  int64_t begin(int64_t block) const { return block * state_size / count / align * align; }
  int64_t end(int64_t block) const { return block + 1 == count ? state_size : begin(block + 1); }
  int64_t max_width() const {
    int64_t widest = 0;
    for (int64_t block = 0; block < count; ++block) {
      widest = std::max(widest, end(block) - begin(block));
    }
    return widest;
  }
};

// `macs`: the recurrent GEMMs' work, all rows and steps.  The column split
// needs its blocks to run at once (they wait for each other every step): it
// is offered only where torch's pool is OpenMP's, where each block of a
// parallel region has a thread of its own.
inline ColumnBlocks split_columns(int64_t state_size, int64_t macs, bool forced) {
  ColumnBlocks blocks;
  blocks.state_size = state_size;
  blocks.count = 1;
  if (openmp_pool() && !in_parallel_region() && state_size > 0) {
    const int64_t by_work = forced ? state_size : std::max<int64_t>(1, macs / kMinMacsPerThread);
    blocks.count = std::clamp<int64_t>(std::min(by_work, state_size), 1, num_threads());
  }
  // The widest alignment that leaves every block at least that wide: 32
  // elements, or less for a narrow state (begin() is then strictly increasing).
  blocks.align = 32;
  while (blocks.align > 1 && state_size < blocks.count * blocks.align) {
    blocks.align /= 2;
  }
  return blocks;
}

inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The column split's barrier, for the threads of one parallel region.  Each
// thread arrives with the number of blocks it runs (OpenMP may give a thread
// more than one), and the barrier opens when all `blocks` have arrived: a
// generation counter, spun on (a step is tens of us to a few ms; a futex
// wake-up would cost as much as a small step), yielding after a few
// thousand spins so that an oversubscribed machine (several Python threads
// calling at once) still makes progress.  A thread that fails aborts it, so
// that the others stop waiting for it and fail too.
class SpinBarrier {
 public:
  explicit SpinBarrier(int64_t blocks) : blocks_(blocks) {}

  void wait(int64_t weight) {
    const int64_t generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(weight, std::memory_order_acq_rel) + weight == blocks_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.store(generation + 1, std::memory_order_release);
      return;
    }
    for (int64_t spin = 0; generation_.load(std::memory_order_acquire) == generation; ++spin) {
      LLTM_CHECK(!aborted_.load(std::memory_order_relaxed), "lltm_cpu: another thread of the time loop failed");
      if (spin < kSpins) {
        cpu_pause();
      } else {
        std::this_thread::yield();
      }
    }
  }

  void abort() { aborted_.store(true, std::memory_order_relaxed); }

 private:
  static constexpr int64_t kSpins = 4096;
  const int64_t blocks_;
  alignas(64) std::atomic<int64_t> arrived_{0};
  alignas(64) std::atomic<int64_t> generation_{0};
  alignas(64) std::atomic<bool> aborted_{false};
};

// The time loop's partition: its split, blocks and recurrent GEMM route.
struct Partition {
  Split split = Split::kRows;
  RowBlocks rows;
  ColumnBlocks columns;
  blas::Route route = blas::Route::kAten;

  bool by_rows() const { return split == Split::kRows; }
  int64_t count() const { return by_rows() ? rows.count : columns.count; }
};

// Runs `body(first, last, barrier)` on each thread of one parallel region,
// blocks [first, last) of the partition its own (one, where there are
// enough threads), every GEMM in it on its thread alone unless the rows'
// single block may use MKL's threads.
template <typename Body>
void run_partition(const Partition& partition, const Body& body) {
  const int64_t count = partition.count();
  SpinBarrier barrier(std::max<int64_t>(count, 1));
  const bool single_threaded = !(partition.by_rows() && partition.rows.blas_threads);
  if (count <= 1) {
    if (count == 1) {
      const blas::SingleThreaded guard(single_threaded);
      body(0, 1, barrier);
    }
    return;
  }
  parallel_for(0, count, 1, [&](int64_t first, int64_t last) {
    const blas::SingleThreaded single_threaded_here(single_threaded);
    try {
      body(first, last, barrier);
    } catch (...) {
      barrier.abort();
      throw;
    }
  });
}

}  // namespace lltm_cpu
