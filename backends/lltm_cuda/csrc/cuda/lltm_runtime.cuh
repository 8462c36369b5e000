// Everything lltm-cuda's kernels and host code touch that differs between the real build (nvcc, a
// GPU) and the emulated one (the same .cu files compiled as C++ for the CPU, with LLTM_CUDA_EMULATE
// defined): the kernel launch, the few runtime queries, the stream, the device guard, the device
// check, the two GEMMs, and the device functions a kernel uses to cooperate (barriers, shared
// memory, warp shuffles and votes, atomics, the cluster, the cooperative grid, the tensor cores' warp
// products).  Nothing else in
// csrc/ may name a CUDA runtime call, <<<>>>, __syncthreads, __shared__ or a cooperative group: a
// kernel reaches them only through rt:: below, so the emulation runs exactly what a GPU runs.
//
// The emulation (csrc/emulation/lltm_emulator.h) runs every thread of a launch as a fiber that
// switches out at each barrier, a cluster of blocks at a time (a cooperative launch's whole grid at
// once), with blockIdx, threadIdx, blockDim and gridDim set for each; the order in which ready
// threads resume is settable, so any dependence between threads that no barrier orders (a race on a
// GPU) changes a result.
// Its knobs, read once per process (see emulation_settings()):
//   LLTM_CUDA_EMULATE_MULTIPROCESSORS      multiprocessors of the emulated GPU (default 4)
//   LLTM_CUDA_EMULATE_BLOCKS_PER_MULTIPROCESSOR  the occupancy every kernel gets (default 2)
//   LLTM_CUDA_EMULATE_THREADS_PER_BLOCK    threads per block (default 256, the real build's)
//   LLTM_CUDA_EMULATE_ORDER                forward | reverse | shuffle (default forward): the order of
//                                          the clusters, and of the threads at the start and after
//                                          every barrier
//   LLTM_CUDA_EMULATE_SEED                 the shuffle's seed (default 0); each launch reshuffles
//   LLTM_CUDA_EMULATE_SHARED_PER_BLOCK     shared memory a block may use, in bytes (default 232448,
//                                          the 227 KB opt-in limit of an H100/H200)
//   LLTM_CUDA_EMULATE_CLUSTERS             1: the device launches clusters (sm_90), 0: it does not
//                                          (sm_80) (default 1)
//   LLTM_CUDA_EMULATE_CLUSTER_BLOCKS       the largest cluster the device co-schedules (default 16,
//                                          Hopper's non-portable limit; a GPC's multiprocessors)
// Small grids make the grid-stride loops go round more than once, as big inputs do on a GPU.
#pragma once

// Only torch's stable ABI: the headers under torch/csrc/stable and torch/headeronly, and the C
// shim.  setup.py defines TORCH_TARGET_VERSION, under which any ATen or c10 header is an #error,
// so one library loads on every torch from the target version on.
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Exception.h>
#include <torch/headeronly/util/Half.h>
#include <torch/headeronly/util/shim_utils.h>

#include <cstdint>
#include <utility>

// torch 2.13's stable headers added STABLE_TORCH_ERROR_CODE_CHECK (which, at a 2.10 target, is
// TORCH_ERROR_CODE_CHECK); 2.10 to 2.12 have only the latter, so the sources build on those too.
#ifndef STABLE_TORCH_ERROR_CODE_CHECK
#define STABLE_TORCH_ERROR_CODE_CHECK(call) TORCH_ERROR_CODE_CHECK(call)
#endif

namespace lltm_cuda::rt {

// A launch of clusters of `cluster` blocks with `shared_bytes` of dynamic shared memory a block;
// cooperative: every block resident at once, so that the kernel may wait at the grid barrier
// (the caller checks first that the grid fits: cooperative_blocks).  Either build's launch takes it.
struct ClusterLaunch {
  const char* name;  // the kernel's, for errors
  int64_t blocks;
  int threads;
  int cluster;
  size_t shared_bytes;
  bool cooperative = false;
};

constexpr unsigned kWarpSize = 32;
// The tensor cores' warp product (rt::mma below) works on kMmaTile x kMmaTile x kMmaTile tiles.
constexpr int kMmaTile = 16;

}  // namespace lltm_cuda::rt

#ifndef LLTM_CUDA_EMULATE

// The C shim declares its CUDA entry points (the current stream) only under USE_CUDA, and any
// stable header may have included it before this one: setup.py defines it for the whole build.
#ifndef USE_CUDA
#error "lltm-cuda's real build needs USE_CUDA defined (setup.py does)"
#endif
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cuda.h>
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#define LLTM_CUDA_DISPATCH_KEY CUDA
// A static shared array: the emulation gives each block its own (see below).
#define LLTM_SHARED(type, name, count) __shared__ type name[count]

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

// Whether `device` launches thread-block clusters (sm_90 on), and the shared memory one block may
// opt in to (227 KB on an H100/H200).
inline bool launches_clusters(int device) {
  int yes = 0;
  check_cuda(cudaDeviceGetAttribute(&yes, cudaDevAttrClusterLaunch, device), "cudaDeviceGetAttribute");
  return yes != 0;
}

inline size_t shared_per_block(int device) {
  int bytes = 0;
  check_cuda(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
             "cudaDeviceGetAttribute");
  return size_t(bytes);
}

// How many blocks of `threads` threads and `shared_bytes` of dynamic shared memory of `kernel` the
// whole device holds at once: the most a cooperative launch of it may have.
template <typename... Params>
int64_t cooperative_blocks(void (*kernel)(Params...), int threads, size_t shared_bytes, int device) {
  // The occupancy counts a kernel's dynamic shared memory only up to what it opted in to.
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)),
             "cudaFuncSetAttribute");
  int blocks = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared_bytes),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return int64_t(blocks) * multiprocessor_count(device);
}

// Above 48 KB a kernel must opt in to more dynamic shared memory, above 8 blocks to a larger cluster.
template <typename... Params>
void opt_in(void (*kernel)(Params...), const ClusterLaunch& shape) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shape.shared_bytes)),
             shape.name);
  if (shape.cluster > 8) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), shape.name);
  }
}

// How many clusters of `shape` (its cluster, threads and dynamic shared memory; not its blocks) the
// device runs at once: 0 where it cannot co-schedule one, as a 16-block cluster on a GPU whose
// GPCs hold fewer multiprocessors, where the launch would fail.
template <typename... Params>
int64_t resident_clusters(void (*kernel)(Params...), const ClusterLaunch& shape) {
  opt_in(kernel, shape);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(shape.cluster));
  config.blockDim = dim3(unsigned(shape.threads));
  config.dynamicSmemBytes = shape.shared_bytes;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = unsigned(shape.cluster);
  attribute.val.clusterDim.y = attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int clusters = 0;
  const cudaError_t status = cudaOccupancyMaxActiveClusters(&clusters, kernel, &config);
  if (status == cudaErrorInvalidClusterSize) {
    (void)cudaGetLastError();  // a size the device never co-schedules; the error is not sticky
    return 0;
  }
  check_cuda(status, "cudaOccupancyMaxActiveClusters");
  return clusters;
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), const ClusterLaunch& shape, Stream stream, Args&&... args) {
  opt_in(kernel, shape);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(shape.blocks));
  config.blockDim = dim3(unsigned(shape.threads));
  config.dynamicSmemBytes = shape.shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  config.attrs = attribute;
  if (shape.cluster > 1) {
    attribute[config.numAttrs].id = cudaLaunchAttributeClusterDimension;
    attribute[config.numAttrs].val.clusterDim.x = unsigned(shape.cluster);
    attribute[config.numAttrs].val.clusterDim.y = 1;
    attribute[config.numAttrs].val.clusterDim.z = 1;
    ++config.numAttrs;
  }
  if (shape.cooperative) {
    attribute[config.numAttrs].id = cudaLaunchAttributeCooperative;
    attribute[config.numAttrs].val.cooperative = 1;
    ++config.numAttrs;
  }
  check_cuda(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), shape.name);
}

// ---- Device functions ----------------------------------------------------------------------------
__device__ __forceinline__ void sync_threads() { __syncthreads(); }

// The dynamic shared memory of the launch, 128-byte aligned (a tensor-core tile needs 32).
template <typename T>
__device__ __forceinline__ T* dynamic_shared() {
  extern __shared__ __align__(128) unsigned char lltm_dynamic_shared_bytes[];
  return reinterpret_cast<T*>(lltm_dynamic_shared_bytes);
}

template <typename T>
__device__ __forceinline__ T shfl_sync(unsigned mask, T value, int lane) { return __shfl_sync(mask, value, lane); }
template <typename T>
__device__ __forceinline__ T shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  return __shfl_xor_sync(mask, value, lane_mask);
}
__device__ __forceinline__ unsigned ballot_sync(unsigned mask, bool predicate) { return __ballot_sync(mask, predicate); }
__device__ __forceinline__ bool all_sync(unsigned mask, bool predicate) { return __all_sync(mask, predicate); }
__device__ __forceinline__ bool any_sync(unsigned mask, bool predicate) { return __any_sync(mask, predicate); }
template <typename T>
__device__ __forceinline__ T atomic_add(T* address, T value) { return atomicAdd(address, value); }

// A warp's product on the tensor cores (nvcuda::wmma, sm_80 on): sums += a b over one
// kMmaTile-cube, a and b of a 16-bit type, the sums in float.  Every lane of the warp makes each
// call, with the same arguments.  a is read row-major and b column-major, their rows (b's columns)
// `ld` elements apart: a multiple of 8 (of 4 for the float sums), from a 32-byte aligned address.
template <typename T>
struct MmaElement;
template <>
struct MmaElement<torch::headeronly::BFloat16> {
  using type = __nv_bfloat16;
};
template <>
struct MmaElement<torch::headeronly::Half> {
  using type = __half;
};
template <typename T>
using MmaA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, kMmaTile, kMmaTile, kMmaTile, typename MmaElement<T>::type,
                                    nvcuda::wmma::row_major>;
template <typename T>
using MmaB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, kMmaTile, kMmaTile, kMmaTile, typename MmaElement<T>::type,
                                    nvcuda::wmma::col_major>;
using MmaSums = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, kMmaTile, kMmaTile, kMmaTile, float>;

template <typename T>
__device__ __forceinline__ void mma_load(MmaA<T>& a, const T* p, unsigned ld) {
  nvcuda::wmma::load_matrix_sync(a, reinterpret_cast<const typename MmaElement<T>::type*>(p), ld);
}
template <typename T>
__device__ __forceinline__ void mma_load(MmaB<T>& b, const T* p, unsigned ld) {
  nvcuda::wmma::load_matrix_sync(b, reinterpret_cast<const typename MmaElement<T>::type*>(p), ld);
}
__device__ __forceinline__ void mma_zero(MmaSums& sums) { nvcuda::wmma::fill_fragment(sums, 0.f); }
template <typename A, typename B>  // MmaA<T>, MmaB<T>: aliases, which deduce no T
__device__ __forceinline__ void mma(MmaSums& sums, const A& a, const B& b) {
  nvcuda::wmma::mma_sync(sums, a, b, sums);
}
// The sums, row-major, rows `ld` floats apart.
__device__ __forceinline__ void mma_store(float* p, const MmaSums& sums, unsigned ld) {
  nvcuda::wmma::store_matrix_sync(p, sums, ld, nvcuda::wmma::mem_row_major);
}

// The grid barrier of a cooperative launch: every thread of every block arrives before any leaves,
// and what each wrote to global memory before it is visible to all after it.
__device__ __forceinline__ void grid_sync() { cooperative_groups::this_grid().sync(); }

// The cluster: on sm_90 the hardware's, whose barrier also orders the blocks' writes to each
// other's shared memory; compiled for an older GPU a kernel runs as a cluster of one (the host
// launches it so there), so the same source compiles for sm_80.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned cluster_rank() { return cooperative_groups::this_cluster().block_rank(); }
__device__ __forceinline__ unsigned cluster_blocks() { return cooperative_groups::this_cluster().num_blocks(); }
__device__ __forceinline__ void cluster_sync() { cooperative_groups::this_cluster().sync(); }
template <typename T>
__device__ __forceinline__ T* map_shared_rank(T* p, unsigned rank) {
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
}
#else
__device__ __forceinline__ unsigned cluster_rank() { return 0; }
__device__ __forceinline__ unsigned cluster_blocks() { return 1; }
__device__ __forceinline__ void cluster_sync() { __syncthreads(); }
template <typename T>
__device__ __forceinline__ T* map_shared_rank(T* p, unsigned) { return p; }
#endif

}  // namespace lltm_cuda::rt

#else  // LLTM_CUDA_EMULATE: the same sources as C++ on the CPU

#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>

#include "../emulation/lltm_emulator.h"

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

// A static shared array: a pointer into the block's arena, the same in every thread of the block.
#define LLTM_SHARED(type, name, count) \
  type* const name = static_cast<type*>(::lltm_cuda::rt::emu::static_shared(sizeof(type) * (count), alignof(type)))

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

using emu::Order;

struct Settings {
  int multiprocessors, blocks_per_multiprocessor, threads_per_block;
  Order order;
  uint64_t seed;
  size_t shared_per_block;
  bool clusters;
  int cluster_blocks;  // the largest cluster co-scheduled
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
  s.shared_per_block = size_t(env_int("LLTM_CUDA_EMULATE_SHARED_PER_BLOCK", 232448, 0, 1 << 30));
  s.clusters = env_int("LLTM_CUDA_EMULATE_CLUSTERS", 1, 0, 1) == 1;
  s.cluster_blocks = int(env_int("LLTM_CUDA_EMULATE_CLUSTER_BLOCKS", 16, 1, 16));
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

inline bool launches_clusters(int /*device*/) { return emulation_settings().clusters; }
inline size_t shared_per_block(int /*device*/) { return emulation_settings().shared_per_block; }

// Every multiprocessor holds the settings' blocks of any kernel, if its shared memory fits a block.
template <typename... Params>
int64_t cooperative_blocks(void (*)(Params...), int /*threads*/, size_t shared_bytes, int /*device*/) {
  const Settings& s = emulation_settings();
  ++counters().occupancy_queries;
  return shared_bytes > s.shared_per_block ? 0 : int64_t(s.multiprocessors) * s.blocks_per_multiprocessor;
}

// The emulator runs a cluster's blocks together whatever its multiprocessor count; a GPU
// co-schedules at most LLTM_CUDA_EMULATE_CLUSTER_BLOCKS of them (a GPC's worth), and none whose
// shared memory does not fit.
template <typename... Params>
int64_t resident_clusters(void (*)(Params...), const ClusterLaunch& shape) {
  const Settings& s = emulation_settings();
  ++counters().occupancy_queries;
  if (shape.shared_bytes > s.shared_per_block || shape.cluster > s.cluster_blocks) {
    return 0;
  }
  return std::max<int64_t>(1, int64_t(s.multiprocessors) * s.blocks_per_multiprocessor / shape.cluster);
}

// Every launch: the grid run by the emulator's scheduler, a new thread order each launch (the same
// sequence of orders for a seed).
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), const ClusterLaunch& shape, Stream, Args&&... args) {
  const Settings& s = emulation_settings();
  STD_TORCH_CHECK(shape.blocks >= 1 && shape.blocks <= INT32_MAX && shape.threads >= 1 && shape.threads <= 1024 &&
                      shape.cluster >= 1 && shape.cluster <= 16,
                  "lltm-cuda (emulated): invalid launch configuration of ", shape.name, ", ", shape.blocks,
                  " blocks of ", shape.threads, " threads in clusters of ", shape.cluster);
  STD_TORCH_CHECK(shape.cluster == 1 || s.clusters, "lltm-cuda (emulated): kernel ", shape.name,
                  " launched in clusters of ", shape.cluster, " on a device without clusters (LLTM_CUDA_EMULATE_CLUSTERS=0)");
  // A GPU refuses a cluster larger than a GPC holds (cluster out of resources).
  STD_TORCH_CHECK(shape.cluster <= s.cluster_blocks, "lltm-cuda (emulated): kernel ", shape.name,
                  " launched in clusters of ", shape.cluster, ", more blocks than the device co-schedules (",
                  s.cluster_blocks, ", LLTM_CUDA_EMULATE_CLUSTER_BLOCKS)");
  // A GPU refuses a cooperative launch larger than what it holds at once (too large a cooperative launch).
  STD_TORCH_CHECK(!shape.cooperative || shape.blocks <= int64_t(s.multiprocessors) * s.blocks_per_multiprocessor,
                  "lltm-cuda (emulated): cooperative launch of ", shape.name, " with ", shape.blocks,
                  " blocks, more than the ", int64_t(s.multiprocessors) * s.blocks_per_multiprocessor,
                  " the device holds at once");
  const uint64_t seed = s.seed * 0x9E3779B97F4A7C15ull + uint64_t(counters().launches.load());
  ++counters().launches;
  auto body = [&] { kernel(args...); };
  emu::run_grid(shape.name, body, unsigned(shape.blocks), unsigned(shape.threads), unsigned(shape.cluster),
                shape.cooperative, shape.shared_bytes, s.shared_per_block, s.order, seed);
  counters().threads_run += shape.blocks * shape.threads;
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), int64_t blocks, int threads, Stream stream, Args&&... args) {
  launch(kernel, ClusterLaunch{"a pointwise kernel", blocks, threads, 1, 0}, stream, std::forward<Args>(args)...);
}

// ---- Device functions (see the real build's above) ---------------------------------------------
inline void sync_threads() { emu::arrive(emu::Wait::kBlock); }
inline void cluster_sync() { emu::arrive(emu::Wait::kCluster); }
inline void grid_sync() { emu::grid_sync(); }
inline unsigned cluster_rank() { return emu::cluster_rank(); }
inline unsigned cluster_blocks() { return emu::cluster_blocks(); }

template <typename T>
T* dynamic_shared() {
  return static_cast<T*>(emu::dynamic_shared());
}

template <typename T>
T* map_shared_rank(T* p, unsigned rank) {
  return static_cast<T*>(emu::map_shared_rank(p, rank));
}

template <typename T>
uint64_t to_slot(T value) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a warp shuffle moves at most 8 bytes");
  uint64_t slot = 0;
  std::memcpy(&slot, &value, sizeof(T));
  return slot;
}

template <typename T>
T from_slot(uint64_t slot) {
  T value;
  std::memcpy(&value, &slot, sizeof(T));
  return value;
}

// The lanes of a warp must all take part (a full warp, or every lane a partial last warp has).
inline void check_full_mask(unsigned mask) {
  STD_TORCH_CHECK(mask == 0xFFFFFFFFu, "lltm-cuda (emulated): kernel ", emu::launch_state().name,
                  ": a warp operation with a partial mask, which the emulation does not model");
}

template <typename T>
T shfl_sync(unsigned mask, T value, int lane) {
  check_full_mask(mask);
  return from_slot<T>(emu::warp_exchange(to_slot(value), [&](const uint64_t* slots, unsigned lanes, unsigned) {
    return slots[unsigned(lane) % lanes];
  }));
}

template <typename T>
T shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  check_full_mask(mask);
  return from_slot<T>(emu::warp_exchange(to_slot(value), [&](const uint64_t* slots, unsigned lanes, unsigned own) {
    const unsigned source = own ^ unsigned(lane_mask);
    return slots[source < lanes ? source : own];
  }));
}

inline unsigned ballot_sync(unsigned mask, bool predicate) {
  check_full_mask(mask);
  return unsigned(emu::warp_exchange(predicate, [](const uint64_t* slots, unsigned lanes, unsigned) {
    uint64_t bits = 0;
    for (unsigned l = 0; l < lanes; ++l) {
      bits |= (slots[l] != 0 ? 1ull : 0ull) << l;
    }
    return bits;
  }));
}

inline bool all_sync(unsigned mask, bool predicate) {
  const unsigned lanes = std::min<unsigned>(emu::kWarpSize, blockDim.x - threadIdx.x / emu::kWarpSize * emu::kWarpSize);
  const unsigned everyone = lanes == 32 ? 0xFFFFFFFFu : (1u << lanes) - 1;
  return ballot_sync(mask, predicate) == everyone;
}

inline bool any_sync(unsigned mask, bool predicate) { return ballot_sync(mask, predicate) != 0; }

// The tensor cores' warp product (see the real build's): every lane holds the whole tile, where a
// GPU spreads it over the warp; the kernels never touch a fragment's elements, so the two agree.
// A store is spread over the lanes as on a GPU (mma_store).
// Every call is a meeting of the warp's lanes (a lane that skips one is an error naming the
// kernel, where a GPU's result would be undefined) and checks wmma's alignment rules.  The sums
// add the products in k order, in float (a 16-bit product is exact there).
template <typename T>
struct MmaA {
  float v[kMmaTile][kMmaTile];  // [row][k]
};
template <typename T>
struct MmaB {
  float v[kMmaTile][kMmaTile];  // [k][column]
};
struct MmaSums {
  float v[kMmaTile][kMmaTile];  // [row][column]
};

inline void mma_meet(const void* p, unsigned ld, unsigned multiple, const char* what) {
  STD_TORCH_CHECK(reinterpret_cast<std::uintptr_t>(p) % 32 == 0 && ld % multiple == 0, "lltm-cuda (emulated): kernel ",
                  emu::launch_state().name, ": a tensor-core ", what, " at ", p, " with rows ", ld,
                  " elements apart; wmma needs a 32-byte aligned address and rows a multiple of ", multiple,
                  " elements apart");
  emu::warp_exchange(0, [](const uint64_t*, unsigned, unsigned) { return uint64_t(0); });
}

template <typename T>
void mma_load(MmaA<T>& a, const T* p, unsigned ld) {
  mma_meet(p, ld, 8, "load");
  for (int i = 0; i < kMmaTile; ++i) {
    for (int k = 0; k < kMmaTile; ++k) {
      a.v[i][k] = float(p[i * ld + k]);
    }
  }
}
template <typename T>
void mma_load(MmaB<T>& b, const T* p, unsigned ld) {
  mma_meet(p, ld, 8, "load");
  for (int j = 0; j < kMmaTile; ++j) {
    for (int k = 0; k < kMmaTile; ++k) {
      b.v[k][j] = float(p[j * ld + k]);
    }
  }
}
inline void mma_zero(MmaSums& sums) { std::fill(&sums.v[0][0], &sums.v[0][0] + kMmaTile * kMmaTile, 0.f); }
template <typename T>
void mma(MmaSums& sums, const MmaA<T>& a, const MmaB<T>& b) {
  emu::warp_exchange(0, [](const uint64_t*, unsigned, unsigned) { return uint64_t(0); });
  for (int i = 0; i < kMmaTile; ++i) {
    for (int j = 0; j < kMmaTile; ++j) {
      for (int k = 0; k < kMmaTile; ++k) {
        sums.v[i][j] += a.v[i][k] * b.v[k][j];
      }
    }
  }
}
// Each lane stores its share of the tile (every lanes-th element), as a GPU's lanes store their
// fragments: a lane reading another's share before a barrier reads what was there before.
inline void mma_store(float* p, const MmaSums& sums, unsigned ld) {
  mma_meet(p, ld, 4, "store");
  const unsigned lane = threadIdx.x % emu::kWarpSize;
  const unsigned lanes = std::min<unsigned>(emu::kWarpSize, blockDim.x - threadIdx.x / emu::kWarpSize * emu::kWarpSize);
  for (unsigned e = lane; e < kMmaTile * kMmaTile; e += lanes) {
    p[e / kMmaTile * ld + e % kMmaTile] = sums.v[e / kMmaTile][e % kMmaTile];
  }
}

// A thread switches only at a barrier, so a read-modify-write is atomic as it stands.
template <typename T>
T atomic_add(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}

}  // namespace lltm_cuda::rt

#endif  // LLTM_CUDA_EMULATE
