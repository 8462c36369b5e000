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
#include "lltm_schema.h"  // the contract's schemas: lltm_core/include/lltm_schema.h

// The signatures lltm_core's backend contract asks for (lltm_core/backend.py).
// forward returns the two results, then what backward needs, in the order of
// lltm_cpu.saved_layout.
STABLE_TORCH_LIBRARY(lltm_cpu, m) {
  m.def(LLTM_SCHEMA_FORWARD);
  m.def(LLTM_SCHEMA_BACKWARD);
  m.def(LLTM_SCHEMA_SEQUENCE_FORWARD);
  m.def(LLTM_SCHEMA_SEQUENCE_BACKWARD);
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

// Why torch.use_deterministic_algorithms's flag cannot be read on this
// torch, or "" where it can (cpu/kernel_common.h).
__attribute__((visibility("default"))) const char* lltm_cpu_deterministic_flag_error() {
  try {
    return thread_copy(lltm_cpu::deterministic_flag_problem());
  } catch (const std::exception& error) {
    return thread_copy(error.what());
  }
}

}  // extern "C"
