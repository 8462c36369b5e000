// The persistent sequence kernels: the LLTM's time loop in one launch (forward, and backward), for
// float32, bfloat16 and float16 with float32 accumulation.
//
// A thread-block cluster of C blocks splits the S hidden units: block r owns units [u0, u0 + n) and
// keeps their rows of W_h (all three gates: 3n rows of S) in shared memory for the whole loop, so
// each step's gates and cell are block-local.  The input projection (all steps, bias folded in) is
// one GEMM before the launch, and the weight and input gradients stay GEMMs after the backward.
//   forward step:  each block holds the whole h_{t-1} (B, S); it computes its units' gates and cell,
//                  and writes its slice of h_t into every block's next h buffer through distributed
//                  shared memory; one cluster barrier a step.  h is double-buffered: a block writes
//                  the buffer its peers read only the step after, and the barrier orders the two.
//   backward step: each block computes its units' d_gates, then its partial d_h = d_gates W_h over
//                  its own rows (all S columns); after the cluster barrier each block sums the
//                  partials for its units over the ranks in order 0..C-1, so the result does not
//                  depend on timing (deterministic); the partials are double-buffered as h is.
// Every product accumulates in float from the stored type (FFMA): float32 stays IEEE whatever
// allow_tf32 says.  On a GPU without clusters (sm_80) a kernel compiled for it runs as a cluster
// of one (see rt::cluster_sync).
#include "lltm_persistent.cuh"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <utility>

namespace lltm_cuda {

namespace {

// Block `rank` of `blocks` owns the hidden units [first, first + count): S split as evenly as it goes.
struct Units {
  int64_t first, count;
};

__device__ __forceinline__ Units units_of(int64_t state_size, unsigned rank, unsigned blocks) {
  const int64_t base = state_size / blocks, extra = state_size % blocks;
  return {rank * base + (int64_t(rank) < extra ? int64_t(rank) : extra), base + (int64_t(rank) < extra ? 1 : 0)};
}

__host__ __device__ inline int64_t max_units(int64_t state_size, int64_t blocks) {
  return (state_size + blocks - 1) / blocks;
}

__host__ __device__ inline int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

// The row stride of W_h's rows in shared memory, in elements: an odd number of 4-byte words, so that
// the threads of a warp, each reading its own unit's row at the same column, hit 32 different banks.
__host__ __device__ inline int64_t w_row_stride(int64_t state_size, int64_t element) {
  int64_t words = (state_size * element + 3) / 4;
  words += words % 2 == 0 ? 1 : 0;
  return words * 4 / element;
}

__host__ __device__ inline int64_t w_bytes(int64_t state_size, int64_t blocks, int64_t element) {
  return align16(3 * max_units(state_size, blocks) * w_row_stride(state_size, element) * element);
}

// Shared memory a block needs: W_h's rows, then the forward's two h buffers (B, S) or the
// backward's d_gates (B, 3, n) and two partial d_h buffers (B, S) in float.
inline int64_t forward_shared_bytes(int64_t element, int64_t batch, int64_t state_size, int64_t blocks) {
  return w_bytes(state_size, blocks, element) + 2 * batch * state_size * element;
}

inline int64_t backward_shared_bytes(int64_t element, int64_t batch, int64_t state_size, int64_t blocks) {
  return w_bytes(state_size, blocks, element) +
         align16(batch * 3 * max_units(state_size, blocks) * 4) + 2 * batch * state_size * 4;
}

// Copies this block's rows of W_h (the first S columns of weights, row stride ld) into
// w_s[3][n_max][w_ld], w_ld = w_row_stride.
template <typename scalar_t>
__device__ __forceinline__ void load_w_h(scalar_t* w_s, const scalar_t* weights, int64_t ld, int64_t state_size,
                                         Units units, int64_t n_max) {
  const int64_t w_ld = w_row_stride(state_size, sizeof(scalar_t));
  const int64_t total = 3 * units.count * state_size;
  for (int64_t i = threadIdx.x; i < total; i += blockDim.x) {
    const int64_t gate = i / (units.count * state_size), unit = i / state_size % units.count, k = i % state_size;
    w_s[(gate * n_max + unit) * w_ld + k] = weights[(gate * state_size + units.first + unit) * ld + k];
  }
}

template <typename scalar_t>
__global__ void persistent_forward_kernel(
    const scalar_t* __restrict__ weights, int64_t ld, scalar_t* __restrict__ gates, scalar_t* __restrict__ h,
    opmath_type<scalar_t>* __restrict__ cell, scalar_t* __restrict__ output, scalar_t* __restrict__ tanh_cell,
    const int64_t* __restrict__ lengths, int64_t steps, int64_t k_begin, int64_t k_end, int64_t first_step,
    bool reverse, bool store_gates, int64_t batch, int64_t state_size) {
  using opmath_t = opmath_type<scalar_t>;
  const unsigned rank = rt::cluster_rank(), blocks = rt::cluster_blocks();
  const Units units = units_of(state_size, rank, blocks);
  const int64_t n_max = max_units(state_size, blocks), S = state_size, BS = batch * state_size;
  scalar_t* const w_s = rt::dynamic_shared<scalar_t>();
  const int64_t w_ld = w_row_stride(S, sizeof(scalar_t));
  scalar_t* const h_s = w_s + w_bytes(S, blocks, sizeof(scalar_t)) / int64_t(sizeof(scalar_t));
  load_w_h(w_s, weights, ld, S, units, n_max);
  for (int64_t i = threadIdx.x; i < BS; i += blockDim.x) {
    h_s[i] = h[i];
  }
  // Every block's W_h and h in place, and every peer started, before any block writes a peer's buffer.
  rt::cluster_sync();
  const int64_t mine = batch * units.count;
  for (int64_t k = k_begin; k < k_end; ++k) {
    const int64_t t = reverse ? steps - 1 - k : k;
    const int current = int((k - k_begin) & 1);
    const int next = 1 - current;  // double-buffered: peers may still read `current` this step
    const scalar_t* const h_now = h_s + current * BS;
    scalar_t* const h_next = h_s + next * BS;
    for (int64_t e = threadIdx.x; e < mine; e += blockDim.x) {
      const int64_t b = e / units.count, u = e % units.count, j = units.first + u;
      scalar_t* const g = gates + ((t - first_step) * batch + b) * 3 * S;
      opmath_t pre_i = opmath_t(g[j]), pre_o = opmath_t(g[S + j]), pre_z = opmath_t(g[2 * S + j]);
      const scalar_t* const row = h_now + b * S;
      const scalar_t* const w_i = w_s + u * w_ld;
      const scalar_t* const w_o = w_s + (n_max + u) * w_ld;
      const scalar_t* const w_z = w_s + (2 * n_max + u) * w_ld;
      for (int64_t c = 0; c < S; ++c) {
        const opmath_t hc = opmath_t(row[c]);
        pre_i += hc * opmath_t(w_i[c]);
        pre_o += hc * opmath_t(w_o[c]);
        pre_z += hc * opmath_t(w_z[c]);
      }
      if (store_gates) {  // the saved pre-activation gates, as the per-step path's GEMM leaves them
        g[j] = scalar_t(pre_i);
        g[S + j] = scalar_t(pre_o);
        g[2 * S + j] = scalar_t(pre_z);
      }
      const int64_t at = b * S + j;
      scalar_t new_h = row[j], out = scalar_t(0), tanh_c = scalar_t(0);  // a row past its length keeps its state
      if (takes_part(lengths, b, t)) {
        const auto result = cell_forward<opmath_t>(pre_i, pre_o, pre_z, cell[at]);
        cell[at] = result.cell;
        new_h = out = scalar_t(result.h);
        tanh_c = scalar_t(result.tanh_cell);
      }
      output[t * BS + at] = out;
      if (tanh_cell != nullptr) {
        tanh_cell[t * BS + at] = tanh_c;
      }
      for (unsigned peer = 0; peer < blocks; ++peer) {
        rt::map_shared_rank(h_next, peer)[at] = new_h;
      }
      if (k == k_end - 1) {
        h[at] = new_h;
      }
    }
    // h_t complete in every block before any reads it; and no block leaves while peers write to it.
    rt::cluster_sync();
  }
}

template <typename scalar_t>
__global__ void persistent_backward_kernel(
    const scalar_t* __restrict__ weights, int64_t ld, const scalar_t* __restrict__ grad_output,
    const scalar_t* __restrict__ gates, const scalar_t* __restrict__ tanh_cell, opmath_type<scalar_t>* __restrict__ grad_h,
    opmath_type<scalar_t>* __restrict__ grad_cell, scalar_t* __restrict__ d_gates, const int64_t* __restrict__ lengths,
    int64_t steps, bool reverse, int64_t batch, int64_t state_size) {
  using opmath_t = opmath_type<scalar_t>;
  const unsigned rank = rt::cluster_rank(), blocks = rt::cluster_blocks();
  const Units units = units_of(state_size, rank, blocks);
  const int64_t n_max = max_units(state_size, blocks), S = state_size, BS = batch * state_size;
  scalar_t* const w_s = rt::dynamic_shared<scalar_t>();
  const int64_t w_ld = w_row_stride(S, sizeof(scalar_t));
  auto* const bytes = reinterpret_cast<unsigned char*>(w_s) + w_bytes(S, blocks, sizeof(scalar_t));
  float* const dg_s = reinterpret_cast<float*>(bytes);  // (B, 3, n_max): this block's d_gates of the step
  float* const partial_s = reinterpret_cast<float*>(bytes + align16(batch * 3 * n_max * 4));  // 2 x (B, S)
  load_w_h(w_s, weights, ld, S, units, n_max);
  rt::cluster_sync();
  const int64_t mine = batch * units.count;
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t t = reverse ? k : steps - 1 - k;  // the forward's steps, last first
    float* const partial = partial_s + (k & 1) * BS;  // double-buffered: peers may still sum the other
    for (int64_t e = threadIdx.x; e < mine; e += blockDim.x) {
      const int64_t b = e / units.count, u = e % units.count, j = units.first + u, at = b * S + j;
      const scalar_t* const g = gates + (t * batch + b) * 3 * S;
      scalar_t d[3] = {scalar_t(0), scalar_t(0), scalar_t(0)};
      if (takes_part(lengths, b, t)) {
        const opmath_t grad_h_t = grad_h[at] + opmath_t(grad_output[t * BS + at]);
        const auto grad = cell_backward<opmath_t>(opmath_t(g[j]), opmath_t(g[S + j]), opmath_t(g[2 * S + j]),
                                                  opmath_t(tanh_cell[t * BS + at]), grad_h_t, grad_cell[at]);
        grad_cell[at] = grad.d_old_cell;
        d[0] = scalar_t(grad.d_i);
        d[1] = scalar_t(grad.d_o);
        d[2] = scalar_t(grad.d_z);
      }
      for (int gate = 0; gate < 3; ++gate) {
        d_gates[(t * batch + b) * 3 * S + gate * S + j] = d[gate];
        dg_s[(b * 3 + gate) * n_max + u] = float(d[gate]);  // rounded, as the per-step path's GEMM reads it
      }
    }
    rt::sync_threads();  // every unit's d_gates in dg_s before the partial product reads them
    for (int64_t o = threadIdx.x; o < BS; o += blockDim.x) {
      const int64_t b = o / S, c = o % S;
      float sum = 0.f;
      for (int gate = 0; gate < 3; ++gate) {
        for (int64_t u = 0; u < units.count; ++u) {
          sum += dg_s[(b * 3 + gate) * n_max + u] * float(w_s[(gate * n_max + u) * w_ld + c]);
        }
      }
      partial[o] = sum;
    }
    rt::cluster_sync();  // every block's partial d_h complete before any block sums them
    for (int64_t e = threadIdx.x; e < mine; e += blockDim.x) {
      const int64_t b = e / units.count, j = units.first + e % units.count, at = b * S + j;
      // A row past its length keeps its gradient (its d_gates are zero); rank order fixes the sum.
      opmath_t sum = takes_part(lengths, b, t) ? opmath_t(0) : grad_h[at];
      for (unsigned peer = 0; peer < blocks; ++peer) {
        sum += opmath_t(rt::map_shared_rank(partial, peer)[at]);
      }
      grad_h[at] = sum;
    }
  }
  rt::cluster_sync();  // no block leaves while a peer still sums its last partial
}

// The device's answers plan_sequence needs, asked once per device.
struct DeviceLimits {
  bool clusters;
  int64_t shared_per_block;
};

DeviceLimits device_limits(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceLimits> known;
  const std::lock_guard<std::mutex> lock(mutex);
  auto found = known.find(device);
  if (found == known.end()) {
    found = known.emplace(device, DeviceLimits{rt::launches_clusters(device), int64_t(rt::shared_per_block(device))}).first;
  }
  return found->second;
}

int64_t element_size(ScalarType dtype) { return dtype == ScalarType::Float ? 4 : dtype == ScalarType::Double ? 8 : 2; }

// The larger of the two kernels' needs: one plan serves the forward and the backward.
int64_t shared_bytes(ScalarType dtype, int64_t batch, int64_t state_size, int64_t blocks) {
  const int64_t element = element_size(dtype);
  return std::max(forward_shared_bytes(element, batch, state_size, blocks),
                  backward_shared_bytes(element, batch, state_size, blocks));
}

template <typename F>
void dispatch_persistent(ScalarType dtype, F&& f) {
  switch (dtype) {
    case ScalarType::Float: f(float{}); break;
    case ScalarType::BFloat16: f(torch::headeronly::BFloat16{}); break;
    case ScalarType::Half: f(torch::headeronly::Half{}); break;
    default: STD_TORCH_CHECK(false, "lltm-cuda: the persistent sequence kernel takes float32, bfloat16 or float16, got ", dtype);
  }
}

}  // namespace

SequencePlan plan_sequence(int device, ScalarType dtype, int64_t batch, int64_t state_size) {
  const char* forced_text = std::getenv("LLTM_CUDA_SEQUENCE");
  const std::string forced = forced_text ? forced_text : "";
  STD_TORCH_CHECK(forced.empty() || forced == "auto" || forced == "persistent" || forced == "per-step",
                  "LLTM_CUDA_SEQUENCE=", forced, ": expected persistent, per-step or auto");
  const char* cluster_text = std::getenv("LLTM_CUDA_CLUSTER");
  const std::string cluster_forced = cluster_text ? cluster_text : "";
  int forced_cluster = 0;
  if (!cluster_forced.empty() && cluster_forced != "0") {
    forced_cluster = cluster_forced == "1" ? 1 : cluster_forced == "2" ? 2 : cluster_forced == "4" ? 4
                   : cluster_forced == "8" ? 8 : cluster_forced == "16" ? 16 : -1;
    STD_TORCH_CHECK(forced_cluster > 0, "LLTM_CUDA_CLUSTER=", cluster_forced, ": expected 1, 2, 4, 8, 16 or 0 (the default)");
  }
  SequencePlan plan;
  if (forced == "per-step") {
    plan.why = "per-step: LLTM_CUDA_SEQUENCE=per-step";
    return plan;
  }
  const bool must = forced == "persistent";
  // A reason the persistent kernel does not run: an error when it was asked for, else the per-step path.
  auto decline = [&](const std::string& reason) {
    STD_TORCH_CHECK(!must, "lltm-cuda: LLTM_CUDA_SEQUENCE=persistent, but ", reason);
    plan.why = "per-step: " + reason;
    return plan;
  };
  if (dtype != ScalarType::Float && dtype != ScalarType::BFloat16 && dtype != ScalarType::Half) {
    return decline("the persistent kernel takes float32, bfloat16 and float16 (float64 runs per step)");
  }
  if (batch == 0) {
    plan.why = "per-step: an empty batch, nothing to run";
    return plan;
  }
  const DeviceLimits limits = device_limits(device);
  if (!limits.clusters && !must) {
    return decline("the device launches no thread-block clusters (sm_80): the per-step path is the default there");
  }
  // The cluster: as many blocks as clusters allow portably (8; 1 without clusters), no more than
  // there are hidden units.
  int cluster = forced_cluster;
  if (cluster == 0) {
    cluster = limits.clusters ? 8 : 1;
    while (cluster > 1 && cluster > state_size) {
      cluster /= 2;
    }
  }
  if (cluster > 1 && !limits.clusters) {
    return decline("LLTM_CUDA_CLUSTER=" + std::to_string(cluster) + " on a device without thread-block clusters");
  }
  const int64_t bytes = shared_bytes(dtype, batch, state_size, cluster);
  if (bytes > limits.shared_per_block) {
    return decline("W_h's rows and the state need " + std::to_string(bytes) + " bytes of shared memory a block over a cluster of " +
                   std::to_string(cluster) + ", over the device's " + std::to_string(limits.shared_per_block));
  }
  plan.persistent = true;
  plan.cluster = cluster;
  plan.why = "persistent: one launch for the time loop, W_h on chip over a cluster of " + std::to_string(cluster) +
             " blocks (" + std::to_string(bytes) + " bytes of shared memory a block)" +
             (must ? " (LLTM_CUDA_SEQUENCE=persistent)" : "");
  return plan;
}

void persistent_forward(const SequencePlan& plan, const PersistentForward& a) {
  const int64_t B = a.h.size(0), S = a.h.size(1);
  dispatch_persistent(a.gates.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    using opmath_t = opmath_type<scalar_t>;
    const size_t bytes = size_t(forward_shared_bytes(sizeof(scalar_t), B, S, plan.cluster));
    rt::launch(persistent_forward_kernel<scalar_t>,
               rt::ClusterLaunch{"persistent_forward_kernel", plan.cluster, rt::threads_per_block(), plan.cluster, bytes},
               rt::current_stream(a.gates.get_device_index()), a.weights.const_data_ptr<scalar_t>(), a.weights.stride(0),
               a.gates.mutable_data_ptr<scalar_t>(), a.h.mutable_data_ptr<scalar_t>(), a.cell.mutable_data_ptr<opmath_t>(),
               a.output.mutable_data_ptr<scalar_t>(),
               a.tanh_cell.has_value() ? a.tanh_cell->mutable_data_ptr<scalar_t>() : nullptr, lengths_ptr(a.lengths),
               a.steps, a.k_begin, a.k_end, a.first_step, a.reverse, a.store_gates, B, S);
  });
}

void persistent_backward(const SequencePlan& plan, const PersistentBackward& a) {
  const int64_t T = a.gates.size(0), B = a.gates.size(1), S = a.grad_h.size(1);
  dispatch_persistent(a.gates.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    using opmath_t = opmath_type<scalar_t>;
    const size_t bytes = size_t(backward_shared_bytes(sizeof(scalar_t), B, S, plan.cluster));
    rt::launch(persistent_backward_kernel<scalar_t>,
               rt::ClusterLaunch{"persistent_backward_kernel", plan.cluster, rt::threads_per_block(), plan.cluster, bytes},
               rt::current_stream(a.gates.get_device_index()), a.weights.const_data_ptr<scalar_t>(), a.weights.stride(0),
               a.grad_output.const_data_ptr<scalar_t>(), a.gates.const_data_ptr<scalar_t>(),
               a.tanh_cell.const_data_ptr<scalar_t>(), a.grad_h.mutable_data_ptr<opmath_t>(),
               a.grad_cell.mutable_data_ptr<opmath_t>(), a.d_gates.mutable_data_ptr<scalar_t>(),
               lengths_ptr(a.lengths), T, a.reverse, B, S);
  });
}

}  // namespace lltm_cuda

// plan_sequence for Python (lltm_cuda.sequence_path, through ctypes): the blocks of the cluster, 0
// for the per-step path, or -1 for an error; `why` gets the reason or the error's message.  A C
// function, not an operator: it answers a question about the library, it computes nothing.
extern "C" __attribute__((visibility("default"))) int lltm_cuda_sequence_plan(int device, int dtype, int64_t batch,
                                                                              int64_t state_size, char* why,
                                                                              size_t why_size) {
  std::string text;
  int cluster = -1;
  try {
    const lltm_cuda::SequencePlan plan =
        lltm_cuda::plan_sequence(device, static_cast<lltm_cuda::ScalarType>(dtype), batch, state_size);
    cluster = plan.persistent ? plan.cluster : 0;
    text = plan.why;
  } catch (const std::exception& error) {
    text = error.what();
  }
  if (why_size > 0) {
    const size_t n = std::min(why_size - 1, text.size());
    std::memcpy(why, text.data(), n);
    why[n] = '\0';
  }
  return cluster;
}
