// What lltm-cuda's two kernel families share: vector access, the LLTM's activations, the
// gate layout, launch sizing, argument checks, and the few tensor operations the host code needs
// beyond what torch/csrc/stable/ops.h offers at the target version.  lltm_kernels.cu is the single step (one
// cell), lltm_sequence.cu the whole sequence; both include this.
#pragma once

#include "lltm_runtime.cuh"

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/Dispatch_v2.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Exception.h>
#include <torch/headeronly/util/Half.h>
#include <torch/headeronly/util/HeaderOnlyArrayRef.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

namespace lltm_cuda {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;
using IntList = torch::headeronly::IntHeaderOnlyArrayRef;

// The type a kernel computes in: float for the 16-bit floating types, else the type itself
// (ATen's opmath_type, which is not part of the stable ABI).
template <typename T>
struct OpMath {
  using type = T;
};
template <>
struct OpMath<torch::headeronly::Half> {
  using type = float;
};
template <>
struct OpMath<torch::headeronly::BFloat16> {
  using type = float;
};
template <typename T>
using opmath_type = typename OpMath<T>::type;

inline ScalarType opmath_scalar_type(ScalarType t) {
  return t == ScalarType::Half || t == ScalarType::BFloat16 ? ScalarType::Float : t;
}

// Runs body() with scalar_t bound to the C++ type of `dtype`, one of the four floating types
// lltm-cuda declares (the header-only dispatch; ATen's AT_DISPATCH is not stable).
#define LLTM_CUDA_DISPATCH_FLOATING(dtype, name, ...)                                                     \
  THO_DISPATCH_V2(dtype, name, AT_WRAP(__VA_ARGS__), AT_FLOATING_TYPES, torch::headeronly::ScalarType::Half, \
                  torch::headeronly::ScalarType::BFloat16)

constexpr int kVectorBytes = 16;  // the widest single load/store a thread can issue

// VEC consecutive elements moved as one aligned access.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

template <int VEC, typename T>
__device__ __forceinline__ Vec<T, VEC> load(const T* p) {
  rt::check_vector_aligned<Vec<T, VEC>>(p);
  return *reinterpret_cast<const Vec<T, VEC>*>(p);
}

template <int VEC, typename T>
__device__ __forceinline__ void store(T* p, const Vec<T, VEC>& value) {
  rt::check_vector_aligned<Vec<T, VEC>>(p);
  *reinterpret_cast<Vec<T, VEC>*>(p) = value;
}

// Math in T itself (float or double): no float literal or float-only function
// may round a double computation, or float64 gradcheck fails.
template <typename T>
__device__ __forceinline__ T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <typename T>
__device__ __forceinline__ T elu(T x) {
  return x > T(0) ? x : std::expm1(x);
}

template <typename T>
__device__ __forceinline__ T elu_derivative(T x) {
  return x > T(0) ? T(1) : std::exp(x);
}

// One cell at one element, in T (the opmath type): the step's and the sequence's kernels both
// run it.  From the pre-activation gates and the previous cell: the new cell, tanh of it, and h.
template <typename T>
struct CellForward {
  T cell, tanh_cell, h;
};

template <typename T>
__device__ __forceinline__ CellForward<T> cell_forward(T pre_i, T pre_o, T pre_z, T old_cell) {
  const T cell = old_cell + elu(pre_z) * sigmoid(pre_i);
  const T tanh_c = std::tanh(cell);
  return {cell, tanh_c, tanh_c * sigmoid(pre_o)};
}

// Back through it: the gradients of the pre-activation gates and of the previous cell, from the
// pre-activation gates, tanh(new cell) and the gradients of the new h and the new cell.
template <typename T>
struct CellBackward {
  T d_i, d_o, d_z, d_old_cell;
};

template <typename T>
__device__ __forceinline__ CellBackward<T> cell_backward(T pre_i, T pre_o, T pre_z, T tanh_c, T grad_h, T grad_cell) {
  const T i = sigmoid(pre_i);
  const T o = sigmoid(pre_o);
  // new_h = tanh(new_cell) * o, new_cell = old_cell + elu(z) * i; with no forget gate the old
  // cell's gradient is the new cell's.
  const T d_cell = (T(1) - tanh_c * tanh_c) * o * grad_h + grad_cell;
  return {elu(pre_z) * d_cell * i * (T(1) - i), tanh_c * grad_h * o * (T(1) - o), i * d_cell * elu_derivative(pre_z),
          d_cell};
}

// Element e = row * S + col of a (B, S) tensor sits at gates[row * 3S + col]
// in the first gate chunk (+S, +2S for the others).
__device__ __forceinline__ int64_t gate_offset(int64_t e, int64_t state_size) {
  return e + 2 * (e / state_size) * state_size;
}

// The three gates' VEC elements of element e (i, o, z), one aligned access each, and back.
template <typename T, int VEC>
struct GateVecs {
  Vec<T, VEC> i, o, z;
};

template <int VEC, typename T>
__device__ __forceinline__ GateVecs<T, VEC> load_gates(const T* gates, int64_t e, int64_t state_size) {
  const T* const g = gates + gate_offset(e, state_size);
  return {load<VEC>(g), load<VEC>(g + state_size), load<VEC>(g + 2 * state_size)};
}

template <int VEC, typename T>
__device__ __forceinline__ void store_gates(T* gates, int64_t e, int64_t state_size, const GateVecs<T, VEC>& value) {
  T* const g = gates + gate_offset(e, state_size);
  store<VEC>(g, value.i);
  store<VEC>(g + state_size, value.o);
  store<VEC>(g + 2 * state_size, value.z);
}

// Whether row `row` takes part in step `step`: with lengths, only steps t < lengths[row] do (in
// either direction; reversed, a row starts at its own last step).  A vector never crosses a row;
// the per-step and the persistent sequence kernels both ask it.
__device__ __forceinline__ bool takes_part(const int64_t* lengths, int64_t row, int64_t step) {
  return lengths == nullptr || step < lengths[row];
}

inline const int64_t* lengths_ptr(const std::optional<Tensor>& lengths) {
  return lengths.has_value() ? lengths->const_data_ptr<int64_t>() : nullptr;
}

// What grid_size() asks the runtime, per device (multiprocessors) and per device and kernel
// (occupancy): fixed for the life of the process, so asked once each, not on every step.
struct GridCache {
  std::mutex mutex;
  std::map<int, int> multiprocessors;
  std::map<std::pair<int, const void*>, int> blocks_per_multiprocessor;
};

inline GridCache& grid_cache() {
  static GridCache cache;
  return cache;
}

// One full wave: as many blocks as fit on the GPU at once at this kernel's
// occupancy (its register use decides it), so no partial second wave idles
// part of the chip; the grid-stride loops cover the rest of the work.
// `device` is the index of the device the launch runs on (the guard's).
template <typename... Params>
int64_t grid_size(void (*kernel)(Params...), int64_t work_items, int device) {
  const int threads = rt::threads_per_block();
  const int64_t needed = (work_items + threads - 1) / threads;
  GridCache& cache = grid_cache();
  const std::lock_guard<std::mutex> lock(cache.mutex);
  auto sms = cache.multiprocessors.find(device);
  if (sms == cache.multiprocessors.end()) {
    sms = cache.multiprocessors.emplace(device, rt::multiprocessor_count(device)).first;
  }
  if (needed <= sms->second) {
    return needed;  // one block per multiprocessor at most: no need to ask (and pay for) the occupancy
  }
  const std::pair<int, const void*> key{device, reinterpret_cast<const void*>(kernel)};
  auto occupancy = cache.blocks_per_multiprocessor.find(key);
  if (occupancy == cache.blocks_per_multiprocessor.end()) {
    occupancy = cache.blocks_per_multiprocessor.emplace(key, rt::blocks_per_multiprocessor(kernel, threads)).first;
  }
  return std::min(needed, int64_t(sms->second) * occupancy->second);
}

// A buffer a pointwise kernel moves in vectors: its address and the size of its elements (the
// float cell state of a float16 sequence has 4-byte elements where the tensors have 2).
struct Buffer {
  const void* pointer;
  int element_size;
};

template <typename T>
Buffer buffer(const T* p) {
  return {p, int(sizeof(T))};
}

inline Buffer buffer(const Tensor& t) { return {t.const_data_ptr(), int(t.element_size())}; }

// Whether a pointwise kernel over rows of state_size elements may move 16 bytes of scalar_t,
// VEC = 16 / sizeof(scalar_t) elements, at a time: S a multiple of VEC (so a vector never crosses
// a row) and every buffer aligned to the VEC of ITS elements (Vec<float, 8>, 32 bytes, for the
// float cell of a float16 kernel), as an input may be a view at an odd offset.
template <typename scalar_t>
bool vectorizable(int64_t state_size, torch::headeronly::HeaderOnlyArrayRef<Buffer> buffers) {
  constexpr int kVec = kVectorBytes / sizeof(scalar_t);
  return state_size % kVec == 0 && std::all_of(buffers.begin(), buffers.end(), [](const Buffer& b) {
           return reinterpret_cast<std::uintptr_t>(b.pointer) % (std::uintptr_t(kVec) * b.element_size) == 0;
         });
}

// Calls launch(std::integral_constant<int, VEC>) with VEC = 16 bytes of
// elements when vectorizable, else with VEC = 1; nothing when numel is 0.
template <typename scalar_t, typename Launch>
void launch_pointwise(int64_t numel, int64_t state_size, torch::headeronly::HeaderOnlyArrayRef<Buffer> buffers,
                      Launch&& launch) {
  if (numel == 0) {
    return;
  }
  if (vectorizable<scalar_t>(state_size, buffers)) {
    launch(std::integral_constant<int, kVectorBytes / sizeof(scalar_t)>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
}

// How the checks' messages name a device and a shape, as torch prints them ("cuda:0", "[2, 3]").
inline std::string describe(const torch::stable::Device& device) {
  std::ostringstream out;
  out << (device.is_cuda() ? "cuda" : device.is_cpu() ? "cpu" : "device");
  if (device.has_index() && !device.is_cpu()) {
    out << ":" << int(device.index());
  }
  return out.str();
}

inline std::string describe(IntList sizes) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    out << (i ? ", " : "") << sizes[i];
  }
  out << "]";
  return out.str();
}

struct Arg {
  const Tensor& tensor;
  const char* name;
};

// lltm-core checks every call before it gets here; these checks keep direct
// calls of torch.ops.lltm_cuda.* from reading out of bounds.
inline void check_args(const char* op, std::initializer_list<Arg> args) {
  const Tensor& first = args.begin()->tensor;
  for (const Arg& arg : args) {
    STD_TORCH_CHECK(rt::on_device(arg.tensor), op, ": ", arg.name, " must be a ", rt::kDeviceName,
                    " tensor, got one on ", describe(arg.tensor.device()));
    STD_TORCH_CHECK(arg.tensor.device() == first.device(), op, ": ", arg.name, " is on ",
                    describe(arg.tensor.device()), ", expected ", describe(first.device()), " (the device of ",
                    args.begin()->name, ")");
    STD_TORCH_CHECK(arg.tensor.scalar_type() == first.scalar_type(), op, ": ", arg.name, " has dtype ",
                    arg.tensor.scalar_type(), ", expected ", first.scalar_type(), " (the dtype of ",
                    args.begin()->name, ")");
    STD_TORCH_CHECK(arg.tensor.is_contiguous(), op, ": ", arg.name, " must be contiguous");
  }
}

inline void check_shape(const char* op, const Arg& arg, IntList expected) {
  const IntList sizes = arg.tensor.sizes();
  STD_TORCH_CHECK(sizes.size() == expected.size() && std::equal(sizes.begin(), sizes.end(), expected.begin()), op,
                  ": ", arg.name, " has shape ", describe(sizes), ", expected ", describe(expected));
}

// The tensor operations of the host code.  torch/csrc/stable/ops.h has most; the rest are aten
// operators called by schema through torch's dispatcher (torch_call_dispatcher, part of the
// stable C API), which is how ops.h itself implements its own.
namespace ops {

template <typename... Args>
Tensor call(const char* name, const char* overload, const Args&... args) {
  std::array<StableIValue, sizeof...(Args)> stack{torch::stable::detail::from(args)...};
  STABLE_TORCH_ERROR_CODE_CHECK(torch_call_dispatcher(name, overload, stack.data(), TORCH_ABI_VERSION));
  return torch::stable::detail::to<Tensor>(stack[0]);
}

// The host code makes and views its tensors through the helpers below, which call the C shim
// directly (as lltm-cpu's kernel_common.h does): ops.h's empty, empty_like, new_empty, contiguous,
// transpose and select look their aten operator up by name and box their arguments on every call,
// as call() does, about 0.5 us each (benchmarks/results/cuda_host.md).

// A new contiguous tensor of `sizes` on the device of `like`.
inline Tensor empty(IntList sizes, ScalarType dtype, const Tensor& like) {
  constexpr size_t kMaxDims = 4;
  STD_TORCH_CHECK(sizes.size() <= kMaxDims, "lltm_cuda: empty() takes at most ", kMaxDims, " dimensions");
  int64_t strides[kMaxDims];
  int64_t stride = 1;
  for (size_t dim = sizes.size(); dim-- > 0;) {
    strides[dim] = stride;
    stride *= std::max<int64_t>(sizes[dim], 1);
  }
  int32_t device_type = 0;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(like.get(), &device_type));
  AtenTensorHandle handle = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(
      static_cast<int64_t>(sizes.size()), sizes.data(), strides,
      torch::stable::detail::to<int32_t>(torch::stable::detail::from(dtype)), device_type,
      like.get_device_index(), &handle));
  Tensor out(handle);
#ifdef LLTM_CUDA_EMULATE
  // As in shared memory, what a kernel reads before anything wrote it is NaN (0xFF bytes) in the
  // emulation, not the zeros a fresh page happens to hold.
  if (out.numel() > 0) {  // an empty tensor's data pointer may be null, which memset may not take
    std::memset(out.data_ptr(), 0xFF, size_t(out.numel()) * out.element_size());
  }
#endif
  return out;
}

// empty_like for a contiguous `t` (each caller's is checked or made so).
inline Tensor empty_like(const Tensor& t) { return empty(t.sizes(), t.scalar_type(), t); }

// `t` itself where it is contiguous, else a contiguous copy.
inline Tensor as_contiguous(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }

// A view of t's memory: `sizes` and `strides` from `offset` elements past t's first (the shim's
// offset is added to t's own storage offset, as inductor's _reinterpret_tensor does).
inline Tensor strided_view(const Tensor& t, IntList sizes, IntList strides, int64_t offset) {
  AtenTensorHandle handle = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch__reinterpret_tensor(
      t.get(), static_cast<int64_t>(sizes.size()), sizes.data(), strides.data(), offset, &handle));
  return Tensor(handle);
}

// t[i] along the first dimension.
inline Tensor select0(const Tensor& t, int64_t i) {
  return strided_view(t, t.sizes().slice(1), t.strides().slice(1), i * t.stride(0));
}

// A fresh contiguous copy of `t`, in `dtype` (the running state and its gradient).
inline Tensor copy_as(const Tensor& t, ScalarType dtype) {
  Tensor out = empty(t.sizes(), dtype, t);
  torch::stable::copy_(out, t);
  return out;
}

inline Tensor narrow(Tensor t, int64_t dim, int64_t start, int64_t length) {
  return torch::stable::narrow(t, dim, start, length);
}

// The transpose of a matrix, as a view.
inline Tensor t(const Tensor& m) {
  const int64_t sizes[] = {m.size(1), m.size(0)};
  const int64_t strides[] = {m.stride(1), m.stride(0)};
  return strided_view(m, IntList(sizes), IntList(strides), 0);
}

inline Tensor sum0(const Tensor& t) {
  const int64_t dims[] = {0};
  return torch::stable::sum(t, IntList(dims));
}

inline Tensor expand(const Tensor& t, IntList sizes) { return call("aten::expand", "", t, sizes, false); }

inline Tensor gather(const Tensor& t, int64_t dim, const Tensor& index) {
  return call("aten::gather", "", t, dim, index, false);
}

// min(max(t, low), high) for an integer tensor, the bounds as 0-dim tensors on its device.
inline Tensor clamp(const Tensor& t, int64_t low, int64_t high) {
  const Tensor lo = torch::stable::full({}, double(low), t.scalar_type(), std::nullopt, t.device());
  const Tensor hi = torch::stable::full({}, double(high), t.scalar_type(), std::nullopt, t.device());
  return call("aten::clamp", "Tensor", t, std::optional<Tensor>(lo), std::optional<Tensor>(hi));
}

// t - 1 for an integer tensor, exactly: ~(-t) in two's complement.  (ops.h's subtract passes a
// floating alpha, which torch refuses for integer tensors, and a Scalar is no stable argument.)
inline Tensor minus_one(const Tensor& t) { return call("aten::bitwise_not", "", call("aten::neg", "", t)); }

// The cell state (or its gradient) as the dtype of `like`: itself when it already is (it is new memory).
inline Tensor as_dtype_of(const Tensor& t, const Tensor& like) {
  return t.scalar_type() == like.scalar_type() ? t : torch::stable::to(t, like.scalar_type());
}

}  // namespace ops

}  // namespace lltm_cuda
