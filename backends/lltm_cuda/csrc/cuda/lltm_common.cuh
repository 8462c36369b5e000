// What lltm-cuda's two kernel families share: vector access, the LLTM's activations, the
// gate layout, launch sizing and argument checks.  lltm_kernels.cu is the single step (one
// cell), lltm_sequence.cu the whole sequence; both include this.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace lltm_cuda {

constexpr int kThreadsPerBlock = 256;
constexpr int kVectorBytes = 16;  // the widest single load/store a thread can issue

// VEC consecutive elements moved as one aligned access.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

template <int VEC, typename T>
__device__ __forceinline__ Vec<T, VEC> load(const T* p) {
  return *reinterpret_cast<const Vec<T, VEC>*>(p);
}

template <int VEC, typename T>
__device__ __forceinline__ void store(T* p, const Vec<T, VEC>& value) {
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

// One full wave: as many blocks as fit on the GPU at once at this kernel's
// occupancy (its register use decides it), so no partial second wave idles
// part of the chip; the grid-stride loops cover the rest of the work.
template <typename Kernel>
int64_t grid_size(Kernel kernel, int64_t work_items) {
  int device = 0, multiprocessors = 0, blocks_per_multiprocessor = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
  const int64_t needed = (work_items + kThreadsPerBlock - 1) / kThreadsPerBlock;
  if (needed <= multiprocessors) {
    return needed;  // one block per multiprocessor at most: no need to ask (and pay for) the occupancy
  }
  C10_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_multiprocessor, kernel, kThreadsPerBlock, 0));
  return std::min(needed, int64_t(multiprocessors) * blocks_per_multiprocessor);
}

// Whether a pointwise kernel over rows of state_size elements may move 16 bytes
// of scalar_t at a time: S a multiple of the vector (so a vector never crosses
// a row) and every pointer 16-byte aligned (an input may be a view at an odd offset).
template <typename scalar_t>
bool vectorizable(int64_t state_size, std::initializer_list<const void*> pointers) {
  constexpr int kVec = kVectorBytes / sizeof(scalar_t);
  return state_size % kVec == 0 && std::all_of(pointers.begin(), pointers.end(), [](const void* p) {
           return reinterpret_cast<std::uintptr_t>(p) % kVectorBytes == 0;
         });
}

// Calls launch(std::integral_constant<int, VEC>) with VEC = 16 bytes of
// elements when vectorizable, else with VEC = 1; nothing when numel is 0.
template <typename scalar_t, typename Launch>
void launch_pointwise(int64_t numel, int64_t state_size, std::initializer_list<const void*> pointers, Launch&& launch) {
  if (numel == 0) {
    return;
  }
  if (vectorizable<scalar_t>(state_size, pointers)) {
    launch(std::integral_constant<int, kVectorBytes / sizeof(scalar_t)>{});
  } else {
    launch(std::integral_constant<int, 1>{});
  }
}

struct Arg {
  const at::Tensor& tensor;
  const char* name;
};

// lltm-core checks every call before it gets here; these checks keep direct
// calls of torch.ops.lltm_cuda.* from reading out of bounds.
inline void check_args(const char* op, std::initializer_list<Arg> args) {
  const at::Tensor& first = args.begin()->tensor;
  for (const Arg& arg : args) {
    TORCH_CHECK(arg.tensor.is_cuda(), op, ": ", arg.name, " must be a CUDA tensor, got one on ", arg.tensor.device());
    TORCH_CHECK(arg.tensor.device() == first.device(), op, ": ", arg.name, " is on ", arg.tensor.device(),
                ", expected ", first.device(), " (the device of ", args.begin()->name, ")");
    TORCH_CHECK(arg.tensor.scalar_type() == first.scalar_type(), op, ": ", arg.name, " has dtype ",
                arg.tensor.scalar_type(), ", expected ", first.scalar_type(), " (the dtype of ", args.begin()->name, ")");
    TORCH_CHECK(arg.tensor.is_contiguous(), op, ": ", arg.name, " must be contiguous");
  }
}

inline void check_shape(const char* op, const Arg& arg, c10::IntArrayRef expected) {
  TORCH_CHECK(arg.tensor.sizes() == expected, op, ": ", arg.name, " has shape ", arg.tensor.sizes(), ", expected ",
              expected);
}

}  // namespace lltm_cuda
