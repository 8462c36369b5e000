// The lltm_cpu operator library: its schema.  The CPU kernels of the step are in
// cpu/lltm_kernels.cpp, those of the sequence in cpu/lltm_sequence.cpp.
#include <torch/library.h>

// The library has no CPython module init and needs nothing from libpython:
// Python loads it with torch.ops.load_library (lltm_cpu._load_library), and a
// C++ program (an AOTInductor runner) with dlopen(RTLD_NOW).

// The signatures lltm_core's backend contract asks for (lltm_core/backend.py).
// forward returns the two results, then what backward needs, in the order of
// lltm_cpu.saved_layout.
TORCH_LIBRARY(lltm_cpu, m) {
  m.def(
      "forward(Tensor input, Tensor weights, Tensor bias, Tensor old_h, Tensor old_cell)"
      " -> (Tensor new_h, Tensor new_cell, Tensor X, Tensor gates, Tensor tanh_cell)");
  m.def(
      "backward(Tensor grad_new_h, Tensor grad_new_cell, Tensor weights,"
      " Tensor X, Tensor gates, Tensor tanh_cell, bool needs_grad_X)"
      " -> (Tensor grad_X, Tensor grad_weights, Tensor grad_bias, Tensor grad_old_cell)");
  // One layer, one direction, over a sequence (interface versions 2 and 3):
  // sequence_forward returns output, h_n, c_n, then what sequence_backward
  // needs, in the order of lltm_cpu.sequence_saved_layout.  With
  // needs_backward false (version 3, inference) those are empty tensors and
  // the forward keeps only a bounded workspace; its default keeps version 2's
  // seven-argument call working.
  m.def(
      "sequence_forward(Tensor input, Tensor weights, Tensor bias, Tensor h0, Tensor c0, Tensor? lengths,"
      " bool reverse, bool needs_backward=True)"
      " -> (Tensor output, Tensor h_n, Tensor c_n, Tensor gates, Tensor tanh_cell)");
  m.def(
      "sequence_backward(Tensor grad_output, Tensor grad_h_n, Tensor grad_c_n, Tensor weights, Tensor input,"
      " Tensor h0, Tensor output, Tensor? lengths, Tensor gates, Tensor tanh_cell, bool reverse,"
      " bool needs_grad_input)"
      " -> (Tensor grad_input, Tensor grad_weights, Tensor grad_bias, Tensor grad_h0, Tensor grad_c0)");
  // The GEMM routes the sequence kernels chose so far in this process, one
  // line per shape: "<which GEMM> <dtype> M.. N.. K..: <route> (measured: ...)"
  // (see cpu/blas.h).
  m.def("gemm_routes() -> str[]");
}
