// CPU kernels of lltm_cpu::sequence_forward and lltm_cpu::sequence_backward:
// one LLTM layer in one direction over a whole sequence, the time loop in C++.
//
// The algorithm is lltm-ref's sequence_forward / sequence_backward (the
// reference this must match), with the same saved tensors: the activated
// gates (T, B, 3S) and tanh(c_t) (T, B, S).
//
// Forward: one GEMM projects the input of all T*B rows into a gates buffer;
// then each step adds its recurrent GEMM h_{t-1} W_h^T into its slice of that
// buffer (bfloat16: into a float buffer of its own) and one fused pointwise
// pass (pointwise_impl.h) adds the bias and turns it into the gates, c_t and
// h_t.
// Inference (needs_backward false, contract v3) saves nothing: it projects
// the input a chunk of steps at a time into one reused buffer and writes no
// tanh(c_t), so its memory is the output plus that buffer.
// Backward: each step one fused pass gives d_gates_t (and sums the bias
// gradient as it goes) and one GEMM d_gates_t W_h the gradient of h_{t-1};
// after the loop, GEMMs over all steps at once give d_W and d_input.
//
// Threads: a batch row's recurrence reads only that row of the previous
// step, so the time loop runs once per block of batch rows, one block per
// thread, with no synchronisation between steps and each block's GEMMs
// single-threaded, on its own copy of W_h laid out for them (see
// blas::RightOperand).  The GEMMs over all steps run before and after the
// loop, on all threads.  Small problems run on one thread.
//
// Each GEMM's route (brgemm, lltm-cpu's bfloat16 kernel, MKL, oneDNN or
// ATen) is the fastest measured for its shape at the first call: see blas.h.
// bfloat16: the recurrent products, the cell state and the carried gradients
// of h and c stay float; what is returned or saved is bfloat16.
//
// Nothing is allocated inside the loop and no ATen operator is called there,
// except GEMMs on the ATen route (where it measured fastest, or where torch
// has no MKL: see blas.h).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "blas.h"
#include "kernel_common.h"

namespace lltm_cpu {
namespace {

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
  int64_t max_rows() const { return count == 0 ? 0 : at::divup(batch, count); }
};

// `macs_per_row`: the recurrent GEMMs' work for one row, all steps;
// `step_gemm_macs`: one step's GEMM for the whole batch.
RowBlocks split_rows(int64_t batch, int64_t macs_per_row, int64_t step_gemm_macs) {
  RowBlocks blocks;
  blocks.batch = batch;
  if (batch == 0) {
    return blocks;
  }
  const int64_t rows_per_thread =
      std::max<int64_t>(1, at::divup(kMinMacsPerThread, std::max<int64_t>(macs_per_row, 1)));
  blocks.count = at::in_parallel_region() ? 1
                                          : std::clamp<int64_t>(batch / rows_per_thread, 1, at::get_num_threads());
  blocks.blas_threads = blocks.count == 1 && step_gemm_macs >= kThreadedStepGemmMacs;
  return blocks;
}

// Runs `body(block, row_begin, row_end)` for each block, one block per thread.
template <typename Body>
void run_blocks(const RowBlocks& blocks, const Body& body) {
  const auto run_block = [&](int64_t block) {
    const blas::SingleThreaded single_threaded(!blocks.blas_threads);
    body(block, blocks.begin(block), blocks.end(block));
  };
  if (blocks.count <= 1) {
    if (blocks.count == 1) {
      run_block(0);
    }
    return;
  }
  // ATen GEMMs (blas.h's fallback) go through the dispatcher, which reads
  // thread-local state that pool threads do not inherit.
  const at::ThreadLocalState caller_state;
  at::parallel_for(0, blocks.count, 1, [&](int64_t first, int64_t last) {
    const at::ThreadLocalStateGuard guard(caller_state);
    for (int64_t block = first; block < last; ++block) {
      run_block(block);
    }
  });
}

// Inference (needs_backward false) keeps no gates for backward: the input is
// projected a chunk of steps at a time into one reused buffer of about this
// many elements (16 MiB of float32), so the forward's memory is its output
// plus this.  On one thread the chunk size hardly matters (T32 B64 I256 S512:
// the same CPU time within 1% for 1 to 8 chunks), but on two each chunk
// boundary makes the threads wait for each other and for the next chunk's
// projection: 2^21 elements (two chunks there) measured 2-24% slower than
// the forward that saves for backward; 2^22 runs that size in one chunk
// (AMD EPYC Zen 5, benchmarks/results/cpu_sequence.md).
constexpr int64_t kInferenceChunkElements = int64_t{1} << 22;

// Steps per chunk: as many as fit kInferenceChunkElements (at least one),
// evened out so that the last chunk is not a sliver.
int64_t inference_chunk_steps(int64_t steps, int64_t batch, int64_t state_size) {
  const int64_t per_step = std::max<int64_t>(batch * 3 * state_size, 1);
  const int64_t fit = std::clamp<int64_t>(kInferenceChunkElements / per_step, 1, steps);
  return at::divup(steps, at::divup(steps, fit));
}

// Checks `lengths` (an int64 CPU tensor (B,) with values in [1, T]) and
// returns it contiguous.
at::Tensor checked_lengths(const at::Tensor& lengths, const char* op, int64_t steps, int64_t batch) {
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == batch, op, ": lengths must have shape [", batch, "], got ",
              lengths.sizes());
  TORCH_CHECK(lengths.scalar_type() == at::kLong && lengths.device().is_cpu(), op,
              ": lengths must be an int64 CPU tensor, got ", lengths.scalar_type(), " on ", lengths.device());
  at::Tensor dense = lengths.contiguous();
  const int64_t* values = dense.const_data_ptr<int64_t>();
  for (int64_t row = 0; row < batch; ++row) {
    TORCH_CHECK(values[row] >= 1 && values[row] <= steps, op, ": lengths must be in [1, ", steps, "], got ",
                values[row], " at ", row);
  }
  return dense;
}

// A contiguous copy of `source` in new memory, which the kernel may write.
at::Tensor fresh_copy(const at::Tensor& source) {
  at::Tensor copy = at::empty(source.sizes(), source.options());
  copy.copy_(source);
  return copy;
}

// The same, in the type the kernels carry state in: float for bfloat16.
at::Tensor state_copy(const at::Tensor& source) {
  at::Tensor copy = at::empty(source.sizes(), source.options().dtype(at::toOpMathType(source.scalar_type())));
  copy.copy_(source);
  return copy;
}

// A state back in `dtype`: itself where it already is (new memory either way).
at::Tensor in_dtype(const at::Tensor& state, at::ScalarType dtype) {
  return state.scalar_type() == dtype ? state : state.to(dtype);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> sequence_forward(
    const at::Tensor& input_arg, const at::Tensor& weights_arg, const at::Tensor& bias_arg, const at::Tensor& h0_arg,
    const at::Tensor& c0_arg, const std::optional<at::Tensor>& lengths_arg, bool reverse, bool needs_backward) {
  constexpr const char* op = "lltm_cpu::sequence_forward";
  TORCH_CHECK(input_arg.dim() == 3, op, ": input must be 3-D (time, batch, input_features), got ", input_arg.sizes());
  TORCH_CHECK(h0_arg.dim() == 2, op, ": h0 must be 2-D (batch, state_size), got ", h0_arg.sizes());
  const int64_t T = input_arg.size(0), B = input_arg.size(1), I = input_arg.size(2), S = h0_arg.size(1);
  check_matrix(weights_arg, op, "weights", 3 * S, S + I);
  TORCH_CHECK(bias_arg.dim() == 1 && bias_arg.size(0) == 3 * S, op, ": bias must have shape [", 3 * S, "], got ",
              bias_arg.sizes());
  check_matrix(h0_arg, op, "h0", B, S);
  check_matrix(c0_arg, op, "c0", B, S);
  check_dtypes(op, {{"input", input_arg}, {"weights", weights_arg}, {"bias", bias_arg}, {"h0", h0_arg},
                    {"c0", c0_arg}});
  // lltm_core passes contiguous tensors, for which these are no-ops.
  const at::Tensor input = input_arg.contiguous();
  const at::Tensor weights = weights_arg.contiguous();
  const at::Tensor bias = bias_arg.contiguous();
  const at::Tensor h0 = h0_arg.contiguous();
  const std::optional<at::Tensor> lengths =
      lengths_arg.has_value() ? std::optional(checked_lengths(*lengths_arg, op, T, B)) : std::nullopt;

  const auto options = input.options();
  at::Tensor output = at::empty({T, B, S}, options);
  // Training: the gates of every step, which backward needs, and the
  // projection's buffer too.  Inference: one chunk's buffer, reused, and no
  // tanh(c_t) at all (the saved slots are empty).
  const int64_t chunk_steps = needs_backward ? T : inference_chunk_steps(T, B, S);
  at::Tensor gates = at::empty({needs_backward ? T : std::min(chunk_steps, T), B, 3 * S}, options);
  at::Tensor tanh_cell = needs_backward ? at::empty({T, B, S}, options) : at::empty({0}, options);
  at::Tensor cell = state_copy(c0_arg);  // the cell state, updated in place step by step
  // With lengths, a row past its length keeps its h, which output (zero
  // there) no longer holds: h_n is then the state the steps update.
  at::Tensor h_n = lengths.has_value() || T == 0 ? fresh_copy(h0) : at::empty({B, S}, options);
  const auto result = [&] {
    return std::tuple{output, h_n, in_dtype(cell, input.scalar_type()), needs_backward ? gates : at::empty({0}, options),
                      tanh_cell};
  };
  if (T == 0 || B == 0) {
    return result();
  }

  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, input.scalar_type(), op, [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    // float and float64 add h W_h^T into the gates buffer; bfloat16's product
    // is float, kept apart until the pointwise pass adds it.
    constexpr bool kSeparateProduct = !std::is_same_v<opmath_t, scalar_t>;
    const scalar_t* w = weights.const_data_ptr<scalar_t>();
    const int64_t ldw = S + I;
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    scalar_t* gates_data = gates.data_ptr<scalar_t>();
    scalar_t* output_data = output.data_ptr<scalar_t>();
    scalar_t* tanh_cell_data = needs_backward ? tanh_cell.data_ptr<scalar_t>() : nullptr;
    opmath_t* cell_data = cell.data_ptr<opmath_t>();
    scalar_t* hidden_data = lengths.has_value() ? h_n.data_ptr<scalar_t>() : nullptr;
    const scalar_t* h0_data = h0.const_data_ptr<scalar_t>();
    const scalar_t* bias_data = bias.const_data_ptr<scalar_t>();
    const int64_t* lengths_data = lengths.has_value() ? lengths->const_data_ptr<int64_t>() : nullptr;
    const auto step_pass = pointwise_kernels<scalar_t>().sequence_forward;

    const RowBlocks blocks = split_rows(B, T * 3 * S * S, B * 3 * S * S);
    const blas::Route route =
        blas::recurrent_route<scalar_t>(/*trans_b=*/true, blocks.max_rows(), 3 * S, S, w, ldw, blocks.blas_threads);
    // Each block's h W_h^T operand, laid out on its own thread at its first
    // chunk, and (bfloat16) its buffer for the product.
    std::vector<std::unique_ptr<blas::RightOperand<scalar_t>>> w_h(blocks.count);
    std::vector<std::vector<opmath_t>> products(blocks.count);
    // The chunks in the order the steps run: step i of that order is t = i,
    // or T-1-i reversed.
    for (int64_t chunk_begin = 0; chunk_begin < T; chunk_begin += chunk_steps) {
      const int64_t chunk_end = std::min(T, chunk_begin + chunk_steps);
      const int64_t first_t = reverse ? T - chunk_end : chunk_begin;  // the chunk's smallest t
      const int64_t rows = (chunk_end - chunk_begin) * B;
      // The chunk's input projection x W_x^T (the pointwise pass adds the bias).
      blas::gemm<scalar_t>(false, true, rows, 3 * S, I, x + first_t * B * I, I, w + S, ldw, false, gates_data, 3 * S);

      run_blocks(blocks, [&](int64_t block, int64_t row_begin, int64_t row_end) {
        const int64_t block_rows = row_end - row_begin;
        if (!w_h[block]) {
          w_h[block] = std::make_unique<blas::RightOperand<scalar_t>>(route, /*trans_b=*/true, blocks.max_rows(),
                                                                      3 * S, S, w, ldw);
          if (kSeparateProduct) {
            products[block].resize(block_rows * 3 * S);
          }
        }
        opmath_t* product = kSeparateProduct ? products[block].data() : nullptr;
        for (int64_t i = chunk_begin; i < chunk_end; ++i) {
          const int64_t t = reverse ? T - 1 - i : i;
          const int64_t first_row = t * B + row_begin;
          // h_{t-1}: the state (with lengths), h0, or the previous step's output.
          const int64_t previous_t = reverse ? t + 1 : t - 1;
          const scalar_t* h_prev = hidden_data != nullptr ? hidden_data + row_begin * S
                                   : i == 0               ? h0_data + row_begin * S
                                                          : output_data + (previous_t * B + row_begin) * S;
          scalar_t* gates_t = gates_data + ((t - first_t) * B + row_begin) * 3 * S;
          // Without a separate product opmath_t is scalar_t: the cast changes nothing.
          w_h[block]->multiply(block_rows, h_prev, S, /*accumulate=*/!kSeparateProduct,
                               kSeparateProduct ? product : reinterpret_cast<opmath_t*>(gates_t), 3 * S);
          const SequenceForwardStep<scalar_t> pass{
              gates_t,
              bias_data,
              product,
              cell_data + row_begin * S,
              hidden_data != nullptr ? hidden_data + row_begin * S : nullptr,
              output_data + first_row * S,
              tanh_cell_data != nullptr ? tanh_cell_data + first_row * S : nullptr,
              lengths_data != nullptr ? lengths_data + row_begin : nullptr,
              t,
              block_rows,
              S};
          step_pass(pass);
        }
      });
    }
  });
  if (!lengths.has_value()) {
    h_n.copy_(output[reverse ? 0 : T - 1]);
  }
  return result();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> sequence_backward(
    const at::Tensor& grad_output_arg, const at::Tensor& grad_h_n, const at::Tensor& grad_c_n,
    const at::Tensor& weights_arg, const at::Tensor& input_arg, const at::Tensor& h0_arg,
    const at::Tensor& output_arg, const std::optional<at::Tensor>& lengths_arg, const at::Tensor& gates_arg,
    const at::Tensor& tanh_cell_arg, bool reverse, bool needs_grad_input) {
  constexpr const char* op = "lltm_cpu::sequence_backward";
  TORCH_CHECK(input_arg.dim() == 3, op, ": input must be 3-D (time, batch, input_features), got ", input_arg.sizes());
  TORCH_CHECK(h0_arg.dim() == 2, op, ": h0 must be 2-D (batch, state_size), got ", h0_arg.sizes());
  const int64_t T = input_arg.size(0), B = input_arg.size(1), I = input_arg.size(2), S = h0_arg.size(1);
  for (const auto& [name, tensor, width] : {std::tuple{"grad_output", &grad_output_arg, S},
                                            std::tuple{"output", &output_arg, S},
                                            std::tuple{"gates", &gates_arg, 3 * S},
                                            std::tuple{"tanh_cell", &tanh_cell_arg, S}}) {
    TORCH_CHECK(tensor->sizes() == at::IntArrayRef({T, B, width}), op, ": ", name, " must have shape [", T, ", ", B,
                ", ", width, "], got ", tensor->sizes());
  }
  check_matrix(grad_h_n, op, "grad_h_n", B, S);
  check_matrix(grad_c_n, op, "grad_c_n", B, S);
  check_matrix(weights_arg, op, "weights", 3 * S, S + I);
  check_matrix(h0_arg, op, "h0", B, S);
  check_dtypes(op, {{"grad_output", grad_output_arg}, {"grad_h_n", grad_h_n}, {"grad_c_n", grad_c_n},
                    {"weights", weights_arg}, {"input", input_arg}, {"h0", h0_arg}, {"output", output_arg},
                    {"gates", gates_arg}, {"tanh_cell", tanh_cell_arg}});
  const at::Tensor weights = weights_arg.contiguous();
  const at::Tensor input = input_arg.contiguous();
  const at::Tensor h0 = h0_arg.contiguous();
  const at::Tensor output = output_arg.contiguous();
  const at::Tensor gates = gates_arg.contiguous();
  const at::Tensor tanh_cell = tanh_cell_arg.contiguous();
  const std::optional<at::Tensor> lengths =
      lengths_arg.has_value() ? std::optional(checked_lengths(*lengths_arg, op, T, B)) : std::nullopt;
  // Autograd's gradient of output.sum() is one value expanded (all strides
  // 0): the pass reads rows of any stride, and a row that is one broadcast
  // value, so only other layouts are copied.
  const at::Tensor grad_output =
      grad_output_arg.stride(2) == 0 || grad_output_arg.stride(2) == 1 ? grad_output_arg : grad_output_arg.contiguous();

  const auto options = input.options();
  // The carried gradients of h and c (float for bfloat16), which end as those of h0 and c0.
  at::Tensor grad_h = state_copy(grad_h_n);
  at::Tensor grad_c = state_copy(grad_c_n);
  const auto result = [&](const at::Tensor& grad_input, const at::Tensor& grad_weights, const at::Tensor& grad_bias) {
    return std::tuple{grad_input, grad_weights, grad_bias, in_dtype(grad_h, input.scalar_type()),
                      in_dtype(grad_c, input.scalar_type())};
  };
  at::Tensor grad_weights = at::empty({3 * S, S + I}, options);
  at::Tensor grad_bias = at::empty({3 * S}, options);
  at::Tensor grad_input = needs_grad_input ? at::empty({T, B, I}, options) : at::empty({0}, options);
  if (T == 0 || B == 0) {
    grad_weights.zero_();
    grad_bias.zero_();
    return result(grad_input, grad_weights, grad_bias);
  }
  at::Tensor grad_gates = at::empty({T, B, 3 * S}, options);

  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, input.scalar_type(), op, [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const scalar_t* w = weights.const_data_ptr<scalar_t>();
    const int64_t ldw = S + I;
    const scalar_t* gates_data = gates.const_data_ptr<scalar_t>();
    const scalar_t* tanh_cell_data = tanh_cell.const_data_ptr<scalar_t>();
    const scalar_t* grad_output_data = grad_output.const_data_ptr<scalar_t>();
    const int64_t grad_output_step_stride = grad_output.stride(0), grad_output_row_stride = grad_output.stride(1);
    const bool grad_output_broadcast_row = grad_output.stride(2) == 0;
    scalar_t* grad_gates_data = grad_gates.data_ptr<scalar_t>();
    opmath_t* grad_h_data = grad_h.data_ptr<opmath_t>();
    opmath_t* grad_c_data = grad_c.data_ptr<opmath_t>();
    const int64_t* lengths_data = lengths.has_value() ? lengths->const_data_ptr<int64_t>() : nullptr;

    // One bias sum per block of rows, added up in block order afterwards
    // (the same order every run).
    std::vector<opmath_t> bias_sums(at::get_num_threads() * 3 * S, opmath_t(0));
    const auto step_pass = pointwise_kernels<scalar_t>().sequence_backward;
    const RowBlocks blocks = split_rows(B, T * 3 * S * S, B * 3 * S * S);
    const blas::Route route =
        blas::recurrent_route<scalar_t>(/*trans_b=*/false, blocks.max_rows(), S, 3 * S, w, ldw, blocks.blas_threads);
    run_blocks(blocks, [&](int64_t block, int64_t row_begin, int64_t row_end) {
      const int64_t rows = row_end - row_begin;
      // d_gates W_h
      const blas::RightOperand<scalar_t> w_h(route, /*trans_b=*/false, blocks.max_rows(), S, 3 * S, w, ldw);
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
            bias_sums.data() + block * 3 * S,
            lengths_data != nullptr ? lengths_data + row_begin : nullptr,
            t,
            rows,
            S};
        step_pass(pass);
        // The gradient of h_{t-1}.  With lengths the pass zeroed the rows
        // that took part, and the rest keep theirs: so add.
        w_h.multiply(rows, grad_gates_t, 3 * S, /*accumulate=*/lengths_data != nullptr, grad_h_rows, S);
      }
    });
    scalar_t* grad_bias_data = grad_bias.data_ptr<scalar_t>();
    for (int64_t col = 0; col < 3 * S; ++col) {
      opmath_t sum = 0;
      for (int64_t block = 0; block < blocks.count; ++block) {
        sum += bias_sums[block * 3 * S + col];
      }
      grad_bias_data[col] = static_cast<scalar_t>(sum);
    }

    // d_W = sum over steps of d_gates_t^T [h_{t-1} | x_t], over all T*B rows
    // at once.  h_{t-1} is output of the step before (in the direction's
    // order), or h0 for the first step: so the h columns take two GEMMs.
    scalar_t* grad_weights_data = grad_weights.data_ptr<scalar_t>();
    const scalar_t* output_data = output.const_data_ptr<scalar_t>();
    const int64_t step_rows = B, later_rows = (T - 1) * B;
    // Forward: step t >= 1 started from output[t-1]; reversed: step t <= T-2 from output[t+1].
    const scalar_t* later_grad_gates = reverse ? grad_gates_data : grad_gates_data + step_rows * 3 * S;
    const scalar_t* earlier_output = reverse ? output_data + step_rows * S : output_data;
    blas::gemm<scalar_t>(true, false, 3 * S, S, later_rows, later_grad_gates, 3 * S, earlier_output, S, false,
                         grad_weights_data, ldw);
    // The steps that started from h0: t = 0 forward; reversed, each row's own
    // last valid step (T-1 without lengths).  Rows past their length have
    // zero d_gates, so output's zeros there add nothing above.
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
    blas::gemm<scalar_t>(true, false, 3 * S, S, B, first_grad_gates, 3 * S, h0.const_data_ptr<scalar_t>(), S, true,
                         grad_weights_data, ldw);
    blas::gemm<scalar_t>(true, false, 3 * S, I, T * B, grad_gates_data, 3 * S, input.const_data_ptr<scalar_t>(), I,
                         false, grad_weights_data + S, ldw);
    if (needs_grad_input) {
      blas::gemm<scalar_t>(false, false, T * B, I, 3 * S, grad_gates_data, 3 * S, w + S, ldw, false,
                           grad_input.data_ptr<scalar_t>(), I);
    }
  });
  return result(grad_input, grad_weights, grad_bias);
}

// The GEMM routes chosen so far in this process, one line per shape (see
// blas.h): for tests, benchmarks and lltm_cpu.gemm_routes().
std::vector<std::string> gemm_routes() { return blas::gemm_routes(); }

}  // namespace

TORCH_LIBRARY_IMPL(lltm_cpu, CPU, m) {
  m.impl("sequence_forward", &sequence_forward);
  m.impl("sequence_backward", &sequence_backward);
}

// It takes no tensor, so no backend key can select it.
TORCH_LIBRARY_IMPL(lltm_cpu, CompositeImplicitAutograd, m) {
  m.impl("gemm_routes", &gemm_routes);
}

}  // namespace lltm_cpu
