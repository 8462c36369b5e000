// lltm-cpu's own short vectors for the pointwise passes (pointwise_impl.h):
// at::vec is ATen's internal C++ and outside the stable ABI, so the passes
// use GCC's vector extensions, which compile to the instruction set each
// pointwise_<isa>.cpp is built for, with intrinsics where the extensions
// have no operator (fused multiply-add, rounding).
//
// Only pointwise_impl.h includes this; everything here is in namespace
// lltm_cpu::CPU_CAPABILITY, so each instruction set's build has its own copy.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

#include <torch/headeronly/util/BFloat16.h>

namespace lltm_cpu {
namespace CPU_CAPABILITY {

#if defined(CPU_CAPABILITY_AVX512)
constexpr int kVectorBytes = 64;
#else
// AVX2: one register; the portable build: two SSE registers on x86-64 (as
// at::vec's default build's 32-byte arrays).
constexpr int kVectorBytes = 32;
#endif

// memcpy of `count` lanes of `lane_bytes` each, where a whole vector is
// kBytes: a whole vector (all but a row's last) as a constant-size copy,
// which compiles to one vector move.  A variable-size memcpy compiles to
// `rep movsb`, which made each store of the passes cost about as much as
// their arithmetic (benchmarks/results/pointwise.md).
template <size_t kBytes>
inline void copy_lanes(void* to, const void* from, int64_t count, size_t lane_bytes) {
  if (static_cast<size_t>(count) * lane_bytes == kBytes) {
    std::memcpy(to, from, kBytes);
  } else {
    std::memcpy(to, from, static_cast<size_t>(count) * lane_bytes);
  }
}

// The vector types, outside the template: GCC drops vector_size from a
// typedef that depends on a template parameter.
template <typename T>
struct NativeVector;
template <>
struct NativeVector<float> {
  typedef float type __attribute__((vector_size(kVectorBytes)));
  typedef int32_t mask __attribute__((vector_size(kVectorBytes)));
};
template <>
struct NativeVector<double> {
  typedef double type __attribute__((vector_size(kVectorBytes)));
  typedef int64_t mask __attribute__((vector_size(kVectorBytes)));
};

template <typename T>
struct Vectorized {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  static constexpr int kSize = kVectorBytes / static_cast<int>(sizeof(T));
  using Lane = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;
  using Native = typename NativeVector<T>::type;
  using Mask = typename NativeVector<T>::mask;  // all ones where true

  Native v;

  Vectorized() = default;
  Vectorized(Native value) : v(value) {}  // NOLINT: the intrinsics' types are these
  Vectorized(T value) : v(Native{} + value) {}  // NOLINT: every lane `value`
  operator Native() const { return v; }  // NOLINT

  static constexpr int size() { return kSize; }

  // `count` leading elements (the rest of the vector zero).
  static Vectorized loadu(const void* ptr, int64_t count = kSize) {
    Vectorized out;
    out.v = Native{};
    copy_lanes<sizeof(Native)>(&out.v, ptr, count, sizeof(T));
    return out;
  }

  void store(void* ptr, int64_t count = kSize) const { copy_lanes<sizeof(Native)>(ptr, &v, count, sizeof(T)); }

  friend Vectorized operator+(const Vectorized& a, const Vectorized& b) { return a.v + b.v; }
  friend Vectorized operator-(const Vectorized& a, const Vectorized& b) { return a.v - b.v; }
  friend Vectorized operator*(const Vectorized& a, const Vectorized& b) { return a.v * b.v; }
  friend Vectorized operator/(const Vectorized& a, const Vectorized& b) { return a.v / b.v; }
  friend Mask operator<(const Vectorized& a, const Vectorized& b) { return a.v < b.v; }
  friend Mask operator>(const Vectorized& a, const Vectorized& b) { return a.v > b.v; }

  Vectorized neg() const { return -v; }

  Vectorized abs() const {
    Mask bits;
    std::memcpy(&bits, &v, sizeof(bits));
    bits &= ~(Lane{1} << (8 * sizeof(T) - 1));
    Vectorized out;
    std::memcpy(&out.v, &bits, sizeof(bits));
    return out;
  }

  // To the nearest integer, ties to even (the current rounding mode).
  Vectorized round() const {
#if defined(CPU_CAPABILITY_AVX512)
    if constexpr (std::is_same_v<T, float>) {
      return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    } else {
      return _mm512_roundscale_pd(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
#elif defined(CPU_CAPABILITY_AVX2)
    if constexpr (std::is_same_v<T, float>) {
      return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    } else {
      return _mm256_round_pd(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
#else
    return each([](T x) { return std::nearbyint(x); });
#endif
  }

  // The C library's functions lane by lane: float64's and the portable
  // build's, whose speed no target depends on (float32's are inlined in
  // pointwise_impl.h).
  Vectorized exp() const { return each([](T x) { return std::exp(x); }); }
  Vectorized expm1() const { return each([](T x) { return std::expm1(x); }); }
  Vectorized tanh() const { return each([](T x) { return std::tanh(x); }); }

  // a where mask is false, b where it is true.
  static Vectorized blendv(const Vectorized& a, const Vectorized& b, const Mask& mask) { return mask ? b.v : a.v; }

 private:
  template <typename F>
  Vectorized each(const F& f) const {
    Vectorized out;
    for (int i = 0; i < kSize; ++i) {
      out.v[i] = f(v[i]);
    }
    return out;
  }
};

// a * b + c, fused where the instruction set has it.
template <typename T>
Vectorized<T> fmadd(const Vectorized<T>& a, const Vectorized<T>& b, const Vectorized<T>& c) {
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_fmadd_ps(a.v, b.v, c.v);
  } else {
    return _mm512_fmadd_pd(a.v, b.v, c.v);
  }
#elif defined(CPU_CAPABILITY_AVX2)
  if constexpr (std::is_same_v<T, float>) {
    return _mm256_fmadd_ps(a.v, b.v, c.v);
  } else {
    return _mm256_fmadd_pd(a.v, b.v, c.v);
  }
#else
  return a * b + c;
#endif
}

// x limited to [low, high]; NaN stays NaN.
template <typename T>
Vectorized<T> clamp(const Vectorized<T>& x, const Vectorized<T>& low, const Vectorized<T>& high) {
  const Vectorized<T> above = Vectorized<T>::blendv(x, low, x < low);
  return Vectorized<T>::blendv(above, high, above > high);
}

// bfloat16 <-> float, a vector of floats' worth of bfloat16 values.
using Bf16Bits = uint16_t __attribute__((vector_size(kVectorBytes / 2)));
using FloatBits = uint32_t __attribute__((vector_size(kVectorBytes)));

inline Vectorized<float> load_bfloat16(const c10::BFloat16* ptr, int64_t count) {
  Bf16Bits half{};
  copy_lanes<sizeof(Bf16Bits)>(&half, ptr, count, sizeof(uint16_t));
  const FloatBits bits = __builtin_convertvector(half, FloatBits) << 16;
  Vectorized<float> out;
  std::memcpy(&out.v, &bits, sizeof(bits));
  return out;
}

// Rounded to nearest, ties to even, NaN to the quiet NaN 0x7fc0 (as c10::BFloat16 rounds).
inline void store_bfloat16(const Vectorized<float>& value, c10::BFloat16* ptr, int64_t count) {
  FloatBits bits;
  std::memcpy(&bits, &value.v, sizeof(bits));
  const FloatBits rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const FloatBits nan = (FloatBits)(value.v != value.v);
  const FloatBits chosen = (nan & 0x7fc0u) | (~nan & rounded);
  const Bf16Bits half = __builtin_convertvector(chosen, Bf16Bits);
  copy_lanes<sizeof(Bf16Bits)>(ptr, &half, count, sizeof(uint16_t));
}

}  // namespace CPU_CAPABILITY
}  // namespace lltm_cpu
