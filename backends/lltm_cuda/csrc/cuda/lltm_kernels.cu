// CUDA implementations of lltm_cuda::forward and lltm_cuda::backward.
//
// Each direction is cuBLAS GEMMs (torch's own, through the stable C shim, so allow_tf32 and the
// current stream are honoured) plus ONE fused pointwise kernel; the forward builds the GEMM's
// operand X = [old_h | input] first, in one kernel of its own.
//
// What forward saves, and why: X = cat([old_h, input]) (grad_weights needs
// it), the pre-activation gates (B, 3S) and tanh(new_cell) (B, S).  The gates
// buffer is the GEMM's own output, so keeping it costs no memory traffic; the
// backward recomputes sigmoid/elu from it, which is free in a memory-bound
// kernel.  Saving the activations instead would add 3S writes per row to the
// forward and save nothing in the backward (it reads 3S values either way).
// The backward also needs the new cell, which cannot be saved by reference
// (new_cell is an output and outputs may not alias) and cannot be rebuilt
// without a copy of old_cell: writing tanh(new_cell), S values per row, is
// the cheapest way to keep it, and spares the backward a tanh.
#include "lltm_common.cuh"

#include <torch/csrc/stable/library.h>

#include <tuple>

namespace {

using namespace lltm_cuda;

// Thread t handles elements [t*VEC, t*VEC + VEC), then strides by the whole
// grid.  When VEC > 1, S is a multiple of VEC, so a vector never crosses a row.
template <typename scalar_t, int VEC>
__global__ void lltm_forward_kernel(
    const scalar_t* __restrict__ gates, const scalar_t* __restrict__ old_cell, scalar_t* __restrict__ new_h,
    scalar_t* __restrict__ new_cell, scalar_t* __restrict__ tanh_cell, int64_t numel, int64_t state_size) {
  using opmath_t = opmath_type<scalar_t>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * VEC;
  for (int64_t e = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC; e < numel; e += stride) {
    const auto pre = load_gates<VEC>(gates, e, state_size);
    const auto cell_in = load<VEC>(old_cell + e);
    Vec<scalar_t, VEC> h, c, t;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const auto out = cell_forward<opmath_t>(pre.i.v[k], pre.o.v[k], pre.z.v[k], cell_in.v[k]);
      c.v[k] = out.cell;
      t.v[k] = out.tanh_cell;
      h.v[k] = out.h;
    }
    store<VEC>(new_h + e, h);
    store<VEC>(new_cell + e, c);
    store<VEC>(tanh_cell + e, t);
  }
}

template <typename scalar_t, int VEC>
__global__ void lltm_backward_kernel(
    const scalar_t* __restrict__ grad_h, const scalar_t* __restrict__ grad_cell, const scalar_t* __restrict__ gates,
    const scalar_t* __restrict__ tanh_cell, scalar_t* __restrict__ d_gates, scalar_t* __restrict__ grad_old_cell,
    int64_t numel, int64_t state_size) {
  using opmath_t = opmath_type<scalar_t>;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * VEC;
  for (int64_t e = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * VEC; e < numel; e += stride) {
    const auto pre = load_gates<VEC>(gates, e, state_size);
    const auto tanh_c = load<VEC>(tanh_cell + e);
    const auto dh = load<VEC>(grad_h + e);
    const auto dc = load<VEC>(grad_cell + e);
    GateVecs<scalar_t, VEC> d;
    Vec<scalar_t, VEC> d_cell_out;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const auto grad = cell_backward<opmath_t>(pre.i.v[k], pre.o.v[k], pre.z.v[k], tanh_c.v[k], dh.v[k], dc.v[k]);
      d.i.v[k] = grad.d_i;
      d.o.v[k] = grad.d_o;
      d.z.v[k] = grad.d_z;
      d_cell_out.v[k] = grad.d_old_cell;
    }
    store_gates<VEC>(d_gates, e, state_size, d);
    store<VEC>(grad_old_cell + e, d_cell_out);
  }
}

// X = [old_h | input], (B, S + I), in one launch rather than a copy for each column block: at a
// small batch a kernel boundary costs more than the copy itself (benchmarks/results/h200.md).
template <typename scalar_t>
__global__ void concat_state_and_input_kernel(const scalar_t* __restrict__ old_h, const scalar_t* __restrict__ input,
                                              scalar_t* __restrict__ X, int64_t numel, int64_t state_size,
                                              int64_t input_features) {
  const int64_t width = state_size + input_features, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < numel; e += stride) {
    const int64_t b = e / width, k = e % width;
    X[e] = k < state_size ? old_h[b * state_size + k] : input[b * input_features + k - state_size];
  }
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> lltm_forward_cuda(
    Tensor input, Tensor weights, Tensor bias, Tensor old_h, Tensor old_cell) {
  constexpr const char* op = "lltm_cuda::forward";
  check_args(op, {{input, "input"}, {weights, "weights"}, {bias, "bias"}, {old_h, "old_h"}, {old_cell, "old_cell"}});
  STD_TORCH_CHECK(input.dim() == 2, op, ": input must be 2-D (batch, input_features), got shape ",
                  describe(input.sizes()));
  STD_TORCH_CHECK(old_h.dim() == 2, op, ": old_h must be 2-D (batch, state_size), got shape ", describe(old_h.sizes()));
  const int64_t batch = input.size(0), state_size = old_h.size(1);
  check_shape(op, {weights, "weights"}, {3 * state_size, state_size + input.size(1)});
  check_shape(op, {bias, "bias"}, {3 * state_size});
  check_shape(op, {old_h, "old_h"}, {batch, state_size});
  check_shape(op, {old_cell, "old_cell"}, {batch, state_size});

  const int32_t device = input.get_device_index();
  const rt::DeviceGuard device_guard(device);
  const Tensor X = ops::empty({batch, state_size + input.size(1)}, input.scalar_type(), input);
  const Tensor gates = ops::empty({batch, 3 * state_size}, input.scalar_type(), input);
  const Tensor new_h = ops::empty_like(old_cell);
  const Tensor new_cell = ops::empty_like(old_cell);
  const Tensor tanh_cell = ops::empty_like(old_cell);
  const rt::Stream stream = rt::current_stream(device);
  const int64_t numel = old_cell.numel();

  LLTM_CUDA_DISPATCH_FLOATING(gates.scalar_type(), "lltm_cuda::forward", [&] {
    if (X.numel() > 0) {
      const auto concat = concat_state_and_input_kernel<scalar_t>;
      rt::launch(concat, grid_size(concat, X.numel(), input.get_device()), rt::threads_per_block(), stream,
                 old_h.const_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(), X.mutable_data_ptr<scalar_t>(),
                 X.numel(), state_size, input.size(1));
    }
    rt::addmm_out(gates, bias, X, ops::t(weights));
    launch_pointwise<scalar_t>(
        numel, state_size,
        {buffer(gates), buffer(old_cell), buffer(new_h), buffer(new_cell), buffer(tanh_cell)},
        [&](auto vec) {
          const auto kernel = lltm_forward_kernel<scalar_t, decltype(vec)::value>;
          rt::launch(kernel, grid_size(kernel, numel / vec, input.get_device()), rt::threads_per_block(), stream,
                     gates.const_data_ptr<scalar_t>(), old_cell.const_data_ptr<scalar_t>(),
                     new_h.mutable_data_ptr<scalar_t>(), new_cell.mutable_data_ptr<scalar_t>(),
                     tanh_cell.mutable_data_ptr<scalar_t>(), numel, state_size);
        });
  });
  return {new_h, new_cell, X, gates, tanh_cell};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> lltm_backward_cuda(
    Tensor grad_h_arg, Tensor grad_cell_arg, Tensor weights, Tensor X, Tensor gates, Tensor tanh_cell,
    bool needs_grad_X) {
  constexpr const char* op = "lltm_cuda::backward";
  // Output gradients come as autograd makes them, often expanded (stride 0)
  // from a sum(); the kernel reads them densely.
  const Tensor grad_h = ops::as_contiguous(grad_h_arg);
  const Tensor grad_cell = ops::as_contiguous(grad_cell_arg);
  check_args(op, {{grad_h, "grad_h"}, {grad_cell, "grad_cell"}, {weights, "weights"}, {X, "X"}, {gates, "gates"},
                  {tanh_cell, "tanh_cell"}});
  STD_TORCH_CHECK(grad_h.dim() == 2, op, ": grad_h must be 2-D (batch, state_size), got shape ",
                  describe(grad_h.sizes()));
  STD_TORCH_CHECK(weights.dim() == 2, op,
                  ": weights must be 2-D (3 * state_size, state_size + input_features), got shape ",
                  describe(weights.sizes()));
  const int64_t batch = grad_h.size(0), state_size = grad_h.size(1);
  check_shape(op, {grad_cell, "grad_cell"}, {batch, state_size});
  check_shape(op, {tanh_cell, "tanh_cell"}, {batch, state_size});
  check_shape(op, {gates, "gates"}, {batch, 3 * state_size});
  check_shape(op, {weights, "weights"}, {3 * state_size, weights.size(1)});
  check_shape(op, {X, "X"}, {batch, weights.size(1)});

  const int32_t device = gates.get_device_index();
  const rt::DeviceGuard device_guard(device);
  const Tensor d_gates = ops::empty_like(gates);
  const Tensor grad_old_cell = ops::empty_like(tanh_cell);
  const rt::Stream stream = rt::current_stream(device);
  const int64_t numel = tanh_cell.numel();

  LLTM_CUDA_DISPATCH_FLOATING(gates.scalar_type(), "lltm_cuda::backward", [&] {
    launch_pointwise<scalar_t>(
        numel, state_size,
        {buffer(grad_h), buffer(grad_cell), buffer(gates), buffer(tanh_cell), buffer(d_gates), buffer(grad_old_cell)},
        [&](auto vec) {
          const auto kernel = lltm_backward_kernel<scalar_t, decltype(vec)::value>;
          rt::launch(kernel, grid_size(kernel, numel / vec, gates.get_device()), rt::threads_per_block(), stream,
                     grad_h.const_data_ptr<scalar_t>(), grad_cell.const_data_ptr<scalar_t>(),
                     gates.const_data_ptr<scalar_t>(), tanh_cell.const_data_ptr<scalar_t>(),
                     d_gates.mutable_data_ptr<scalar_t>(), grad_old_cell.mutable_data_ptr<scalar_t>(), numel,
                     state_size);
        });
  });
  // d_gates is (B, 3S): grad_X = d_gates @ W, grad_W = d_gates^T @ X, grad_bias = column sums.
  // grad_X is one of the two GEMMs: skipped when neither input nor old_h needs a gradient.
  Tensor grad_X = ops::empty({0}, weights.scalar_type(), weights);
  if (needs_grad_X) {
    grad_X = ops::empty({batch, weights.size(1)}, weights.scalar_type(), weights);
    rt::mm_out(grad_X, d_gates, weights);
  }
  const Tensor grad_weights = ops::empty({3 * state_size, weights.size(1)}, weights.scalar_type(), weights);
  rt::mm_out(grad_weights, ops::t(d_gates), X);
  return {grad_X, grad_weights, ops::sum0(d_gates), grad_old_cell};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(lltm_cuda, LLTM_CUDA_DISPATCH_KEY, m) {
  m.impl("forward", TORCH_BOX(&lltm_forward_cuda));
  m.impl("backward", TORCH_BOX(&lltm_backward_cuda));
}
