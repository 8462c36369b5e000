// Small kernels that test the emulator itself (torch.ops.lltm_cuda_emulation.probe_*), each written
// as a GPU kernel is, through rt::: a block reduction that is wrong without its barriers, warp
// shuffles and votes, atomics, a cluster exchanging shared memory, a cooperative grid exchanging
// global memory, unwritten shared memory, and barriers that not every thread reaches.
// backends/lltm_cuda/tests/test_emulator.py runs them.
#include "../cuda/lltm_common.cuh"

#ifndef LLTM_CUDA_EMULATE
#error "emulator_probes.cpp belongs to the emulated build only (setup.py defines LLTM_CUDA_EMULATE)"
#endif

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include <limits>

namespace {

using namespace lltm_cuda;

// A tree sum over one block in shared memory: the barriers order each level after the one before.
// It first rotates the values by one thread, so that without barriers the first thread to run reads
// a neighbour's unwritten value in any order (a tree alone comes out right run last thread first).
__global__ void block_sum_kernel(const float* x, float* out, bool barriers) {
  float* partial = rt::dynamic_shared<float>();
  const unsigned t = threadIdx.x;
  partial[t] = x[blockIdx.x * blockDim.x + t];
  if (barriers) {
    rt::sync_threads();
  }
  const float next = partial[(t + 1) % blockDim.x];
  if (barriers) {
    rt::sync_threads();
  }
  partial[t] = next;
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (barriers) {
      rt::sync_threads();
    }
    if (t < stride) {
      partial[t] += partial[t + stride];
    }
  }
  if (t == 0) {
    out[blockIdx.x] = partial[0];
  }
}

// Per thread: the sum over its warp (xor butterfly), lane 3's value, its warp's ballot of x > 0,
// and whether all / any lane has x > 0.
__global__ void warp_kernel(const float* x, float* out) {
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
  float sum = x[t];
  for (int mask = 16; mask > 0; mask /= 2) {
    sum += rt::shfl_xor_sync(0xFFFFFFFFu, sum, mask);
  }
  const float lane3 = rt::shfl_sync(0xFFFFFFFFu, x[t], 3);
  const unsigned ballot = rt::ballot_sync(0xFFFFFFFFu, x[t] > 0);
  const bool all = rt::all_sync(0xFFFFFFFFu, x[t] > 0), any = rt::any_sync(0xFFFFFFFFu, x[t] > 0);
  out[5 * t] = sum;
  out[5 * t + 1] = lane3;
  out[5 * t + 2] = float(ballot);
  out[5 * t + 3] = all;
  out[5 * t + 4] = any;
}

__global__ void atomic_kernel(const float* x, float* out) {
  rt::atomic_add(out, x[blockIdx.x * blockDim.x + threadIdx.x]);
}

// Each block posts x of its threads in its static shared memory; after the cluster barrier each
// thread reads what the next rank posted, through distributed shared memory.
__global__ void cluster_kernel(const float* x, float* out, int64_t* ranks) {
  LLTM_SHARED(float, posted, 1024);
  const unsigned t = threadIdx.x, rank = rt::cluster_rank(), size = rt::cluster_blocks();
  const unsigned g = blockIdx.x * blockDim.x + t;
  posted[t] = x[g];
  rt::cluster_sync();
  out[g] = rt::map_shared_rank(posted, (rank + 1) % size)[t];
  ranks[blockIdx.x] = rank;
  rt::cluster_sync();  // a peer's shared memory must outlive its readers
}

// Each block posts x of its threads in global memory (`posted`, NaN until written); after the grid
// barrier each thread reads what the next block posted.  Without the barrier the first thread to
// run, whichever it is, reads a value nobody wrote yet.
__global__ void grid_kernel(const float* x, float* posted, float* out, bool barrier) {
  const unsigned g = blockIdx.x * blockDim.x + threadIdx.x;
  posted[g] = x[g];
  if (barrier) {
    rt::grid_sync();
  }
  out[g] = posted[(blockIdx.x + 1) % gridDim.x * blockDim.x + threadIdx.x];
}

// What shared memory holds before anyone writes it, static and dynamic.
__global__ void unwritten_shared_kernel(float* out) {
  LLTM_SHARED(float, fixed, 4);
  out[0] = fixed[threadIdx.x % 4];
  out[1] = rt::dynamic_shared<float>()[threadIdx.x % 4];
}

// Thread 0 (or block rank 0 of the cluster, or block 0 of the grid) leaves before the barrier the
// others wait at.
enum class Scope { kBlock, kCluster, kGrid };

__global__ void skipped_barrier_kernel(Scope scope) {
  if (scope == Scope::kBlock ? threadIdx.x == 0 : scope == Scope::kCluster ? rt::cluster_rank() == 0 : blockIdx.x == 0) {
    return;
  }
  scope == Scope::kBlock ? rt::sync_threads() : scope == Scope::kCluster ? rt::cluster_sync() : rt::grid_sync();
}

// Which place each thread took among its block's threads to arrive, before and after a barrier.
__global__ void resume_order_kernel(int64_t* tickets) {
  LLTM_SHARED(int64_t, counter, 2);
  if (threadIdx.x == 0) {
    counter[0] = counter[1] = 0;
  }
  rt::sync_threads();
  tickets[2 * threadIdx.x] = rt::atomic_add(&counter[0], int64_t(1));
  rt::sync_threads();
  tickets[2 * threadIdx.x + 1] = rt::atomic_add(&counter[1], int64_t(1));
}

Tensor zeros(const Tensor& like, int64_t n, ScalarType dtype) { return torch::stable::new_zeros(like, {n}, dtype); }

Tensor block_sum(Tensor x, int64_t threads, bool barriers) {
  const int64_t blocks = x.numel() / threads;
  Tensor out = zeros(x, blocks, ScalarType::Float);
  rt::launch(block_sum_kernel, rt::ClusterLaunch{"block_sum_kernel", blocks, int(threads), 1, size_t(threads) * 4}, 0,
             x.const_data_ptr<float>(), out.mutable_data_ptr<float>(), barriers);
  return out;
}

Tensor warp(Tensor x, int64_t threads) {
  Tensor out = zeros(x, 5 * x.numel(), ScalarType::Float);
  rt::launch(warp_kernel, rt::ClusterLaunch{"warp_kernel", x.numel() / threads, int(threads), 1, 0}, 0,
             x.const_data_ptr<float>(), out.mutable_data_ptr<float>());
  return out;
}

Tensor atomic(Tensor x, int64_t threads) {
  Tensor out = zeros(x, 1, ScalarType::Float);
  rt::launch(atomic_kernel, rt::ClusterLaunch{"atomic_kernel", x.numel() / threads, int(threads), 1, 0}, 0,
             x.const_data_ptr<float>(), out.mutable_data_ptr<float>());
  return out;
}

std::tuple<Tensor, Tensor> cluster(Tensor x, int64_t threads, int64_t cluster_blocks) {
  const int64_t blocks = x.numel() / threads;
  Tensor out = zeros(x, x.numel(), ScalarType::Float), ranks = zeros(x, blocks, ScalarType::Long);
  rt::launch(cluster_kernel, rt::ClusterLaunch{"cluster_kernel", blocks, int(threads), int(cluster_blocks), 0}, 0,
             x.const_data_ptr<float>(), out.mutable_data_ptr<float>(), ranks.mutable_data_ptr<int64_t>());
  return {out, ranks};
}

// `cooperative` false: the grid barrier in a launch that does not allow it, an error.
Tensor grid(Tensor x, int64_t threads, bool barrier, bool cooperative) {
  const int64_t blocks = x.numel() / threads;
  Tensor posted = torch::stable::new_empty(x, {x.numel()});
  torch::stable::fill_(posted, std::numeric_limits<double>::quiet_NaN());
  Tensor out = zeros(x, x.numel(), ScalarType::Float);
  rt::launch(grid_kernel, rt::ClusterLaunch{"grid_kernel", blocks, int(threads), 1, 0, cooperative}, 0,
             x.const_data_ptr<float>(), posted.mutable_data_ptr<float>(), out.mutable_data_ptr<float>(), barrier);
  return out;
}

Tensor unwritten_shared(Tensor like, int64_t dynamic_bytes) {
  Tensor out = zeros(like, 2, ScalarType::Float);
  rt::launch(unwritten_shared_kernel, rt::ClusterLaunch{"unwritten_shared_kernel", 1, 4, 1, size_t(dynamic_bytes)}, 0,
             out.mutable_data_ptr<float>());
  return out;
}

// Over one block, a cluster of `cluster_blocks`, or (grid) a cooperative grid of two blocks.
void skipped_barrier(int64_t threads, int64_t cluster_blocks, bool grid) {
  const Scope scope = grid ? Scope::kGrid : cluster_blocks > 1 ? Scope::kCluster : Scope::kBlock;
  rt::launch(skipped_barrier_kernel,
             rt::ClusterLaunch{"skipped_barrier_kernel", grid ? 2 : cluster_blocks, int(threads),
                               grid ? 1 : int(cluster_blocks), 0, grid},
             0, scope);
}

Tensor resume_order(Tensor like, int64_t threads) {
  Tensor tickets = zeros(like, 2 * threads, ScalarType::Long);
  rt::launch(resume_order_kernel, rt::ClusterLaunch{"resume_order_kernel", 1, int(threads), 1, 0}, 0,
             tickets.mutable_data_ptr<int64_t>());
  return tickets;
}

}  // namespace

// The probes' schemas, beside emulation_ops.cpp's operators in the same namespace.
constexpr const char* kProbeSchemas[] = {
    "probe_block_sum(Tensor x, int threads, bool barriers) -> Tensor",
    "probe_warp(Tensor x, int threads) -> Tensor",
    "probe_atomic(Tensor x, int threads) -> Tensor",
    "probe_cluster(Tensor x, int threads, int cluster) -> (Tensor, Tensor)",
    "probe_grid(Tensor x, int threads, bool barrier, bool cooperative=True) -> Tensor",
    "probe_unwritten_shared(Tensor like, int dynamic_bytes) -> Tensor",
    "probe_skipped_barrier(int threads, int cluster, bool grid=False) -> ()",
    "probe_resume_order(Tensor like, int threads) -> Tensor",
};

STABLE_TORCH_LIBRARY_FRAGMENT(lltm_cuda_emulation, m) {
  for (const char* schema : kProbeSchemas) {
    m.def(schema);
  }
}

STABLE_TORCH_LIBRARY_IMPL(lltm_cuda_emulation, CompositeExplicitAutograd, m) {
  m.impl("probe_block_sum", TORCH_BOX(&block_sum));
  m.impl("probe_warp", TORCH_BOX(&warp));
  m.impl("probe_atomic", TORCH_BOX(&atomic));
  m.impl("probe_cluster", TORCH_BOX(&cluster));
  m.impl("probe_grid", TORCH_BOX(&grid));
  m.impl("probe_unwritten_shared", TORCH_BOX(&unwritten_shared));
  m.impl("probe_skipped_barrier", TORCH_BOX(&skipped_barrier));
  m.impl("probe_resume_order", TORCH_BOX(&resume_order));
}
