// The lltm_cpu operator library: its schema, and the C functions that
// lltm_cpu/__init__.py reads with ctypes.  The CPU kernels of the step are
// in cpu/lltm_kernels.cpp, those of the sequence in cpu/lltm_sequence.cpp.
//
// Built against PyTorch's stable ABI (TORCH_TARGET_VERSION: see
// lltm_cpu/_build_config.py), so one build loads on every torch from the
// target version on.  It has no Python in it: Python loads it with
// torch.ops.load_library, and a C++ program with dlopen
// (lltm_cpu.library_path() says where it is).
#include <torch/csrc/stable/library.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "cpu/blas.h"
#include "cpu/partition.h"
#include "cpu/tuning.h"

// The signatures lltm_core's backend contract asks for (lltm_core/backend.py).
// forward returns the two results, then what backward needs, in the order of
// lltm_cpu.saved_layout.
STABLE_TORCH_LIBRARY(lltm_cpu, m) {
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
}

namespace {
// A copy that stays valid until the next call on this thread.
const char* thread_copy(std::string text) {
  static thread_local std::string held;
  held = std::move(text);
  return held.c_str();
}
}  // namespace

// C functions, for ctypes: an operator of the stable ABI cannot return a
// list of strings.  Neither throws.
extern "C" {

// The GEMM routes and time-loop splits chosen so far in this process, as a
// JSON array of records (cpu/tuning.h).
__attribute__((visibility("default"))) const char* lltm_cpu_gemm_routes_json() {
  try {
    return thread_copy(lltm_cpu::tuning::report_json());
  } catch (const std::exception& error) {
    return thread_copy(std::string("[]"));
  }
}

// Why LLTM_CPU_GEMM or LLTM_CPU_SPLIT cannot be used, or "" when both are
// unset or valid: checked before any call, so that a bad value makes the
// backend unavailable with the reason instead of failing every call.
__attribute__((visibility("default"))) const char* lltm_cpu_settings_error() {
  try {
    lltm_cpu::blas::requested_route();
    lltm_cpu::requested_split();
    return thread_copy("");
  } catch (const std::exception& error) {
    return thread_copy(error.what());
  }
}

}  // extern "C"
