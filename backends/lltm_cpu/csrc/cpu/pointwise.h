// The fused pointwise passes of the LLTM, compiled once per instruction set.
//
// pointwise_impl.h holds the only implementation; pointwise_{default,avx2,
// avx512}.cpp each compile it for one instruction set into the namespace
// lltm_cpu::<ISA>, and lltm_kernels.cpp picks one at run time.  Nothing here
// depends on ATen's tensor types, so the ISA-specific files only see raw
// pointers and at::vec.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace lltm_cpu {

// One forward call.  Every matrix is row-major and contiguous; S = state_size.
// scalar_t is float, double or c10::BFloat16 (which the passes compute in float).
template <typename scalar_t>
struct ForwardPointers {
  // (B, 3S).  In: X @ weights^T, without the bias.  Out: the activated gates
  // [sigmoid(i) | sigmoid(o) | elu(z)], which backward needs.
  scalar_t* gates;
  const scalar_t* bias;      // (3S)
  const scalar_t* old_cell;  // (B, S)
  scalar_t* new_h;           // (B, S)
  scalar_t* new_cell;        // (B, S)
  scalar_t* tanh_cell;       // (B, S) tanh(new_cell), saved for backward
  int64_t batch;
  int64_t state_size;
};

// One backward call, with the tensors ForwardPointers produced.
template <typename scalar_t>
struct BackwardPointers {
  const scalar_t* grad_h;     // (B, S)
  const scalar_t* grad_cell;  // (B, S)
  const scalar_t* gates;      // (B, 3S) activated gates
  const scalar_t* tanh_cell;  // (B, S)
  scalar_t* grad_gates;       // (B, 3S) out: gradient of the pre-activation gates
  scalar_t* grad_bias;        // (3S) out: grad_gates summed over the batch
  scalar_t* grad_old_cell;    // (B, S) out
  int64_t batch;
  int64_t state_size;
};

// Each pass covers every row and the state columns [col_begin, col_end) of
// all three gates.  Column ranges never share an output element (grad_bias
// included), so disjoint ranges may run on different threads.
#define LLTM_DECLARE_POINTWISE_KERNELS(ISA)                                                       \
  namespace ISA {                                                                                 \
  void forward_pointwise(const ForwardPointers<float>& p, int64_t col_begin, int64_t col_end);    \
  void forward_pointwise(const ForwardPointers<double>& p, int64_t col_begin, int64_t col_end);   \
  void backward_pointwise(const BackwardPointers<float>& p, int64_t col_begin, int64_t col_end);  \
  void backward_pointwise(const BackwardPointers<double>& p, int64_t col_begin, int64_t col_end); \
  void forward_pointwise(const ForwardPointers<c10::BFloat16>& p, int64_t col_begin, int64_t col_end); \
  void backward_pointwise(const BackwardPointers<c10::BFloat16>& p, int64_t col_begin, int64_t col_end); \
  }

LLTM_DECLARE_POINTWISE_KERNELS(DEFAULT)
#if defined(__x86_64__)
LLTM_DECLARE_POINTWISE_KERNELS(AVX2)
LLTM_DECLARE_POINTWISE_KERNELS(AVX512)
#endif

#undef LLTM_DECLARE_POINTWISE_KERNELS

}  // namespace lltm_cpu
