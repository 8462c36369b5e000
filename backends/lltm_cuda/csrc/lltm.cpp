// The operator schemas of lltm-cuda, and the empty Python module whose import loads them.
// The CUDA implementations are registered in cuda/lltm_kernels.cu.
#include <Python.h>
#include <torch/library.h>

// `import lltm_cuda._C` loads this library, which runs the TORCH_LIBRARY
// registrations below.  No pybind11: the module only uses the stable Python
// ABI, so one abi3 build serves every Python from torch's oldest supported on.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}

// The saved tensors (X, gates, tanh_cell) are the ones lltm_cuda.saved_layout declares.
TORCH_LIBRARY(lltm_cuda, m) {
  m.def(
      "forward(Tensor input, Tensor weights, Tensor bias, Tensor old_h, Tensor old_cell) "
      "-> (Tensor new_h, Tensor new_cell, Tensor X, Tensor gates, Tensor tanh_cell)");
  m.def(
      "backward(Tensor grad_h, Tensor grad_cell, Tensor weights, Tensor X, Tensor gates, Tensor tanh_cell, "
      "bool needs_grad_X) "
      "-> (Tensor grad_X, Tensor grad_weights, Tensor grad_bias, Tensor grad_old_cell)");
}
