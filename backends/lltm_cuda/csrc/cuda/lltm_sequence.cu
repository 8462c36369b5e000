// CUDA implementations of lltm_cuda::sequence_forward and lltm_cuda::sequence_backward: one LLTM
// layer in one direction over T steps, the time loop in C++ (never a Python frame per step).
//
// The algorithm is lltm-ref's (backends/lltm_ref): with X_t = [h_{t-1} | x_t] and W = [W_h | W_x],
//   forward:  gates = x W_x^T + b for all T*B rows in one GEMM; then per step one GEMM
//             gates[t] += h W_h^T, in place in step t's slice, and ONE fused pointwise kernel;
//   backward: per step ONE fused pointwise kernel (d_gates[t], and the cell's gradient) and one
//             GEMM d_h = d_gates[t] W_h; after the loop d_W, d_input and d_bias over all steps.
// Every GEMM is ATen's (cuBLAS, allow_tf32 honoured) and everything runs on the current stream.
//
// With needs_backward (training) it saves the gates before activation (T, B, 3S: the GEMMs' own output, so keeping them costs no
// traffic; the backward recomputes sigmoid and elu, free in a memory-bound kernel) and tanh(c_t)
// (T, B, S).  With the input and output lltm-core holds that is (5S + I)·T·B elements, under the
// contract's (6S + I)·T·B.  No cell is kept: with no forget gate d c_{t-1} = d c_t (+ the step's
// own term), so the backward never needs c_t itself.  Without it (inference, contract v3) nothing
// is kept: no tanh(c_t), and the input is projected a chunk of steps at a time into one reused
// (chunk, B, 3S) buffer, so the memory is the output plus a workspace that does not grow with T.
//
// The cell state and its gradient run from step to step in float for float16/bfloat16 (they never
// meet a GEMM, so their type is free), rounded once at the end: T roundings fewer than storing them.
#include "lltm_common.cuh"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/sum.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <tuple>

namespace {

using namespace lltm_cuda;

// Whether row `row` takes part in step `step`: with lengths, only steps t < lengths[row] do (in
// either direction; reversed, a row starts at its own last step).  A vector never crosses a row.
__device__ __forceinline__ bool takes_part(const int64_t* lengths, int64_t row, int64_t step) {
  return lengths == nullptr || step < lengths[row];
}

// One forward step over the (B, S) elements.  gates is step t's slice (GEMMs done), h and cell the
// running state (read, then overwritten), output and tanh_cell step t's slices; tanh_cell is null
// when nothing is kept for a backward.  A row not taking part keeps its state and outputs zero.
template <typename scalar_t, int VEC>
__global__ void sequence_forward_step_kernel(
    const scalar_t* __restrict__ gates, scalar_t* __restrict__ h, at::opmath_type<scalar_t>* __restrict__ cell,
    scalar_t* __restrict__ output, scalar_t* __restrict__ tanh_cell, const int64_t* __restrict__ lengths,
    int64_t step, int64_t numel, int64_t state_size) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * VEC;
  for (int64_t e = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC; e < numel; e += stride) {
    Vec<scalar_t, VEC> new_h, tanh_c;
    if (!takes_part(lengths, e / state_size, step)) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        new_h.v[k] = scalar_t(0);
      }
      store<VEC>(output + e, new_h);
      if (tanh_cell != nullptr) {
        store<VEC>(tanh_cell + e, new_h);  // never read; written so the saved tensor holds no stale memory
      }
      continue;
    }
    const int64_t g = gate_offset(e, state_size);
    const auto pre_i = load<VEC>(gates + g);
    const auto pre_o = load<VEC>(gates + g + state_size);
    const auto pre_z = load<VEC>(gates + g + 2 * state_size);
    auto c = load<VEC>(cell + e);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const auto out = cell_forward<opmath_t>(pre_i.v[k], pre_o.v[k], pre_z.v[k], c.v[k]);
      c.v[k] = out.cell;
      tanh_c.v[k] = out.tanh_cell;
      new_h.v[k] = out.h;
    }
    store<VEC>(cell + e, c);
    store<VEC>(h + e, new_h);
    store<VEC>(output + e, new_h);
    if (tanh_cell != nullptr) {
      store<VEC>(tanh_cell + e, tanh_c);
    }
  }
}

// One backward step.  grad_h and grad_cell hold the gradients of the state after step t; grad_cell
// leaves holding the one before it.  grad_h is finished by the GEMM that follows (d_gates[t] W_h):
// without lengths that GEMM overwrites it; with lengths it adds, so a row taking part has its
// grad_h zeroed here and a row not taking part keeps it (its d_gates are zero), with no mask in
// the GEMM.
template <typename scalar_t, int VEC>
__global__ void sequence_backward_step_kernel(
    const scalar_t* __restrict__ grad_output, const scalar_t* __restrict__ gates,
    const scalar_t* __restrict__ tanh_cell, scalar_t* __restrict__ grad_h,
    at::opmath_type<scalar_t>* __restrict__ grad_cell, scalar_t* __restrict__ d_gates,
    const int64_t* __restrict__ lengths, int64_t step, int64_t numel, int64_t state_size) {
  using opmath_t = at::opmath_type<scalar_t>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * VEC;
  for (int64_t e = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC; e < numel; e += stride) {
    const int64_t g = gate_offset(e, state_size);
    Vec<scalar_t, VEC> d_i, d_o, d_z;
    if (!takes_part(lengths, e / state_size, step)) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        d_i.v[k] = scalar_t(0);
      }
      store<VEC>(d_gates + g, d_i);
      store<VEC>(d_gates + g + state_size, d_i);
      store<VEC>(d_gates + g + 2 * state_size, d_i);
      continue;
    }
    const auto pre_i = load<VEC>(gates + g);
    const auto pre_o = load<VEC>(gates + g + state_size);
    const auto pre_z = load<VEC>(gates + g + 2 * state_size);
    const auto tanh_c = load<VEC>(tanh_cell + e);
    const auto dh = load<VEC>(grad_h + e);
    const auto d_out = load<VEC>(grad_output + e);
    auto dc = load<VEC>(grad_cell + e);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      // The gradient of h_t: from the output at step t and from the steps after it.
      const opmath_t grad_h_t = opmath_t(dh.v[k]) + opmath_t(d_out.v[k]);
      const auto grad = cell_backward<opmath_t>(pre_i.v[k], pre_o.v[k], pre_z.v[k], tanh_c.v[k], grad_h_t, dc.v[k]);
      d_i.v[k] = grad.d_i;
      d_o.v[k] = grad.d_o;
      d_z.v[k] = grad.d_z;
      dc.v[k] = grad.d_old_cell;
    }
    store<VEC>(d_gates + g, d_i);
    store<VEC>(d_gates + g + state_size, d_o);
    store<VEC>(d_gates + g + 2 * state_size, d_z);
    store<VEC>(grad_cell + e, dc);
    if (lengths != nullptr) {
      Vec<scalar_t, VEC> zero;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        zero.v[k] = scalar_t(0);
      }
      store<VEC>(grad_h + e, zero);
    }
  }
}

void check_lengths(const char* op, const std::optional<at::Tensor>& lengths, const at::Tensor& like, int64_t batch) {
  if (!lengths.has_value()) {
    return;
  }
  const at::Tensor& l = *lengths;
  TORCH_CHECK(rt::on_device(l) && l.device() == like.device(), op, ": lengths must be on ", like.device(), ", got ",
              l.device());
  TORCH_CHECK(l.scalar_type() == at::kLong, op, ": lengths must be int64, got ", l.scalar_type());
  check_shape(op, {l, "lengths"}, {batch});
  TORCH_CHECK(l.is_contiguous(), op, ": lengths must be contiguous");
}

// Rows of the input projection one chunk holds when nothing is kept for a backward: a few
// thousand rows keep the GEMM efficient, and the (chunk, B, 3S) buffer small beside the output.
constexpr int64_t kInferenceChunkRows = 2048;

const int64_t* lengths_ptr(const std::optional<at::Tensor>& lengths) {
  return lengths.has_value() ? lengths->const_data_ptr<int64_t>() : nullptr;
}

// A fresh (B, S) copy of `t` in the type the cell state runs in (float for the half types).
at::Tensor opmath_copy(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options().dtype(at::toOpMathType(t.scalar_type()))).copy_(t);
}

// The cell state (or its gradient) as the dtype of `like`: itself when it already is (it is new memory).
at::Tensor as_dtype_of(const at::Tensor& t, const at::Tensor& like) {
  return t.scalar_type() == like.scalar_type() ? t : t.to(like.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> lltm_sequence_forward_cuda(
    const at::Tensor& input, const at::Tensor& weights, const at::Tensor& bias, const at::Tensor& h0,
    const at::Tensor& c0, const std::optional<at::Tensor>& lengths, bool reverse, bool needs_backward) {
  constexpr const char* op = "lltm_cuda::sequence_forward";
  check_args(op, {{input, "input"}, {weights, "weights"}, {bias, "bias"}, {h0, "h0"}, {c0, "c0"}});
  TORCH_CHECK(input.dim() == 3, op, ": input must be 3-D (time, batch, input_features), got shape ", input.sizes());
  TORCH_CHECK(h0.dim() == 2, op, ": h0 must be 2-D (batch, state_size), got shape ", h0.sizes());
  const int64_t T = input.size(0), B = input.size(1), I = input.size(2), S = h0.size(1);
  check_shape(op, {weights, "weights"}, {3 * S, S + I});
  check_shape(op, {bias, "bias"}, {3 * S});
  check_shape(op, {h0, "h0"}, {B, S});
  check_shape(op, {c0, "c0"}, {B, S});
  check_lengths(op, lengths, input, B);

  const rt::DeviceGuard device_guard(input.device());
  const at::Tensor w_h_t = weights.narrow(1, 0, S).t();  // (S, 3S), a strided view cuBLAS reads as it is
  const at::Tensor w_x_t = weights.narrow(1, S, I).t();  // (I, 3S)
  // The input projection, bias folded in: for a backward every step's at once (the one big GEMM,
  // its output saved), else a chunk of steps at a time into the same buffer.
  const int64_t chunk = needs_backward || B == 0 ? T : std::clamp((kInferenceChunkRows + B - 1) / B, int64_t(1), T);
  at::Tensor gates = at::empty({chunk, B, 3 * S}, input.options());
  at::Tensor output = at::empty({T, B, S}, input.options());
  at::Tensor tanh_cell = needs_backward ? at::empty({T, B, S}, input.options()) : input.new_empty({0});
  at::Tensor h = h0.clone();       // the running state; h_n when the loop ends
  at::Tensor cell = opmath_copy(c0);
  const int64_t numel = B * S;
  const rt::Stream stream = rt::current_stream();

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), op, [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    // Every per-step slice starts a multiple of B*S (or B*3S) elements past its tensor's start, so
    // the bases decide the vector path for all steps at once.
    scalar_t* const tanh_cell_base = needs_backward ? tanh_cell.mutable_data_ptr<scalar_t>() : nullptr;
    launch_pointwise<scalar_t>(
        numel, S,
        {buffer(gates.const_data_ptr<scalar_t>()), buffer(output.const_data_ptr<scalar_t>()),
         buffer<scalar_t>(tanh_cell_base), buffer(h.const_data_ptr<scalar_t>()), buffer(cell.const_data_ptr<opmath_t>())},
        [&](auto vec) {
          constexpr int VEC = decltype(vec)::value;
          const auto kernel = sequence_forward_step_kernel<scalar_t, VEC>;
          const int64_t blocks = grid_size(kernel, numel / VEC, input.get_device());  // once, not per step
          int64_t chunk_first = 0;  // the step whose gates sit at gates[0]
          for (int64_t k = 0; k < T; ++k) {
            const int64_t t = reverse ? T - 1 - k : k;
            if (k % chunk == 0) {  // project the next chunk of steps, in the order they run
              const int64_t n = std::min(chunk, T - k);
              chunk_first = reverse ? t - n + 1 : t;
              at::Tensor chunk_gates = gates.narrow(0, 0, n).view({n * B, 3 * S});
              at::addmm_out(chunk_gates, bias, input.narrow(0, chunk_first, n).view({n * B, I}), w_x_t);
            }
            at::Tensor step_gates = gates.select(0, t - chunk_first);  // contiguous (B, 3S): a GEMM output as it is
            at::addmm_out(step_gates, step_gates, h, w_h_t);
            rt::launch(kernel, blocks, rt::threads_per_block(), stream, step_gates.const_data_ptr<scalar_t>(),
                       h.mutable_data_ptr<scalar_t>(), cell.mutable_data_ptr<opmath_t>(),
                       output.mutable_data_ptr<scalar_t>() + t * numel,
                       tanh_cell_base == nullptr ? nullptr : tanh_cell_base + t * numel, lengths_ptr(lengths), t,
                       numel, S);
          }
        });
  });
  if (!needs_backward) {
    return {output, h, as_dtype_of(cell, input), input.new_empty({0}), tanh_cell};  // tanh_cell is empty too
  }
  return {output, h, as_dtype_of(cell, input), gates, tanh_cell};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> lltm_sequence_backward_cuda(
    const at::Tensor& grad_output_arg, const at::Tensor& grad_h_n, const at::Tensor& grad_c_n,
    const at::Tensor& weights, const at::Tensor& input, const at::Tensor& h0, const at::Tensor& output,
    const std::optional<at::Tensor>& lengths, const at::Tensor& gates, const at::Tensor& tanh_cell, bool reverse,
    bool needs_grad_input) {
  constexpr const char* op = "lltm_cuda::sequence_backward";
  // Output gradients come as autograd makes them (a sum's is expanded, stride 0); the kernel
  // reads them densely.  The state gradients are copied anyway, into the running buffers.
  const at::Tensor grad_output = grad_output_arg.contiguous();
  check_args(op, {{grad_output, "grad_output"}, {weights, "weights"}, {input, "input"}, {h0, "h0"},
                  {output, "output"}, {gates, "gates"}, {tanh_cell, "tanh_cell"}});
  TORCH_CHECK(input.dim() == 3, op, ": input must be 3-D (time, batch, input_features), got shape ", input.sizes());
  TORCH_CHECK(h0.dim() == 2, op, ": h0 must be 2-D (batch, state_size), got shape ", h0.sizes());
  const int64_t T = input.size(0), B = input.size(1), I = input.size(2), S = h0.size(1);
  check_shape(op, {weights, "weights"}, {3 * S, S + I});
  check_shape(op, {grad_output, "grad_output"}, {T, B, S});
  check_shape(op, {output, "output"}, {T, B, S});
  check_shape(op, {tanh_cell, "tanh_cell"}, {T, B, S});
  check_shape(op, {gates, "gates"}, {T, B, 3 * S});
  for (const Arg& arg : {Arg{grad_h_n, "grad_h_n"}, Arg{grad_c_n, "grad_c_n"}}) {
    TORCH_CHECK(arg.tensor.device() == input.device() && arg.tensor.scalar_type() == input.scalar_type(), op, ": ",
                arg.name, " must be ", input.scalar_type(), " on ", input.device());
    check_shape(op, arg, {B, S});
  }
  check_lengths(op, lengths, input, B);
  TORCH_CHECK(T >= 1, op, ": a sequence needs at least one step");

  const rt::DeviceGuard device_guard(input.device());
  const at::Tensor w_h = weights.narrow(1, 0, S);  // (3S, S), strided: cuBLAS reads it as it is
  at::Tensor d_gates = at::empty_like(gates);
  at::Tensor grad_h = grad_h_n.clone(at::MemoryFormat::Contiguous);  // running; grad_h0 when the loop ends
  at::Tensor grad_cell = opmath_copy(grad_c_n);
  const int64_t numel = B * S;
  const rt::Stream stream = rt::current_stream();

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, input.scalar_type(), op, [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    launch_pointwise<scalar_t>(
        numel, S,
        {buffer(grad_output.const_data_ptr<scalar_t>()), buffer(gates.const_data_ptr<scalar_t>()),
         buffer(tanh_cell.const_data_ptr<scalar_t>()), buffer(grad_h.const_data_ptr<scalar_t>()),
         buffer(grad_cell.const_data_ptr<opmath_t>()), buffer(d_gates.const_data_ptr<scalar_t>())},
        [&](auto vec) {
          constexpr int VEC = decltype(vec)::value;
          const auto kernel = sequence_backward_step_kernel<scalar_t, VEC>;
          const int64_t blocks = grid_size(kernel, numel / VEC, input.get_device());
          for (int64_t k = 0; k < T; ++k) {
            const int64_t t = reverse ? k : T - 1 - k;  // the forward's steps, last first
            at::Tensor step_d_gates = d_gates.select(0, t);
            rt::launch(kernel, blocks, rt::threads_per_block(), stream,
                       grad_output.const_data_ptr<scalar_t>() + t * numel,
                       gates.const_data_ptr<scalar_t>() + 3 * t * numel, tanh_cell.const_data_ptr<scalar_t>() + t * numel,
                       grad_h.mutable_data_ptr<scalar_t>(), grad_cell.mutable_data_ptr<opmath_t>(),
                       step_d_gates.mutable_data_ptr<scalar_t>(), lengths_ptr(lengths), t, numel, S);
            if (lengths.has_value()) {
              at::addmm_out(grad_h, grad_h, step_d_gates, w_h);  // see the kernel: rows that took part were zeroed
            } else {
              at::mm_out(grad_h, step_d_gates, w_h);
            }
          }
        });
  });

  // d_W = d_gates^T [h_prev | x] over all T*B rows, written as its two column blocks (strided
  // views of grad_weights that cuBLAS writes as they are), so no (T, B, S+I) [h_prev | x] is built.
  const at::Tensor d_gates_2d = d_gates.view({T * B, 3 * S});
  at::Tensor grad_weights = at::empty_like(weights);
  at::Tensor grad_w_h = grad_weights.narrow(1, 0, S);
  at::Tensor grad_w_x = grad_weights.narrow(1, S, I);
  at::mm_out(grad_w_x, d_gates_2d.t(), input.view({T * B, I}));
  // h_prev of step t is the output of the step before it (t-1, or t+1 reversed), except at a row's
  // first step, where it is h0: one GEMM over the T-1 steps that have a step before them, plus one
  // B-row GEMM for h0.  Reversed with lengths, a row's first step is lengths[b]-1; the term the big
  // GEMM gives it there is zero (output[lengths[b]] is a zero output), and its d_gates are gathered.
  const at::Tensor later = reverse ? d_gates.narrow(0, 0, T - 1) : d_gates.narrow(0, 1, T - 1);
  const at::Tensor before = reverse ? output.narrow(0, 1, T - 1) : output.narrow(0, 0, T - 1);
  at::mm_out(grad_w_h, later.reshape({(T - 1) * B, 3 * S}).t(), before.reshape({(T - 1) * B, S}));
  at::Tensor first;
  if (!reverse) {
    first = d_gates.select(0, 0);
  } else if (!lengths.has_value()) {
    first = d_gates.select(0, T - 1);
  } else {
    // clamp: lltm-core passes lengths in [1, T]; a direct call with others must not read out of bounds.
    const at::Tensor index = lengths->sub(1).clamp(0, T - 1).view({1, B, 1}).expand({1, B, 3 * S});
    first = at::gather(d_gates, 0, index).squeeze(0);
  }
  at::addmm_out(grad_w_h, grad_w_h, first.t(), h0);
  at::Tensor grad_input =
      needs_grad_input ? at::mm(d_gates_2d, weights.narrow(1, S, I)).view({T, B, I}) : weights.new_empty({0});
  return {grad_input, grad_weights, d_gates_2d.sum(0), grad_h, as_dtype_of(grad_cell, input)};
}

}  // namespace

TORCH_LIBRARY_IMPL(lltm_cuda, LLTM_CUDA_DISPATCH_KEY, m) {
  m.impl("sequence_forward", &lltm_sequence_forward_cuda);
  m.impl("sequence_backward", &lltm_sequence_backward_cuda);
}
