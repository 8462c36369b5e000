// The persistent sequence paths (lltm_persistent.cu): the whole time loop in one launch, W_h kept on
// chip across a thread-block cluster, or (the grid path) spread over every multiprocessor of a
// cooperative launch.  lltm_sequence.cu asks plan_sequence() which path a call
// takes and runs the persistent kernels through these functions.
#pragma once

#include "lltm_common.cuh"

#include <optional>
#include <string>

namespace lltm_cuda {

// Which path a sequence call takes, and why (lltm_cuda.sequence_path and the docs show it).
struct SequencePlan {
  bool persistent = false;  // one launch for the time loop: the cluster's kernels, or the grid's
  bool grid = false;        // the grid's: a cooperative launch of `blocks` blocks
  int cluster = 1;          // blocks of the cluster that splits the hidden units
  int64_t blocks = 1;       // blocks of the cooperative grid that splits them
  int64_t unit_groups = 1;  // the grid's: groups of units (blocks / unit_groups of the batch)
  std::string why;
};

// LLTM_CUDA_SEQUENCE (persistent | grid | per-step | auto) and LLTM_CUDA_CLUSTER (1, 2, 4, 8, 16 or 0
// for the default) force a choice; a forced path that cannot run is an error, never a fallback.
SequencePlan plan_sequence(int device, ScalarType dtype, int64_t batch, int64_t state_size);

// Steps k_begin..k_end-1 of the forward (step t = k, or T-1-k reversed) in one launch.  `gates`
// holds the input projection of steps first_step.. (bias included) and leaves with the pre-activation
// gates when store_gates; h (B, S) and cell (B, S, opmath) carry the state out, and in: the launch
// that starts the sequence (k_begin 0) reads it from h0 and c0 instead, so nothing copies them first.
// c_n (B, S) gets the cell after the launch's last step in the input's dtype (it may be `cell`
// itself, in float32), so nothing converts it after.
struct PersistentForward {
  Tensor weights, gates, h, cell, output;
  std::optional<Tensor> tanh_cell, lengths;
  int64_t steps, k_begin, k_end, first_step;
  bool reverse, store_gates;
  Tensor h0, c0, c_n;
};
void persistent_forward(const SequencePlan& plan, const PersistentForward& args);

// The whole backward time loop in one launch: d_gates (T, B, 3S) out; it reads the gradients of
// h_n and c_n (contiguous) itself, grad_h and grad_cell (B, S, opmath) carry the running
// gradients, and grad_h0 and grad_c0 (B, S) get those of h0 and c0 in the input's dtype at the last
// step (they may be grad_h and grad_cell themselves, in float32), so nothing converts them after.
struct PersistentBackward {
  Tensor weights, grad_output, gates, tanh_cell, grad_h, grad_cell, d_gates;
  std::optional<Tensor> lengths;
  bool reverse;
  Tensor grad_h_n, grad_c_n, grad_h0, grad_c0;
};
void persistent_backward(const SequencePlan& plan, const PersistentBackward& args);

}  // namespace lltm_cuda
