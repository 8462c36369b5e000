// CPU kernels of lltm_cpu::forward and lltm_cpu::backward.
//
// Each is GEMMs (blas.h: MKL where torch links it, torch's mm through the
// stable C shim otherwise) plus one fused pointwise pass (pointwise_impl.h),
// compiled per instruction set and chosen at run time.  float32 and float64
// compute in their own type.  bfloat16 tensors stay bfloat16 in memory
// (torch's bfloat16 GEMMs accumulate in float) and the pointwise passes
// compute in float, as ATen's own bfloat16 kernels do.
//
// What forward saves, and why: backward needs X = cat([old_h, input]) for
// grad_weights, the three activated gates and tanh(new_cell).  The activated
// gates overwrite the GEMM's output buffer in place, so saving them costs no
// extra allocation or pass; with them and tanh(new_cell) saved, backward runs
// no transcendental function at all (elu' is recovered from elu's output).
// Recomputing instead would mean keeping the pre-activation gates and paying
// three exp and one tanh per element again in backward.
#include <torch/csrc/stable/library.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "blas.h"
#include "kernel_common.h"

namespace lltm_cpu {
namespace {

// Splits a pass over `columns` state columns of `rows` rows into per-thread
// column ranges.  Column ranges (not rows) so that each thread owns its slice
// of grad_bias and the bias reduction needs no second pass.
template <typename Pass>
void for_column_ranges(int64_t rows, int64_t columns, const Pass& pass) {
  const int64_t min_columns = divup(kMinElementsPerThread, std::max<int64_t>(rows, 1));
  parallel_for(0, columns, min_columns, pass);
}

// Runs backward's two GEMMs, which cost the same (`macs` multiply-adds each).
// On two threads, one GEMM per thread beats two GEMMs one after the other,
// each split over both threads, at the tutorial's size (BLAS runs
// single-threaded inside a parallel region; benchmarks/results/cpu.md).  With more threads, that
// pays only while the GEMMs are too small to spread over all of them.
template <typename Gemm1, typename Gemm2>
void run_both_gemms(const Gemm1& first, const Gemm2& second, int64_t macs) {
  constexpr int64_t kSmallGemmMacs = int64_t{1} << 22;
  if (num_threads() <= 2 || macs <= kSmallGemmMacs) {
    parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) {
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
void concat_rows(const Tensor& old_h, const Tensor& input, Tensor& X) {
  const int64_t element_size = X.element_size();
  const int64_t h_bytes = old_h.size(1) * element_size;
  const int64_t input_bytes = input.size(1) * element_size;
  const auto* h_data = static_cast<const char*>(old_h.const_data_ptr());
  const auto* input_data = static_cast<const char*>(input.const_data_ptr());
  auto* x_data = static_cast<char*>(X.mutable_data_ptr());
  const int64_t min_rows = divup(kMinElementsPerThread, std::max<int64_t>(X.size(1), 1));
  parallel_for(0, X.size(0), min_rows, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      char* x_row = x_data + row * (h_bytes + input_bytes);
      std::memcpy(x_row, h_data + row * h_bytes, h_bytes);
      std::memcpy(x_row + h_bytes, input_data + row * input_bytes, input_bytes);
    }
  });
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> lltm_forward(
    const Tensor& input_arg, const Tensor& weights_arg, const Tensor& bias_arg,
    const Tensor& old_h_arg, const Tensor& old_cell_arg) {
  constexpr const char* op = "lltm_cpu::forward";
  LLTM_CHECK(input_arg.dim() == 2, op, ": input must be 2-D (batch, input_features), got ", shape(input_arg));
  LLTM_CHECK(old_h_arg.dim() == 2, op, ": old_h must be 2-D (batch, state_size), got ", shape(old_h_arg));
  const int64_t batch = input_arg.size(0);
  const int64_t input_features = input_arg.size(1);
  const int64_t state_size = old_h_arg.size(1);
  check_matrix(weights_arg, op, "weights", 3 * state_size, state_size + input_features);
  LLTM_CHECK(bias_arg.dim() == 1 && bias_arg.size(0) == 3 * state_size, op, ": bias must have shape [",
              3 * state_size, "], got ", shape(bias_arg));
  check_matrix(old_h_arg, op, "old_h", batch, state_size);
  check_matrix(old_cell_arg, op, "old_cell", batch, state_size);
  check_dtypes(op, {{"input", input_arg}, {"weights", weights_arg}, {"bias", bias_arg}, {"old_h", old_h_arg},
                    {"old_cell", old_cell_arg}});
  // lltm_core passes contiguous tensors, for which these are no-ops.
  const Tensor input = as_contiguous(input_arg);
  const Tensor weights = as_contiguous(weights_arg);
  const Tensor bias = as_contiguous(bias_arg);
  const Tensor old_h = as_contiguous(old_h_arg);
  const Tensor old_cell = as_contiguous(old_cell_arg);

  const ScalarType dtype = input.scalar_type();
  Tensor X = empty({batch, state_size + input_features}, dtype);
  concat_rows(old_h, input, X);
  Tensor gates = empty({batch, 3 * state_size}, dtype);
  Tensor new_h = empty({batch, state_size}, dtype);
  Tensor new_cell = empty({batch, state_size}, dtype);
  Tensor tanh_cell = empty({batch, state_size}, dtype);

  dispatch_floating(dtype, op, [&](auto zero) {
    using scalar_t = decltype(zero);
    // The bias is added in the pointwise pass, which reads each gate anyway;
    // addmm would first broadcast-copy it into the output.
    const int64_t x_features = state_size + input_features;
    blas::gemm<scalar_t>(false, true, batch, 3 * state_size, x_features, X.const_data_ptr<scalar_t>(), x_features,
                         weights.const_data_ptr<scalar_t>(), x_features, false, gates.mutable_data_ptr<scalar_t>(),
                         3 * state_size);
    const ForwardPointers<scalar_t> pointers{
        gates.mutable_data_ptr<scalar_t>(), bias.const_data_ptr<scalar_t>(),     old_cell.const_data_ptr<scalar_t>(),
        new_h.mutable_data_ptr<scalar_t>(), new_cell.mutable_data_ptr<scalar_t>(), tanh_cell.mutable_data_ptr<scalar_t>(),
        batch,                              state_size};
    const auto forward_pass = pointwise_kernels<scalar_t>().forward;
    for_column_ranges(batch, state_size, [&](int64_t begin, int64_t end) { forward_pass(pointers, begin, end); });
  });
  return {new_h, new_cell, X, gates, tanh_cell};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> lltm_backward(
    const Tensor& grad_h_arg, const Tensor& grad_cell_arg, const Tensor& weights_arg,
    const Tensor& X_arg, const Tensor& gates_arg, const Tensor& tanh_cell_arg, bool needs_grad_X) {
  constexpr const char* op = "lltm_cpu::backward";
  LLTM_CHECK(grad_h_arg.dim() == 2, op, ": grad_new_h must be 2-D (batch, state_size), got ", shape(grad_h_arg));
  LLTM_CHECK(X_arg.dim() == 2, op, ": X must be 2-D (batch, state_size + input_features), got ", shape(X_arg));
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
  const Tensor grad_h = as_contiguous(grad_h_arg);
  const Tensor grad_cell = as_contiguous(grad_cell_arg);
  const Tensor weights = as_contiguous(weights_arg);
  const Tensor X = as_contiguous(X_arg);
  const Tensor gates = as_contiguous(gates_arg);
  const Tensor tanh_cell = as_contiguous(tanh_cell_arg);

  const ScalarType dtype = grad_h.scalar_type();
  Tensor grad_gates = empty({batch, 3 * state_size}, dtype);
  Tensor grad_bias = empty({3 * state_size}, dtype);
  Tensor grad_old_cell = empty({batch, state_size}, dtype);
  Tensor grad_weights = empty({3 * state_size, x_features}, dtype);
  Tensor grad_X = empty({needs_grad_X ? batch : 0, needs_grad_X ? x_features : 0}, dtype);

  dispatch_floating(dtype, op, [&](auto zero) {
    using scalar_t = decltype(zero);
    const BackwardPointers<scalar_t> pointers{
        grad_h.const_data_ptr<scalar_t>(),          grad_cell.const_data_ptr<scalar_t>(),
        gates.const_data_ptr<scalar_t>(),           tanh_cell.const_data_ptr<scalar_t>(),
        grad_gates.mutable_data_ptr<scalar_t>(),    grad_bias.mutable_data_ptr<scalar_t>(),
        grad_old_cell.mutable_data_ptr<scalar_t>(), batch,
        state_size};
    const auto backward_pass = pointwise_kernels<scalar_t>().backward;
    for_column_ranges(batch, state_size, [&](int64_t begin, int64_t end) { backward_pass(pointers, begin, end); });
    const scalar_t* d_gates = grad_gates.const_data_ptr<scalar_t>();
    const auto weights_gradient = [&] {  // grad_gates^T X
      blas::gemm<scalar_t>(true, false, 3 * state_size, x_features, batch, d_gates, 3 * state_size,
                           X.const_data_ptr<scalar_t>(), x_features, false, grad_weights.mutable_data_ptr<scalar_t>(),
                           x_features);
    };
    if (!needs_grad_X) {  // neither input nor old_h needs a gradient: one GEMM fewer
      weights_gradient();
      return;
    }
    run_both_gemms(weights_gradient, [&] {  // grad_gates W
      blas::gemm<scalar_t>(false, false, batch, x_features, 3 * state_size, d_gates, 3 * state_size,
                           weights.const_data_ptr<scalar_t>(), x_features, false, grad_X.mutable_data_ptr<scalar_t>(),
                           x_features);
    }, batch * 3 * state_size * x_features);
  });
  if (!needs_grad_X) {
    grad_X = empty({0}, dtype);
  }
  return {grad_X, grad_weights, grad_bias, grad_old_cell};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(lltm_cpu, CPU, m) {
  m.impl("forward", TORCH_BOX(&lltm_forward));
  m.impl("backward", TORCH_BOX(&lltm_backward));
}

}  // namespace lltm_cpu
