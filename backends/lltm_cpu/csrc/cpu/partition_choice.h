// The time loop's split, chosen by timing both on the real weights at the
// first call of a (dtype, B, S, threads, direction) (tuning.h; partition.h
// holds the splits themselves), and the key and record gemm_routes()
// reports it under.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "blas.h"
#include "block_operands.h"
#include "kernel_common.h"
#include "partition.h"
#include "pointwise.h"
#include "tuning.h"

namespace lltm_cpu {
namespace sequence {

// Microseconds per step of the time loop on this partition, all threads at
// once: each step's recurrent GEMM on the real weights, laid out as the loop
// lays them out (LoopOperands: the rows' one shared layout is a call per
// slice), and its pointwise pass (and, for the column split, its barrier),
// on made-up state in buffers of the real sizes, h_t (forward) or d_gates_t
// (backward) feeding the next step's GEMM as in the loop.  The pass is timed too: the column
// split's threads wait for each other every step, so what one thread's pass
// or GEMM loses to the other's, the barrier shows (timing the GEMMs and
// barrier alone chose a split that ran the loop slower:
// benchmarks/results/cpu_sequence.md).  Rounds of a few steps after a warm-up step, timed until about a
// millisecond has passed (at least 3 rounds), the fastest round; the state
// is reset before each round, so that nothing grows or decays into
// denormals.
template <typename scalar_t>
double time_partition(const Partition& partition, bool forward, int64_t B, int64_t S, const scalar_t* w,
                      int64_t ldw) {
  using acc_t = opmath_type<scalar_t>;
  constexpr int64_t kStepsPerRound = 4;
  const auto made_up = [](int64_t count, float base) {
    std::vector<scalar_t> data(std::max<int64_t>(count, 1));
    for (int64_t i = 0; i < count; ++i) {
      data[i] = static_cast<scalar_t>(base + 0.01f * static_cast<float>(i % 13) - 0.06f);
    }
    return data;
  };
  // Forward: the gates, two h buffers (read one, write the other), c.
  // Backward: the saved gates and tanh(c_t), two d_gates buffers, the
  // carried gradients, the bias sums.
  std::vector<scalar_t> gates = made_up(B * 3 * S, 0.5f), saved_tanh = made_up(B * S, 0.3f),
                        upstream = made_up(B * S, 0.1f);
  std::vector<scalar_t> ping_pong[2] = {made_up(B * (forward ? S : 3 * S), 0.1f),
                                        made_up(B * (forward ? S : 3 * S), 0.1f)};
  const std::vector<scalar_t> zero_bias(3 * S, scalar_t(0));
  std::vector<acc_t> product(B * 3 * S), cell(B * S), carried_h(B * S), bias_sums(partition.count() * 3 * S);
  const auto reset_state = [&] {
    std::fill(cell.begin(), cell.end(), acc_t(0));
    std::fill(carried_h.begin(), carried_h.end(), acc_t(0));
    std::fill(product.begin(), product.end(), acc_t(0));  // backward: the carried gradient of c
  };
  const auto forward_pass = pointwise_kernels<scalar_t>().sequence_forward;
  const auto backward_pass = pointwise_kernels<scalar_t>().sequence_backward;
  double best_us = 0;
  std::atomic<bool> stop{false};
  LoopOperands<scalar_t> w_h(partition, forward, B, S, w, ldw);  // as the loop lays them out
  run_partition(partition, [&](int64_t first, int64_t last, SpinBarrier& barrier) {
    const int64_t weight = last - first;
    const bool by_rows = partition.by_rows();
    struct Block {
      const BlockOperands<scalar_t>* operands;
      int64_t row_begin, row_end, col_begin, col_end;
    };
    std::vector<Block> blocks;  // this thread's, each with its operands laid out on this thread
    if (by_rows) {
      for (int64_t block = first; block < last; ++block) {
        blocks.push_back({&w_h.of_block(first, last, block, barrier), partition.rows.begin(block),
                          partition.rows.end(block), 0, S});
      }
    } else {
      const auto [col_begin, col_end] = owned_columns(partition.columns, first, last);
      blocks.push_back({&w_h.of_block(first, last, first, barrier), 0, B, col_begin, col_end});
    }
    int64_t parity = 0;
    const auto step = [&] {
      const scalar_t* in = ping_pong[parity].data();
      scalar_t* out = ping_pong[1 - parity].data();
      for (int64_t index = 0; index < static_cast<int64_t>(blocks.size()); ++index) {
        const Block& b = blocks[index];
        const int64_t rows = b.row_end - b.row_begin;
        acc_t* bias_sum = bias_sums.data() + (by_rows ? first + index : 0) * 3 * S;
        if (forward) {
          b.operands->multiply(rows, in + b.row_begin * S, S, false, product.data() + b.row_begin * 3 * S, 3 * S);
          forward_pass({gates.data() + b.row_begin * 3 * S, zero_bias.data(), product.data() + b.row_begin * 3 * S,
                        cell.data() + b.row_begin * S, nullptr, out + b.row_begin * S, nullptr, nullptr, 0, rows, S,
                        b.col_begin, b.col_end});
        } else {
          backward_pass({upstream.data() + b.row_begin * S, S, false, carried_h.data() + b.row_begin * S,
                         product.data() + b.row_begin * S, gates.data() + b.row_begin * 3 * S,
                         saved_tanh.data() + b.row_begin * S, out + b.row_begin * 3 * S, bias_sum, nullptr, 0, rows,
                         S, b.col_begin, b.col_end});
        }
      }
      if (!by_rows) {
        barrier.wait(weight);
      }
      if (!forward) {
        for (const Block& b : blocks) {
          b.operands->multiply(b.row_end - b.row_begin, out + b.row_begin * 3 * S, 3 * S, false,
                               carried_h.data() + b.row_begin * S, S);
        }
      }
      parity = 1 - parity;
    };
    step();  // first-use costs
    double total_us = 0;
    for (int64_t round = 0; !stop.load(); ++round) {
      if (first == 0) {
        reset_state();
      }
      barrier.wait(weight);
      const auto start = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < kStepsPerRound; ++i) {
        step();
      }
      barrier.wait(weight);  // the round ends with its slowest thread
      if (first == 0) {
        const double us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() /
            kStepsPerRound;
        best_us = round == 0 ? us : std::min(best_us, us);
        total_us += us * kStepsPerRound;
        stop.store((round >= 2 && total_us >= 1000.0) || round >= 31);
      }
      barrier.wait(weight);  // every thread reads the same `stop`
    }
  });
  return best_us;
}

// "time loop float32 B64 S512 threads 2 forward": the partition's key in
// gemm_routes(), with the blocks each split would run where they are not
// one per thread (a small problem); and the record of what it is for.
template <typename scalar_t>
std::pair<std::string, tuning::Record> split_key(bool forward, int64_t B, int64_t S, const Partition& partition) {
  const int64_t threads = num_threads();
  std::ostringstream key;
  key << "time loop " << dtype_name<scalar_t>() << " B" << B << " S" << S << " threads " << threads
      << (forward ? " forward" : " backward");
  if (partition.rows.count != threads || partition.columns.count != threads) {
    key << " (rows in " << partition.rows.count << " blocks, columns in " << partition.columns.count << ")";
  }
  tuning::Record what;
  what.kind = "time loop";
  what.dtype = dtype_name<scalar_t>();
  what.batch = B, what.state_size = S, what.threads = threads;
  what.direction = forward ? "forward" : "backward";
  what.row_blocks = partition.rows.count, what.column_blocks = partition.columns.count;
  return {key.str(), what};
}

// The time loop's partition for a problem: by rows or by columns, as
// measured (or as LLTM_CPU_SPLIT says), with its blocks' GEMM route; by rows
// wherever the columns cannot be split (one thread, a small problem).
template <typename scalar_t>
Partition tuned_partition(bool forward, int64_t T, int64_t B, int64_t S, const scalar_t* w, int64_t ldw) {
  const std::optional<Split> forced = requested_split();
  Partition partition;
  partition.rows = split_rows(B, T * 3 * S * S, B * 3 * S * S, forced.has_value());
  partition.columns = split_columns(S, T * B * 3 * S * S, forced.has_value());
  const int64_t n = forward ? 3 * S : S, k = forward ? S : 3 * S;
  const auto rows_route = [&] {
    return blas::recurrent_route<scalar_t>(/*trans_b=*/forward, partition.rows.max_rows(), n, k, w, ldw,
                                           partition.rows.blas_threads);
  };
  const auto columns_route = [&] {
    const int64_t width = partition.columns.max_width();
    return blas::recurrent_route<scalar_t>(/*trans_b=*/forward, B, width, k, w, ldw, /*threaded=*/false);
  };
  if (partition.columns.count <= 1 || forced == Split::kRows) {
    partition.split = Split::kRows;
    partition.route = rows_route();
    if (partition.columns.count > 1) {  // reported: LLTM_CPU_SPLIT chose
      const auto [key, what] = split_key<scalar_t>(forward, B, S, partition);
      tuned_split(key, what, [](Split) { return 0.0; });
    }
    return partition;
  }
  // Both routes first: choosing one takes the tuning mutex, which
  // tuned_split holds while it times the partitions.
  Partition by_rows = partition, by_columns = partition;
  by_columns.split = Split::kColumns;
  by_columns.route = columns_route();
  if (forced != Split::kColumns) {
    by_rows.route = rows_route();
  }
  const auto [key, what] = split_key<scalar_t>(forward, B, S, partition);
  const Split split = tuned_split(key, what, [&](Split which) {
    return time_partition<scalar_t>(which == Split::kRows ? by_rows : by_columns, forward, B, S, w, ldw);
  });
  return split == Split::kRows ? by_rows : by_columns;
}

// The partition for this call: tuned_partition's, kept by each thread per problem, so that
// later calls skip formatting keys and taking the tuning mutex.  Invariant: `problem` holds
// everything the choice depends on (the variables are read once and a tuned choice never
// changes) (benchmarks/results/cpu_sequence.md, "the operators' rest taken apart").
template <typename scalar_t>
Partition choose_partition(bool forward, int64_t T, int64_t B, int64_t S, const scalar_t* w, int64_t ldw) {
  thread_local std::map<std::tuple<bool, int64_t, int64_t, int64_t, int64_t, bool, bool>, Partition> chosen;
  const auto problem =
      std::make_tuple(forward, T, B, S, num_threads(), in_parallel_region(), deterministic_algorithms());
  if (const auto found = chosen.find(problem); found != chosen.end()) {
    return found->second;
  }
  return chosen[problem] = tuned_partition<scalar_t>(forward, T, B, S, w, ldw);
}

}  // namespace sequence
}  // namespace lltm_cpu
