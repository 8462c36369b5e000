// The fused pointwise passes, written once against lltm-cpu's own vectors
// (vec.h).
//
// Only pointwise_<isa>.cpp include this file.  Each first defines
// CPU_CAPABILITY, the namespace the functions land in, so that the three
// builds never share a symbol, and CPU_CAPABILITY_AVX2/_AVX512, which
// select vec.h's intrinsics.

#ifndef CPU_CAPABILITY
#error "pointwise_impl.h is included by pointwise_<isa>.cpp, after defining CPU_CAPABILITY"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "pointwise.h"
#include "vec.h"

namespace lltm_cpu {
namespace CPU_CAPABILITY {
namespace {

template <typename scalar_t>
using Vec = Vectorized<scalar_t>;

// Loads and stores of up to one vector of `count` elements of a tensor of
// scalar_t, as vectors of opmath_t, the type the passes compute in: float for
// bfloat16, scalar_t itself otherwise.
template <typename scalar_t>
struct Memory {
  using opmath_t = opmath_type<scalar_t>;
  using V = Vec<opmath_t>;

  static V load(const scalar_t* ptr, int64_t count) {
    if constexpr (std::is_same_v<scalar_t, opmath_t>) {
      return V::loadu(ptr, count);
    } else {
      return load_bfloat16(ptr, count);
    }
  }

  static void store(const V& value, scalar_t* ptr, int64_t count) {
    if constexpr (std::is_same_v<scalar_t, opmath_t>) {
      value.store(ptr, count);
    } else {
      store_bfloat16(value, ptr, count);
    }
  }
};

// Horner's rule: coefficients[0] + x * (coefficients[1] + x * (...)).
template <typename scalar_t, size_t n>
Vec<scalar_t> polynomial(const Vec<scalar_t>& x, const scalar_t (&coefficients)[n]) {
  Vec<scalar_t> result(coefficients[n - 1]);
  for (size_t i = n - 1; i-- > 0;) {
    result = fmadd(result, x, Vec<scalar_t>(coefficients[i]));
  }
  return result;
}

// exp for float32 vectors, inlined: a call out of line per vector (SLEEF's
// expf, as at::vec had it) made the cell's four a vector most of the
// sequence forward's pointwise pass (see benchmarks/results/cpu_sequence.md).
// Cody-Waite: x = n ln2 + r with |r| <= ln2/2 (ln2 in two parts, the first
// exact times any n here), e^r = 1 + r + r^2 (1/2! + r/3! + ... + r^5/7!),
// whose first omitted term is below 0.1 ulp, then scaled by 2^n.  The clamp
// keeps inf out of the reduction (inf - inf), and NaN passes through it.
// Its lower bound, ln(FLT_MIN), keeps the result normal: a subnormal result
// costs a microcode assist, and made whole passes several times slower once
// an LLTM cell state (which no forget gate bounds) fell below -43.7.  Every
// caller adds the result to 1 or subtracts 1 from it, which rounds any value
// below FLT_MIN away exactly as it rounds FLT_MIN (benchmarks/results/pointwise.md).
// Float64 and the scalar build keep the C library's exp, lane by lane (vec.h).
template <typename scalar_t>
Vec<scalar_t> exp_inline(const Vec<scalar_t>& x) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  if constexpr (std::is_same_v<scalar_t, float>) {
    using V = Vec<float>;
    static constexpr float kTaylor[] = {1.f / 2, 1.f / 6, 1.f / 24, 1.f / 120, 1.f / 720, 1.f / 5040};
    const V clamped = clamp(x, V(-87.33f), V(89.f));
    const V n = (clamped * V(1.44269504088896341f)).round();
    V r = fmadd(n, V(-0.693145751953125f), clamped);
    r = fmadd(n, V(-1.42860682030941723212e-6f), r);
    const V e = fmadd(r * r, polynomial(r, kTaylor), r) + V(1.f);
#if defined(CPU_CAPABILITY_AVX512)
    return _mm512_scalef_ps(e, n);  // e 2^n, to inf or through the subnormals as exp does
#else
    // 2^n as two powers of two, each a normal float for n in [-150, 129]
    // (where the clamp puts it), so that e 2^n overflows and underflows as
    // exp does.
    const __m256i k = _mm256_cvtps_epi32(n);
    const __m256i half = _mm256_srai_epi32(k, 1);
    const __m256i bias = _mm256_set1_epi32(127);
    const V first(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23)));
    const V second(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(k, half), bias), 23)));
    return e * first * second;
#endif
  }
#endif
  return x.exp();
}

template <typename scalar_t>
Vec<scalar_t> sigmoid(const Vec<scalar_t>& x) {
  const Vec<scalar_t> one(1);
  return one / (one + exp_inline(x.neg()));
}

// expm1 and tanh for float32 built on exp, because separate expm1 and tanh
// cost three to five times exp (see benchmarks/results/cpu_sequence.md).  The exp-based formulas lose
// relative precision to cancellation near 0, so there each switches to its
// Taylor series, truncated where the next term is below 0.2 float32 ulp; both
// stay within a few ulp everywhere (tests/test_lltm_cpu.py checks).  Float64
// keeps the C library's: these series are too short for its precision.
template <typename scalar_t>
Vec<scalar_t> expm1_from_exp(const Vec<scalar_t>& x) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    using V = Vec<float>;
    // x + x^2 (1/2! + x/3! + ... + x^6/8!) for |x| < 0.5.
    static constexpr float kTaylor[] = {1.f / 2, 1.f / 6, 1.f / 24, 1.f / 120, 1.f / 720, 1.f / 5040, 1.f / 40320};
    const V near_zero = fmadd(x * x, polynomial(x, kTaylor), x);
    return V::blendv(exp_inline(x) - V(1.f), near_zero, x.abs() < V(0.5f));
  } else {
    return x.expm1();
  }
}

template <typename scalar_t>
Vec<scalar_t> tanh_from_exp(const Vec<scalar_t>& x) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    using V = Vec<float>;
    // x + x^3 (-1/3 + x^2 2/15 - ... ) for |x| < 0.3125.
    static constexpr float kTaylor[] = {-1.f / 3, 2.f / 15, -17.f / 315, 62.f / 2835, -1382.f / 155925};
    const V x2 = x * x;
    const V near_zero = fmadd(x * x2, polynomial(x2, kTaylor), x);
    // 1 - 2 / (exp(2x) + 1) saturates cleanly: exp overflowing gives 1, underflowing -1.
    const V one(1.f);
    const V elsewhere = one - V(2.f) / (exp_inline(x + x) + one);
    return V::blendv(elsewhere, near_zero, x.abs() < V(0.3125f));
  } else {
    return x.tanh();
  }
}

// The cell's forward for one vector of elements, from the pre-activation
// gates: what the step and the sequence passes share.
template <typename V>
struct CellForward {
  V input_gate, output_gate, candidate, new_cell, tanh_cell;
};

template <typename V>
[[gnu::always_inline]] inline CellForward<V> cell_forward(const V& input_pre, const V& output_pre,
                                                          const V& candidate_pre, const V& old_cell) {
  CellForward<V> out;
  out.input_gate = sigmoid(input_pre);
  out.output_gate = sigmoid(output_pre);
  // elu with alpha = 1.
  out.candidate = V::blendv(expm1_from_exp(candidate_pre), candidate_pre, candidate_pre > V(0));
  out.new_cell = fmadd(out.candidate, out.input_gate, old_cell);
  out.tanh_cell = tanh_from_exp(out.new_cell);
  return out;
}

// The cell's backward for one vector: the gradients of the three
// pre-activation gates and of the new cell, from the upstream gradients of h
// and of the cell and what forward saved.
template <typename V>
struct CellBackward {
  V grad_new_cell, grad_input, grad_output, grad_candidate;
};

template <typename V>
[[gnu::always_inline]] inline CellBackward<V> cell_backward(const V& grad_h, const V& grad_cell, const V& tanh_cell,
                                                            const V& input_gate, const V& output_gate,
                                                            const V& candidate) {
  const V one(1);
  CellBackward<V> out;
  // new_h = tanh(new_cell) * output_gate, new_cell = old_cell + candidate * input_gate.
  out.grad_new_cell = fmadd((one - tanh_cell * tanh_cell) * output_gate, grad_h, grad_cell);
  // Back through the activations: sigmoid' = s (1 - s); elu'(u) is 1 for
  // u > 0 and exp(u) = elu(u) + 1 otherwise, so it needs only elu's output.
  out.grad_input = candidate * out.grad_new_cell * input_gate * (one - input_gate);
  out.grad_output = tanh_cell * grad_h * output_gate * (one - output_gate);
  const V elu_slope = V::blendv(candidate + one, one, candidate > V(0));
  out.grad_candidate = input_gate * out.grad_new_cell * elu_slope;
  return out;
}

template <typename scalar_t>
void forward_pass(const ForwardPointers<scalar_t>& p, int64_t col_begin, int64_t col_end) {
  using M = Memory<scalar_t>;
  using V = typename M::V;
  const int64_t S = p.state_size;
  for (int64_t row = 0; row < p.batch; ++row) {
    scalar_t* gates = p.gates + row * 3 * S;
    const int64_t row_offset = row * S;
    for (int64_t col = col_begin; col < col_end; col += V::size()) {
      // The range's last vector may be partial: loadu/store take a count.
      const int64_t count = std::min<int64_t>(V::size(), col_end - col);
      auto load = [count](const scalar_t* ptr) { return M::load(ptr, count); };
      auto store = [count](const V& value, scalar_t* ptr) { M::store(value, ptr, count); };

      const CellForward<V> cell = cell_forward(
          load(gates + col) + load(p.bias + col), load(gates + S + col) + load(p.bias + S + col),
          load(gates + 2 * S + col) + load(p.bias + 2 * S + col), load(p.old_cell + row_offset + col));
      store(cell.input_gate, gates + col);
      store(cell.output_gate, gates + S + col);
      store(cell.candidate, gates + 2 * S + col);
      store(cell.new_cell, p.new_cell + row_offset + col);
      store(cell.tanh_cell, p.tanh_cell + row_offset + col);
      store(cell.tanh_cell * cell.output_gate, p.new_h + row_offset + col);
    }
  }
}

template <typename scalar_t>
void backward_pass(const BackwardPointers<scalar_t>& p, int64_t col_begin, int64_t col_end) {
  using M = Memory<scalar_t>;
  using opmath_t = typename M::opmath_t;
  using V = typename M::V;
  const int64_t S = p.state_size;
  const int64_t width = col_end - col_begin;
  // This range owns these bias entries.  Rows add into them in opmath_t, so a
  // bfloat16 bias gradient is rounded once, not once per row.
  std::vector<opmath_t> bias_sums(3 * width, opmath_t(0));
  for (int64_t row = 0; row < p.batch; ++row) {
    const scalar_t* gates = p.gates + row * 3 * S;
    scalar_t* grad_gates = p.grad_gates + row * 3 * S;
    const int64_t row_offset = row * S;
    for (int64_t col = col_begin; col < col_end; col += V::size()) {
      const int64_t count = std::min<int64_t>(V::size(), col_end - col);
      auto load = [count](const scalar_t* ptr) { return M::load(ptr, count); };
      // Writes one gate's gradient and adds it to that gate's bias sum.
      auto store_gate = [&](int64_t gate, const V& grad) {
        M::store(grad, grad_gates + gate * S + col, count);
        opmath_t* sum = bias_sums.data() + gate * width + (col - col_begin);
        (V::loadu(sum, count) + grad).store(sum, count);
      };

      const CellBackward<V> grads = cell_backward(
          load(p.grad_h + row_offset + col), load(p.grad_cell + row_offset + col),
          load(p.tanh_cell + row_offset + col), load(gates + col), load(gates + S + col), load(gates + 2 * S + col));
      M::store(grads.grad_new_cell, p.grad_old_cell + row_offset + col, count);
      store_gate(0, grads.grad_input);
      store_gate(1, grads.grad_output);
      store_gate(2, grads.grad_candidate);
    }
  }
  for (int64_t gate = 0; gate < 3; ++gate) {
    for (int64_t col = col_begin; col < col_end; col += V::size()) {
      const int64_t count = std::min<int64_t>(V::size(), col_end - col);
      M::store(V::loadu(bias_sums.data() + gate * width + (col - col_begin), count),
               p.grad_bias + gate * S + col, count);
    }
  }
}

// Asks for the next row's three gates at this column while this row
// computes.  Where a sequence's gates outgrow L2 (gates_beyond_l2, set by
// the caller), each step's come from L3 or memory, and the hardware
// prefetchers, following several short streams a row, left the sequence
// passes waiting on them; where they fit, the requests only cost
// instructions (benchmarks/results/cpu_sequence.md, "the gates asked for a
// row ahead").
template <bool kForWrite, typename scalar_t>
[[gnu::always_inline]] inline void prefetch_gates(const scalar_t* gates, int64_t S) {
  __builtin_prefetch(gates, kForWrite);
  __builtin_prefetch(gates + S, kForWrite);
  __builtin_prefetch(gates + 2 * S, kForWrite);
}

// Whether a row takes part in a step of the sequence: t < its length.
inline bool takes_part(const int64_t* lengths, int64_t row, int64_t step) {
  return lengths == nullptr || step < lengths[row];
}

template <typename scalar_t>
void fill_zero(scalar_t* ptr, int64_t count) {
  std::fill(ptr, ptr + count, scalar_t(0));
}

template <typename scalar_t>
void sequence_forward_pass(const SequenceForwardStep<scalar_t>& p) {
  using M = Memory<scalar_t>;
  using opmath_t = typename M::opmath_t;
  using V = typename M::V;
  const int64_t S = p.state_size;
  const int64_t col_begin = p.col_begin, col_end = p.col_end, width = col_end - col_begin;
  for (int64_t row = 0; row < p.rows; ++row) {
    scalar_t* gates = p.gates + row * 3 * S;
    const bool ahead = p.gates_beyond_l2 && row + 1 < p.rows;
    const int64_t row_offset = row * S;
    if (!takes_part(p.lengths, row, p.step)) {
      // Its state stays; what is saved for this row is never read, but is
      // written all the same so that the saved tensors hold no stale memory.
      fill_zero(p.output + row_offset + col_begin, width);
      if (p.tanh_cell != nullptr) {
        fill_zero(p.tanh_cell + row_offset + col_begin, width);
        for (int64_t gate = 0; gate < 3; ++gate) {
          fill_zero(gates + gate * S + col_begin, width);
        }
      }
      continue;
    }
    for (int64_t col = col_begin; col < col_end; col += V::size()) {
      const int64_t count = std::min<int64_t>(V::size(), col_end - col);
      auto load = [count](const scalar_t* ptr) { return M::load(ptr, count); };
      auto store = [count](const V& value, scalar_t* ptr) { M::store(value, ptr, count); };

      if (ahead) {
        prefetch_gates</*kForWrite=*/true>(gates + 3 * S + col, S);
      }
      V input_pre = load(gates + col) + load(p.bias + col);
      V output_pre = load(gates + S + col) + load(p.bias + S + col);
      V candidate_pre = load(gates + 2 * S + col) + load(p.bias + 2 * S + col);
      if (p.recurrent != nullptr) {
        const opmath_t* recurrent = p.recurrent + row * 3 * S;
        input_pre = input_pre + V::loadu(recurrent + col, count);
        output_pre = output_pre + V::loadu(recurrent + S + col, count);
        candidate_pre = candidate_pre + V::loadu(recurrent + 2 * S + col, count);
      }
      opmath_t* cell_state = p.cell + row_offset + col;
      const CellForward<V> cell = cell_forward(input_pre, output_pre, candidate_pre, V::loadu(cell_state, count));
      const V new_h = cell.tanh_cell * cell.output_gate;
      cell.new_cell.store(cell_state, count);
      if (p.tanh_cell != nullptr) {  // saving for backward; inference writes neither
        store(cell.input_gate, gates + col);
        store(cell.output_gate, gates + S + col);
        store(cell.candidate, gates + 2 * S + col);
        store(cell.tanh_cell, p.tanh_cell + row_offset + col);
      }
      store(new_h, p.output + row_offset + col);
      if (p.hidden != nullptr) {
        store(new_h, p.hidden + row_offset + col);
      }
    }
  }
}

template <typename scalar_t>
void sequence_backward_pass(const SequenceBackwardStep<scalar_t>& p) {
  using M = Memory<scalar_t>;
  using opmath_t = typename M::opmath_t;
  using V = typename M::V;
  const int64_t S = p.state_size;
  const int64_t col_begin = p.col_begin, col_end = p.col_end;
  for (int64_t row = 0; row < p.rows; ++row) {
    scalar_t* grad_gates = p.grad_gates + row * 3 * S;
    if (!takes_part(p.lengths, row, p.step)) {
      // The row did not take part in this step: its gradients pass through.
      for (int64_t gate = 0; gate < 3; ++gate) {
        fill_zero(grad_gates + gate * S + col_begin, col_end - col_begin);
      }
      continue;
    }
    const scalar_t* gates = p.gates + row * 3 * S;
    const scalar_t* grad_output = p.grad_output + row * p.grad_output_row_stride;
    const int64_t row_offset = row * S;
    const bool ahead = p.gates_beyond_l2 && row + 1 < p.rows;
    for (int64_t col = col_begin; col < col_end; col += V::size()) {
      const int64_t count = std::min<int64_t>(V::size(), col_end - col);
      if (ahead) {
        prefetch_gates</*kForWrite=*/false>(gates + 3 * S + col, S);
        prefetch_gates</*kForWrite=*/true>(grad_gates + 3 * S + col, S);
        __builtin_prefetch(p.tanh_cell + row_offset + S + col, /*rw=*/0);
      }
      auto load = [count](const scalar_t* ptr) { return M::load(ptr, count); };
      auto store_gate = [&](int64_t gate, const V& grad) {
        M::store(grad, grad_gates + gate * S + col, count);
        opmath_t* sum = p.grad_bias + gate * S + col;
        (V::loadu(sum, count) + grad).store(sum, count);
      };

      const V upstream =
          p.grad_output_broadcast_row ? V(static_cast<opmath_t>(grad_output[0])) : load(grad_output + col);
      const V grad_h = V::loadu(p.grad_h + row_offset + col, count) + upstream;
      const CellBackward<V> grads = cell_backward(
          grad_h, V::loadu(p.grad_cell + row_offset + col, count), load(p.tanh_cell + row_offset + col),
          load(gates + col), load(gates + S + col), load(gates + 2 * S + col));
      grads.grad_new_cell.store(p.grad_cell + row_offset + col, count);
      if (p.lengths != nullptr) {
        V(0).store(p.grad_h + row_offset + col, count);
      }
      store_gate(0, grads.grad_input);
      store_gate(1, grads.grad_output);
      store_gate(2, grads.grad_candidate);
    }
  }
}

}  // namespace

void forward_pointwise(const ForwardPointers<float>& p, int64_t col_begin, int64_t col_end) {
  forward_pass(p, col_begin, col_end);
}
void forward_pointwise(const ForwardPointers<double>& p, int64_t col_begin, int64_t col_end) {
  forward_pass(p, col_begin, col_end);
}
void backward_pointwise(const BackwardPointers<float>& p, int64_t col_begin, int64_t col_end) {
  backward_pass(p, col_begin, col_end);
}
void backward_pointwise(const BackwardPointers<double>& p, int64_t col_begin, int64_t col_end) {
  backward_pass(p, col_begin, col_end);
}
void forward_pointwise(const ForwardPointers<c10::BFloat16>& p, int64_t col_begin, int64_t col_end) {
  forward_pass(p, col_begin, col_end);
}
void backward_pointwise(const BackwardPointers<c10::BFloat16>& p, int64_t col_begin, int64_t col_end) {
  backward_pass(p, col_begin, col_end);
}
void sequence_forward_step(const SequenceForwardStep<float>& p) { sequence_forward_pass(p); }
void sequence_forward_step(const SequenceForwardStep<double>& p) { sequence_forward_pass(p); }
void sequence_forward_step(const SequenceForwardStep<c10::BFloat16>& p) { sequence_forward_pass(p); }
void sequence_backward_step(const SequenceBackwardStep<float>& p) { sequence_backward_pass(p); }
void sequence_backward_step(const SequenceBackwardStep<double>& p) { sequence_backward_pass(p); }
void sequence_backward_step(const SequenceBackwardStep<c10::BFloat16>& p) { sequence_backward_pass(p); }

}  // namespace CPU_CAPABILITY
}  // namespace lltm_cpu
