// Everything lltm-cuda's kernels and host code touch that differs between the real build (nvcc,
// a GPU) and the emulated one (the same .cu files compiled as C++ for the CPU, with
// LLTM_CUDA_EMULATE defined): the kernel launch, the few runtime queries, the stream, the device
// guard, the device check and the two GEMMs.  Nothing else in csrc/ may name a CUDA runtime call or use <<<>>>:
// a kernel is launched only through launch() below, so the emulation runs exactly what a GPU runs.
//
// The emulation runs a launch as a serial loop over every block and every thread of the grid,
// with blockIdx, threadIdx, blockDim and gridDim set for each.  That is exact for these kernels
// (grid-stride loops, no shared memory, no block synchronisation, no atomics), and the order of
// the threads is settable, so any dependence between threads (a race on a GPU) changes a result.
// Its knobs, read once per process (see emulation_settings()):
//   LLTM_CUDA_EMULATE_MULTIPROCESSORS      multiprocessors of the emulated GPU (default 4)
//   LLTM_CUDA_EMULATE_BLOCKS_PER_MULTIPROCESSOR  the occupancy every kernel gets (default 2)
//   LLTM_CUDA_EMULATE_THREADS_PER_BLOCK    threads per block (default 256, the real build's)
//   LLTM_CUDA_EMULATE_ORDER                forward | reverse | shuffle (default forward)
//   LLTM_CUDA_EMULATE_SEED                 the shuffle's seed (default 0); each launch reshuffles
// Small grids make the grid-stride loops go round more than once, as big inputs do on a GPU.
#pragma once

// Only torch's stable ABI: the headers under torch/csrc/stable and torch/headeronly, and the C
// shim.  setup.py defines TORCH_TARGET_VERSION, under which any ATen or c10 header is an #error,
// so one library loads on every torch from the target version on.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>
#include <torch/headeronly/util/shim_utils.h>

#include <cstdint>
#include <utility>

// torch 2.13's stable headers added STABLE_TORCH_ERROR_CODE_CHECK (which, at a 2.10 target, is
// TORCH_ERROR_CODE_CHECK); 2.10 to 2.12 have only the latter, so the sources build on those too.
#ifndef STABLE_TORCH_ERROR_CODE_CHECK
#define STABLE_TORCH_ERROR_CODE_CHECK(call) TORCH_ERROR_CODE_CHECK(call)
#endif

#ifndef LLTM_CUDA_EMULATE

// The C shim declares its CUDA entry points (the current stream) only under USE_CUDA, and any
// stable header may have included it before this one: setup.py defines it for the whole build.
#ifndef USE_CUDA
#error "lltm-cuda's real build needs USE_CUDA defined (setup.py does)"
#endif
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>
#include <cuda_runtime.h>

#define LLTM_CUDA_DISPATCH_KEY CUDA

namespace lltm_cuda::rt {

using Stream = cudaStream_t;
// Sets the current device for the host code's tensor calls and launches, restores it after.
using DeviceGuard = torch::stable::accelerator::DeviceGuard;
constexpr const char* kDeviceName = "CUDA";

// A CUDA runtime error as a C++ exception (torch turns it into a Python RuntimeError).
inline void check_cuda(cudaError_t status, const char* what) {
  STD_TORCH_CHECK(status == cudaSuccess, "lltm-cuda: ", what, " failed: ", cudaGetErrorString(status));
}

inline bool on_device(const torch::stable::Tensor& t) { return t.is_cuda(); }

// torch's current stream on `device` (what the caller's torch.cuda.stream() set), so the kernels
// order with the GEMMs and with the caller's own work.
inline Stream current_stream(int32_t device) {
  void* stream = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  return static_cast<Stream>(stream);
}
constexpr int threads_per_block() { return 256; }

inline int multiprocessor_count(int device) {
  int count = 0;
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return count;
}

// How many blocks of `threads` threads of `kernel` one multiprocessor holds at once (register use decides).
template <typename... Params>
int blocks_per_multiprocessor(void (*kernel)(Params...), int threads) {
  int blocks = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return blocks;
}

// out = self + mat1 @ mat2 (self broadcast; self may be out) and out = self @ mat2: torch's own
// cuBLAS calls through the C shim, so allow_tf32, the current stream and the workspace are torch's.
inline void addmm_out(const torch::stable::Tensor& out, const torch::stable::Tensor& self,
                      const torch::stable::Tensor& mat1, const torch::stable::Tensor& mat2) {
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_cuda_addmm_out(out.get(), self.get(), mat1.get(), mat2.get(), 1.0, 1.0));
}

inline void mm_out(const torch::stable::Tensor& out, const torch::stable::Tensor& self,
                   const torch::stable::Tensor& mat2) {
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_cuda_mm_out(out.get(), self.get(), mat2.get()));
}

// A vector access's address must be a multiple of its size on the GPU, which traps otherwise.
template <typename V>
__device__ __forceinline__ void check_vector_aligned(const void*) {}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), int64_t blocks, int threads, Stream stream, Args&&... args) {
  kernel<<<blocks, threads, 0, stream>>>(std::forward<Args>(args)...);
  check_cuda(cudaGetLastError(), "a kernel launch");
}

}  // namespace lltm_cuda::rt

#else  // LLTM_CUDA_EMULATE: the same sources as C++ on the CPU

#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

// CUDA's function qualifiers mean nothing to a C++ compiler; __restrict__ it knows.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

#define LLTM_CUDA_DISPATCH_KEY CPU

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
};
// What a kernel reads to know which thread it is: set by launch() before each thread runs.
// thread_local: two host threads may each run an emulated launch at once.
inline thread_local dim3 blockIdx, threadIdx, blockDim, gridDim;

namespace lltm_cuda::rt {

using Stream = int;  // one, implicit: the emulation runs every launch at once, in order

struct DeviceGuard {
  explicit DeviceGuard(int32_t) {}
};

constexpr const char* kDeviceName = "CPU (lltm-cuda's emulated build)";

inline bool on_device(const torch::stable::Tensor& t) { return t.is_cpu(); }
inline Stream current_stream(int32_t) { return 0; }

// The real build's GEMMs, on the CPU through the same C shim: the host code is the same either way.
inline void addmm_out(const torch::stable::Tensor& out, const torch::stable::Tensor& self,
                      const torch::stable::Tensor& mat1, const torch::stable::Tensor& mat2) {
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_addmm_out(out.get(), self.get(), mat1.get(), mat2.get(), 1.0, 1.0));
}

inline void mm_out(const torch::stable::Tensor& out, const torch::stable::Tensor& self,
                   const torch::stable::Tensor& mat2) {
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_mm_out(out.get(), self.get(), mat2.get()));
}

enum class Order { kForward, kReverse, kShuffle };

struct Settings {
  int multiprocessors, blocks_per_multiprocessor, threads_per_block;
  Order order;
  uint64_t seed;
};

inline int64_t env_int(const char* name, int64_t fallback, int64_t lowest, int64_t highest) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') {
    return fallback;
  }
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  STD_TORCH_CHECK(*end == '\0' && value >= lowest && value <= highest, name, "=", text, " is not an integer in [",
              lowest, ", ", highest, "]");
  return value;
}

inline Settings read_settings() {
  Settings s{};
  s.multiprocessors = int(env_int("LLTM_CUDA_EMULATE_MULTIPROCESSORS", 4, 1, 1 << 16));
  s.blocks_per_multiprocessor = int(env_int("LLTM_CUDA_EMULATE_BLOCKS_PER_MULTIPROCESSOR", 2, 1, 1 << 16));
  s.threads_per_block = int(env_int("LLTM_CUDA_EMULATE_THREADS_PER_BLOCK", 256, 1, 1024));
  s.seed = uint64_t(env_int("LLTM_CUDA_EMULATE_SEED", 0, 0, INT64_MAX));
  const char* order = std::getenv("LLTM_CUDA_EMULATE_ORDER");
  const std::string o = order ? order : "";
  if (o.empty() || o == "forward") {
    s.order = Order::kForward;
  } else if (o == "reverse") {
    s.order = Order::kReverse;
  } else if (o == "shuffle") {
    s.order = Order::kShuffle;
  } else {
    STD_TORCH_CHECK(false, "LLTM_CUDA_EMULATE_ORDER=", o, ": expected forward, reverse or shuffle");
  }
  return s;
}

// Read once, at the first launch or query: a value is checked then, and a bad one fails every call.
inline const Settings& emulation_settings() {
  static const Settings settings = read_settings();
  return settings;
}

// What the emulated GPU was asked and did, for the tests (lltm_cuda_emulation::counters).
struct Counters {
  std::atomic<int64_t> multiprocessor_queries{0}, occupancy_queries{0}, launches{0}, threads_run{0};
};

inline Counters& counters() {
  static Counters c;
  return c;
}

inline int threads_per_block() { return emulation_settings().threads_per_block; }

inline int multiprocessor_count(int /*device*/) {
  ++counters().multiprocessor_queries;
  return emulation_settings().multiprocessors;
}

template <typename... Params>
int blocks_per_multiprocessor(void (*)(Params...), int /*threads*/) {
  ++counters().occupancy_queries;
  return emulation_settings().blocks_per_multiprocessor;
}

// The CPU does not trap on a misaligned access; the emulation checks what the GPU would require.
template <typename V>
inline void check_vector_aligned(const void* p) {
  STD_TORCH_CHECK(reinterpret_cast<std::uintptr_t>(p) % alignof(V) == 0, "lltm-cuda (emulated): a ", sizeof(V),
              "-byte vector access at ", p, " is not ", alignof(V), "-byte aligned: the GPU would trap here");
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), int64_t blocks, int threads, Stream, Args&&... args) {
  const Settings& s = emulation_settings();
  STD_TORCH_CHECK(blocks >= 1 && blocks <= INT32_MAX && threads >= 1 && threads <= 1024,
              "lltm-cuda (emulated): invalid launch configuration, ", blocks, " blocks of ", threads, " threads");
  const int64_t total = blocks * threads;
  std::vector<int64_t> order(static_cast<size_t>(total));
  std::iota(order.begin(), order.end(), int64_t(0));
  if (s.order == Order::kReverse) {
    std::reverse(order.begin(), order.end());
  } else if (s.order == Order::kShuffle) {
    // A new order for every launch, the same sequence of orders for a seed.
    std::mt19937_64 rng(s.seed * 0x9E3779B97F4A7C15ull + uint64_t(counters().launches.load()));
    std::shuffle(order.begin(), order.end(), rng);
  }
  ++counters().launches;
  gridDim = dim3{unsigned(blocks), 1, 1};
  blockDim = dim3{unsigned(threads), 1, 1};
  for (const int64_t thread : order) {
    blockIdx = dim3{unsigned(thread / threads), 0, 0};
    threadIdx = dim3{unsigned(thread % threads), 0, 0};
    kernel(args...);
  }
  counters().threads_run += total;
}

}  // namespace lltm_cuda::rt

#endif  // LLTM_CUDA_EMULATE
