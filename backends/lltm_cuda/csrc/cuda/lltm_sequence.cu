// CUDA implementations of lltm_cuda::sequence_forward and lltm_cuda::sequence_backward: one LLTM
// layer in one direction over T steps, the time loop in C++ (never a Python frame per step).
// plan_sequence (lltm_persistent.cu) chooses between the persistent kernels there (the loop in one
// launch, W_h on chip) and the per-step path here; the projection before the loop and the
// gradients' GEMMs after it are this file's for both.
//
// The per-step algorithm is lltm-ref's (backends/lltm_ref): with X_t = [h_{t-1} | x_t] and W = [W_h | W_x],
//   forward:  gates = x W_x^T + b for all T*B rows in one GEMM; then per step one GEMM
//             gates[t] += h W_h^T, in place in step t's slice, and ONE fused pointwise kernel;
//   backward: per step ONE fused pointwise kernel (d_gates[t], and the cell's gradient) and one
//             GEMM d_h = d_gates[t] W_h; after the loop d_W, d_input and d_bias over all steps.
// Every GEMM is torch's (cuBLAS through the stable C shim, allow_tf32 honoured) and everything runs
// on the current stream.
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
#include "lltm_persistent.cuh"

#include <torch/csrc/stable/library.h>

#include <algorithm>
#include <optional>
#include <tuple>

namespace {

using namespace lltm_cuda;

// One forward step over the (B, S) elements.  gates is step t's slice (GEMMs done), h and cell the
// running state (read, then overwritten), output and tanh_cell step t's slices; tanh_cell is null
// when nothing is kept for a backward.  A row not taking part keeps its state and outputs zero.
template <typename scalar_t, int VEC>
__global__ void sequence_forward_step_kernel(
    const scalar_t* __restrict__ gates, scalar_t* __restrict__ h, opmath_type<scalar_t>* __restrict__ cell,
    scalar_t* __restrict__ output, scalar_t* __restrict__ tanh_cell, const int64_t* __restrict__ lengths,
    int64_t step, int64_t numel, int64_t state_size) {
  using opmath_t = opmath_type<scalar_t>;
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
    const auto pre = load_gates<VEC>(gates, e, state_size);
    auto c = load<VEC>(cell + e);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const auto out = cell_forward<opmath_t>(pre.i.v[k], pre.o.v[k], pre.z.v[k], c.v[k]);
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
    opmath_type<scalar_t>* __restrict__ grad_cell, scalar_t* __restrict__ d_gates,
    const int64_t* __restrict__ lengths, int64_t step, int64_t numel, int64_t state_size) {
  using opmath_t = opmath_type<scalar_t>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * VEC;
  for (int64_t e = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC; e < numel; e += stride) {
    GateVecs<scalar_t, VEC> d;
    if (!takes_part(lengths, e / state_size, step)) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        d.i.v[k] = d.o.v[k] = d.z.v[k] = scalar_t(0);
      }
      store_gates<VEC>(d_gates, e, state_size, d);
      continue;
    }
    const auto pre = load_gates<VEC>(gates, e, state_size);
    const auto tanh_c = load<VEC>(tanh_cell + e);
    const auto dh = load<VEC>(grad_h + e);
    const auto d_out = load<VEC>(grad_output + e);
    auto dc = load<VEC>(grad_cell + e);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      // The gradient of h_t: from the output at step t and from the steps after it.
      const opmath_t grad_h_t = opmath_t(dh.v[k]) + opmath_t(d_out.v[k]);
      const auto grad = cell_backward<opmath_t>(pre.i.v[k], pre.o.v[k], pre.z.v[k], tanh_c.v[k], grad_h_t, dc.v[k]);
      d.i.v[k] = grad.d_i;
      d.o.v[k] = grad.d_o;
      d.z.v[k] = grad.d_z;
      dc.v[k] = grad.d_old_cell;
    }
    store_gates<VEC>(d_gates, e, state_size, d);
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

void check_lengths(const char* op, const std::optional<Tensor>& lengths, const Tensor& like, int64_t batch) {
  if (!lengths.has_value()) {
    return;
  }
  const Tensor& l = *lengths;
  STD_TORCH_CHECK(rt::on_device(l) && l.device() == like.device(), op, ": lengths must be on ",
                  describe(like.device()), ", got ", describe(l.device()));
  STD_TORCH_CHECK(l.scalar_type() == ScalarType::Long, op, ": lengths must be int64, got ", l.scalar_type());
  check_shape(op, {l, "lengths"}, {batch});
  STD_TORCH_CHECK(l.is_contiguous(), op, ": lengths must be contiguous");
}

// Rows of the input projection one chunk holds when nothing is kept for a backward: a few
// thousand rows keep the GEMM efficient, and the (chunk, B, 3S) buffer small beside the output.
constexpr int64_t kInferenceChunkRows = 2048;

// A fresh (B, S) copy of `t` in the type the cell state runs in (float for the half types).
Tensor opmath_copy(const Tensor& t) { return ops::copy_as(t, opmath_scalar_type(t.scalar_type())); }

using ops::as_dtype_of;

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> lltm_sequence_forward_cuda(
    Tensor input, Tensor weights, Tensor bias, Tensor h0, Tensor c0, std::optional<Tensor> lengths, bool reverse,
    bool needs_backward) {
  constexpr const char* op = "lltm_cuda::sequence_forward";
  check_args(op, {{input, "input"}, {weights, "weights"}, {bias, "bias"}, {h0, "h0"}, {c0, "c0"}});
  STD_TORCH_CHECK(input.dim() == 3, op, ": input must be 3-D (time, batch, input_features), got shape ",
                  describe(input.sizes()));
  STD_TORCH_CHECK(h0.dim() == 2, op, ": h0 must be 2-D (batch, state_size), got shape ", describe(h0.sizes()));
  const int64_t T = input.size(0), B = input.size(1), I = input.size(2), S = h0.size(1);
  check_shape(op, {weights, "weights"}, {3 * S, S + I});
  check_shape(op, {bias, "bias"}, {3 * S});
  check_shape(op, {h0, "h0"}, {B, S});
  check_shape(op, {c0, "c0"}, {B, S});
  check_lengths(op, lengths, input, B);

  const int32_t device = input.get_device_index();
  const rt::DeviceGuard device_guard(device);
  const Tensor w_h_t = ops::t(ops::narrow(weights, 1, 0, S));  // (S, 3S), a strided view cuBLAS reads as it is
  const Tensor w_x_t = ops::t(ops::narrow(weights, 1, S, I));  // (I, 3S)
  // The input projection, bias folded in: for a backward every step's at once (the one big GEMM,
  // its output saved), else a chunk of steps at a time into the same buffer.
  const int64_t chunk = needs_backward || B == 0 ? T : std::clamp((kInferenceChunkRows + B - 1) / B, int64_t(1), T);
  const ScalarType dtype = input.scalar_type();
  const Tensor gates = ops::empty({chunk, B, 3 * S}, dtype, input);
  const Tensor output = ops::empty({T, B, S}, dtype, input);
  const Tensor tanh_cell = needs_backward ? ops::empty({T, B, S}, dtype, input) : ops::empty({0}, dtype, input);
  const SequencePlan plan = plan_sequence(device, dtype, B, S);
  // The running state; h_n and c_n when the loop ends.  The persistent kernels read h0 and c0 at
  // the first step themselves: no copy kernels (each a kernel boundary) before their loop.
  const bool state_in_kernel = plan.persistent && T > 0;
  const Tensor h = state_in_kernel ? ops::empty({B, S}, dtype, input) : ops::copy_as(h0, dtype);
  const Tensor cell = state_in_kernel ? ops::empty({B, S}, opmath_scalar_type(dtype), input) : opmath_copy(c0);
  // c_n in the input's dtype: the persistent kernels write it at their last step (in float32 it is
  // the running cell itself); the per-step path rounds the cell once, after its loop.
  const Tensor c_n = state_in_kernel && cell.scalar_type() != dtype ? ops::empty({B, S}, dtype, input) : cell;
  const int64_t numel = B * S;
  const rt::Stream stream = rt::current_stream(device);
  // Projects the chunk of steps that starts at step k (in the order they run) into gates[0..n);
  // returns the step whose gates sit at gates[0].
  auto project = [&](int64_t k) {
    const int64_t n = std::min(chunk, T - k);
    const int64_t first = reverse ? T - k - n : k;
    const Tensor chunk_gates = torch::stable::view(ops::narrow(gates, 0, 0, n), {n * B, 3 * S});
    rt::addmm_out(chunk_gates, bias, torch::stable::view(ops::narrow(input, 0, first, n), {n * B, I}), w_x_t);
    return first;
  };

  if (plan.persistent) {
    for (int64_t k = 0; k < T; k += chunk) {  // one launch for the whole loop when all steps are projected
      const int64_t first = project(k);
      persistent_forward(plan, {weights, gates, h, cell, output, needs_backward ? std::optional<Tensor>(tanh_cell) : std::nullopt,
                                lengths, T, k, std::min(T, k + chunk), first, reverse, needs_backward, h0, c0, c_n});
    }
  } else {
    LLTM_CUDA_DISPATCH_FLOATING(dtype, op, [&] {
      using opmath_t = opmath_type<scalar_t>;
      // Every per-step slice starts a multiple of B*S (or B*3S) elements past its tensor's start, so
      // the bases decide the vector path for all steps at once.
      scalar_t* const tanh_cell_base = needs_backward ? tanh_cell.mutable_data_ptr<scalar_t>() : nullptr;
      launch_pointwise<scalar_t>(
          numel, S,
          {buffer(gates), buffer(output), buffer<scalar_t>(tanh_cell_base), buffer(h), buffer(cell)},
          [&](auto vec) {
            const auto kernel = sequence_forward_step_kernel<scalar_t, decltype(vec)::value>;
            const int64_t blocks = grid_size(kernel, numel / vec, input.get_device());  // once, not per step
            int64_t chunk_first = 0;  // the step whose gates sit at gates[0]
            for (int64_t k = 0; k < T; ++k) {
              const int64_t t = reverse ? T - 1 - k : k;
              if (k % chunk == 0) {
                chunk_first = project(k);
              }
              // contiguous (B, 3S): a GEMM output as it is
              const Tensor step_gates = ops::select0(gates, t - chunk_first);
              rt::addmm_out(step_gates, step_gates, h, w_h_t);
              rt::launch(kernel, blocks, rt::threads_per_block(), stream, step_gates.const_data_ptr<scalar_t>(),
                         h.mutable_data_ptr<scalar_t>(), cell.mutable_data_ptr<opmath_t>(),
                         output.mutable_data_ptr<scalar_t>() + t * numel,
                         tanh_cell_base == nullptr ? nullptr : tanh_cell_base + t * numel, lengths_ptr(lengths), t,
                         numel, S);
            }
          });
    });
  }
  if (!needs_backward) {
    return {output, h, as_dtype_of(c_n, input), ops::empty({0}, dtype, input), tanh_cell};  // tanh_cell is empty too
  }
  return {output, h, as_dtype_of(c_n, input), gates, tanh_cell};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> lltm_sequence_backward_cuda(
    Tensor grad_output_arg, Tensor grad_h_n, Tensor grad_c_n, Tensor weights, Tensor input, Tensor h0, Tensor output,
    std::optional<Tensor> lengths, Tensor gates, Tensor tanh_cell, bool reverse, bool needs_grad_input) {
  constexpr const char* op = "lltm_cuda::sequence_backward";
  // Output gradients come as autograd makes them (a sum's is expanded, stride 0); the kernel
  // reads them densely.  The state gradients are copied anyway, into the running buffers.
  const Tensor grad_output = ops::as_contiguous(grad_output_arg);
  check_args(op, {{grad_output, "grad_output"}, {weights, "weights"}, {input, "input"}, {h0, "h0"},
                  {output, "output"}, {gates, "gates"}, {tanh_cell, "tanh_cell"}});
  STD_TORCH_CHECK(input.dim() == 3, op, ": input must be 3-D (time, batch, input_features), got shape ",
                  describe(input.sizes()));
  STD_TORCH_CHECK(h0.dim() == 2, op, ": h0 must be 2-D (batch, state_size), got shape ", describe(h0.sizes()));
  const int64_t T = input.size(0), B = input.size(1), I = input.size(2), S = h0.size(1);
  check_shape(op, {weights, "weights"}, {3 * S, S + I});
  check_shape(op, {grad_output, "grad_output"}, {T, B, S});
  check_shape(op, {output, "output"}, {T, B, S});
  check_shape(op, {tanh_cell, "tanh_cell"}, {T, B, S});
  check_shape(op, {gates, "gates"}, {T, B, 3 * S});
  for (const Arg& arg : {Arg{grad_h_n, "grad_h_n"}, Arg{grad_c_n, "grad_c_n"}}) {
    STD_TORCH_CHECK(arg.tensor.device() == input.device() && arg.tensor.scalar_type() == input.scalar_type(), op,
                    ": ", arg.name, " must be ", input.scalar_type(), " on ", describe(input.device()));
    check_shape(op, arg, {B, S});
  }
  check_lengths(op, lengths, input, B);
  STD_TORCH_CHECK(T >= 1, op, ": a sequence needs at least one step");

  const int32_t device = input.get_device_index();
  const rt::DeviceGuard device_guard(device);
  const Tensor w_h = ops::narrow(weights, 1, 0, S);  // (3S, S), strided: cuBLAS reads it as it is
  const Tensor d_gates = ops::empty_like(gates);
  const SequencePlan plan = plan_sequence(device, input.scalar_type(), B, S);
  // Running; grad_h0 and grad_c0 when the loop ends.  The persistent kernels read grad_h_n and
  // grad_c_n themselves (no copy kernels before their loop), run in float for the half types, and
  // write grad_h0 and grad_c0 in the input's dtype at their last step (no conversion after it).
  const ScalarType dtype = input.scalar_type(), opmath = opmath_scalar_type(dtype);
  const Tensor grad_h = plan.persistent ? ops::empty({B, S}, opmath, input) : ops::copy_as(grad_h_n, dtype);
  const Tensor grad_cell = plan.persistent ? ops::empty({B, S}, opmath, input) : opmath_copy(grad_c_n);
  const bool rounded_in_kernel = plan.persistent && opmath != dtype;
  const Tensor grad_h0 = rounded_in_kernel ? ops::empty({B, S}, dtype, input) : grad_h;
  const Tensor grad_c0 = rounded_in_kernel ? ops::empty({B, S}, dtype, input) : grad_cell;
  const int64_t numel = B * S;
  const rt::Stream stream = rt::current_stream(device);

  if (plan.persistent) {
    persistent_backward(plan, {weights, grad_output, gates, tanh_cell, grad_h, grad_cell, d_gates, lengths, reverse,
                               ops::as_contiguous(grad_h_n), ops::as_contiguous(grad_c_n), grad_h0, grad_c0});
  } else {
    LLTM_CUDA_DISPATCH_FLOATING(input.scalar_type(), op, [&] {
      using opmath_t = opmath_type<scalar_t>;
      launch_pointwise<scalar_t>(
          numel, S,
          {buffer(grad_output), buffer(gates), buffer(tanh_cell), buffer(grad_h), buffer(grad_cell), buffer(d_gates)},
          [&](auto vec) {
            const auto kernel = sequence_backward_step_kernel<scalar_t, decltype(vec)::value>;
            const int64_t blocks = grid_size(kernel, numel / vec, input.get_device());
            for (int64_t k = 0; k < T; ++k) {
              const int64_t t = reverse ? k : T - 1 - k;  // the forward's steps, last first
              const Tensor step_d_gates = ops::select0(d_gates, t);
              rt::launch(kernel, blocks, rt::threads_per_block(), stream,
                         grad_output.const_data_ptr<scalar_t>() + t * numel,
                         gates.const_data_ptr<scalar_t>() + 3 * t * numel, tanh_cell.const_data_ptr<scalar_t>() + t * numel,
                         grad_h.mutable_data_ptr<scalar_t>(), grad_cell.mutable_data_ptr<opmath_t>(),
                         step_d_gates.mutable_data_ptr<scalar_t>(), lengths_ptr(lengths), t, numel, S);
              if (lengths.has_value()) {
                rt::addmm_out(grad_h, grad_h, step_d_gates, w_h);  // see the kernel: rows that took part were zeroed
              } else {
                rt::mm_out(grad_h, step_d_gates, w_h);
              }
            }
          });
    });
  }

  // d_W = d_gates^T [h_prev | x] over all T*B rows, written as its two column blocks (strided
  // views of grad_weights that cuBLAS writes as they are), so no (T, B, S+I) [h_prev | x] is built.
  const Tensor d_gates_2d = torch::stable::view(d_gates, {T * B, 3 * S});
  const Tensor grad_weights = ops::empty_like(weights);
  const Tensor grad_w_h = ops::narrow(grad_weights, 1, 0, S);
  const Tensor grad_w_x = ops::narrow(grad_weights, 1, S, I);
  rt::mm_out(grad_w_x, ops::t(d_gates_2d), torch::stable::view(input, {T * B, I}));
  // h_prev of step t is the output of the step before it (t-1, or t+1 reversed), except at a row's
  // first step, where it is h0: one GEMM over the T-1 steps that have a step before them, plus one
  // B-row GEMM for h0.  Reversed with lengths, a row's first step is lengths[b]-1; the term the big
  // GEMM gives it there is zero (output[lengths[b]] is a zero output), and its d_gates are gathered.
  const Tensor later = reverse ? ops::narrow(d_gates, 0, 0, T - 1) : ops::narrow(d_gates, 0, 1, T - 1);
  const Tensor before = reverse ? ops::narrow(output, 0, 1, T - 1) : ops::narrow(output, 0, 0, T - 1);
  rt::mm_out(grad_w_h, ops::t(torch::stable::reshape(later, {(T - 1) * B, 3 * S})),
             torch::stable::reshape(before, {(T - 1) * B, S}));
  Tensor first = ops::select0(d_gates, reverse ? T - 1 : 0);
  if (reverse && lengths.has_value()) {
    // clamp: lltm-core passes lengths in [1, T]; a direct call with others must not read out of bounds.
    const Tensor last = ops::minus_one(ops::clamp(*lengths, 1, T));
    const Tensor index = ops::expand(torch::stable::view(last, {1, B, 1}), {1, B, 3 * S});
    first = torch::stable::squeeze(ops::gather(d_gates, 0, index), 0);
  }
  rt::addmm_out(grad_w_h, grad_w_h, ops::t(first), h0);
  Tensor grad_input = ops::empty({0}, weights.scalar_type(), weights);
  if (needs_grad_input) {
    grad_input = ops::empty({T * B, I}, input.scalar_type(), input);
    rt::mm_out(grad_input, d_gates_2d, ops::narrow(weights, 1, S, I));
    grad_input = torch::stable::view(grad_input, {T, B, I});
  }
  return {grad_input, grad_weights, ops::sum0(d_gates_2d), grad_h0, as_dtype_of(grad_c0, input)};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(lltm_cuda, LLTM_CUDA_DISPATCH_KEY, m) {
  m.impl("sequence_forward", TORCH_BOX(&lltm_sequence_forward_cuda));
  m.impl("sequence_backward", TORCH_BOX(&lltm_sequence_backward_cuda));
}
