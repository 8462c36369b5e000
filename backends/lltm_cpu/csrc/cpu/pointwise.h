// The fused pointwise passes of the LLTM, compiled once per instruction set.
//
// pointwise_impl.h holds the only implementation; pointwise_{default,avx2,
// avx512}.cpp each compile it for one instruction set into the namespace
// lltm_cpu::<ISA>, and kernel_common.h picks one at run time.  Nothing here
// depends on tensor types, so the ISA-specific files only see raw pointers
// and lltm-cpu's own vectors (vec.h).
#pragma once

#include <torch/headeronly/util/BFloat16.h>

#include <cstdint>
#include <type_traits>

namespace lltm_cpu {

// The type a kernel computes and carries state in: float for bfloat16 (as
// ATen's own bfloat16 kernels do), the type itself otherwise.
template <typename scalar_t>
using opmath_type = std::conditional_t<std::is_same_v<scalar_t, c10::BFloat16>, float, scalar_t>;

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

// One time step of the sequence forward (lltm_sequence.cpp), for a block of
// `rows` consecutive batch rows and the state columns [col_begin, col_end)
// of all three gates (each row's pointers still point at its first column:
// the block's columns are at their own offsets).  The input projection
// is already in `gates`; the pass adds the bias (which a fill before the
// projection GEMM would cost a pass over all T*B*3S gates, and the GEMM a
// read of them).  Rows are contiguous: a row of gates has 3S elements, the
// others S.
// The cell state and the recurrent GEMM's product are in opmath_t, float for
// bfloat16 (as lltm-cuda keeps them): only what is returned or saved is
// rounded to bfloat16.
template <typename scalar_t>
struct SequenceForwardStep {
  using opmath_t = opmath_type<scalar_t>;
  // In: x W_x^T (+ h_{t-1} W_h^T where `recurrent` is nullptr).  Out, when
  // saving for backward (tanh_cell not nullptr): the activated gates
  // [sigmoid(i) | sigmoid(o) | elu(z)], zero for rows past their length.
  // Inference leaves them as they were: the buffer is its chunk's projection,
  // and skipping the three stores saves a tenth of a bfloat16 pass.
  scalar_t* gates;
  const scalar_t* bias;  // (3S)
  const opmath_t* recurrent;  // nullptr, or h_{t-1} W_h^T (rows of 3S), added to gates
  opmath_t* cell;       // in: c_{t-1}; out: c_t (rows past their length keep c_{t-1})
  scalar_t* hidden;     // nullptr, or the state h, which rows within their length set to h_t
  scalar_t* output;     // out: h_t; zero for rows past their length
  // out: tanh(c_t), saved for backward; zero for rows past their length.
  // nullptr in inference, which saves nothing.
  scalar_t* tanh_cell;
  const int64_t* lengths;  // nullptr, or per row: the row takes part in steps t < lengths[row]
  int64_t step;            // t
  int64_t rows;
  int64_t state_size;
  int64_t col_begin;  // the block's state columns: [0, state_size) for all of them
  int64_t col_end;
  bool gates_beyond_l2 = false;  // ask for the next row's gates ahead (pointwise_impl.h, prefetch_gates)
};

// One time step of the sequence backward, undoing SequenceForwardStep, for
// the same kind of block.  The carried gradients of h and c are in opmath_t,
// as the forward's state.
template <typename scalar_t>
struct SequenceBackwardStep {
  using opmath_t = opmath_type<scalar_t>;
  // d loss / d output_t, row r at grad_output + r * grad_output_row_stride;
  // along a row the stride is 1, or 0 (one value broadcast, as from output.sum()).
  const scalar_t* grad_output;
  int64_t grad_output_row_stride;
  bool grad_output_broadcast_row;
  // In: the gradient of h_t from the steps after t.  With lengths, a row
  // within its length is zeroed once read, so that the GEMM that follows may
  // add d_gates_t W_h into it while rows past their length keep theirs.
  opmath_t* grad_h;
  opmath_t* grad_cell;  // in: the gradient of c_t; out: of c_{t-1} (rows past their length keep it)
  const scalar_t* gates;      // the activated gates SequenceForwardStep saved
  const scalar_t* tanh_cell;  // tanh(c_t)
  scalar_t* grad_gates;       // out: d loss / d pre-activation gates; zero for rows past their length
  opmath_type<scalar_t>* grad_bias;  // (3S): grad_gates summed into its block's columns, over rows (and steps)
  const int64_t* lengths;
  int64_t step;
  int64_t rows;
  int64_t state_size;
  int64_t col_begin;
  int64_t col_end;
  bool gates_beyond_l2 = false;  // ask for the next row's gates and tanh(c_t) ahead (pointwise_impl.h)
};

// Each pass covers every row and the state columns [col_begin, col_end) of
// all three gates.  Column ranges never share an output element (grad_bias
// included), so disjoint ranges may run on different threads.  The sequence
// steps cover their block of rows and columns: disjoint blocks may run on
// different threads (blocks of rows each with its own grad_bias; blocks of
// columns may share one, as they write different entries of it).
#define LLTM_DECLARE_POINTWISE_KERNELS(ISA)                                                       \
  namespace ISA {                                                                                 \
  void forward_pointwise(const ForwardPointers<float>& p, int64_t col_begin, int64_t col_end);    \
  void forward_pointwise(const ForwardPointers<double>& p, int64_t col_begin, int64_t col_end);   \
  void backward_pointwise(const BackwardPointers<float>& p, int64_t col_begin, int64_t col_end);  \
  void backward_pointwise(const BackwardPointers<double>& p, int64_t col_begin, int64_t col_end); \
  void forward_pointwise(const ForwardPointers<c10::BFloat16>& p, int64_t col_begin, int64_t col_end); \
  void backward_pointwise(const BackwardPointers<c10::BFloat16>& p, int64_t col_begin, int64_t col_end); \
  void sequence_forward_step(const SequenceForwardStep<float>& p);                                \
  void sequence_forward_step(const SequenceForwardStep<double>& p);                               \
  void sequence_forward_step(const SequenceForwardStep<c10::BFloat16>& p);                        \
  void sequence_backward_step(const SequenceBackwardStep<float>& p);                              \
  void sequence_backward_step(const SequenceBackwardStep<double>& p);                             \
  void sequence_backward_step(const SequenceBackwardStep<c10::BFloat16>& p);                      \
  }

LLTM_DECLARE_POINTWISE_KERNELS(DEFAULT)
#if defined(__x86_64__)
LLTM_DECLARE_POINTWISE_KERNELS(AVX2)
LLTM_DECLARE_POINTWISE_KERNELS(AVX512)
#endif

#undef LLTM_DECLARE_POINTWISE_KERNELS

}  // namespace lltm_cpu
