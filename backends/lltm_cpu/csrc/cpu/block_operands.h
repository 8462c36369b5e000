// Each thread's share of the recurrent weights W_h in the time loop
// (lltm_sequence.cpp), laid out once per call for its GEMM route, by the
// thread that uses it.
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
      : col_begin_(col_begin), col_end_(col_end) {
    const int64_t k = forward ? S : 3 * S;
    const auto add = [&](int64_t begin, int64_t end) {
      // forward: W_h's rows [begin, end), transposed; backward: W_h's columns [begin, end).
      const scalar_t* b = forward ? w + begin * ldw : w + begin;
      parts_.push_back(std::make_unique<blas::RightOperand<scalar_t>>(route, /*trans_b=*/forward, max_m,
                                                                      end - begin, k, b, ldw));
      offsets_.push_back(begin);
    };
    if (!forward) {
      add(col_begin, col_end);
    } else if (all_gates_whole) {
      add(0, 3 * S);
    } else {
      for (int64_t gate = 0; gate < 3; ++gate) {
        add(gate * S + col_begin, gate * S + col_end);
      }
    }
  }

  // C's block columns (rows of ldc) = A op(W_h)'s (+ C if accumulate), m rows.
  void multiply(int64_t m, const scalar_t* a, int64_t lda, bool accumulate, acc_t* c, int64_t ldc) const {
    for (size_t part = 0; part < parts_.size(); ++part) {
      parts_[part]->multiply(m, a, lda, accumulate, c + offsets_[part], ldc);
    }
  }

  bool covers(int64_t col_begin, int64_t col_end) const { return col_begin_ == col_begin && col_end_ == col_end; }

 private:
  int64_t col_begin_, col_end_;
  std::vector<std::unique_ptr<blas::RightOperand<scalar_t>>> parts_;
  std::vector<int64_t> offsets_;
};

// The state columns a thread of the column split owns: its blocks' together.
inline std::pair<int64_t, int64_t> owned_columns(const ColumnBlocks& columns, int64_t first, int64_t last) {
  return {columns.begin(first), columns.end(last - 1)};
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

}  // namespace sequence
}  // namespace lltm_cpu
