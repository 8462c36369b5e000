// Each thread's share of the recurrent weights W_h in the time loop
// (lltm_sequence.cpp, and the split's timing in partition_choice.h), laid
// out once per call for its GEMM route, by the thread that uses it; or, for
// the blocks of rows, one layout they share, each block's thread laying out
// a slice of it (LoopOperands holds a call's).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "blas.h"
#include "kernel_common.h"
#include "partition.h"

namespace lltm_cpu {
namespace sequence {

// A block's share of W_h for its recurrent GEMMs: one blas::RightOperand
// for each slice [begin, end) of op(W_h)'s columns that the block computes,
// each writing C's columns [begin, end).  Forward op(W_h) is W_h^T (S x 3S):
// rows take all 3S columns, a block of state columns [j0, j1) the three
// gates' slices g S + j0 .. g S + j1, each W_h rows that are contiguous in
// W.  Backward op(W_h) is W_h (3S x S): its columns j0 .. j1.
template <typename scalar_t>
class BlockOperands {
 public:
  using acc_t = opmath_type<scalar_t>;

  BlockOperands(blas::Route route, bool forward, int64_t max_m, int64_t S, const scalar_t* w, int64_t ldw,
                int64_t col_begin, int64_t col_end, bool all_gates_whole)
      : BlockOperands(route, forward, max_m, S, w, ldw, col_begin, col_end) {
    if (!forward) {
      add(col_begin, col_end);
    } else if (all_gates_whole) {
      add(0, 3 * S);
    } else {
      for (int64_t gate = 0; gate < 3; ++gate) {
        add(gate * S + col_begin, gate * S + col_end);
      }
    }
    for (size_t part = 0; part < parts_.size(); ++part) {
      lay_out(part);
    }
  }

  // All of op(W_h) for every block of rows, in `count` slices of its
  // columns, none laid out yet: the thread of block p lays out slice p
  // (lay_out), and every block multiplies by all of them once all are.
  static std::unique_ptr<BlockOperands> shared(blas::Route route, bool forward, int64_t max_m, int64_t S,
                                               const scalar_t* w, int64_t ldw, int64_t count) {
    const int64_t n = forward ? 3 * S : S;
    std::unique_ptr<BlockOperands> operands(new BlockOperands(route, forward, max_m, S, w, ldw, 0, S));
    int64_t align = kSharedSliceAlign;
    while (align > 1 && n < count * align) {
      align /= 2;
    }
    for (int64_t part = 0; part < count; ++part) {
      const int64_t end = part + 1 == count ? n : (part + 1) * n / count / align * align;
      operands->add(part * n / count / align * align, end);
    }
    return operands;
  }

  bool laid_out(int64_t part) const { return parts_[part] != nullptr; }

  // Lays out slice `part` (its columns [begin, end) of op(W_h)).
  void lay_out(size_t part) {
    const auto [begin, end] = ranges_[part];
    // forward: W_h's rows [begin, end), transposed; backward: W_h's columns [begin, end).
    const scalar_t* b = forward_ ? w_ + begin * ldw_ : w_ + begin;
    parts_[part] = std::make_unique<blas::RightOperand<scalar_t>>(route_, /*trans_b=*/forward_, max_m_, end - begin,
                                                                  k_, b, ldw_);
  }

  // C's block columns (rows of ldc) = A op(W_h)'s (+ C if accumulate), m rows.
  void multiply(int64_t m, const scalar_t* a, int64_t lda, bool accumulate, acc_t* c, int64_t ldc) const {
    for (size_t part = 0; part < parts_.size(); ++part) {
      parts_[part]->multiply(m, a, lda, accumulate, c + ranges_[part].first, ldc);
    }
  }

  bool covers(int64_t col_begin, int64_t col_end) const { return col_begin_ == col_begin && col_end_ == col_end; }

 private:
  // Shared slices begin at multiples of this many columns, or fewer for a
  // narrow op(W_h) (whole vectors for the packed kernels).
  static constexpr int64_t kSharedSliceAlign = 64;

  BlockOperands(blas::Route route, bool forward, int64_t max_m, int64_t S, const scalar_t* w, int64_t ldw,
                int64_t col_begin, int64_t col_end)
      : col_begin_(col_begin), col_end_(col_end), route_(route), forward_(forward), max_m_(max_m),
        k_(forward ? S : 3 * S), w_(w), ldw_(ldw) {}

  void add(int64_t begin, int64_t end) {
    ranges_.emplace_back(begin, end);
    parts_.emplace_back();
  }

  int64_t col_begin_, col_end_;
  blas::Route route_;
  bool forward_;
  int64_t max_m_, k_;
  const scalar_t* w_;
  int64_t ldw_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // each slice's columns of op(W_h), C's columns it writes
  std::vector<std::unique_ptr<blas::RightOperand<scalar_t>>> parts_;
};

// The state columns a thread of the column split owns: its blocks' together.
inline std::pair<int64_t, int64_t> owned_columns(const ColumnBlocks& columns, int64_t first, int64_t last) {
  return {columns.begin(first), columns.end(last - 1)};
}

// Whether the blocks of rows share one layout of W_h, each block's thread
// laying out a slice of it, instead of each laying out all of it: where every
// block has a thread of its own at once (OpenMP's pool, as for the column
// split), since the blocks wait for each other's slices, and where the
// route lays out a copy that several threads may multiply by at once
// (benchmarks/results/cpu_sequence.md, "one layout of W_h").
template <typename scalar_t>
bool rows_share_layout(const Partition& partition) {
  return partition.by_rows() && partition.rows.count > 1 && openmp_pool() &&
         blas::RightOperand<scalar_t>::shared_layout(partition.route);
}

// The rows split's shared layout of op(W_h), none of it laid out yet.
template <typename scalar_t>
std::unique_ptr<BlockOperands<scalar_t>> shared_operands(const Partition& partition, bool forward, int64_t S,
                                                         const scalar_t* w, int64_t ldw) {
  return BlockOperands<scalar_t>::shared(partition.route, forward, partition.rows.max_rows(), S, w, ldw,
                                         partition.rows.count);
}

// Blocks [first, last) lay out their slices of `shared`, then wait for the
// others' (once: a later call finds them laid out and waits for nothing).
template <typename scalar_t>
void lay_out_shared(BlockOperands<scalar_t>& shared, int64_t first, int64_t last, SpinBarrier& barrier) {
  if (shared.laid_out(first)) {
    return;
  }
  for (int64_t block = first; block < last; ++block) {
    shared.lay_out(block);
  }
  barrier.wait(last - first);
}

// The operands of one block of `partition`, built on the thread that uses
// them: a block of rows multiplies by all of W_h, for up to the widest
// block's rows; a thread of the column split by its columns' slices
// [col_begin, col_end), for all B rows.
template <typename scalar_t>
std::unique_ptr<BlockOperands<scalar_t>> block_operands(const Partition& partition, bool forward, int64_t B, int64_t S,
                                                        const scalar_t* w, int64_t ldw, int64_t col_begin,
                                                        int64_t col_end) {
  const bool by_rows = partition.by_rows();
  return std::make_unique<BlockOperands<scalar_t>>(partition.route, forward, by_rows ? partition.rows.max_rows() : B,
                                                   S, w, ldw, col_begin, col_end, /*all_gates_whole=*/by_rows);
}

// The recurrent operands of one call's time loop, for every block of
// `partition`: the rows' shared layout where rows_share_layout, else each
// block's own (block_operands).  Each is laid out by the thread that runs
// its block, at its first use.  The loop and the split's timing
// (partition_choice.h) both take theirs from here, so that the timing
// measures the layout that runs.
template <typename scalar_t>
class LoopOperands {
 public:
  LoopOperands(const Partition& partition, bool forward, int64_t B, int64_t S, const scalar_t* w, int64_t ldw)
      : partition_(partition), forward_(forward), B_(B), S_(S), w_(w), ldw_(ldw), own_(partition.count()) {
    if (rows_share_layout<scalar_t>(partition)) {
      shared_ = shared_operands(partition, forward, S, w, ldw);
    }
  }

  // The operands of block `block`, on the thread that runs blocks [first,
  // last) (the column split: those blocks' columns together).  The shared
  // layout's first use lays out this thread's slices and waits on `barrier`
  // for the others', so every thread must ask before its first step.
  const BlockOperands<scalar_t>& of_block(int64_t first, int64_t last, int64_t block, SpinBarrier& barrier) {
    if (shared_) {
      lay_out_shared(*shared_, first, last, barrier);
      return *shared_;
    }
    if (partition_.by_rows()) {
      if (!own_[block]) {
        own_[block] = block_operands(partition_, forward_, B_, S_, w_, ldw_, 0, S_);
      }
      return *own_[block];
    }
    const auto [col_begin, col_end] = owned_columns(partition_.columns, first, last);
    if (!own_[first] || !own_[first]->covers(col_begin, col_end)) {
      own_[first] = block_operands(partition_, forward_, B_, S_, w_, ldw_, col_begin, col_end);
    }
    return *own_[first];
  }

 private:
  const Partition partition_;
  const bool forward_;
  const int64_t B_, S_;
  const scalar_t* const w_;
  const int64_t ldw_;
  std::vector<std::unique_ptr<BlockOperands<scalar_t>>> own_;  // per block of rows, or per thread's first column block
  std::unique_ptr<BlockOperands<scalar_t>> shared_;
};

}  // namespace sequence
}  // namespace lltm_cpu
