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
// In bfloat16 and float16 the grid path's products run on the tensor cores (rt::mma, 16x16x16
// warp tiles summed in float): forward, h_{t-1} from its buffer in global memory by the block's
// rows of W_h; backward, the step's d_gates, handed over through two buffers in global memory as
// h is, by its units' columns of W_h, kept in shared memory.  At T64 B256 S1024 the FFMA products
// alone would take about 24 us a step on an H200, the tensor cores' a few (the estimate:
// benchmarks/results/h200.md, 2026-12-07).
// Elsewhere a step's products are register-tiled (a thread: kRows rows of the batch by a unit's
// three gates forward, by kColumns columns of d_h backward) and read shared memory 16 bytes at a
// time, so that they are bound by FFMA rather than by shared-memory loads (the per-step estimate,
// to be checked on a GPU: benchmarks/results/h200.md, 2026-12-07).  Every product accumulates in
// float from the stored type: float32 stays IEEE (FFMA) whatever allow_tf32 says.  On a GPU
// without clusters (sm_80) a kernel compiled for it runs as a cluster of one (see
// rt::cluster_sync).
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

__host__ __device__ inline int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }
__host__ __device__ inline int64_t align16(int64_t bytes) { return round_up(bytes, 16); }

// The products read shared memory 16 bytes a thread at a time (kVectorBytes: 4 floats, 8 halves).
// A row of W_h or of h is padded with zeros to whole 16-byte chunks, and rows are an odd number of
// chunks apart, so that the threads of a quarter-warp, each reading its own row at the same
// column, hit different banks.
__host__ __device__ inline int64_t chunks_of(int64_t state_size, int64_t element) {
  return (state_size * element + kVectorBytes - 1) / kVectorBytes;
}

__host__ __device__ inline int64_t row_stride(int64_t state_size, int64_t element) {
  return (chunks_of(state_size, element) | 1) * (kVectorBytes / element);
}

__host__ __device__ inline int64_t w_bytes(int64_t state_size, int64_t blocks, int64_t element) {
  return align16(3 * max_units(state_size, blocks) * row_stride(state_size, element) * element);
}

// How a block's threads share a step's product.  A thread's tile is kRows rows of the batch by one
// column group (forward: a unit with its three gates; backward: kColumns columns of d_h), summed
// over a slice of the reduction.  Where the tiles are fewer than the threads, the reduction is cut
// into `splits` slices of at least kMinDepth steps; their partial sums meet in shared memory and
// slice 0's thread adds them in slice order, so the result does not depend on timing.  A thread
// then has one (tile, slice) at most.  The host sizes shared memory with the same function.
constexpr int kRows = 4;
constexpr int kColumns = 4;
constexpr int64_t kMinDepth = 4;

struct Tiling {
  int64_t tiles, splits, depth;  // tiles; slices a tile; the reduction's length
  __host__ __device__ int64_t begin(int64_t slice) const { return depth * slice / splits; }
  // Floats of shared memory for the partial sums of slices 1.., `values` a tile.
  __host__ __device__ int64_t partial_floats(int64_t values) const { return (splits - 1) * tiles * values; }
  // Slice `slice` (> 0) of `tile` leaves its `values` sums, sums[slice - 1][i][tile]; slice 0's
  // thread adds them to its own after the block barrier, in slice order.
  __device__ void leave(float* sums, int64_t tile, int64_t slice, const float* acc, int values) const {
    for (int i = 0; i < values; ++i) {
      sums[((slice - 1) * values + i) * tiles + tile] = acc[i];
    }
  }
  __device__ void add(const float* sums, int64_t tile, float* acc, int values) const {
    for (int64_t slice = 1; slice < splits; ++slice) {
      for (int i = 0; i < values; ++i) {
        acc[i] += sums[((slice - 1) * values + i) * tiles + tile];
      }
    }
  }
};

__host__ __device__ inline Tiling tiling(int64_t batch, int64_t column_groups, int64_t depth, int64_t threads) {
  const int64_t tiles = (batch + kRows - 1) / kRows * column_groups;
  int64_t splits = tiles >= threads ? 1 : threads / tiles;
  const int64_t deepest = depth / kMinDepth > 1 ? depth / kMinDepth : 1;
  return {tiles, splits < deepest ? splits : deepest, depth};
}

// The forward's: a unit's three gates by kRows rows, over the 16-byte chunks of h_{t-1}.
__host__ __device__ inline Tiling forward_tiling(int64_t batch, int64_t state_size, int64_t blocks, int64_t element,
                                                 int64_t threads) {
  return tiling(batch, max_units(state_size, blocks), chunks_of(state_size, element), threads);
}

// The backward's: kRows rows by kColumns columns of the partial d_h, over the block's 3 n_max rows of W_h.
__host__ __device__ inline Tiling backward_tiling(int64_t batch, int64_t state_size, int64_t blocks, int64_t threads) {
  return tiling(batch, (state_size + kColumns - 1) / kColumns, 3 * max_units(state_size, blocks), threads);
}

// The backward's d_gates of the step in shared memory, (3 n_max, ldb) floats: column b a row of the
// batch, so that a thread reads its kRows rows' values of one row of W_h in one access.
__host__ __device__ inline int64_t d_gates_stride(int64_t batch) { return round_up(batch, kRows); }

// The grid path's products in the 16-bit types run on the tensor cores (rt::mma), over operands
// padded with zeros to whole tiles: the batch rounded up to a tile, and rows (of h, of W_h, of the
// backward's d_gates) mma_stride elements apart: whole tiles and half a tile more, an odd number
// of 16-byte chunks, as row_stride's are.  float32 keeps FFMA there: it stays IEEE.
using rt::kMmaTile;
template <typename scalar_t>
constexpr bool kTensorCores = sizeof(scalar_t) == 2;
constexpr int kMmaGroup = 4;  // a warp's column tiles at once, each with its sums in registers
constexpr int kMmaAhead = 8;  // the tiles of the left operand a warp loads before it multiplies

__host__ __device__ inline int64_t mma_stride(int64_t length) { return round_up(length, kMmaTile) + kMmaTile / 2; }

// On the tensor cores the grid splits the batch as well as the units: block i takes unit group
// i % unit_groups and batch group i / unit_groups.  Each block reads its rows of the step's left
// operand (h forward, d_gates backward) from L2, so the traffic a step is unit_groups times that
// operand: the fewer unit groups (the more units a block keeps on chip) the better.  A batch
// group is group_rows rows, whole tiles; the buffers in global memory have batch_groups of them.
__host__ __device__ inline int64_t group_rows(int64_t batch, int64_t batch_groups) {
  return round_up((batch + batch_groups - 1) / batch_groups, kMmaTile);
}

// A block's share: its units, and its rows [row0, row0 + rows) of the padded batch, `own` of
// which are the batch's.
struct GridShare {
  Units units;
  int64_t row0, rows, own;
};

__device__ __forceinline__ GridShare grid_share(int64_t batch, int64_t state_size, int64_t unit_groups) {
  const int64_t rows = group_rows(batch, gridDim.x / unit_groups), row0 = blockIdx.x / unit_groups * rows;
  const int64_t own = batch - row0 < 0 ? 0 : batch - row0 < rows ? batch - row0 : rows;
  return {units_of(state_size, unsigned(blockIdx.x % unit_groups), unsigned(unit_groups)), row0, rows, own};
}

// Forward: a block's rows of W_h (three gates of n_max units, rounded up to a tile), then the
// step's sums (its rows by those) in float.  Backward: its units' columns of W_h (rounded up to a
// tile, each of 3S), then the step's sums of d_h (its rows by those columns).
__host__ __device__ inline int64_t forward_mma_rows(int64_t state_size, int64_t unit_groups) {
  return round_up(3 * max_units(state_size, unit_groups), kMmaTile);
}
__host__ __device__ inline int64_t backward_mma_columns(int64_t state_size, int64_t unit_groups) {
  return round_up(max_units(state_size, unit_groups), kMmaTile);
}

// How a block's warps share a product of (rows, columns) sums over `depth` (all whole tiles): an
// item is a row tile by up to kMmaGroup column tiles, over the whole depth; where the items are
// fewer than the warps, the depth is cut into `slices` (a tile deep at least), whose sums meet in
// shared memory and are added in slice order, so the result does not depend on timing.  The host
// sizes shared memory with the same function.
struct MmaWork {
  int64_t items, slices;
};
__host__ __device__ inline MmaWork mma_work(int64_t rows, int64_t columns, int64_t depth, int64_t threads) {
  const int64_t column_tiles = columns / kMmaTile, groups = (column_tiles + kMmaGroup - 1) / kMmaGroup;
  const int64_t items = rows / kMmaTile * groups, warps = (threads + rt::kWarpSize - 1) / rt::kWarpSize;
  const int64_t slices = items >= warps ? 1 : warps / items;
  return {items, slices < depth / kMmaTile ? slices : depth / kMmaTile};
}

// The step's sums in float: (rows, columns) for each slice (mma_work).
inline int64_t mma_sums_bytes(int64_t rows, int64_t columns, int64_t depth) {
  return mma_work(rows, columns, depth, rt::threads_per_block()).slices * rows * columns * 4;
}
inline int64_t forward_mma_shared_bytes(int64_t rows, int64_t state_size, int64_t unit_groups) {
  const int64_t w_rows = forward_mma_rows(state_size, unit_groups);
  return w_rows * mma_stride(state_size) * 2 + mma_sums_bytes(rows, w_rows, round_up(state_size, kMmaTile));
}
inline int64_t backward_mma_shared_bytes(int64_t rows, int64_t state_size, int64_t unit_groups) {
  const int64_t columns = backward_mma_columns(state_size, unit_groups);
  return columns * mma_stride(3 * state_size) * 2 + mma_sums_bytes(rows, columns, round_up(3 * state_size, kMmaTile));
}

// Shared memory a block needs.  Forward: W_h's rows, the two h buffers (B, ldh) (the cluster's
// only: the grid's are in global memory), the split partial sums.  Backward: W_h's rows, d_gates
// (3 n_max, ldb), two partial d_h buffers (B, S) in float, the split partial sums.
inline int64_t forward_shared_bytes(int64_t element, int64_t batch, int64_t state_size, int64_t blocks, bool cluster) {
  const Tiling t = forward_tiling(batch, state_size, blocks, element, rt::threads_per_block());
  return w_bytes(state_size, blocks, element) + (cluster ? 2 * batch * row_stride(state_size, element) * element : 0) +
         t.partial_floats(3 * kRows) * 4;
}

inline int64_t backward_shared_bytes(int64_t element, int64_t batch, int64_t state_size, int64_t blocks) {
  const Tiling t = backward_tiling(batch, state_size, blocks, rt::threads_per_block());
  return w_bytes(state_size, blocks, element) + align16(3 * max_units(state_size, blocks) * d_gates_stride(batch) * 4) +
         align16(2 * batch * state_size * 4) + t.partial_floats(kRows * kColumns) * 4;
}

// A block's rows of W_h in shared memory, w[3][n_max][ld] (ld = row_stride): gate g's row of its
// unit u at row(g, u), the k-th of the 3 n_max at w + k ld.
template <typename scalar_t>
struct BlockRows {
  const scalar_t* w;
  int64_t n_max, ld;
  __device__ __forceinline__ const scalar_t* row(int gate, int64_t u) const { return w + (gate * n_max + u) * ld; }
};

// Copies the rows of W_h of `units` (the first S columns of weights, row stride ld) into the start
// of the dynamic shared memory, laid out for `blocks` blocks, `padded_rows` rows `ld_s` apart; the
// padding columns and rows, and the rows of units this block lacks (it has n_max - 1 where S does
// not split evenly), are zeros, which the products may then run over.  Returns where they are.
// The FFMA products take them row_stride apart, 3 n_max rows; the tensor cores, mma_stride apart,
// forward_mma_rows.
template <typename scalar_t>
__device__ __forceinline__ BlockRows<scalar_t> load_w_h(const scalar_t* weights, int64_t ld, int64_t state_size,
                                                        Units units, unsigned blocks, int64_t ld_s, int64_t padded_rows) {
  scalar_t* const w_s = rt::dynamic_shared<scalar_t>();
  const BlockRows<scalar_t> rows{w_s, max_units(state_size, blocks), ld_s};
  for (int64_t i = threadIdx.x; i < padded_rows * ld_s; i += blockDim.x) {
    const int64_t row = i / ld_s, k = i % ld_s, gate = row / rows.n_max, unit = row % rows.n_max;
    w_s[i] = gate < 3 && unit < units.count && k < state_size
                 ? weights[(gate * state_size + units.first + unit) * ld + k]
                 : scalar_t(0);
  }
  return rows;
}

template <typename scalar_t>
__device__ __forceinline__ BlockRows<scalar_t> load_w_h(const scalar_t* weights, int64_t ld, int64_t state_size,
                                                        Units units, unsigned blocks) {
  return load_w_h(weights, ld, state_size, units, blocks, row_stride(state_size, sizeof(scalar_t)),
                  3 * max_units(state_size, blocks));
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
  // The state before the sequence's first step, read by the launch that runs it (null in later
  // launches, which start from h and cell): no copy kernels before the loop.
  const scalar_t* h0;
  const scalar_t* c0;
  scalar_t* c_n;  // the cell after the launch's last step, in scalar_t (`cell` itself for float)
};

// Where a step of the loop stands: its time step t; whether it is the first of the sequence (its
// state then comes from h0 and c0), the last of the launch (h and c_n are written out then).
struct StepAt {
  int64_t t;
  bool first, last;
};

// The cell of element `at` (b S + j) before step `step`.
template <typename scalar_t>
__device__ __forceinline__ opmath_type<scalar_t> cell_before(const ForwardParams<scalar_t>& p, int64_t at,
                                                             const StepAt& step) {
  return step.first ? opmath_type<scalar_t>(p.c0[at]) : p.cell[at];
}

// acc[g][r] += the product of h_{t-1}'s row b0 + r (rows `ldh` apart; a row past the batch reads
// its last, and its sums go unused) with the row of gate g of unit u of W_h, over chunks
// [c_begin, c_end).
template <typename scalar_t>
__device__ __forceinline__ void gate_sums(opmath_type<scalar_t> (&acc)[3][kRows], const BlockRows<scalar_t>& w,
                                          int64_t u, const scalar_t* h, int64_t ldh, int64_t b0, int64_t batch,
                                          int64_t c_begin, int64_t c_end) {
  using opmath_t = opmath_type<scalar_t>;
  constexpr int V = kVectorBytes / int(sizeof(scalar_t));
  const scalar_t* rows[kRows];
  for (int r = 0; r < kRows; ++r) {
    rows[r] = h + (b0 + r < batch ? b0 + r : batch - 1) * ldh;
  }
  const scalar_t *const w_i = w.row(0, u), *const w_o = w.row(1, u), *const w_z = w.row(2, u);
  for (int64_t c = c_begin * V; c < c_end * V; c += V) {
    const Vec<scalar_t, V> wi = load<V>(w_i + c), wo = load<V>(w_o + c), wz = load<V>(w_z + c);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const Vec<scalar_t, V> x = load<V>(rows[r] + c);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const opmath_t hv = opmath_t(x.v[v]);
        acc[0][r] += hv * opmath_t(wi.v[v]);
        acc[1][r] += hv * opmath_t(wo.v[v]);
        acc[2][r] += hv * opmath_t(wz.v[v]);
      }
    }
  }
}

// A tile's input projection (bias folded in) and its rows' cells, loaded before its sums so that
// the loads' latency hides behind them.
template <typename opmath_t>
struct TileInputs {
  opmath_t pre[3][kRows], cell[kRows];
};

template <typename scalar_t>
__device__ __forceinline__ TileInputs<opmath_type<scalar_t>> tile_inputs(const ForwardParams<scalar_t>& p, int64_t b0,
                                                                          int64_t j, const StepAt& step) {
  using opmath_t = opmath_type<scalar_t>;
  const int64_t S = p.state_size;
  TileInputs<opmath_t> in{};
  for (int r = 0; r < kRows && b0 + r < p.batch; ++r) {
    const scalar_t* const g = p.gates + ((step.t - p.first_step) * p.batch + b0 + r) * 3 * S;
    in.pre[0][r] = opmath_t(g[j]);
    in.pre[1][r] = opmath_t(g[S + j]);
    in.pre[2][r] = opmath_t(g[2 * S + j]);
    in.cell[r] = cell_before(p, (b0 + r) * S + j, step);
  }
  return in;
}

// The blocks that share a time loop, and how they hand each other h.  A team gives rank() and
// blocks(), sync() (the barrier a step ends with) and, over its two h buffers of (B, ldh), rows
// padded with zeros: start(h) (h_{k_begin-1} into buffer 0, before the first sync), buffer(i) (to
// read) and publish(i, at, value) (element `at` of buffer i, for every block).
//
// The cluster path: the blocks of one cluster, each holding the whole h in its shared memory after
// W_h's rows; a block writes its units' h into every peer's buffer (distributed shared memory).
template <typename scalar_t>
struct ClusterTeam {
  scalar_t* h_s;  // two (B, ldh) buffers in this block's shared memory
  int64_t count;  // B * ldh
  int64_t ldh, state_size;
  __device__ __forceinline__ unsigned rank() const { return rt::cluster_rank(); }
  __device__ __forceinline__ unsigned blocks() const { return rt::cluster_blocks(); }
  __device__ __forceinline__ void sync() const { rt::cluster_sync(); }
  __device__ __forceinline__ void start(const scalar_t* h, Units) const {
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
      const int64_t b = i / ldh, c = i % ldh;
      h_s[i] = c < state_size ? h[b * state_size + c] : scalar_t(0);
      if (c >= state_size) {
        h_s[count + i] = scalar_t(0);
      }
    }
  }
  __device__ __forceinline__ const scalar_t* buffer(int i) const { return h_s + i * count; }
  __device__ __forceinline__ void publish(int i, int64_t at, scalar_t value) const {
    for (unsigned peer = 0; peer < blocks(); ++peer) {
      rt::map_shared_rank(h_s + i * count, peer)[at] = value;
    }
  }
};

// The padding of the grid path's two exchange buffers in global memory, (rows, ld) each, of which
// the first `batch` rows hold `length` values: the columns past `length`, and the rows past the
// batch that the tensor cores' tiles add.  Block 0 writes the zeros.
template <typename scalar_t>
__device__ __forceinline__ void zero_padding(scalar_t* buffers, int64_t batch, int64_t rows, int64_t ld, int64_t length) {
  const int64_t count = rows * ld, padding = ld - length, tail = count - batch * ld;
  for (int64_t e = threadIdx.x; blockIdx.x == 0 && e < 2 * batch * padding; e += blockDim.x) {
    buffers[e / (batch * padding) * count + e % (batch * padding) / padding * ld + length + e % padding] = scalar_t(0);
  }
  for (int64_t e = threadIdx.x; blockIdx.x == 0 && e < 2 * tail; e += blockDim.x) {
    buffers[e / tail * count + batch * ld + e % tail] = scalar_t(0);
  }
}

// The grid path: every block of a cooperative launch, h in two (rows, ldh) buffers in global
// memory (L2), each block writing its own units of its rows [row0, row0 + own) (all the batch's,
// on FFMA), block 0 the padding (the columns past S, and the rows past the batch that the tensor
// cores' tiles add); the grid barrier ends a step.
template <typename scalar_t>
struct GridTeam {
  scalar_t* exchange;  // two (rows, ldh) buffers in global memory
  int64_t count;       // rows * ldh
  int64_t ldh, state_size, batch;
  int64_t row0, own;
  __device__ __forceinline__ unsigned rank() const { return blockIdx.x; }
  __device__ __forceinline__ unsigned blocks() const { return gridDim.x; }
  __device__ __forceinline__ void sync() const { rt::grid_sync(); }
  __device__ __forceinline__ void start(const scalar_t* h, Units units) const {
    for (int64_t e = threadIdx.x; e < own * units.count; e += blockDim.x) {
      const int64_t b = row0 + e / units.count, c = units.first + e % units.count;
      exchange[b * ldh + c] = h[b * state_size + c];
    }
    zero_padding(exchange, batch, count / ldh, ldh, state_size);
  }
  __device__ __forceinline__ const scalar_t* buffer(int i) const { return exchange + i * count; }
  __device__ __forceinline__ void publish(int i, int64_t at, scalar_t value) const { exchange[i * count + at] = value; }
};

// Unit j of row b at step `step` from its gates (pre: input projection + product) and its cell
// before the step, the step's outputs, h itself after the launch's last step, and h_t handed to
// the team's buffer `next` (a row past its length keeps its state: h_{t-1}, read from `h`, and the
// cell, written out at the sequence's first step, which read it from c0).
template <typename scalar_t, typename Team>
__device__ __forceinline__ void finish_unit(const ForwardParams<scalar_t>& p, const Team& team, int next,
                                            const scalar_t* h, int64_t b, int64_t j, const StepAt& step,
                                            opmath_type<scalar_t> pre_i, opmath_type<scalar_t> pre_o,
                                            opmath_type<scalar_t> pre_z, opmath_type<scalar_t> cell) {
  using opmath_t = opmath_type<scalar_t>;
  const int64_t S = p.state_size, BS = p.batch * S, at = b * S + j, t = step.t;
  if (p.store_gates) {  // the saved pre-activation gates, as the per-step path's GEMM leaves them
    scalar_t* const g = p.gates + ((t - p.first_step) * p.batch + b) * 3 * S;
    g[j] = scalar_t(pre_i);
    g[S + j] = scalar_t(pre_o);
    g[2 * S + j] = scalar_t(pre_z);
  }
  scalar_t new_h = h[b * team.ldh + j], out = scalar_t(0), tanh_c = scalar_t(0);
  opmath_t new_cell = cell;
  if (takes_part(p.lengths, b, t)) {
    const auto result = cell_forward<opmath_t>(pre_i, pre_o, pre_z, cell);
    new_cell = p.cell[at] = result.cell;
    new_h = out = scalar_t(result.h);
    tanh_c = scalar_t(result.tanh_cell);
  } else if (step.first) {
    p.cell[at] = cell;
  }
  p.output[t * BS + at] = out;
  if (p.tanh_cell != nullptr) {
    p.tanh_cell[t * BS + at] = tanh_c;
  }
  if (step.last) {
    p.h[at] = new_h;
    p.c_n[at] = scalar_t(new_cell);
  }
  team.publish(next, b * team.ldh + j, new_h);
}

// finish_unit for each row of a tile.
template <typename scalar_t, typename Team>
__device__ __forceinline__ void finish_tile(const ForwardParams<scalar_t>& p, const Team& team, int next,
                                            const scalar_t* h, int64_t b0, int64_t j, const StepAt& step,
                                            const TileInputs<opmath_type<scalar_t>>& in,
                                            const opmath_type<scalar_t> (&acc)[3][kRows]) {
  for (int r = 0; r < kRows && b0 + r < p.batch; ++r) {
    finish_unit(p, team, next, h, b0 + r, j, step, in.pre[0][r] + acc[0][r], in.pre[1][r] + acc[1][r],
                in.pre[2][r] + acc[2][r], in.cell[r]);
  }
}

// The forward's time loop, steps k_begin..k_end-1, on either team: block `rank` computes its units
// of every row each step from h_{t-1} (run(step, h, next): the product and the cells) and hands
// its slice of h_t to the others; one team barrier a step.  h is double-buffered: a block writes
// the buffer the others read only the step after, and the barrier orders the two.
template <typename scalar_t, typename Team, typename Run>
__device__ __forceinline__ void forward_loop(const ForwardParams<scalar_t>& p, const Team& team, Units units,
                                             Run&& run) {
  team.start(p.h0 != nullptr ? p.h0 : p.h, units);
  // Every block's W_h and h in place, and every block started, before any block writes another's buffer.
  team.sync();
  for (int64_t k = p.k_begin; k < p.k_end; ++k) {
    const StepAt step{p.reverse ? p.steps - 1 - k : k, k == p.k_begin && p.c0 != nullptr, k == p.k_end - 1};
    const int current = int((k - p.k_begin) & 1);
    const int next = 1 - current;  // double-buffered: others may still read `current` this step
    run(step, team.buffer(current), next);
    // h_t complete in every block before any reads it; and no block leaves while others write to it.
    team.sync();
  }
}

// A forward step's product on FFMA, register-tiled (forward_tiling); `partials` holds the split sums.
template <typename scalar_t, typename Team>
__device__ __forceinline__ void ffma_forward_step(const ForwardParams<scalar_t>& p, const Team& team,
                                                  const BlockRows<scalar_t>& w, Units units, const Tiling& tiles,
                                                  float* partials, const StepAt& step, const scalar_t* h, int next) {
  using opmath_t = opmath_type<scalar_t>;
  if (tiles.splits == 1) {
    for (int64_t tile = threadIdx.x; tile < tiles.tiles; tile += blockDim.x) {
      const int64_t u = tile % w.n_max, b0 = tile / w.n_max * kRows;
      if (u < units.count) {
        const TileInputs<opmath_t> in = tile_inputs(p, b0, units.first + u, step);
        opmath_t acc[3][kRows] = {};
        gate_sums(acc, w, u, h, team.ldh, b0, p.batch, 0, tiles.depth);
        finish_tile(p, team, next, h, b0, units.first + u, step, in, acc);
      }
    }
  } else {  // one (tile, slice) a thread at most
    const int64_t tile = threadIdx.x % tiles.tiles, slice = threadIdx.x / tiles.tiles;
    const int64_t u = tile % w.n_max, b0 = tile / w.n_max * kRows;
    const bool mine = slice < tiles.splits && u < units.count;
    opmath_t acc[3][kRows] = {};
    TileInputs<opmath_t> in{};
    if (mine) {
      if (slice == 0) {
        in = tile_inputs(p, b0, units.first + u, step);
      }
      gate_sums(acc, w, u, h, team.ldh, b0, p.batch, tiles.begin(slice), tiles.begin(slice + 1));
      if (slice > 0) {
        tiles.leave(partials, tile, slice, &acc[0][0], 3 * kRows);
      }
    }
    rt::sync_threads();  // every slice's sums in shared memory before slice 0 adds them
    if (mine && slice == 0) {
      tiles.add(partials, tile, &acc[0][0], 3 * kRows);
      finish_tile(p, team, next, h, b0, units.first + u, step, in, acc);
    }
  }
}

// The FFMA forward on either team: W_h's rows (load_w_h), then the loop.
template <typename scalar_t, typename Team>
__device__ __forceinline__ void ffma_forward(const ForwardParams<scalar_t>& p, const Team& team, float* partials) {
  const Units units = units_of(p.state_size, team.rank(), team.blocks());
  const BlockRows<scalar_t> w = load_w_h(p.weights, p.ld, p.state_size, units, team.blocks());
  const Tiling tiles = forward_tiling(p.batch, p.state_size, team.blocks(), sizeof(scalar_t), blockDim.x);
  forward_loop(p, team, units, [&](const StepAt& step, const scalar_t* h, int next) {
    ffma_forward_step(p, team, w, units, tiles, partials, step, h, next);
  });
}

template <typename scalar_t>
__global__ void persistent_forward_kernel(ForwardParams<scalar_t> p) {
  const int64_t S = p.state_size, ldh = row_stride(S, sizeof(scalar_t));
  // After W_h's rows: the two h buffers, then the split sums.
  unsigned char* const bytes = rt::dynamic_shared<unsigned char>() + w_bytes(S, rt::cluster_blocks(), sizeof(scalar_t));
  scalar_t* const h_s = reinterpret_cast<scalar_t*>(bytes);
  float* const partials = reinterpret_cast<float*>(bytes + 2 * p.batch * ldh * int64_t(sizeof(scalar_t)));
  ffma_forward(p, ClusterTeam<scalar_t>{h_s, p.batch * ldh, ldh, S}, partials);
}

template <typename scalar_t>
__global__ void persistent_grid_forward_kernel(ForwardParams<scalar_t> p, scalar_t* exchange) {
  const int64_t S = p.state_size, ldh = row_stride(S, sizeof(scalar_t));
  float* const partials = reinterpret_cast<float*>(rt::dynamic_shared<unsigned char>() +
                                                                   w_bytes(S, gridDim.x, sizeof(scalar_t)));
  ffma_forward(p, GridTeam<scalar_t>{exchange, p.batch * ldh, ldh, S, p.batch, 0, p.batch}, partials);
}

// The index of this thread's warp, and how many the block has (the emulated build's blocks may
// be smaller than a warp: then one, partial).
__device__ __forceinline__ int64_t warp_index() { return threadIdx.x / rt::kWarpSize; }
__device__ __forceinline__ int64_t warp_count() { return (blockDim.x + rt::kWarpSize - 1) / rt::kWarpSize; }

// sums (rows_a, columns) = a (rows_a, depth) b^T, b (columns, depth): a row-major, rows lda apart,
// b's rows ldb apart, all three counts whole tiles, on the tensor cores, the warps taking the
// (item, slice) pairs of mma_work; the sums land row-major in `sums` (rows `columns` floats apart),
// slice s > 0's at sums + s rows_a columns until they are added to slice 0's, after a block
// barrier, in slice order.  The caller orders the sums' readers after it (a block barrier).
template <typename scalar_t>
__device__ __forceinline__ void mma_product(float* sums, const scalar_t* a, int64_t lda, int64_t rows_a,
                                            const scalar_t* b, int64_t ldb, int64_t columns, int64_t depth) {
  const int64_t column_tiles = columns / kMmaTile, groups = (column_tiles + kMmaGroup - 1) / kMmaGroup;
  const MmaWork work = mma_work(rows_a, columns, depth, blockDim.x);
  const int64_t deep = depth / kMmaTile, count = rows_a * columns;
  for (int64_t pair = warp_index(); pair < work.items * work.slices; pair += warp_count()) {
    const int64_t item = pair % work.items, slice = pair / work.items;
    const int64_t row0 = item / groups * kMmaTile, first = item % groups * kMmaGroup;
    const int64_t tiles = column_tiles - first < kMmaGroup ? column_tiles - first : kMmaGroup;
    const int64_t k_end = deep * (slice + 1) / work.slices * kMmaTile;
    rt::MmaSums acc[kMmaGroup];
#pragma unroll
    for (int g = 0; g < kMmaGroup; ++g) {
      rt::mma_zero(acc[g]);
    }
    for (int64_t k0 = deep * slice / work.slices * kMmaTile; k0 < k_end; k0 += kMmaAhead * kMmaTile) {
      // a's tiles come from global memory (L2) on the grid path: all kMmaAhead are asked for
      // before the first is used, so that their latencies overlap.
      rt::MmaA<scalar_t> x[kMmaAhead];
#pragma unroll
      for (int s = 0; s < kMmaAhead; ++s) {
        if (k0 + s * kMmaTile < k_end) {
          rt::mma_load(x[s], a + row0 * lda + k0 + s * kMmaTile, unsigned(lda));
        }
      }
#pragma unroll
      for (int s = 0; s < kMmaAhead; ++s) {
#pragma unroll
        for (int g = 0; g < kMmaGroup; ++g) {
          if (k0 + s * kMmaTile < k_end && g < tiles) {
            rt::MmaB<scalar_t> y;
            rt::mma_load(y, b + (first + g) * kMmaTile * ldb + k0 + s * kMmaTile, unsigned(ldb));
            rt::mma(acc[g], x[s], y);
          }
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kMmaGroup; ++g) {
      if (g < tiles) {
        rt::mma_store(sums + slice * count + row0 * columns + (first + g) * kMmaTile, acc[g], unsigned(columns));
      }
    }
  }
  if (work.slices > 1) {
    rt::sync_threads();  // every slice's sums in shared memory before they are added
    for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
      float total = sums[e];
      for (int64_t s = 1; s < work.slices; ++s) {
        total += sums[s * count + e];
      }
      sums[e] = total;
    }
  }
}

// The grid's forward in a 16-bit type (a block's share: grid_share): each step's product on the
// tensor cores, gates (its rows, 3 n_max rounded up) = h_{t-1} (its rows, S) W_h's rows^T, into
// shared memory; then each of its (row, unit) finishes its cell from there.  The next step's
// product overwrites the sums only after the grid barrier, which every reader here has passed.
template <typename scalar_t>
__global__ void persistent_grid_forward_mma_kernel(ForwardParams<scalar_t> p, scalar_t* exchange, int64_t unit_groups) {
  using opmath_t = opmath_type<scalar_t>;
  const int64_t S = p.state_size, ldh = mma_stride(S), w_rows = forward_mma_rows(S, unit_groups);
  const GridShare share = grid_share(p.batch, S, unit_groups);
  const Units units = share.units;
  const BlockRows<scalar_t> w = load_w_h(p.weights, p.ld, S, units, unsigned(unit_groups), ldh, w_rows);
  float* const sums = reinterpret_cast<float*>(rt::dynamic_shared<unsigned char>() + w_rows * ldh * int64_t(sizeof(scalar_t)));
  const int64_t buffer_rows = gridDim.x / unit_groups * share.rows;
  const GridTeam<scalar_t> team{exchange, buffer_rows * ldh, ldh, S, p.batch, share.row0, share.own};
  forward_loop(p, team, units, [&](const StepAt& step, const scalar_t* h, int next) {
    mma_product(sums, h + share.row0 * ldh, ldh, share.rows, w.w, w.ld, w_rows, round_up(S, kMmaTile));
    rt::sync_threads();  // the step's sums complete before the cells read them
    for (int64_t e = threadIdx.x; e < share.own * units.count; e += blockDim.x) {
      const int64_t r = e / units.count, b = share.row0 + r, u = e % units.count, j = units.first + u;
      const scalar_t* const g = p.gates + ((step.t - p.first_step) * p.batch + b) * 3 * S;
      const float* const sum = sums + r * w_rows + u;
      finish_unit(p, team, next, h, b, j, step, opmath_t(g[j]) + sum[0], opmath_t(g[S + j]) + sum[w.n_max],
                  opmath_t(g[2 * S + j]) + sum[2 * w.n_max], cell_before(p, b * S + j, step));
    }
  });
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
  // The gradients of h_n and c_n, read at the loop's first iteration: no copy kernels before it.
  const scalar_t* grad_h_n;
  const scalar_t* grad_c_n;
  // The gradients of h0 and c0 in scalar_t, written at the last iteration (grad_h and grad_cell
  // themselves for float): no conversion kernels after the loop.
  scalar_t* grad_h0;
  scalar_t* grad_c0;
};

// The gradient of h_t (of c_t) that element `at` (b S + j) has from the steps after t, at the
// loop's k-th iteration: grad_h_n's (grad_c_n's) at the first.
template <typename scalar_t>
__device__ __forceinline__ opmath_type<scalar_t> grad_h_after(const BackwardParams<scalar_t>& p, int64_t at, int64_t k) {
  return k == 0 ? opmath_type<scalar_t>(p.grad_h_n[at]) : p.grad_h[at];
}
template <typename scalar_t>
__device__ __forceinline__ opmath_type<scalar_t> grad_cell_after(const BackwardParams<scalar_t>& p, int64_t at,
                                                                 int64_t k) {
  return k == 0 ? opmath_type<scalar_t>(p.grad_c_n[at]) : p.grad_cell[at];
}

// Element `at`'s gradient of h_{t-1} after the loop's k-th iteration: the running one, and at the
// last iteration the gradient of h0.
template <typename scalar_t>
__device__ __forceinline__ void store_grad_h(const BackwardParams<scalar_t>& p, int64_t at, int64_t k,
                                             opmath_type<scalar_t> value) {
  p.grad_h[at] = value;
  if (k == p.steps - 1) {
    p.grad_h0[at] = scalar_t(value);
  }
}

// Unit j of row b at the loop's k-th iteration (step t), backward: the unit's d_gates (written
// out, and returned rounded to scalar_t, as the per-step path's GEMM reads them) and the cell's
// gradient (a row past its length keeps it: written out at the first iteration, which read it
// from grad_c_n).
template <typename scalar_t>
struct UnitGrads {
  scalar_t d[3];
};

// What the forward saved of unit j of row b at step t, and its output's gradient: backward_unit's
// inputs from global memory, which a kernel may ask for a step ahead.
template <typename scalar_t>
struct UnitInputs {
  scalar_t gates[3], tanh_cell, grad_output;
};

template <typename scalar_t>
__device__ __forceinline__ UnitInputs<scalar_t> unit_inputs(const BackwardParams<scalar_t>& p, int64_t b, int64_t j,
                                                            int64_t t) {
  const int64_t S = p.state_size, at = t * p.batch * S + b * S + j;
  const scalar_t* const g = p.gates + (t * p.batch + b) * 3 * S;
  return {{g[j], g[S + j], g[2 * S + j]}, p.tanh_cell[at], p.grad_output[at]};
}

template <typename scalar_t>
__device__ __forceinline__ UnitGrads<scalar_t> backward_unit(const BackwardParams<scalar_t>& p, int64_t b, int64_t j,
                                                            int64_t t, int64_t k, const UnitInputs<scalar_t>& in) {
  using opmath_t = opmath_type<scalar_t>;
  const int64_t S = p.state_size, at = b * S + j;
  UnitGrads<scalar_t> out{{scalar_t(0), scalar_t(0), scalar_t(0)}};
  opmath_t grad_cell = grad_cell_after(p, at, k);
  if (takes_part(p.lengths, b, t)) {
    const opmath_t grad_h_t = grad_h_after(p, at, k) + opmath_t(in.grad_output);
    const auto grad = cell_backward<opmath_t>(opmath_t(in.gates[0]), opmath_t(in.gates[1]), opmath_t(in.gates[2]),
                                              opmath_t(in.tanh_cell), grad_h_t, grad_cell);
    grad_cell = p.grad_cell[at] = grad.d_old_cell;
    out.d[0] = scalar_t(grad.d_i);
    out.d[1] = scalar_t(grad.d_o);
    out.d[2] = scalar_t(grad.d_z);
  } else if (k == 0) {
    p.grad_cell[at] = grad_cell;
  }
  if (k == p.steps - 1) {
    p.grad_c0[at] = scalar_t(grad_cell);
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

// acc[r][v] += the product of the step's d_gates of row b0 + r (dg: (3 n_max, ldb), see
// d_gates_stride) with W_h's rows [k_begin, k_end) of this block, at column c0 + v.
template <typename scalar_t>
__device__ __forceinline__ void input_grad_sums(float (&acc)[kRows][kColumns], const BlockRows<scalar_t>& w,
                                                const float* dg, int64_t ldb, int64_t b0, int64_t c0, int64_t k_begin,
                                                int64_t k_end) {
  for (int64_t k = k_begin; k < k_end; ++k) {
    const Vec<float, kRows> d = load<kRows>(dg + k * ldb + b0);
    const Vec<scalar_t, kColumns> row = load<kColumns>(w.w + k * w.ld + c0);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int v = 0; v < kColumns; ++v) {
        acc[r][v] += d.v[r] * float(row.v[v]);
      }
    }
  }
}

// The cluster's backward: each block computes its units' d_gates, then its partial d_h = d_gates
// W_h over its own rows (all S columns); after the cluster barrier each block sums the partials
// for its units over the ranks in order 0..C-1, so the result does not depend on timing; the
// partials are double-buffered as h is.
template <typename scalar_t>
__global__ void persistent_backward_kernel(BackwardParams<scalar_t> p) {
  using opmath_t = opmath_type<scalar_t>;
  constexpr unsigned kMostBlocks = 16;  // a cluster's, non-portable
  const unsigned blocks = rt::cluster_blocks();
  const int64_t S = p.state_size, BS = p.batch * S, ldb = d_gates_stride(p.batch);
  const Units units = units_of(S, rt::cluster_rank(), blocks);
  const BlockRows<scalar_t> w = load_w_h(p.weights, p.ld, S, units, blocks);
  auto* const bytes = rt::dynamic_shared<unsigned char>() + w_bytes(S, blocks, sizeof(scalar_t));  // after W_h's rows
  float* const dg_s = reinterpret_cast<float*>(bytes);  // (3 n_max, ldb): this block's d_gates of the step
  float* const partial_s = reinterpret_cast<float*>(bytes + align16(3 * w.n_max * ldb * 4));  // 2 x (B, S)
  float* const sums_s = partial_s + align16(2 * BS * 4) / 4;  // the split sums (Tiling::leave)
  // Rows of the batch past B and units past the block's count stay zero, as do their products.
  for (int64_t i = threadIdx.x; i < 3 * w.n_max * ldb; i += blockDim.x) {
    dg_s[i] = 0.f;
  }
  const Tiling tiles = backward_tiling(p.batch, S, blocks, blockDim.x);
  const int64_t groups = (S + kColumns - 1) / kColumns;
  rt::cluster_sync();
  const int64_t mine = p.batch * units.count;
  // With one unit a thread at most (T64 B16 S128 over 8 blocks: 256 for 256 threads), a thread asks
  // for its unit's next inputs before the step's product, so that their latency hides behind it.
  const bool ahead = mine <= int64_t(blockDim.x);
  const int64_t per_row = units.count > 0 ? units.count : 1;  // a forced cluster may leave a block no unit
  const int64_t b_ahead = threadIdx.x / per_row, j_ahead = units.first + threadIdx.x % per_row;
  UnitInputs<scalar_t> next{};
  if (ahead && threadIdx.x < mine) {
    next = unit_inputs(p, b_ahead, j_ahead, backward_step(p.steps, p.reverse, 0));
  }
  for (int64_t k = 0; k < p.steps; ++k) {
    const int64_t t = backward_step(p.steps, p.reverse, k);
    float* const partial = partial_s + (k & 1) * BS;  // double-buffered: peers may still sum the other
    for (int64_t e = threadIdx.x; e < mine; e += blockDim.x) {
      const int64_t b = e / units.count, u = e % units.count;
      const UnitInputs<scalar_t> in = ahead ? next : unit_inputs(p, b, units.first + u, t);
      const UnitGrads<scalar_t> grads = backward_unit(p, b, units.first + u, t, k, in);
      for (int gate = 0; gate < 3; ++gate) {
        dg_s[(gate * w.n_max + u) * ldb + b] = float(grads.d[gate]);
      }
    }
    rt::sync_threads();  // every unit's d_gates in dg_s before the partial product reads them
    if (ahead && threadIdx.x < mine && k + 1 < p.steps) {
      next = unit_inputs(p, b_ahead, j_ahead, backward_step(p.steps, p.reverse, k + 1));
    }
    // A tile of the partial d_h: one (tile, slice) a thread where the rows of W_h are split, else
    // every tile whole, a thread's tiles blockDim apart.
    for (int64_t work = threadIdx.x; work < (tiles.splits == 1 ? tiles.tiles : int64_t(blockDim.x));
         work += blockDim.x) {
      const int64_t tile = work % tiles.tiles, slice = work / tiles.tiles;
      const int64_t b0 = tile / groups * kRows, c0 = tile % groups * kColumns;
      const bool active = slice < tiles.splits;
      float acc[kRows][kColumns] = {};
      if (active) {
        input_grad_sums(acc, w, dg_s, ldb, b0, c0, tiles.begin(slice), tiles.begin(slice + 1));
        if (slice > 0) {
          tiles.leave(sums_s, tile, slice, &acc[0][0], kRows * kColumns);
        }
      }
      if (tiles.splits > 1) {
        rt::sync_threads();  // every slice's sums in shared memory before slice 0 adds them
      }
      if (active && slice == 0) {
        tiles.add(sums_s, tile, &acc[0][0], kRows * kColumns);
        for (int r = 0; r < kRows && b0 + r < p.batch; ++r) {
          for (int v = 0; v < kColumns && c0 + v < S; ++v) {
            partial[(b0 + r) * S + c0 + v] = acc[r][v];
          }
        }
      }
    }
    rt::cluster_sync();  // every block's partial d_h complete before any block sums them
    for (int64_t e = threadIdx.x; e < mine; e += blockDim.x) {
      const int64_t b = e / units.count, j = units.first + e % units.count, at = b * S + j;
      // A row past its length keeps its gradient (its d_gates are zero); rank order fixes the sum.
      // The peers' values are all asked for before any is added: their latencies overlap.
      float from[kMostBlocks];
#pragma unroll
      for (unsigned peer = 0; peer < kMostBlocks; ++peer) {
        from[peer] = peer < blocks ? rt::map_shared_rank(partial, peer)[at] : 0.f;
      }
      opmath_t sum = takes_part(p.lengths, b, t) ? opmath_t(0) : grad_h_after(p, at, k);
#pragma unroll
      for (unsigned peer = 0; peer < kMostBlocks; ++peer) {
        if (peer < blocks) {
          sum += opmath_t(from[peer]);
        }
      }
      store_grad_h(p, at, k, sum);
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
      const int64_t b = e / units.count, j = units.first + e % units.count;
      backward_unit(p, b, j, t, k, unit_inputs(p, b, j, t));
    }
    rt::grid_sync();  // every unit's d_gates of step t written before any block reads them
    for (int64_t e = threadIdx.x; e < mine; e += blockDim.x) {
      const int64_t b = e / units.count, j = units.first + e % units.count, at = b * S + j;
      const scalar_t* const d = p.d_gates + (t * p.batch + b) * 3 * S;
      // A row past its length keeps its gradient (its d_gates are zero).
      opmath_t sum = takes_part(p.lengths, b, t) ? opmath_t(0) : grad_h_after(p, at, k);
      for (int64_t r = 0; r < 3 * S; ++r) {
        sum += opmath_t(d[r]) * opmath_t(p.weights[r * p.ld + j]);
      }
      store_grad_h(p, at, k, sum);
    }
  }
}

// The grid's backward in a 16-bit type (a block's share: grid_share): as
// persistent_grid_backward_kernel, with d_h's product on the tensor cores.  Each block keeps its
// units' columns of W_h in shared memory (transposed: a unit's column of 3S values a row,
// mma_stride(3S) apart), and hands its d_gates of the step to the others through two (rows,
// mma_stride(3S)) buffers in global memory (the padding zeros), as the forward hands h: a block
// writes the buffer the others read only the step after, and the grid barrier orders the two.
// After the barrier each block's product d_h (its rows, its units) = d_gates (its rows, 3S) W_h's
// columns lands in shared memory, summed over r in one fixed order (the tensor cores' tiles, k
// ascending): deterministic.
template <typename scalar_t>
__global__ void persistent_grid_backward_mma_kernel(BackwardParams<scalar_t> p, scalar_t* exchange, int64_t unit_groups) {
  using opmath_t = opmath_type<scalar_t>;
  const int64_t S = p.state_size, depth = 3 * S, ld = mma_stride(depth), columns = backward_mma_columns(S, unit_groups);
  const GridShare share = grid_share(p.batch, S, unit_groups);
  const Units units = share.units;
  const int64_t rows = gridDim.x / unit_groups * share.rows, count = rows * ld, mine = share.own * units.count;
  scalar_t* const w_t = rt::dynamic_shared<scalar_t>();
  for (int64_t i = threadIdx.x; i < columns * ld; i += blockDim.x) {
    const int64_t u = i / ld, r = i % ld;
    w_t[i] = u < units.count && r < depth ? p.weights[r * p.ld + units.first + u] : scalar_t(0);
  }
  float* const sums = reinterpret_cast<float*>(w_t + columns * ld);
  zero_padding(exchange, p.batch, rows, ld, depth);  // read only after the first grid barrier
  for (int64_t k = 0; k < p.steps; ++k) {
    const int64_t t = backward_step(p.steps, p.reverse, k);
    scalar_t* const d_gates = exchange + (k & 1) * count;
    for (int64_t e = threadIdx.x; e < mine; e += blockDim.x) {
      const int64_t b = share.row0 + e / units.count, j = units.first + e % units.count;
      const UnitGrads<scalar_t> grads = backward_unit(p, b, j, t, k, unit_inputs(p, b, j, t));
      for (int gate = 0; gate < 3; ++gate) {
        d_gates[b * ld + gate * S + j] = grads.d[gate];
      }
    }
    rt::grid_sync();  // the step's d_gates all in the buffer before any block's product reads them
    mma_product(sums, d_gates + share.row0 * ld, ld, share.rows, w_t, ld, columns, round_up(depth, kMmaTile));
    rt::sync_threads();  // the step's sums complete before they are read
    for (int64_t e = threadIdx.x; e < mine; e += blockDim.x) {
      const int64_t r = e / units.count, b = share.row0 + r, u = e % units.count, at = b * S + units.first + u;
      // A row past its length keeps its gradient (its d_gates are zero).
      store_grad_h(p, at, k, (takes_part(p.lengths, b, t) ? opmath_t(0) : grad_h_after(p, at, k)) + opmath_t(sums[r * columns + u]));
    }
  }
}

// The device's answers plan_sequence needs, asked once per device.
struct DeviceLimits {
  bool clusters;
  int64_t shared_per_block;
  int64_t multiprocessors;
};

// `ask()`'s answer for `key`, asked once: plan_sequence runs on every sequence call, and the runtime's
// attribute and occupancy queries behind these answers need not.  Each caller's lambda is its own
// type, so each gets its own table.
template <typename Key, typename Ask>
auto asked_once(const Key& key, Ask&& ask) {
  static std::mutex mutex;
  static std::map<Key, decltype(ask())> known;
  const std::lock_guard<std::mutex> lock(mutex);
  auto found = known.find(key);
  if (found == known.end()) {
    found = known.emplace(key, ask()).first;
  }
  return found->second;
}

DeviceLimits device_limits(int device) {
  return asked_once(device, [&] {
    return DeviceLimits{rt::launches_clusters(device), int64_t(rt::shared_per_block(device)),
                        int64_t(rt::multiprocessor_count(device))};
  });
}

int64_t element_size(ScalarType dtype) { return dtype == ScalarType::Float ? 4 : dtype == ScalarType::Double ? 8 : 2; }

// The larger of the two kernels' needs: one plan serves the forward and the backward.
int64_t shared_bytes(ScalarType dtype, int64_t batch, int64_t state_size, int64_t blocks) {
  const int64_t element = element_size(dtype);
  return std::max(forward_shared_bytes(element, batch, state_size, blocks, true),
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

// The shared memory a block of the grid's forward and backward kernels needs, over `unit_groups`
// groups of units and `batch_groups` of the batch (one, on FFMA).
std::pair<int64_t, int64_t> grid_shared_bytes(ScalarType dtype, int64_t batch, int64_t state_size,
                                              int64_t unit_groups, int64_t batch_groups) {
  if (dtype == ScalarType::Float) {
    return {forward_shared_bytes(4, batch, state_size, unit_groups, false), 0};
  }
  const int64_t rows = group_rows(batch, batch_groups);
  return {forward_mma_shared_bytes(rows, state_size, unit_groups), backward_mma_shared_bytes(rows, state_size, unit_groups)};
}

// How many blocks of both grid kernels (with `bytes` of shared memory: grid_shared_bytes) the
// device holds at once, asked once per device, dtype and size.
int64_t grid_capacity(int device, ScalarType dtype, std::pair<int64_t, int64_t> bytes) {
  return asked_once(std::make_tuple(device, int(dtype), bytes.first, bytes.second), [&] {
    int64_t blocks = 0;
    dispatch_persistent(dtype, [&](auto zero) {
      using scalar_t = decltype(zero);
      const int threads = rt::threads_per_block();
      auto held = [&](auto forward, auto backward) {
        return std::min(rt::cooperative_blocks(forward, threads, size_t(bytes.first), device),
                        rt::cooperative_blocks(backward, threads, size_t(bytes.second), device));
      };
      if constexpr (kTensorCores<scalar_t>) {
        blocks = held(persistent_grid_forward_mma_kernel<scalar_t>, persistent_grid_backward_mma_kernel<scalar_t>);
      } else {
        blocks = held(persistent_grid_forward_kernel<scalar_t>, persistent_grid_backward_kernel<scalar_t>);
      }
    });
    return blocks;
  });
}

// How many clusters of `cluster` blocks of both cluster kernels, at their shared memory for `batch`
// and `state_size`, the device runs at once (0: it co-schedules none), asked once per device, dtype
// and size.
int64_t cluster_capacity(int device, ScalarType dtype, int64_t batch, int64_t state_size, int cluster) {
  return asked_once(std::make_tuple(device, int(dtype), batch, state_size, cluster), [&] {
    int64_t clusters = 0;
    dispatch_persistent(dtype, [&](auto zero) {
      using scalar_t = decltype(zero);
      const int64_t element = sizeof(scalar_t);
      clusters = std::min(
          rt::resident_clusters(persistent_forward_kernel<scalar_t>,
                                rt::ClusterLaunch{"persistent_forward_kernel", cluster, rt::threads_per_block(), cluster,
                                                  size_t(forward_shared_bytes(element, batch, state_size, cluster, true))}),
          rt::resident_clusters(persistent_backward_kernel<scalar_t>,
                                rt::ClusterLaunch{"persistent_backward_kernel", cluster, rt::threads_per_block(), cluster,
                                                  size_t(backward_shared_bytes(element, batch, state_size, cluster))}));
    });
    return clusters;
  });
}

// The grid path: at most one block a multiprocessor, each keeping its units' rows of W_h in shared
// memory; all blocks resident at once, or the launch is refused.  On FFMA the blocks split the
// units alone (no more blocks than units).  On the tensor cores they split the batch into groups
// of whole tiles and the units into as few groups as shared memory allows (the traffic a step
// grows with them: see group_rows), but no fewer than keep every multiprocessor busy where the
// batch has few tiles (a small operand costs little traffic).
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
  const int64_t most = std::min(state_size, limits.multiprocessors), tiles = (batch + kMmaTile - 1) / kMmaTile;
  int64_t unit_groups = dtype == ScalarType::Float ? most
                                                   : std::min(most, (limits.multiprocessors + tiles - 1) / tiles);
  int64_t batch_groups = 1;
  std::pair<int64_t, int64_t> needs;
  for (;; ++unit_groups) {
    if (dtype != ScalarType::Float) {
      batch_groups = std::clamp(limits.multiprocessors / unit_groups, int64_t(1), tiles);
    }
    needs = grid_shared_bytes(dtype, batch, state_size, unit_groups, batch_groups);
    if (std::max(needs.first, needs.second) <= limits.shared_per_block || unit_groups == most) {
      break;
    }
  }
  const int64_t blocks = unit_groups * batch_groups, bytes = std::max(needs.first, needs.second);
  if (bytes > limits.shared_per_block) {
    refuse("a block's rows of W_h need " + std::to_string(bytes) + " bytes of shared memory, with its partial sums, over " +
           std::to_string(blocks) + " blocks, over the device's " + std::to_string(limits.shared_per_block));
  }
  const int64_t capacity = grid_capacity(device, dtype, needs);
  if (capacity < blocks) {
    refuse("its cooperative launch of " + std::to_string(blocks) + " blocks of " +
           std::to_string(rt::threads_per_block()) + " threads must be resident at once, and the device holds " +
           std::to_string(capacity) + " of them");
  }
  plan.persistent = plan.grid = true;
  plan.blocks = blocks;
  plan.unit_groups = unit_groups;
  plan.why = "grid: one cooperative launch for the time loop over " + std::to_string(blocks) +
             " blocks, each with its rows of W_h in shared memory (" + std::to_string(bytes) +
             " bytes), h exchanged through global memory with one grid barrier a step" +
             (dtype == ScalarType::Float ? ""
                                         : ", the products on the tensor cores (the units split " +
                                               std::to_string(unit_groups) + " ways, the batch " +
                                               std::to_string(batch_groups) + ")") +
             " (LLTM_CUDA_SEQUENCE=grid)";
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
  int64_t bytes = shared_bytes(dtype, batch, state_size, cluster);
  if (bytes > limits.shared_per_block) {
    // The grid-persistent path (LLTM_CUDA_SEQUENCE=grid) also runs such shapes in one launch; it
    // becomes the default only where a GPU measures it faster (benchmarks/persistent_vs_cudnn.py).
    return decline("W_h's rows and the state need " + std::to_string(bytes) + " bytes of shared memory a block over a cluster of " +
                   std::to_string(cluster) + ", over the device's " + std::to_string(limits.shared_per_block) +
                   (must ? std::string()
                         : "; the grid-persistent path (LLTM_CUDA_SEQUENCE=grid) runs it in one launch too, and "
                           "measurement decides whether it becomes the default (benchmarks/persistent_vs_cudnn.py)"));
  }
  // A cluster runs only where the device co-schedules its blocks (a GPC holds them all): the
  // default halves it until one is, a forced size that is not declines.
  std::string smaller;
  while (cluster > 1 && cluster_capacity(device, dtype, batch, state_size, cluster) == 0) {
    const std::string refused = "the device co-schedules no cluster of " + std::to_string(cluster) + " blocks with " +
                                std::to_string(bytes) + " bytes of shared memory a block (cudaOccupancyMaxActiveClusters)";
    if (forced_cluster != 0) {
      return decline(refused);
    }
    const int64_t half = shared_bytes(dtype, batch, state_size, cluster / 2);
    if (half > limits.shared_per_block) {
      return decline(refused + ", and a cluster of " + std::to_string(cluster / 2) + " would need " + std::to_string(half) +
                     " bytes a block, over the device's " + std::to_string(limits.shared_per_block));
    }
    smaller = "; " + refused;
    cluster /= 2;
    bytes = half;
  }
  plan.persistent = true;
  plan.cluster = cluster;
  plan.why = "persistent: one launch for the time loop, W_h on chip over a cluster of " + std::to_string(cluster) +
             " blocks (" + std::to_string(bytes) + " bytes of shared memory a block)" + smaller +
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
                                    a.store_gates, B, S,
                                    a.k_begin == 0 ? a.h0.const_data_ptr<scalar_t>() : nullptr,
                                    a.k_begin == 0 ? a.c0.const_data_ptr<scalar_t>() : nullptr,
                                    a.c_n.mutable_data_ptr<scalar_t>()};
    if (plan.grid) {
      // h's two buffers, rows padded as the product reads them (the kernel writes the padding)
      const int64_t batch_groups = plan.blocks / plan.unit_groups;
      const size_t bytes =
          size_t(grid_shared_bytes(a.gates.scalar_type(), B, S, plan.unit_groups, batch_groups).first);
      if constexpr (kTensorCores<scalar_t>) {
        const Tensor exchange = ops::empty({2, batch_groups * group_rows(B, batch_groups), mma_stride(S)},
                                           a.h.scalar_type(), a.h);
        rt::launch(persistent_grid_forward_mma_kernel<scalar_t>,
                   rt::ClusterLaunch{"persistent_grid_forward_mma_kernel", plan.blocks, rt::threads_per_block(), 1, bytes, true},
                   stream, p, exchange.mutable_data_ptr<scalar_t>(), plan.unit_groups);
      } else {
        const Tensor exchange = ops::empty({2, B, row_stride(S, sizeof(scalar_t))}, a.h.scalar_type(), a.h);
        rt::launch(persistent_grid_forward_kernel<scalar_t>,
                   rt::ClusterLaunch{"persistent_grid_forward_kernel", plan.blocks, rt::threads_per_block(), 1, bytes, true},
                   stream, p, exchange.mutable_data_ptr<scalar_t>());
      }
    } else {
      const size_t bytes = size_t(forward_shared_bytes(sizeof(scalar_t), B, S, plan.cluster, true));
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
                                     lengths_ptr(a.lengths), T, a.reverse, B, S, a.grad_h_n.const_data_ptr<scalar_t>(),
                                     a.grad_c_n.const_data_ptr<scalar_t>(), a.grad_h0.mutable_data_ptr<scalar_t>(),
                                     a.grad_c0.mutable_data_ptr<scalar_t>()};
    if (plan.grid) {
      if constexpr (kTensorCores<scalar_t>) {
        // d_gates' two buffers, rows padded as the product reads them (the kernel writes the padding)
        const int64_t batch_groups = plan.blocks / plan.unit_groups;
        const Tensor exchange = ops::empty({2, batch_groups * group_rows(B, batch_groups), mma_stride(3 * S)},
                                           a.gates.scalar_type(), a.gates);
        const size_t bytes =
            size_t(grid_shared_bytes(a.gates.scalar_type(), B, S, plan.unit_groups, batch_groups).second);
        rt::launch(persistent_grid_backward_mma_kernel<scalar_t>,
                   rt::ClusterLaunch{"persistent_grid_backward_mma_kernel", plan.blocks, rt::threads_per_block(), 1, bytes, true},
                   stream, p, exchange.mutable_data_ptr<scalar_t>(), plan.unit_groups);
      } else {
        rt::launch(persistent_grid_backward_kernel<scalar_t>,
                   rt::ClusterLaunch{"persistent_grid_backward_kernel", plan.blocks, rt::threads_per_block(), 1, 0, true},
                   stream, p);
      }
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
    // The occupancy queries ask the current device, as the operators' own guard makes it.
    const lltm_cuda::rt::DeviceGuard device_guard(device);
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
