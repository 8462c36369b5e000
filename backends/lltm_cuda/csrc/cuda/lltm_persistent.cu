// The persistent sequence kernels: the LLTM's time loop in one launch (forward, and backward), for
// float32, bfloat16 and float16 with float32 accumulation.
//
// The cluster path: a thread-block cluster of C blocks splits the S hidden units: block r owns
// units [u0, u0 + n) and keeps their rows of W_h (all three gates: 3n rows of S) in shared memory
// for the whole loop, so each step's gates and cell are block-local.  The input projection (all
// steps, bias folded in) is one GEMM before the launch, and the weight and input gradients stay
// GEMMs after the backward.
//   forward step:  each block holds the whole h_{t-1} (B, S); it computes its units' gates and cell,
//                  and writes its slice of h_t into every block's next h buffer through distributed
//                  shared memory; one cluster barrier a step.  h is double-buffered: a block writes
//                  the buffer its peers read only the step after, and the barrier orders the two.
//   backward step: each block computes its units' d_gates, then its partial d_h = d_gates W_h over
//                  its own rows (all S columns); after the cluster barrier each block sums the
//                  partials for its units over the ranks in order 0..C-1, so the result does not
//                  depend on timing (deterministic); the partials are double-buffered as h is.
// Where W_h does not fit a cluster (T64 B256 I1024 S1024), the grid path (LLTM_CUDA_SEQUENCE=grid)
// runs the same loop over a cooperative launch of one block a multiprocessor: each block keeps its
// units' rows of W_h in shared memory, h_{t-1} is exchanged through two buffers in global memory,
// and the grid barrier ends a step.  Its backward writes d_gates to global memory, and after the
// grid barrier each block sums d_h for its own units over W_h's columns in a fixed order.  One
// kernel a step on the critical path either way; whether it beats the per-step path there is a
// GPU's to measure (benchmarks/persistent_vs_cudnn.py), and until then it runs only when forced.
// Every product accumulates in float from the stored type (FFMA): float32 stays IEEE whatever
// allow_tf32 says.  On a GPU without clusters (sm_80) a kernel compiled for it runs as a cluster
// of one (see rt::cluster_sync).
#include "lltm_persistent.cuh"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>
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

// A block's rows of W_h in shared memory, w[3][n_max][ld] (ld = w_row_stride): gate g's row of
// its unit u at row(g, u).
template <typename scalar_t>
struct BlockRows {
  const scalar_t* w;
  int64_t n_max, ld;
  __device__ __forceinline__ const scalar_t* row(int gate, int64_t u) const { return w + (gate * n_max + u) * ld; }
};

// Copies the rows of W_h of `units` (the first S columns of weights, row stride ld) into the start
// of the dynamic shared memory, laid out for `blocks` blocks; returns where they are.
template <typename scalar_t>
__device__ __forceinline__ BlockRows<scalar_t> load_w_h(const scalar_t* weights, int64_t ld, int64_t state_size,
                                                        Units units, unsigned blocks) {
  scalar_t* const w_s = rt::dynamic_shared<scalar_t>();
  const BlockRows<scalar_t> rows{w_s, max_units(state_size, blocks), w_row_stride(state_size, sizeof(scalar_t))};
  const int64_t total = 3 * units.count * state_size;
  for (int64_t i = threadIdx.x; i < total; i += blockDim.x) {
    const int64_t gate = i / (units.count * state_size), unit = i / state_size % units.count, k = i % state_size;
    w_s[(gate * rows.n_max + unit) * rows.ld + k] = weights[(gate * state_size + units.first + unit) * ld + k];
  }
  return rows;
}

// What a forward launch works on, on either path (see PersistentForward).
template <typename scalar_t>
struct ForwardParams {
  const scalar_t* weights;
  int64_t ld;
  scalar_t* gates;
  scalar_t* h;
  opmath_type<scalar_t>* cell;
  scalar_t* output;
  scalar_t* tanh_cell;  // null: nothing kept for a backward
  const int64_t* lengths;
  int64_t steps, k_begin, k_end, first_step;
  bool reverse, store_gates;
  int64_t batch, state_size;
};

// Unit j (the block's u-th) of row b at step t: its gates from the input projection and h_{t-1}
// (`row`, the S values of row b), the cell, the step's outputs, and h itself after the launch's
// last step; returns the unit's h_t (the state it had, for a row past its length).
template <typename scalar_t>
__device__ __forceinline__ scalar_t forward_unit(const ForwardParams<scalar_t>& p, const BlockRows<scalar_t>& w,
                                                 const scalar_t* row, int64_t b, int64_t u, int64_t j, int64_t t,
                                                 bool last) {
  using opmath_t = opmath_type<scalar_t>;
  const int64_t S = p.state_size, BS = p.batch * S;
  scalar_t* const g = p.gates + ((t - p.first_step) * p.batch + b) * 3 * S;
  opmath_t pre_i = opmath_t(g[j]), pre_o = opmath_t(g[S + j]), pre_z = opmath_t(g[2 * S + j]);
  const scalar_t *const w_i = w.row(0, u), *const w_o = w.row(1, u), *const w_z = w.row(2, u);
  for (int64_t c = 0; c < S; ++c) {
    const opmath_t hc = opmath_t(row[c]);
    pre_i += hc * opmath_t(w_i[c]);
    pre_o += hc * opmath_t(w_o[c]);
    pre_z += hc * opmath_t(w_z[c]);
  }
  if (p.store_gates) {  // the saved pre-activation gates, as the per-step path's GEMM leaves them
    g[j] = scalar_t(pre_i);
    g[S + j] = scalar_t(pre_o);
    g[2 * S + j] = scalar_t(pre_z);
  }
  const int64_t at = b * S + j;
  scalar_t new_h = row[j], out = scalar_t(0), tanh_c = scalar_t(0);  // a row past its length keeps its state
  if (takes_part(p.lengths, b, t)) {
    const auto result = cell_forward<opmath_t>(pre_i, pre_o, pre_z, p.cell[at]);
    p.cell[at] = result.cell;
    new_h = out = scalar_t(result.h);
    tanh_c = scalar_t(result.tanh_cell);
  }
  p.output[t * BS + at] = out;
  if (p.tanh_cell != nullptr) {
    p.tanh_cell[t * BS + at] = tanh_c;
  }
  if (last) {
    p.h[at] = new_h;
  }
  return new_h;
}

// The blocks that share a time loop, and how they hand each other h.  A team gives rank() and
// blocks(), sync() (the barrier a step ends with) and, over its two h buffers of (B, S): start(h)
// (h_{k_begin-1} into buffer 0, before the first sync), buffer(i) (to read) and publish(i, at,
// value) (element `at` of buffer i, for every block).
//
// The cluster path: the blocks of one cluster, each holding the whole h in its shared memory after
// W_h's rows; a block writes its units' h into every peer's buffer (distributed shared memory).
template <typename scalar_t>
struct ClusterTeam {
  scalar_t* h_s;  // two (B, S) buffers in this block's shared memory
  int64_t count;  // B * S
  __device__ __forceinline__ unsigned rank() const { return rt::cluster_rank(); }
  __device__ __forceinline__ unsigned blocks() const { return rt::cluster_blocks(); }
  __device__ __forceinline__ void sync() const { rt::cluster_sync(); }
  __device__ __forceinline__ void start(const scalar_t* h, Units) const {
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
      h_s[i] = h[i];
    }
  }
  __device__ __forceinline__ const scalar_t* buffer(int i) const { return h_s + i * count; }
  __device__ __forceinline__ void publish(int i, int64_t at, scalar_t value) const {
    for (unsigned peer = 0; peer < blocks(); ++peer) {
      rt::map_shared_rank(h_s + i * count, peer)[at] = value;
    }
  }
};

// The grid path: every block of a cooperative launch, h in two (B, S) buffers in global memory
// (L2), each block writing its own units once; the grid barrier ends a step.
template <typename scalar_t>
struct GridTeam {
  scalar_t* exchange;  // two (B, S) buffers in global memory
  int64_t count, state_size;
  __device__ __forceinline__ unsigned rank() const { return blockIdx.x; }
  __device__ __forceinline__ unsigned blocks() const { return gridDim.x; }
  __device__ __forceinline__ void sync() const { rt::grid_sync(); }
  __device__ __forceinline__ void start(const scalar_t* h, Units units) const {
    for (int64_t e = threadIdx.x; e < count / state_size * units.count; e += blockDim.x) {
      const int64_t at = e / units.count * state_size + units.first + e % units.count;
      exchange[at] = h[at];
    }
  }
  __device__ __forceinline__ const scalar_t* buffer(int i) const { return exchange + i * count; }
  __device__ __forceinline__ void publish(int i, int64_t at, scalar_t value) const { exchange[i * count + at] = value; }
};

// The forward's time loop, steps k_begin..k_end-1, on either team: block `rank` computes its units
// of every row each step from h_{t-1} and hands its slice of h_t to the others; one team barrier a
// step.  h is double-buffered: a block writes the buffer the others read only the step after, and
// the barrier orders the two.
template <typename scalar_t, typename Team>
__device__ __forceinline__ void forward_loop(const ForwardParams<scalar_t>& p, const Team& team) {
  const Units units = units_of(p.state_size, team.rank(), team.blocks());
  const BlockRows<scalar_t> w = load_w_h(p.weights, p.ld, p.state_size, units, team.blocks());
  team.start(p.h, units);
  // Every block's W_h and h in place, and every block started, before any block writes another's buffer.
  team.sync();
  const int64_t mine = p.batch * units.count;
  for (int64_t k = p.k_begin; k < p.k_end; ++k) {
    const int64_t t = p.reverse ? p.steps - 1 - k : k;
    const int current = int((k - p.k_begin) & 1);
    const int next = 1 - current;  // double-buffered: others may still read `current` this step
    for (int64_t e = threadIdx.x; e < mine; e += blockDim.x) {
      const int64_t b = e / units.count, u = e % units.count, j = units.first + u;
      const scalar_t new_h =
          forward_unit(p, w, team.buffer(current) + b * p.state_size, b, u, j, t, k == p.k_end - 1);
      team.publish(next, b * p.state_size + j, new_h);
    }
    // h_t complete in every block before any reads it; and no block leaves while others write to it.
    team.sync();
  }
}

template <typename scalar_t>
__global__ void persistent_forward_kernel(ForwardParams<scalar_t> p) {
  const int64_t S = p.state_size;
  const int64_t w_elements = w_bytes(S, rt::cluster_blocks(), sizeof(scalar_t)) / int64_t(sizeof(scalar_t));
  scalar_t* const h_s = rt::dynamic_shared<scalar_t>() + w_elements;  // after W_h's rows
  forward_loop(p, ClusterTeam<scalar_t>{h_s, p.batch * S});
}

template <typename scalar_t>
__global__ void persistent_grid_forward_kernel(ForwardParams<scalar_t> p, scalar_t* exchange) {
  forward_loop(p, GridTeam<scalar_t>{exchange, p.batch * p.state_size, p.state_size});
}

// What a backward launch works on, on either path (see PersistentBackward).
template <typename scalar_t>
struct BackwardParams {
  const scalar_t* weights;
  int64_t ld;
  const scalar_t* grad_output;
  const scalar_t* gates;
  const scalar_t* tanh_cell;
  opmath_type<scalar_t>* grad_h;
  opmath_type<scalar_t>* grad_cell;
  scalar_t* d_gates;
  const int64_t* lengths;
  int64_t steps;
  bool reverse;
  int64_t batch, state_size;
};

// Unit j of row b at step t, backward: the unit's d_gates (written out, and returned rounded to
// scalar_t, as the per-step path's GEMM reads them) and the cell's gradient; grad_h holds the
// gradient of h_t from the steps after t.
template <typename scalar_t>
struct UnitGrads {
  scalar_t d[3];
};

template <typename scalar_t>
__device__ __forceinline__ UnitGrads<scalar_t> backward_unit(const BackwardParams<scalar_t>& p, int64_t b, int64_t j,
                                                            int64_t t) {
  using opmath_t = opmath_type<scalar_t>;
  const int64_t S = p.state_size, BS = p.batch * S, at = b * S + j;
  const scalar_t* const g = p.gates + (t * p.batch + b) * 3 * S;
  UnitGrads<scalar_t> out{{scalar_t(0), scalar_t(0), scalar_t(0)}};
  if (takes_part(p.lengths, b, t)) {
    const opmath_t grad_h_t = p.grad_h[at] + opmath_t(p.grad_output[t * BS + at]);
    const auto grad = cell_backward<opmath_t>(opmath_t(g[j]), opmath_t(g[S + j]), opmath_t(g[2 * S + j]),
                                              opmath_t(p.tanh_cell[t * BS + at]), grad_h_t, p.grad_cell[at]);
    p.grad_cell[at] = grad.d_old_cell;
    out.d[0] = scalar_t(grad.d_i);
    out.d[1] = scalar_t(grad.d_o);
    out.d[2] = scalar_t(grad.d_z);
  }
  for (int gate = 0; gate < 3; ++gate) {
    p.d_gates[(t * p.batch + b) * 3 * S + gate * S + j] = out.d[gate];
  }
  return out;
}

// The step the backward's k-th iteration runs: the forward's steps, last first.
__device__ __forceinline__ int64_t backward_step(int64_t steps, bool reverse, int64_t k) {
  return reverse ? k : steps - 1 - k;
}

// The cluster's backward: each block computes its units' d_gates, then its partial d_h = d_gates
// W_h over its own rows (all S columns); after the cluster barrier each block sums the partials
// for its units over the ranks in order 0..C-1, so the result does not depend on timing; the
// partials are double-buffered as h is.
template <typename scalar_t>
__global__ void persistent_backward_kernel(BackwardParams<scalar_t> p) {
  using opmath_t = opmath_type<scalar_t>;
  const unsigned blocks = rt::cluster_blocks();
  const int64_t S = p.state_size, BS = p.batch * S;
  const Units units = units_of(S, rt::cluster_rank(), blocks);
  const BlockRows<scalar_t> w = load_w_h(p.weights, p.ld, S, units, blocks);
  auto* const bytes = rt::dynamic_shared<unsigned char>() + w_bytes(S, blocks, sizeof(scalar_t));  // after W_h's rows
  float* const dg_s = reinterpret_cast<float*>(bytes);  // (B, 3, n_max): this block's d_gates of the step
  float* const partial_s = reinterpret_cast<float*>(bytes + align16(p.batch * 3 * w.n_max * 4));  // 2 x (B, S)
  rt::cluster_sync();
  const int64_t mine = p.batch * units.count;
  for (int64_t k = 0; k < p.steps; ++k) {
    const int64_t t = backward_step(p.steps, p.reverse, k);
    float* const partial = partial_s + (k & 1) * BS;  // double-buffered: peers may still sum the other
    for (int64_t e = threadIdx.x; e < mine; e += blockDim.x) {
      const int64_t b = e / units.count, u = e % units.count;
      const UnitGrads<scalar_t> grads = backward_unit(p, b, units.first + u, t);
      for (int gate = 0; gate < 3; ++gate) {
        dg_s[(b * 3 + gate) * w.n_max + u] = float(grads.d[gate]);
      }
    }
    rt::sync_threads();  // every unit's d_gates in dg_s before the partial product reads them
    for (int64_t o = threadIdx.x; o < BS; o += blockDim.x) {
      const int64_t b = o / S, c = o % S;
      float sum = 0.f;
      for (int gate = 0; gate < 3; ++gate) {
        for (int64_t u = 0; u < units.count; ++u) {
          sum += dg_s[(b * 3 + gate) * w.n_max + u] * float(w.row(gate, u)[c]);
        }
      }
      partial[o] = sum;
    }
    rt::cluster_sync();  // every block's partial d_h complete before any block sums them
    for (int64_t e = threadIdx.x; e < mine; e += blockDim.x) {
      const int64_t b = e / units.count, j = units.first + e % units.count, at = b * S + j;
      // A row past its length keeps its gradient (its d_gates are zero); rank order fixes the sum.
      opmath_t sum = takes_part(p.lengths, b, t) ? opmath_t(0) : p.grad_h[at];
      for (unsigned peer = 0; peer < blocks; ++peer) {
        sum += opmath_t(rt::map_shared_rank(partial, peer)[at]);
      }
      p.grad_h[at] = sum;
    }
  }
  rt::cluster_sync();  // no block leaves while a peer still sums its last partial
}

// The grid's backward: each block computes its units' d_gates into d_gates (global memory); after
// the grid barrier it finishes d_h of its own units, d_h[b, j] = sum over the 3S rows r of
// d_gates[t, b, r] W_h[r, j] (its units' columns of W_h, read from global memory), in the order
// of r: deterministic.  A thread finishes the very elements it starts the next step with, so the
// grid barrier is the step's only one.
template <typename scalar_t>
__global__ void persistent_grid_backward_kernel(BackwardParams<scalar_t> p) {
  using opmath_t = opmath_type<scalar_t>;
  const int64_t S = p.state_size;
  const Units units = units_of(S, blockIdx.x, gridDim.x);
  const int64_t mine = p.batch * units.count;
  for (int64_t k = 0; k < p.steps; ++k) {
    const int64_t t = backward_step(p.steps, p.reverse, k);
    for (int64_t e = threadIdx.x; e < mine; e += blockDim.x) {
      backward_unit(p, e / units.count, units.first + e % units.count, t);
    }
    rt::grid_sync();  // every unit's d_gates of step t written before any block reads them
    for (int64_t e = threadIdx.x; e < mine; e += blockDim.x) {
      const int64_t b = e / units.count, j = units.first + e % units.count, at = b * S + j;
      const scalar_t* const d = p.d_gates + (t * p.batch + b) * 3 * S;
      // A row past its length keeps its gradient (its d_gates are zero).
      opmath_t sum = takes_part(p.lengths, b, t) ? opmath_t(0) : p.grad_h[at];
      for (int64_t r = 0; r < 3 * S; ++r) {
        sum += opmath_t(d[r]) * opmath_t(p.weights[r * p.ld + j]);
      }
      p.grad_h[at] = sum;
    }
  }
}

// The device's answers plan_sequence needs, asked once per device.
struct DeviceLimits {
  bool clusters;
  int64_t shared_per_block;
  int64_t multiprocessors;
};

DeviceLimits device_limits(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceLimits> known;
  const std::lock_guard<std::mutex> lock(mutex);
  auto found = known.find(device);
  if (found == known.end()) {
    found = known.emplace(device, DeviceLimits{rt::launches_clusters(device), int64_t(rt::shared_per_block(device)),
                                               int64_t(rt::multiprocessor_count(device))}).first;
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

// How many blocks of both grid kernels (the forward's with `forward_bytes` of shared memory) the
// device holds at once, asked once per device, dtype and size.
int64_t grid_capacity(int device, ScalarType dtype, int64_t forward_bytes) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int64_t>, int64_t> known;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, int(dtype), forward_bytes);
  auto found = known.find(key);
  if (found == known.end()) {
    int64_t blocks = 0;
    dispatch_persistent(dtype, [&](auto zero) {
      using scalar_t = decltype(zero);
      const int threads = rt::threads_per_block();
      const auto forward = persistent_grid_forward_kernel<scalar_t>;
      const auto backward = persistent_grid_backward_kernel<scalar_t>;
      blocks = std::min(rt::cooperative_blocks(forward, threads, size_t(forward_bytes), device),
                        rt::cooperative_blocks(backward, threads, 0, device));
    });
    found = known.emplace(key, blocks).first;
  }
  return found->second;
}

// The grid path: one block a multiprocessor (no more blocks than hidden units), each keeping its
// units' rows of W_h in shared memory; all blocks resident at once, or the launch is refused.
SequencePlan plan_grid(int device, ScalarType dtype, int64_t batch, int64_t state_size, const DeviceLimits& limits) {
  std::ostringstream described;
  described << "at batch " << batch << ", state size " << state_size << ", " << dtype;
  const std::string shape = described.str();
  auto refuse = [&](const std::string& reason) {
    STD_TORCH_CHECK(false, "lltm-cuda: LLTM_CUDA_SEQUENCE=grid, but the grid-persistent path cannot run ", shape, ": ",
                    reason, "; unset LLTM_CUDA_SEQUENCE for the default path");
  };
  SequencePlan plan;
  if (dtype != ScalarType::Float && dtype != ScalarType::BFloat16 && dtype != ScalarType::Half) {
    refuse("it takes float32, bfloat16 and float16 (float64 runs per step)");
  }
  if (batch == 0) {
    plan.why = "per-step: an empty batch, nothing to run";
    return plan;
  }
  const int64_t blocks = std::min(state_size, limits.multiprocessors);
  const int64_t bytes = w_bytes(state_size, blocks, element_size(dtype));
  if (bytes > limits.shared_per_block) {
    refuse("a block's rows of W_h need " + std::to_string(bytes) + " bytes of shared memory over " +
           std::to_string(blocks) + " blocks, over the device's " + std::to_string(limits.shared_per_block));
  }
  const int64_t capacity = grid_capacity(device, dtype, bytes);
  if (capacity < blocks) {
    refuse("its cooperative launch of " + std::to_string(blocks) + " blocks of " +
           std::to_string(rt::threads_per_block()) + " threads must be resident at once, and the device holds " +
           std::to_string(capacity) + " of them");
  }
  plan.persistent = plan.grid = true;
  plan.blocks = blocks;
  plan.why = "grid: one cooperative launch for the time loop over " + std::to_string(blocks) +
             " blocks, each with its rows of W_h in shared memory (" + std::to_string(bytes) +
             " bytes), h exchanged through global memory with one grid barrier a step (LLTM_CUDA_SEQUENCE=grid)";
  return plan;
}

}  // namespace

SequencePlan plan_sequence(int device, ScalarType dtype, int64_t batch, int64_t state_size) {
  const char* forced_text = std::getenv("LLTM_CUDA_SEQUENCE");
  const std::string forced = forced_text ? forced_text : "";
  STD_TORCH_CHECK(forced.empty() || forced == "auto" || forced == "persistent" || forced == "per-step" ||
                      forced == "grid",
                  "LLTM_CUDA_SEQUENCE=", forced, ": expected persistent, grid, per-step or auto");
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
  if (forced == "grid") {
    return plan_grid(device, dtype, batch, state_size, device_limits(device));
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
    // The grid-persistent path (LLTM_CUDA_SEQUENCE=grid) also runs such shapes in one launch; it
    // becomes the default only where a GPU measures it faster (benchmarks/persistent_vs_cudnn.py).
    return decline("W_h's rows and the state need " + std::to_string(bytes) + " bytes of shared memory a block over a cluster of " +
                   std::to_string(cluster) + ", over the device's " + std::to_string(limits.shared_per_block) +
                   (must ? std::string()
                         : "; the grid-persistent path (LLTM_CUDA_SEQUENCE=grid) runs it in one launch too, and "
                           "measurement decides whether it becomes the default (benchmarks/persistent_vs_cudnn.py)"));
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
  const rt::Stream stream = rt::current_stream(a.gates.get_device_index());
  dispatch_persistent(a.gates.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    const ForwardParams<scalar_t> p{a.weights.const_data_ptr<scalar_t>(), a.weights.stride(0),
                                    a.gates.mutable_data_ptr<scalar_t>(), a.h.mutable_data_ptr<scalar_t>(),
                                    a.cell.mutable_data_ptr<opmath_type<scalar_t>>(), a.output.mutable_data_ptr<scalar_t>(),
                                    a.tanh_cell.has_value() ? a.tanh_cell->mutable_data_ptr<scalar_t>() : nullptr,
                                    lengths_ptr(a.lengths), a.steps, a.k_begin, a.k_end, a.first_step, a.reverse,
                                    a.store_gates, B, S};
    if (plan.grid) {
      const Tensor exchange = ops::empty({2, B, S}, a.h.scalar_type(), a.h);  // h's two buffers
      const size_t bytes = size_t(w_bytes(S, plan.blocks, sizeof(scalar_t)));
      rt::launch(persistent_grid_forward_kernel<scalar_t>,
                 rt::ClusterLaunch{"persistent_grid_forward_kernel", plan.blocks, rt::threads_per_block(), 1, bytes, true},
                 stream, p, exchange.mutable_data_ptr<scalar_t>());
    } else {
      const size_t bytes = size_t(forward_shared_bytes(sizeof(scalar_t), B, S, plan.cluster));
      rt::launch(persistent_forward_kernel<scalar_t>,
                 rt::ClusterLaunch{"persistent_forward_kernel", plan.cluster, rt::threads_per_block(), plan.cluster, bytes},
                 stream, p);
    }
  });
}

void persistent_backward(const SequencePlan& plan, const PersistentBackward& a) {
  const int64_t T = a.gates.size(0), B = a.gates.size(1), S = a.grad_h.size(1);
  const rt::Stream stream = rt::current_stream(a.gates.get_device_index());
  dispatch_persistent(a.gates.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    using opmath_t = opmath_type<scalar_t>;
    const BackwardParams<scalar_t> p{a.weights.const_data_ptr<scalar_t>(), a.weights.stride(0),
                                     a.grad_output.const_data_ptr<scalar_t>(), a.gates.const_data_ptr<scalar_t>(),
                                     a.tanh_cell.const_data_ptr<scalar_t>(), a.grad_h.mutable_data_ptr<opmath_t>(),
                                     a.grad_cell.mutable_data_ptr<opmath_t>(), a.d_gates.mutable_data_ptr<scalar_t>(),
                                     lengths_ptr(a.lengths), T, a.reverse, B, S};
    if (plan.grid) {
      rt::launch(persistent_grid_backward_kernel<scalar_t>,
                 rt::ClusterLaunch{"persistent_grid_backward_kernel", plan.blocks, rt::threads_per_block(), 1, 0, true},
                 stream, p);
    } else {
      const size_t bytes = size_t(backward_shared_bytes(sizeof(scalar_t), B, S, plan.cluster));
      rt::launch(persistent_backward_kernel<scalar_t>,
                 rt::ClusterLaunch{"persistent_backward_kernel", plan.cluster, rt::threads_per_block(), plan.cluster, bytes},
                 stream, p);
    }
  });
}

}  // namespace lltm_cuda

// plan_sequence for Python (lltm_cuda.sequence_path, through ctypes): the path (0 per-step, 1 the
// cluster's, 2 the cooperative grid's) or -1 for an error; `blocks` gets the blocks of the cluster or
// of the grid (1 per step), `why` the reason or the error's message.  A C function, not an operator:
// it answers a question about the library, it computes nothing.
extern "C" __attribute__((visibility("default"))) int lltm_cuda_sequence_plan(int device, int dtype, int64_t batch,
                                                                              int64_t state_size, int64_t* blocks,
                                                                              char* why, size_t why_size) {
  std::string text;
  int path = -1;
  *blocks = 1;
  try {
    const lltm_cuda::SequencePlan plan =
        lltm_cuda::plan_sequence(device, static_cast<lltm_cuda::ScalarType>(dtype), batch, state_size);
    path = plan.grid ? 2 : plan.persistent ? 1 : 0;
    *blocks = plan.grid ? plan.blocks : plan.persistent ? plan.cluster : 1;
    text = plan.why;
  } catch (const std::exception& error) {
    text = error.what();
  }
  if (why_size > 0) {
    const size_t n = std::min(why_size - 1, text.size());
    std::memcpy(why, text.data(), n);
    why[n] = '\0';
  }
  return path;
}
