// CPU kernels of lltm_cpu::forward and lltm_cpu::backward.
//
// Each is GEMMs through ATen (MKL here) plus one fused pointwise pass
// (pointwise_impl.h), compiled per instruction set and chosen at run time.
// float32 and float64 compute in their own type.  bfloat16 tensors stay
// bfloat16 in memory (ATen's bfloat16 GEMMs accumulate in float) and the
// pointwise passes compute in float, as ATen's own bfloat16 kernels do.
//
// What forward saves, and why: backward needs X = cat([old_h, input]) for
// grad_weights, the three activated gates and tanh(new_cell).  The activated
// gates overwrite the GEMM's output buffer in place, so saving them costs no
// extra allocation or pass; with them and tanh(new_cell) saved, backward runs
// no transcendental function at all (elu' is recovered from elu's output).
// Recomputing instead would mean keeping the pre-activation gates and paying
// three exp and one tanh per element again in backward.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "kernel_common.h"

namespace lltm_cpu {
namespace {

// Splits a pass over `columns` state columns of `rows` rows into per-thread
// column ranges.  Column ranges (not rows) so that each thread owns its slice
// of grad_bias and the bias reduction needs no second pass.
template <typename Pass>
void for_column_ranges(int64_t rows, int64_t columns, const Pass& pass) {
  const int64_t min_columns = at::divup(kMinElementsPerThread, std::max<int64_t>(rows, 1));
  at::parallel_for(0, columns, min_columns, pass);
}

// Runs backward's two GEMMs, which cost the same (`macs` multiply-adds each).
// On two threads, one GEMM per thread beats two GEMMs one after the other,
// each split over both threads: at B16 I32 S128, 29 us against 40 us (BLAS
// runs single-threaded inside a parallel region).  With more threads, that
// pays only while the GEMMs are too small to spread over all of them.
template <typename Gemm1, typename Gemm2>
void run_both_gemms(const Gemm1& first, const Gemm2& second, int64_t macs) {
  constexpr int64_t kSmallGemmMacs = int64_t{1} << 22;
  if (at::get_num_threads() <= 2 || macs <= kSmallGemmMacs) {
    // The GEMMs go through the dispatcher, which reads thread-local state
    // (grad mode, dispatch keys) that pool threads do not inherit.
    const at::ThreadLocalState caller_state;
    at::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) {
      const at::ThreadLocalStateGuard guard(caller_state);
      for (int64_t gemm = begin; gemm < end; ++gemm) {
        if (gemm == 0) {
          first();
        } else {
          second();
        }
      }
    });
  } else {
    first();
    second();
  }
}

// X = cat([old_h, input], 1), one memcpy per row and piece.
void concat_rows(const at::Tensor& old_h, const at::Tensor& input, at::Tensor& X) {
  const int64_t element_size = X.element_size();
  const int64_t h_bytes = old_h.size(1) * element_size;
  const int64_t input_bytes = input.size(1) * element_size;
  const auto* h_data = static_cast<const char*>(old_h.const_data_ptr());
  const auto* input_data = static_cast<const char*>(input.const_data_ptr());
  auto* x_data = static_cast<char*>(X.data_ptr());
  const int64_t min_rows = at::divup(kMinElementsPerThread, std::max<int64_t>(X.size(1), 1));
  at::parallel_for(0, X.size(0), min_rows, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      char* x_row = x_data + row * (h_bytes + input_bytes);
      std::memcpy(x_row, h_data + row * h_bytes, h_bytes);
      std::memcpy(x_row + h_bytes, input_data + row * input_bytes, input_bytes);
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> lltm_forward(
    const at::Tensor& input_arg, const at::Tensor& weights_arg, const at::Tensor& bias_arg,
    const at::Tensor& old_h_arg, const at::Tensor& old_cell_arg) {
  constexpr const char* op = "lltm_cpu::forward";
  TORCH_CHECK(input_arg.dim() == 2, op, ": input must be 2-D (batch, input_features), got ", input_arg.sizes());
  TORCH_CHECK(old_h_arg.dim() == 2, op, ": old_h must be 2-D (batch, state_size), got ", old_h_arg.sizes());
  const int64_t batch = input_arg.size(0);
  const int64_t input_features = input_arg.size(1);
  const int64_t state_size = old_h_arg.size(1);
  check_matrix(weights_arg, op, "weights", 3 * state_size, state_size + input_features);
  TORCH_CHECK(bias_arg.dim() == 1 && bias_arg.size(0) == 3 * state_size, op, ": bias must have shape [",
              3 * state_size, "], got ", bias_arg.sizes());
  check_matrix(old_h_arg, op, "old_h", batch, state_size);
  check_matrix(old_cell_arg, op, "old_cell", batch, state_size);
  check_dtypes(op, {{"input", input_arg}, {"weights", weights_arg}, {"bias", bias_arg}, {"old_h", old_h_arg},
                    {"old_cell", old_cell_arg}});
  // lltm_core passes contiguous tensors, for which these are no-ops.
  const at::Tensor input = input_arg.contiguous();
  const at::Tensor weights = weights_arg.contiguous();
  const at::Tensor bias = bias_arg.contiguous();
  const at::Tensor old_h = old_h_arg.contiguous();
  const at::Tensor old_cell = old_cell_arg.contiguous();

  const auto options = input.options();
  at::Tensor X = at::empty({batch, state_size + input_features}, options);
  concat_rows(old_h, input, X);
  // The bias is added in the pointwise pass, which reads each gate anyway;
  // addmm would first broadcast-copy it into the output.
  at::Tensor gates = at::mm(X, weights.t());
  at::Tensor new_h = at::empty({batch, state_size}, options);
  at::Tensor new_cell = at::empty({batch, state_size}, options);
  at::Tensor tanh_cell = at::empty({batch, state_size}, options);

  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, input.scalar_type(), op, [&] {
    const ForwardPointers<scalar_t> pointers{
        gates.data_ptr<scalar_t>(), bias.const_data_ptr<scalar_t>(), old_cell.const_data_ptr<scalar_t>(),
        new_h.data_ptr<scalar_t>(), new_cell.data_ptr<scalar_t>(),   tanh_cell.data_ptr<scalar_t>(),
        batch,                      state_size};
    const auto forward_pass = pointwise_kernels<scalar_t>().forward;
    for_column_ranges(batch, state_size, [&](int64_t begin, int64_t end) { forward_pass(pointers, begin, end); });
  });
  return {new_h, new_cell, X, gates, tanh_cell};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> lltm_backward(
    const at::Tensor& grad_h_arg, const at::Tensor& grad_cell_arg, const at::Tensor& weights_arg,
    const at::Tensor& X_arg, const at::Tensor& gates_arg, const at::Tensor& tanh_cell_arg, bool needs_grad_X) {
  constexpr const char* op = "lltm_cpu::backward";
  TORCH_CHECK(grad_h_arg.dim() == 2, op, ": grad_new_h must be 2-D (batch, state_size), got ", grad_h_arg.sizes());
  TORCH_CHECK(X_arg.dim() == 2, op, ": X must be 2-D (batch, state_size + input_features), got ", X_arg.sizes());
  const int64_t batch = grad_h_arg.size(0);
  const int64_t state_size = grad_h_arg.size(1);
  const int64_t x_features = X_arg.size(1);
  check_matrix(grad_cell_arg, op, "grad_new_cell", batch, state_size);
  check_matrix(weights_arg, op, "weights", 3 * state_size, x_features);
  check_matrix(X_arg, op, "X", batch, x_features);
  check_matrix(gates_arg, op, "gates", batch, 3 * state_size);
  check_matrix(tanh_cell_arg, op, "tanh_cell", batch, state_size);
  check_dtypes(op, {{"grad_new_h", grad_h_arg}, {"grad_new_cell", grad_cell_arg}, {"weights", weights_arg},
                    {"X", X_arg}, {"gates", gates_arg}, {"tanh_cell", tanh_cell_arg}});
  const at::Tensor grad_h = grad_h_arg.contiguous();
  const at::Tensor grad_cell = grad_cell_arg.contiguous();
  const at::Tensor weights = weights_arg.contiguous();
  const at::Tensor X = X_arg.contiguous();
  const at::Tensor gates = gates_arg.contiguous();
  const at::Tensor tanh_cell = tanh_cell_arg.contiguous();

  const auto options = grad_h.options();
  at::Tensor grad_gates = at::empty({batch, 3 * state_size}, options);
  at::Tensor grad_bias = at::empty({3 * state_size}, options);
  at::Tensor grad_old_cell = at::empty({batch, state_size}, options);

  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, grad_h.scalar_type(), op, [&] {
    const BackwardPointers<scalar_t> pointers{
        grad_h.const_data_ptr<scalar_t>(),  grad_cell.const_data_ptr<scalar_t>(),
        gates.const_data_ptr<scalar_t>(),   tanh_cell.const_data_ptr<scalar_t>(),
        grad_gates.data_ptr<scalar_t>(),    grad_bias.data_ptr<scalar_t>(),
        grad_old_cell.data_ptr<scalar_t>(), batch,
        state_size};
    const auto backward_pass = pointwise_kernels<scalar_t>().backward;
    for_column_ranges(batch, state_size, [&](int64_t begin, int64_t end) { backward_pass(pointers, begin, end); });
  });
  at::Tensor grad_weights = at::empty({3 * state_size, x_features}, options);
  if (!needs_grad_X) {  // neither input nor old_h needs a gradient: one GEMM fewer
    at::mm_out(grad_weights, grad_gates.t(), X);
    return {at::empty({0}, options), grad_weights, grad_bias, grad_old_cell};
  }
  at::Tensor grad_X = at::empty({batch, x_features}, options);
  run_both_gemms(
      [&] { at::mm_out(grad_weights, grad_gates.t(), X); }, [&] { at::mm_out(grad_X, grad_gates, weights); },
      batch * 3 * state_size * x_features);
  return {grad_X, grad_weights, grad_bias, grad_old_cell};
}

}  // namespace

TORCH_LIBRARY_IMPL(lltm_cpu, CPU, m) {
  m.impl("forward", &lltm_forward);
  m.impl("backward", &lltm_backward);
}

}  // namespace lltm_cpu
