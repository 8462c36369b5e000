// The operator schemas of lltm-cuda.  The CUDA implementations are registered in
// cuda/lltm_kernels.cu (the step) and cuda/lltm_sequence.cu (a whole sequence).
//
// No Python here: lltm_cuda/__init__.py loads this library with torch.ops.load_library, whose
// dlopen runs the registrations, so a C++ program (an AOTInductor runner) loads it the same way
// with no libpython in the process.
#include <torch/csrc/stable/library.h>

// The saved tensors (X, gates, tanh_cell; for a sequence gates, tanh_cell) are the ones
// lltm_cuda.saved_layout and lltm_cuda.sequence_saved_layout declare.  sequence_forward with
// needs_backward=False (contract v3, inference) returns them empty; its default, True, is the
// contract-v2 call.
STABLE_TORCH_LIBRARY(lltm_cuda, m) {
  m.def(
      "forward(Tensor input, Tensor weights, Tensor bias, Tensor old_h, Tensor old_cell) "
      "-> (Tensor new_h, Tensor new_cell, Tensor X, Tensor gates, Tensor tanh_cell)");
  m.def(
      "backward(Tensor grad_h, Tensor grad_cell, Tensor weights, Tensor X, Tensor gates, Tensor tanh_cell, "
      "bool needs_grad_X) "
      "-> (Tensor grad_X, Tensor grad_weights, Tensor grad_bias, Tensor grad_old_cell)");
  m.def(
      "sequence_forward(Tensor input, Tensor weights, Tensor bias, Tensor h0, Tensor c0, Tensor? lengths, "
      "bool reverse, bool needs_backward=True) -> (Tensor output, Tensor h_n, Tensor c_n, Tensor gates, "
      "Tensor tanh_cell)");
  m.def(
      "sequence_backward(Tensor grad_output, Tensor grad_h_n, Tensor grad_c_n, Tensor weights, Tensor input, "
      "Tensor h0, Tensor output, Tensor? lengths, Tensor gates, Tensor tanh_cell, bool reverse, "
      "bool needs_grad_input) "
      "-> (Tensor grad_input, Tensor grad_weights, Tensor grad_bias, Tensor grad_h0, Tensor grad_c0)");
}
