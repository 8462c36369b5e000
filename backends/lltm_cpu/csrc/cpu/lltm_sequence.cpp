// CPU kernels of lltm_cpu::sequence_forward and lltm_cpu::sequence_backward:
// one LLTM layer in one direction over a whole sequence, the time loop in C++.
//
// The algorithm is lltm-ref's sequence_forward / sequence_backward (the
// reference this must match), with the same saved tensors: the activated
// gates (T, B, 3S) and tanh(c_t) (T, B, S).
//
// Forward: one GEMM projects the input of all T*B rows into a gates buffer;
// then each step's recurrent GEMM h_{t-1} W_h^T goes into a product buffer
// (in opmath_t: float for bfloat16) and one fused pointwise pass
// (pointwise_impl.h) adds the product and the bias to the step's slice of
// the gates buffer and turns it into the gates, c_t and h_t.
// Inference (needs_backward false, contract v3) saves nothing: it projects
// the input a chunk of steps at a time into one reused buffer and writes no
// tanh(c_t), so its memory is the output plus that buffer.
// Backward: each step one fused pass gives d_gates_t (and sums the bias
// gradient as it goes) and one GEMM d_gates_t W_h the gradient of h_{t-1};
// after the loop, GEMMs over all steps at once give d_W and d_input.
// From a zero h0 (LLTMLayer's default state) the first step's recurrent
// GEMM and h0's part of d_W are skipped: their products are zero (all_zero).
//
// Threads: the time loop is divided between threads in one of two ways,
// whichever measured faster at the first call of its (dtype, B, S, threads,
// direction) (partition.h; LLTM_CPU_SPLIT forces one):
// * rows: a batch row's recurrence reads only that row of the previous step,
//   so the loop runs once per block of batch rows, one block per thread,
//   with no synchronisation between steps and each block's GEMMs
//   single-threaded, multiplying by all of W_h laid out for them (one layout
//   the blocks share, where the route allows: block_operands.h);
// * columns: each thread owns a block of state columns [j0, j1) of all three
//   gates and computes them for every batch row: its GEMMs read only its
//   slices of W_h (W_h's rows g*S + j0 .. g*S + j1 forward, its columns
//   j0 .. j1 backward), half of W_h on two threads, each weight used for the
//   whole batch; the pointwise pass of column j needs only gate columns j,
//   S + j and 2S + j of its row, so nothing crosses threads within a step,
//   and one barrier a step (a spin barrier, in one parallel region for the
//   whole loop) waits for all of h_t (forward) or d_gates_t (backward)
//   before the next GEMM reads it.  With lengths the forward updates the
//   state h in place, so a second barrier lets every thread read h_{t-1}
//   before any writes h_t.
// The GEMMs over all steps run before and after the loop, on all threads
// (backward in float32: each thread a share of their rows, on its own).
// Small problems run on one thread.
//
// Each GEMM's route (MKL, lltm-cpu's own kernels, or torch's mm through
// the stable C shim) is the fastest measured for its shape at the first
// call, or a fixed one under torch.use_deterministic_algorithms: see blas.h
// and tuning.h.  The split's timing and choice are partition_choice.h's.
// bfloat16: the recurrent products, the cell state and the carried gradients
// of h and c stay float; what is returned or saved is bfloat16.
//
// Nothing is allocated inside the loop and no torch operator is called
// there, except GEMMs on the "aten" route (where it measured fastest, or
// where torch has no MKL: see blas.h).
#include <torch/csrc/stable/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "blas.h"
#include "block_operands.h"
#include "kernel_common.h"
#include "cache_sizes.h"
#include "partition.h"
#include "partition_choice.h"
#include "tuning.h"

namespace lltm_cpu {
namespace {

using sequence::BlockOperands;
using sequence::choose_partition;
using sequence::LoopOperands;
using sequence::owned_columns;

// Inference (needs_backward false) keeps no gates for backward: the input is
// projected a chunk of steps at a time into one reused buffer of about this
// many elements (16 MiB of float32), so the forward's memory is its output
// plus this.  On one thread the chunk size hardly matters, but on two each
// chunk boundary makes the threads wait for each other and for the next
// chunk's projection; 2^22 elements runs T32 B64 I256 S512 in one chunk
// (benchmarks/results/cpu_sequence.md).
constexpr int64_t kInferenceChunkElements = int64_t{1} << 22;

// Steps per chunk: as many as fit kInferenceChunkElements (at least one),
// evened out so that the last chunk is not a sliver.
int64_t inference_chunk_steps(int64_t steps, int64_t batch, int64_t state_size) {
  const int64_t per_step = std::max<int64_t>(batch * 3 * state_size, 1);
  const int64_t fit = std::clamp<int64_t>(kInferenceChunkElements / per_step, 1, steps);
  return divup(steps, divup(steps, fit));
}

// Checks `lengths` (an int64 CPU tensor (B,) with values in [1, T]) and
// returns it contiguous.
Tensor checked_lengths(const Tensor& lengths, const char* op, int64_t steps, int64_t batch) {
  LLTM_CHECK(lengths.dim() == 1 && lengths.size(0) == batch, op, ": lengths must have shape [", batch, "], got ",
                  shape(lengths));
  LLTM_CHECK(lengths.scalar_type() == ScalarType::Long && lengths.is_cpu(), op,
                  ": lengths must be an int64 CPU tensor, got ", c10::toString(lengths.scalar_type()),
                  lengths.is_cpu() ? " on the CPU" : " on another device");
  Tensor dense = as_contiguous(lengths);
  const int64_t* values = dense.const_data_ptr<int64_t>();
  for (int64_t row = 0; row < batch; ++row) {
    LLTM_CHECK(values[row] >= 1 && values[row] <= steps, op, ": lengths must be in [1, ", steps, "], got ",
                    values[row], " at ", row);
  }
  return dense;
}

// A contiguous copy of `source` (2-D) in new memory of `dtype`, which the kernel may write.  A
// memcpy where only the memory changes: torch's copy_ through the shim costs several times a
// state's bytes (benchmarks/results/cpu_sequence.md, "the operators' rest taken apart").
Tensor fresh_copy(const Tensor& source, ScalarType dtype) {
  Tensor copy = empty({source.size(0), source.size(1)}, dtype);
  if (source.numel() == 0) {  // an empty batch: its data pointers may be null, which memcpy may not take
  } else if (source.scalar_type() == dtype && source.is_contiguous()) {
    std::memcpy(copy.mutable_data_ptr(), source.const_data_ptr(), source.numel() * source.element_size());
  } else {
    torch::stable::copy_(copy, source);
  }
  return copy;
}

Tensor fresh_copy(const Tensor& source) { return fresh_copy(source, source.scalar_type()); }

// The same, in the type the kernels carry state in: float for bfloat16.
Tensor state_copy(const Tensor& source) {
  return fresh_copy(source, source.scalar_type() == ScalarType::BFloat16 ? ScalarType::Float : source.scalar_type());
}

// Whether every element of h0 is zero, of either sign: LLTMLayer's default
// initial state, as nn.LSTM's hx=None.  Its products at the first step are
// then zero, so the kernels skip them, as cuDNN does for an omitted hx: the
// first step's recurrent GEMM forward, and the h0 part of d_W backward.  The
// one difference from multiplying is that 0 * inf is NaN: with non-finite
// W_h, or a non-finite d_gates at the first step, the skipped product is 0
// where the GEMM's would be NaN.  An OR over the bits, so that it vectorizes
// (bfloat16 too) and costs a small fraction of the GEMM it can save.
template <typename scalar_t>
bool all_zero(const scalar_t* data, int64_t count) {
  using Bits = std::conditional_t<sizeof(scalar_t) == 2, uint16_t,
                                  std::conditional_t<sizeof(scalar_t) == 4, uint32_t, uint64_t>>;
  static_assert(sizeof(Bits) == sizeof(scalar_t));
  Bits any = 0;
  for (int64_t i = 0; i < count; ++i) {
    Bits bits;
    std::memcpy(&bits, data + i, sizeof(bits));
    any |= bits;
  }
  return (any & static_cast<Bits>(std::numeric_limits<Bits>::max() >> 1)) == 0;  // the sign bit aside
}

// A state back in `dtype`: itself where it already is (new memory either way).
Tensor in_dtype(const Tensor& state, ScalarType dtype) {
  return state.scalar_type() == dtype ? state : fresh_copy(state, dtype);
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> sequence_forward(
    const Tensor& input_arg, const Tensor& weights_arg, const Tensor& bias_arg, const Tensor& h0_arg,
    const Tensor& c0_arg, const std::optional<Tensor>& lengths_arg, bool reverse, bool needs_backward) {
  constexpr const char* op = "lltm_cpu::sequence_forward";
  LLTM_CHECK(input_arg.dim() == 3, op, ": input must be 3-D (time, batch, input_features), got ", shape(input_arg));
  LLTM_CHECK(h0_arg.dim() == 2, op, ": h0 must be 2-D (batch, state_size), got ", shape(h0_arg));
  const int64_t T = input_arg.size(0), B = input_arg.size(1), I = input_arg.size(2), S = h0_arg.size(1);
  check_matrix(weights_arg, op, "weights", 3 * S, S + I);
  LLTM_CHECK(bias_arg.dim() == 1 && bias_arg.size(0) == 3 * S, op, ": bias must have shape [", 3 * S, "], got ",
              shape(bias_arg));
  check_matrix(h0_arg, op, "h0", B, S);
  check_matrix(c0_arg, op, "c0", B, S);
  check_dtypes(op, {{"input", input_arg}, {"weights", weights_arg}, {"bias", bias_arg}, {"h0", h0_arg},
                    {"c0", c0_arg}});
  // lltm_core passes contiguous tensors, for which these are no-ops.
  const Tensor input = as_contiguous(input_arg);
  const Tensor weights = as_contiguous(weights_arg);
  const Tensor bias = as_contiguous(bias_arg);
  const Tensor h0 = as_contiguous(h0_arg);
  const std::optional<Tensor> lengths =
      lengths_arg.has_value() ? std::optional(checked_lengths(*lengths_arg, op, T, B)) : std::nullopt;

  const ScalarType dtype = input.scalar_type();
  Tensor output = empty({T, B, S}, dtype);
  // Training: the gates of every step, which backward needs, and the
  // projection's buffer too.  Inference: one chunk's buffer, reused, and no
  // tanh(c_t) at all (the saved slots are empty).
  const int64_t chunk_steps = needs_backward ? T : inference_chunk_steps(T, B, S);
  Tensor gates = empty({needs_backward ? T : std::min(chunk_steps, T), B, 3 * S}, dtype);
  Tensor tanh_cell = needs_backward ? empty({T, B, S}, dtype) : empty({0}, dtype);
  Tensor cell = state_copy(c0_arg);  // the cell state, updated in place step by step
  // With lengths, a row past its length keeps its h, which output (zero
  // there) no longer holds: h_n is then the state the steps update.
  Tensor h_n = lengths.has_value() || T == 0 ? fresh_copy(h0) : empty({B, S}, dtype);
  const auto result = [&] {
    return std::tuple{output, h_n, in_dtype(cell, input.scalar_type()), needs_backward ? gates : empty({0}, dtype),
                      tanh_cell};
  };
  if (T == 0 || B == 0) {
    return result();
  }

  dispatch_floating(input.scalar_type(), op, [&](auto zero) {
    using scalar_t = decltype(zero);
    using opmath_t = opmath_type<scalar_t>;
    const scalar_t* w = weights.const_data_ptr<scalar_t>();
    const int64_t ldw = S + I;
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    scalar_t* gates_data = gates.mutable_data_ptr<scalar_t>();
    scalar_t* output_data = output.mutable_data_ptr<scalar_t>();
    scalar_t* tanh_cell_data = needs_backward ? tanh_cell.mutable_data_ptr<scalar_t>() : nullptr;
    opmath_t* cell_data = cell.mutable_data_ptr<opmath_t>();
    scalar_t* hidden_data = lengths.has_value() ? h_n.mutable_data_ptr<scalar_t>() : nullptr;
    const scalar_t* h0_data = h0.const_data_ptr<scalar_t>();
    const bool h0_zero = all_zero(h0_data, B * S);
    const scalar_t* bias_data = bias.const_data_ptr<scalar_t>();
    const int64_t* lengths_data = lengths.has_value() ? lengths->const_data_ptr<int64_t>() : nullptr;
    const auto step_pass = pointwise_kernels<scalar_t>().sequence_forward;
    const bool gates_beyond_l2 = beyond_l2(gates.numel() * gates.element_size());

    const Partition partition = choose_partition<scalar_t>(/*forward=*/true, T, B, S, w, ldw);
    // The h W_h^T operands, laid out on each block's thread at its first
    // chunk.  Not at all for a single step from a zero h0, which has no
    // recurrent product: laying out W_h costs more than that whole call's
    // other work (T1 B64 S512 float32, benchmarks/results/cpu_sequence.md).
    const bool any_product = T > 1 || !h0_zero;
    LoopOperands<scalar_t> w_h(partition, /*forward=*/true, B, S, w, ldw);
    // h W_h^T, B x 3S, in a buffer of its own (float for bfloat16), which
    // the pointwise pass adds to the projection and the bias; each block
    // writes its rows or columns.  Adding it into the gates buffer instead
    // would make the GEMM read and write the projection's rows, which the
    // projection left in L3, and its micro-kernel waits on them (measured
    // slower: benchmarks/results/cpu_sequence.md).
    std::vector<opmath_t> products(B * 3 * S);

    // The steps [chunk_begin, chunk_end) (first_t: the chunk's smallest t)
    // for rows [row_begin, row_end) and state columns [col_begin, col_end);
    // with a barrier (the column split) every thread's after each step, and
    // with lengths also before the pass writes the state h.
    const auto run_steps = [&](int64_t chunk_begin, int64_t chunk_end, int64_t first_t, int64_t row_begin,
                               int64_t row_end, int64_t col_begin, int64_t col_end,
                               const BlockOperands<scalar_t>* operands, SpinBarrier* barrier, int64_t weight) {
      const int64_t block_rows = row_end - row_begin;
      opmath_t* product = products.data() + row_begin * 3 * S;
      for (int64_t i = chunk_begin; i < chunk_end; ++i) {
        const int64_t t = reverse ? T - 1 - i : i;
        const int64_t first_row = t * B + row_begin;
        // h_{t-1}: the state (with lengths), h0, or the previous step's output.
        const int64_t previous_t = reverse ? t + 1 : t - 1;
        const scalar_t* h_prev = hidden_data != nullptr ? hidden_data + row_begin * S
                                 : i == 0               ? h0_data + row_begin * S
                                                        : output_data + (previous_t * B + row_begin) * S;
        scalar_t* gates_t = gates_data + ((t - first_t) * B + row_begin) * 3 * S;
        // From a zero h0 (with lengths too: the state starts as h0) the first product is zero.
        const bool from_zero = i == 0 && h0_zero;
        if (!from_zero) {
          operands->multiply(block_rows, h_prev, S, /*accumulate=*/false, product, 3 * S);
        }
        if (barrier != nullptr && hidden_data != nullptr) {
          barrier->wait(weight);  // every thread has read h_{t-1} before any writes h_t over it
        }
        const SequenceForwardStep<scalar_t> pass{
            gates_t,
            bias_data,
            from_zero ? nullptr : product,
            cell_data + row_begin * S,
            hidden_data != nullptr ? hidden_data + row_begin * S : nullptr,
            output_data + first_row * S,
            tanh_cell_data != nullptr ? tanh_cell_data + first_row * S : nullptr,
            lengths_data != nullptr ? lengths_data + row_begin : nullptr,
            t,
            block_rows,
            S,
            col_begin,
            col_end,
            gates_beyond_l2};
        step_pass(pass);
        if (barrier != nullptr) {
          barrier->wait(weight);  // all of h_t, which the next step's GEMM reads
        }
      }
    };

    // The chunks in the order the steps run: step i of that order is t = i,
    // or T-1-i reversed.
    for (int64_t chunk_begin = 0; chunk_begin < T; chunk_begin += chunk_steps) {
      const int64_t chunk_end = std::min(T, chunk_begin + chunk_steps);
      const int64_t first_t = reverse ? T - chunk_end : chunk_begin;  // the chunk's smallest t
      const int64_t rows = (chunk_end - chunk_begin) * B;
      // The chunk's input projection x W_x^T (the pointwise pass adds the bias).
      blas::gemm<scalar_t>(false, true, rows, 3 * S, I, x + first_t * B * I, I, w + S, ldw, false, gates_data, 3 * S);

      run_partition(partition, [&](int64_t first, int64_t last, SpinBarrier& barrier) {
        const auto operands = [&](int64_t block) {
          return any_product ? &w_h.of_block(first, last, block, barrier) : nullptr;
        };
        if (partition.by_rows()) {
          for (int64_t block = first; block < last; ++block) {
            run_steps(chunk_begin, chunk_end, first_t, partition.rows.begin(block), partition.rows.end(block), 0, S,
                      operands(block), nullptr, 0);
          }
          return;
        }
        const auto [col_begin, col_end] = owned_columns(partition.columns, first, last);
        run_steps(chunk_begin, chunk_end, first_t, 0, B, col_begin, col_end, operands(first), &barrier, last - first);
      });
    }
  });
  if (!lengths.has_value() && B * S > 0) {  // (an empty batch's data pointers may be null)
    const size_t step_bytes = B * S * output.element_size();
    std::memcpy(h_n.mutable_data_ptr(), static_cast<const char*>(output.const_data_ptr()) + (reverse ? 0 : T - 1) * step_bytes,
                step_bytes);
  }
  return result();
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> sequence_backward(
    const Tensor& grad_output_arg, const Tensor& grad_h_n, const Tensor& grad_c_n,
    const Tensor& weights_arg, const Tensor& input_arg, const Tensor& h0_arg,
    const Tensor& output_arg, const std::optional<Tensor>& lengths_arg, const Tensor& gates_arg,
    const Tensor& tanh_cell_arg, bool reverse, bool needs_grad_input) {
  constexpr const char* op = "lltm_cpu::sequence_backward";
  LLTM_CHECK(input_arg.dim() == 3, op, ": input must be 3-D (time, batch, input_features), got ", shape(input_arg));
  LLTM_CHECK(h0_arg.dim() == 2, op, ": h0 must be 2-D (batch, state_size), got ", shape(h0_arg));
  const int64_t T = input_arg.size(0), B = input_arg.size(1), I = input_arg.size(2), S = h0_arg.size(1);
  for (const auto& [name, tensor, width] : {std::tuple{"grad_output", &grad_output_arg, S},
                                            std::tuple{"output", &output_arg, S},
                                            std::tuple{"gates", &gates_arg, 3 * S},
                                            std::tuple{"tanh_cell", &tanh_cell_arg, S}}) {
    LLTM_CHECK(has_shape(*tensor, {T, B, width}), op, ": ", name, " must have shape [", T, ", ", B,
                ", ", width, "], got ", shape(*tensor));
  }
  check_matrix(grad_h_n, op, "grad_h_n", B, S);
  check_matrix(grad_c_n, op, "grad_c_n", B, S);
  check_matrix(weights_arg, op, "weights", 3 * S, S + I);
  check_matrix(h0_arg, op, "h0", B, S);
  check_dtypes(op, {{"grad_output", grad_output_arg}, {"grad_h_n", grad_h_n}, {"grad_c_n", grad_c_n},
                    {"weights", weights_arg}, {"input", input_arg}, {"h0", h0_arg}, {"output", output_arg},
                    {"gates", gates_arg}, {"tanh_cell", tanh_cell_arg}});
  const Tensor weights = as_contiguous(weights_arg);
  const Tensor input = as_contiguous(input_arg);
  const Tensor h0 = as_contiguous(h0_arg);
  const Tensor output = as_contiguous(output_arg);
  const Tensor gates = as_contiguous(gates_arg);
  const Tensor tanh_cell = as_contiguous(tanh_cell_arg);
  const std::optional<Tensor> lengths =
      lengths_arg.has_value() ? std::optional(checked_lengths(*lengths_arg, op, T, B)) : std::nullopt;
  // Autograd's gradient of output.sum() is one value expanded (all strides
  // 0): the pass reads rows of any stride, and a row that is one broadcast
  // value, so only other layouts are copied.
  const Tensor grad_output =
      grad_output_arg.stride(2) == 0 || grad_output_arg.stride(2) == 1 ? grad_output_arg : as_contiguous(grad_output_arg);

  const ScalarType dtype = input.scalar_type();
  // The carried gradients of h and c (float for bfloat16), which end as those of h0 and c0.
  Tensor grad_h = state_copy(grad_h_n);
  Tensor grad_c = state_copy(grad_c_n);
  const auto result = [&](const Tensor& grad_input, const Tensor& grad_weights, const Tensor& grad_bias) {
    return std::tuple{grad_input, grad_weights, grad_bias, in_dtype(grad_h, input.scalar_type()),
                      in_dtype(grad_c, input.scalar_type())};
  };
  Tensor grad_weights = empty({3 * S, S + I}, dtype);
  Tensor grad_bias = empty({3 * S}, dtype);
  Tensor grad_input = needs_grad_input ? empty({T, B, I}, dtype) : empty({0}, dtype);
  if (T == 0 || B == 0) {
    torch::stable::zero_(grad_weights);
    torch::stable::zero_(grad_bias);
    return result(grad_input, grad_weights, grad_bias);
  }
  Tensor grad_gates = empty({T, B, 3 * S}, dtype);

  dispatch_floating(input.scalar_type(), op, [&](auto zero) {
    using scalar_t = decltype(zero);
    using opmath_t = opmath_type<scalar_t>;
    const scalar_t* w = weights.const_data_ptr<scalar_t>();
    const int64_t ldw = S + I;
    const scalar_t* gates_data = gates.const_data_ptr<scalar_t>();
    const scalar_t* tanh_cell_data = tanh_cell.const_data_ptr<scalar_t>();
    const scalar_t* grad_output_data = grad_output.const_data_ptr<scalar_t>();
    const int64_t grad_output_step_stride = grad_output.stride(0), grad_output_row_stride = grad_output.stride(1);
    const bool grad_output_broadcast_row = grad_output.stride(2) == 0;
    scalar_t* grad_gates_data = grad_gates.mutable_data_ptr<scalar_t>();
    opmath_t* grad_h_data = grad_h.mutable_data_ptr<opmath_t>();
    opmath_t* grad_c_data = grad_c.mutable_data_ptr<opmath_t>();
    const int64_t* lengths_data = lengths.has_value() ? lengths->const_data_ptr<int64_t>() : nullptr;

    const auto step_pass = pointwise_kernels<scalar_t>().sequence_backward;
    const bool gates_beyond_l2 = beyond_l2(gates.numel() * gates.element_size());
    const Partition partition = choose_partition<scalar_t>(/*forward=*/false, T, B, S, w, ldw);
    // Blocks of rows: one bias sum per block, added up in block order
    // afterwards (the same order every run).  Blocks of columns: one sum,
    // each block summing its own columns.
    const int64_t bias_rows = partition.by_rows() ? std::max<int64_t>(partition.rows.count, 1) : 1;
    std::vector<opmath_t> bias_sums(bias_rows * 3 * S, opmath_t(0));

    // The steps for rows [row_begin, row_end) and state columns [col_begin,
    // col_end); with a barrier (the column split) every thread's between
    // the pass, which writes d_gates_t's block, and the GEMM, which reads all of it.
    const auto run_steps = [&](int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end,
                               const BlockOperands<scalar_t>& w_h, opmath_t* bias_sum, SpinBarrier* barrier,
                               int64_t weight) {
      const int64_t rows = row_end - row_begin;
      for (int64_t i = 0; i < T; ++i) {
        const int64_t t = reverse ? i : T - 1 - i;  // the steps, last first
        const int64_t first_row = t * B + row_begin;
        scalar_t* grad_gates_t = grad_gates_data + first_row * 3 * S;
        opmath_t* grad_h_rows = grad_h_data + row_begin * S;
        const SequenceBackwardStep<scalar_t> pass{
            grad_output_data + t * grad_output_step_stride + row_begin * grad_output_row_stride,
            grad_output_row_stride,
            grad_output_broadcast_row,
            grad_h_rows,
            grad_c_data + row_begin * S,
            gates_data + first_row * 3 * S,
            tanh_cell_data + first_row * S,
            grad_gates_t,
            bias_sum,
            lengths_data != nullptr ? lengths_data + row_begin : nullptr,
            t,
            rows,
            S,
            col_begin,
            col_end,
            gates_beyond_l2};
        step_pass(pass);
        if (barrier != nullptr) {
          barrier->wait(weight);
        }
        // The gradient of h_{t-1}.  With lengths the pass zeroed the rows
        // that took part, and the rest keep theirs: so add.
        w_h.multiply(rows, grad_gates_t, 3 * S, /*accumulate=*/lengths_data != nullptr, grad_h_rows, S);
      }
    };

    LoopOperands<scalar_t> w_h(partition, /*forward=*/false, B, S, w, ldw);  // for d_gates W_h
    run_partition(partition, [&](int64_t first, int64_t last, SpinBarrier& barrier) {
      if (partition.by_rows()) {
        for (int64_t block = first; block < last; ++block) {
          run_steps(partition.rows.begin(block), partition.rows.end(block), 0, S,
                    w_h.of_block(first, last, block, barrier), bias_sums.data() + block * 3 * S, nullptr, 0);
        }
        return;
      }
      const auto [col_begin, col_end] = owned_columns(partition.columns, first, last);
      run_steps(0, B, col_begin, col_end, w_h.of_block(first, last, first, barrier), bias_sums.data(), &barrier,
                last - first);
    });
    scalar_t* grad_bias_data = grad_bias.mutable_data_ptr<scalar_t>();
    for (int64_t col = 0; col < 3 * S; ++col) {
      opmath_t sum = 0;
      for (int64_t block = 0; block < bias_rows; ++block) {
        sum += bias_sums[block * 3 * S + col];
      }
      grad_bias_data[col] = static_cast<scalar_t>(sum);
    }

    // d_W = sum over steps of d_gates_t^T [h_{t-1} | x_t], over all T*B rows
    // at once.  h_{t-1} is output of the step before (in the direction's
    // order), or h0 for the first step: so the h columns take two GEMMs.
    scalar_t* grad_weights_data = grad_weights.mutable_data_ptr<scalar_t>();
    const scalar_t* output_data = output.const_data_ptr<scalar_t>();
    const int64_t step_rows = B, later_rows = (T - 1) * B;
    // Forward: step t >= 1 started from output[t-1]; reversed: step t <= T-2 from output[t+1].
    const scalar_t* later_grad_gates = reverse ? grad_gates_data : grad_gates_data + step_rows * 3 * S;
    const scalar_t* earlier_output = reverse ? output_data + step_rows * S : output_data;
    // Part `part` of `parts` of the GEMMs that need no h0: its share of d_W's rows (both the h and
    // the x columns) and of d_input's.
    const auto gradient_part = [&](int64_t part, int64_t parts) {
      const int64_t w_begin = part * 3 * S / parts, w_end = (part + 1) * 3 * S / parts;
      blas::gemm<scalar_t>(true, false, w_end - w_begin, S, later_rows, later_grad_gates + w_begin, 3 * S,
                           earlier_output, S, false, grad_weights_data + w_begin * ldw, ldw);
      blas::gemm<scalar_t>(true, false, w_end - w_begin, I, T * B, grad_gates_data + w_begin, 3 * S,
                           input.const_data_ptr<scalar_t>(), I, false, grad_weights_data + w_begin * ldw + S, ldw);
      if (needs_grad_input) {
        const int64_t x_begin = part * T * B / parts, x_end = (part + 1) * T * B / parts;
        blas::gemm<scalar_t>(false, false, x_end - x_begin, I, 3 * S, grad_gates_data + x_begin * 3 * S, 3 * S,
                             w + S, ldw, false, grad_input.mutable_data_ptr<scalar_t>() + x_begin * I, I);
      }
    };
    // float32: each thread a share of all three GEMMs' rows, on its own, in one parallel region:
    // at small sizes MKL's threads gained less on each GEMM than a share of its rows run alone,
    // and each GEMM was a region of its own (benchmarks/results/cpu_sequence.md, "the operators'
    // rest taken apart").  Other dtypes (torch's mm for bfloat16) keep their threaded GEMMs.
    const int64_t parts =
        std::is_same_v<scalar_t, float>
            ? std::clamp<int64_t>(T * B * 3 * S * (S + 2 * I) / kMinMacsPerThread, 1,
                                  in_parallel_region() ? 1 : num_threads())
            : 1;
    if (parts > 1) {
      parallel_for(0, parts, 1, [&](int64_t first, int64_t last) {
        const blas::SingleThreaded single_threaded(true);
        for (int64_t part = first; part < last; ++part) {
          gradient_part(part, parts);
        }
      });
    } else {
      gradient_part(0, 1);
    }
    // The steps that started from h0: t = 0 forward; reversed, each row's own
    // last valid step (T-1 without lengths).  Rows past their length have
    // zero d_gates, so output's zeros there add nothing above.  A zero h0
    // adds nothing (see all_zero).
    if (const scalar_t* h0_data = h0.const_data_ptr<scalar_t>(); !all_zero(h0_data, B * S)) {
      const scalar_t* first_grad_gates = grad_gates_data + (reverse ? (T - 1) * B * 3 * S : 0);
      std::vector<scalar_t> gathered;
      if (reverse && lengths_data != nullptr) {
        gathered.resize(B * 3 * S);
        for (int64_t row = 0; row < B; ++row) {
          std::memcpy(gathered.data() + row * 3 * S, grad_gates_data + ((lengths_data[row] - 1) * B + row) * 3 * S,
                      3 * S * sizeof(scalar_t));
        }
        first_grad_gates = gathered.data();
      }
      blas::gemm<scalar_t>(true, false, 3 * S, S, B, first_grad_gates, 3 * S, h0_data, S, true, grad_weights_data,
                           ldw);
    }
  });
  return result(grad_input, grad_weights, grad_bias);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(lltm_cpu, CPU, m) {
  m.impl("sequence_forward", TORCH_BOX(&sequence_forward));
  m.impl("sequence_backward", TORCH_BOX(&sequence_backward));
}

}  // namespace lltm_cpu
