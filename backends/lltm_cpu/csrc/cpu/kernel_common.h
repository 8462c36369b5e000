// What the step kernels (lltm_kernels.cpp) and the sequence kernels
// (lltm_sequence.cpp) share: the stable ABI's tensor and its checks, the
// dtype switch, the thread pool, and the choice of the pointwise passes'
// build for this CPU.
#pragma once

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include "check.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>

#include "pointwise.h"

namespace lltm_cpu {

using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;

constexpr int64_t divup(int64_t x, int64_t y) { return (x + y - 1) / y; }

// Fewer (row, column) elements than this per thread, and starting threads
// costs more than it saves (ATen uses the same grain for elementwise ops): the
// seed's B16 S128 step runs its pointwise passes on one thread.
constexpr int64_t kMinElementsPerThread = 32768;

inline const char* dtype_name(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Float:
      return "float32";
    case ScalarType::Double:
      return "float64";
    case ScalarType::BFloat16:
      return "bfloat16";
    default:
      return c10::toString(dtype);
  }
}

template <typename scalar_t>
constexpr ScalarType scalar_type_of() {
  if constexpr (std::is_same_v<scalar_t, float>) {
    return ScalarType::Float;
  } else if constexpr (std::is_same_v<scalar_t, double>) {
    return ScalarType::Double;
  } else {
    return ScalarType::BFloat16;
  }
}

template <typename scalar_t>
const char* dtype_name() {
  return dtype_name(scalar_type_of<scalar_t>());
}

// Calls body(scalar_t{}) for float32, float64 or bfloat16.
template <typename Body>
void dispatch_floating(ScalarType dtype, const char* op, const Body& body) {
  switch (dtype) {
    case ScalarType::Float:
      return body(float{});
    case ScalarType::Double:
      return body(double{});
    case ScalarType::BFloat16:
      return body(c10::BFloat16{});
    default:
      LLTM_CHECK(false, op, ": takes float32, float64 or bfloat16 tensors, got ", dtype_name(dtype));
  }
}

inline std::string shape(const Tensor& t) {
  std::ostringstream out;
  out << '[';
  for (int64_t d = 0; d < t.dim(); ++d) {
    out << (d == 0 ? "" : ", ") << t.size(d);
  }
  out << ']';
  return out.str();
}

inline bool has_shape(const Tensor& t, std::initializer_list<int64_t> sizes) {
  if (t.dim() != static_cast<int64_t>(sizes.size())) {
    return false;
  }
  int64_t d = 0;
  for (const int64_t size : sizes) {
    if (t.size(d++) != size) {
      return false;
    }
  }
  return true;
}

inline void check_matrix(const Tensor& t, const char* op, const char* name, int64_t rows, int64_t cols) {
  LLTM_CHECK(has_shape(t, {rows, cols}), op, ": ", name, " must have shape [", rows, ", ", cols, "], got ",
                  shape(t));
}

struct NamedTensor {
  const char* name;
  const Tensor& tensor;
};

// All tensors must share the first one's dtype, float32, float64 or bfloat16.
inline void check_dtypes(const char* op, std::initializer_list<NamedTensor> tensors) {
  const NamedTensor& first = *tensors.begin();
  const ScalarType dtype = first.tensor.scalar_type();
  LLTM_CHECK(dtype == ScalarType::Float || dtype == ScalarType::Double || dtype == ScalarType::BFloat16, op,
                  ": takes float32, float64 or bfloat16 tensors, got ", first.name, " of dtype ", dtype_name(dtype));
  for (const NamedTensor& t : tensors) {
    LLTM_CHECK(t.tensor.scalar_type() == dtype, op, ": ", t.name, " has dtype ",
                    dtype_name(t.tensor.scalar_type()), ", expected ", dtype_name(dtype), " (the dtype of ",
                    first.name, ")");
  }
}

// The per-step cell's kernels take and make a dozen tensors a call.
// torch::stable::empty and ::contiguous look their aten operator up by name and
// box its arguments on every call, a visible share of a cell forward at the
// tutorial's size (benchmarks/results/cpu.md).  The two below skip that.

// A new contiguous CPU tensor, made by the C shim's empty_strided.
inline Tensor empty(std::initializer_list<int64_t> sizes, ScalarType dtype) {
  constexpr size_t kMaxDims = 4;
  LLTM_CHECK(sizes.size() <= kMaxDims, "lltm_cpu: empty() takes at most ", kMaxDims, " dimensions");
  int64_t strides[kMaxDims];
  int64_t stride = 1;
  for (size_t dim = sizes.size(); dim-- > 0;) {
    strides[dim] = stride;
    stride *= std::max<int64_t>(sizes.begin()[dim], 1);
  }
  const auto shim_dtype = torch::stable::detail::to<int32_t>(torch::stable::detail::from(dtype));
  AtenTensorHandle handle = nullptr;
  LLTM_CHECK(aoti_torch_empty_strided(static_cast<int64_t>(sizes.size()), sizes.begin(), strides, shim_dtype,
                                      aoti_torch_device_type_cpu(), 0, &handle) == AOTI_TORCH_SUCCESS,
             "lltm_cpu: could not allocate a ", dtype_name(dtype), " tensor of ", sizes.size(), " dimensions");
  return Tensor(handle);
}

// `t` itself where it is contiguous, else a contiguous copy.
inline Tensor as_contiguous(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }

// torch's thread count (torch.set_num_threads), and whether this thread is
// inside a parallel region of torch's pool (where a parallel_for runs inline).
inline int64_t num_threads() { return static_cast<int64_t>(torch::stable::get_num_threads()); }
bool in_parallel_region();
// Whether torch's pool is OpenMP's: each block of a parallel region then
// has a thread of its own, as the column split's barrier requires.
bool openmp_pool();

// A symbol of torch's libraries or of what they loaded (MKL, OpenMP), or
// nullptr: C functions of other libraries' ABIs, looked up at run time.
void* find_symbol(const char* name);

// torch.use_deterministic_algorithms's flag, read at each call through
// at::globalContext().deterministicAlgorithms(), found with find_symbol (the
// stable ABI has no getter); false where this torch does not export them.
// deterministic_flag_problem() says so ("" where the flag is read), and
// lltm_cpu warns with it once, as it loads the library.
bool deterministic_algorithms();
std::string deterministic_flag_problem();

namespace detail {
extern thread_local int parallel_depth;  // parallel_for's regions this thread is inside
}

// torch::stable::parallel_for, which reports an exception of `body` only as
// an error code: the first one's message is kept and thrown on this thread.
template <typename Body>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const Body& body) {
  std::mutex mutex;
  std::string failure;
  const auto run = [&](int64_t first, int64_t last) {
    ++detail::parallel_depth;
    try {
      body(first, last);
    } catch (const std::exception& error) {
      const std::lock_guard<std::mutex> lock(mutex);
      if (failure.empty()) {
        failure = error.what();
      }
    }
    --detail::parallel_depth;
  };
  if (end - begin <= grain || in_parallel_region() || num_threads() == 1) {
    run(begin, end);
  } else {
    torch::stable::parallel_for(begin, end, grain, run);
  }
  if (!failure.empty()) {
    throw std::runtime_error(failure);
  }
}

template <typename scalar_t>
struct PointwiseKernels {
  void (*forward)(const ForwardPointers<scalar_t>&, int64_t, int64_t);
  void (*backward)(const BackwardPointers<scalar_t>&, int64_t, int64_t);
  void (*sequence_forward)(const SequenceForwardStep<scalar_t>&);
  void (*sequence_backward)(const SequenceBackwardStep<scalar_t>&);
};

// The widest build this CPU runs: "AVX512", "AVX2" or "DEFAULT", as ATen
// chooses its own (AVX-512 F/BW/VL/DQ; AVX2 with FMA), lowered by
// ATEN_CPU_CAPABILITY=default|avx2 as ATen's is.
const char* cpu_capability();

template <typename scalar_t>
PointwiseKernels<scalar_t> choose_pointwise_kernels() {
#if defined(__x86_64__)
  const std::string capability = cpu_capability();
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

}  // namespace lltm_cpu
