// The operator schemas of lltm-cuda.  The CUDA implementations are registered in
// cuda/lltm_kernels.cu (the step) and cuda/lltm_sequence.cu (a whole sequence).
//
// No Python here: lltm_cuda/__init__.py loads this library with torch.ops.load_library, whose
// dlopen runs the registrations, so a C++ program (an AOTInductor runner) loads it the same way
// with no libpython in the process.
#include <torch/csrc/stable/library.h>
#include "lltm_schema.h"  // the contract's schemas: lltm_core/include/lltm_schema.h

// The saved tensors (X, gates, tanh_cell; for a sequence gates, tanh_cell) are the ones
// lltm_cuda.saved_layout and lltm_cuda.sequence_saved_layout declare.  sequence_forward with
// needs_backward=False (contract v3, inference) returns them empty; its default, True, is the
// contract-v2 call.
STABLE_TORCH_LIBRARY(lltm_cuda, m) {
  m.def(LLTM_SCHEMA_FORWARD);
  m.def(LLTM_SCHEMA_BACKWARD);
  m.def(LLTM_SCHEMA_SEQUENCE_FORWARD);
  m.def(LLTM_SCHEMA_SEQUENCE_BACKWARD);
}
