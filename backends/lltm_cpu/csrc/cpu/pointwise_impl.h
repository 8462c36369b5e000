// The fused pointwise passes, written once against at::vec::Vectorized.
//
// Only pointwise_<isa>.cpp include this file.  Each first defines
// CPU_CAPABILITY, the namespace the functions land in (as ATen's own per-ISA
// kernels do: at::vec's classes live in at::vec::CPU_CAPABILITY too, so the
// three builds never share a symbol), and CPU_CAPABILITY_AVX2/_AVX512, which
// select at::vec's intrinsics and SLEEF's vector math.

#ifndef CPU_CAPABILITY
#error "pointwise_impl.h is included by pointwise_<isa>.cpp, after defining CPU_CAPABILITY"
#endif

#include <ATen/OpMathType.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "pointwise.h"

namespace lltm_cpu {
namespace CPU_CAPABILITY {
namespace {

template <typename scalar_t>
using Vec = at::vec::Vectorized<scalar_t>;

// Loads and stores of up to one vector of `count` elements of a tensor of
// scalar_t, as vectors of opmath_t, the type the passes compute in: float for
// bfloat16 (as ATen's own kernels do), scalar_t itself otherwise.  A whole
// bfloat16 vector converts in registers; a partial one (the end of a row)
// goes through a small float buffer.
template <typename scalar_t>
struct Memory {
  using opmath_t = at::opmath_type<scalar_t>;
  using V = Vec<opmath_t>;

  static V load(const scalar_t* ptr, int64_t count) {
    if constexpr (std::is_same_v<scalar_t, opmath_t>) {
      return V::loadu(ptr, count);
    } else {
      if (count == V::size()) {
        V widened;
        at::vec::load_to_float(ptr, widened);
        return widened;
      }
      opmath_t widened[V::size()];
      at::vec::convert(ptr, widened, count);
      return V::loadu(widened, count);
    }
  }

  static void store(const V& value, scalar_t* ptr, int64_t count) {
    if constexpr (std::is_same_v<scalar_t, opmath_t>) {
      value.store(ptr, count);
    } else {
      if (count == V::size()) {
        // Converts two float vectors into one of scalar_t; only the first half is stored.
        at::vec::convert_from_float<scalar_t>(value, value).store(ptr, count);
        return;
      }
      opmath_t wide[V::size()];
      value.store(wide, count);
      at::vec::convert(wide, ptr, count);
    }
  }
};

template <typename scalar_t>
Vec<scalar_t> sigmoid(const Vec<scalar_t>& x) {
  const Vec<scalar_t> one(1);
  return one / (one + x.neg().exp());
}

// Horner's rule: coefficients[0] + x * (coefficients[1] + x * (...)).
template <typename scalar_t, size_t n>
Vec<scalar_t> polynomial(const Vec<scalar_t>& x, const scalar_t (&coefficients)[n]) {
  Vec<scalar_t> result(coefficients[n - 1]);
  for (size_t i = n - 1; i-- > 0;) {
    result = at::vec::fmadd(result, x, Vec<scalar_t>(coefficients[i]));
  }
  return result;
}

// expm1 and tanh for float32 built on exp, because SLEEF's expm1f and tanhf
// cost three to five times its expf (measured: the forward pass took 9.2 us
// at B16 S128 with them, 5.9 us with these).  The exp-based formulas lose
// relative precision to cancellation near 0, so there each switches to its
// Taylor series, truncated where the next term is below 0.2 float32 ulp; both
// stay within a few ulp everywhere (tests/test_lltm_cpu.py checks).  Float64
// keeps SLEEF's functions: these series are too short for its precision.
template <typename scalar_t>
Vec<scalar_t> expm1_from_exp(const Vec<scalar_t>& x) {
  if constexpr (std::is_same_v<scalar_t, float>) {
    using V = Vec<float>;
    // x + x^2 (1/2! + x/3! + ... + x^6/8!) for |x| < 0.5.
    static constexpr float kTaylor[] = {1.f / 2, 1.f / 6, 1.f / 24, 1.f / 120, 1.f / 720, 1.f / 5040, 1.f / 40320};
    const V near_zero = at::vec::fmadd(x * x, polynomial(x, kTaylor), x);
    return V::blendv(x.exp() - V(1.f), near_zero, x.abs() < V(0.5f));
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
    const V near_zero = at::vec::fmadd(x * x2, polynomial(x2, kTaylor), x);
    // 1 - 2 / (exp(2x) + 1) saturates cleanly: exp overflowing gives 1, underflowing -1.
    const V one(1.f);
    const V elsewhere = one - V(2.f) / ((x + x).exp() + one);
    return V::blendv(elsewhere, near_zero, x.abs() < V(0.3125f));
  } else {
    return x.tanh();
  }
}

template <typename scalar_t>
void forward_pass(const ForwardPointers<scalar_t>& p, int64_t col_begin, int64_t col_end) {
  using M = Memory<scalar_t>;
  using V = typename M::V;
  const int64_t S = p.state_size;
  const V zero(0);
  for (int64_t row = 0; row < p.batch; ++row) {
    scalar_t* gates = p.gates + row * 3 * S;
    const int64_t row_offset = row * S;
    for (int64_t col = col_begin; col < col_end; col += V::size()) {
      // The range's last vector may be partial: loadu/store take a count.
      const int64_t count = std::min<int64_t>(V::size(), col_end - col);
      auto load = [count](const scalar_t* ptr) { return M::load(ptr, count); };
      auto store = [count](const V& value, scalar_t* ptr) { M::store(value, ptr, count); };

      const V input_gate = sigmoid(load(gates + col) + load(p.bias + col));
      const V output_gate = sigmoid(load(gates + S + col) + load(p.bias + S + col));
      const V candidate_pre = load(gates + 2 * S + col) + load(p.bias + 2 * S + col);
      // elu with alpha = 1.
      const V candidate = V::blendv(expm1_from_exp(candidate_pre), candidate_pre, candidate_pre > zero);
      const V new_cell = at::vec::fmadd(candidate, input_gate, load(p.old_cell + row_offset + col));
      const V tanh_cell = tanh_from_exp(new_cell);

      store(input_gate, gates + col);
      store(output_gate, gates + S + col);
      store(candidate, gates + 2 * S + col);
      store(new_cell, p.new_cell + row_offset + col);
      store(tanh_cell, p.tanh_cell + row_offset + col);
      store(tanh_cell * output_gate, p.new_h + row_offset + col);
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
  const V zero(0);
  const V one(1);
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

      const V grad_h = load(p.grad_h + row_offset + col);
      const V tanh_cell = load(p.tanh_cell + row_offset + col);
      const V input_gate = load(gates + col);
      const V output_gate = load(gates + S + col);
      const V candidate = load(gates + 2 * S + col);

      // new_h = tanh(new_cell) * output_gate, new_cell = old_cell + candidate * input_gate.
      const V grad_new_cell = at::vec::fmadd(
          (one - tanh_cell * tanh_cell) * output_gate, grad_h, load(p.grad_cell + row_offset + col));
      M::store(grad_new_cell, p.grad_old_cell + row_offset + col, count);
      // Back through the activations: sigmoid' = s (1 - s); elu'(u) is 1 for
      // u > 0 and exp(u) = elu(u) + 1 otherwise, so it needs only elu's output.
      store_gate(0, candidate * grad_new_cell * input_gate * (one - input_gate));
      store_gate(1, tanh_cell * grad_h * output_gate * (one - output_gate));
      const V elu_slope = V::blendv(candidate + one, one, candidate > zero);
      store_gate(2, input_gate * grad_new_cell * elu_slope);
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

}  // namespace CPU_CAPABILITY
}  // namespace lltm_cpu
