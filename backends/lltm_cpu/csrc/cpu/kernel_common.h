// What the step kernels (lltm_kernels.cpp) and the sequence kernels
// (lltm_sequence.cpp) share: argument checks, and the choice of the
// pointwise passes' build for this CPU.
#pragma once

#include <ATen/Version.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "pointwise.h"

namespace lltm_cpu {

// Fewer (row, column) elements than this per thread, and starting threads
// costs more than it saves (ATen uses the same grain for elementwise ops): the
// seed's B16 S128 step runs its pointwise passes on one thread.
constexpr int64_t kMinElementsPerThread = 32768;

template <typename scalar_t>
struct PointwiseKernels {
  void (*forward)(const ForwardPointers<scalar_t>&, int64_t, int64_t);
  void (*backward)(const BackwardPointers<scalar_t>&, int64_t, int64_t);
  void (*sequence_forward)(const SequenceForwardStep<scalar_t>&);
  void (*sequence_backward)(const SequenceBackwardStep<scalar_t>&);
};

// The widest build this CPU runs, as ATen decides for its own kernels (so
// ATEN_CPU_CAPABILITY=default|avx2|avx512 also steers this choice).
template <typename scalar_t>
PointwiseKernels<scalar_t> choose_pointwise_kernels() {
#if defined(__x86_64__)
  const std::string capability = at::get_cpu_capability();
  if (capability == "AVX512") {
    return {AVX512::forward_pointwise, AVX512::backward_pointwise, AVX512::sequence_forward_step,
            AVX512::sequence_backward_step};
  }
  if (capability == "AVX2") {
    return {AVX2::forward_pointwise, AVX2::backward_pointwise, AVX2::sequence_forward_step,
            AVX2::sequence_backward_step};
  }
#endif
  return {DEFAULT::forward_pointwise, DEFAULT::backward_pointwise, DEFAULT::sequence_forward_step,
          DEFAULT::sequence_backward_step};
}

template <typename scalar_t>
const PointwiseKernels<scalar_t>& pointwise_kernels() {
  static const PointwiseKernels<scalar_t> kernels = choose_pointwise_kernels<scalar_t>();
  return kernels;
}

inline void check_matrix(const at::Tensor& t, const char* op, const char* name, int64_t rows, int64_t cols) {
  TORCH_CHECK(
      t.dim() == 2 && t.size(0) == rows && t.size(1) == cols, op, ": ", name, " must have shape [",
      rows, ", ", cols, "], got ", t.sizes());
}

struct NamedTensor {
  const char* name;
  const at::Tensor& tensor;
};

// All tensors must share the first one's dtype, float32, float64 or bfloat16.
inline void check_dtypes(const char* op, std::initializer_list<NamedTensor> tensors) {
  const NamedTensor& first = *tensors.begin();
  const at::ScalarType dtype = first.tensor.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16, op,
              ": takes float32, float64 or bfloat16 tensors, got ", first.name, " of dtype ", dtype);
  for (const NamedTensor& t : tensors) {
    TORCH_CHECK(t.tensor.scalar_type() == dtype, op, ": ", t.name, " has dtype ", t.tensor.scalar_type(),
                ", expected ", dtype, " (the dtype of ", first.name, ")");
  }
}

}  // namespace lltm_cpu
