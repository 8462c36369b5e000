// lltm-cpu's bfloat16 micro-kernels, called only where the CPU has them (see
// gemm_routes.cpp): AVX512_BF16 dot products (gemm_bf16_avx512.cpp, which also packs
// for both) and AMX tiles (gemm_bf16_amx.cpp).  bfloat16 values are passed as
// their 16 bits.
//
// Both read op(B) packed in one layout: blocks of kBlock columns; within a
// block, row pair p holds the 2 kBlock values (B[2p][j], B[2p+1][j]) of its
// columns j, interleaved (the operand layout of vdpbf16ps and of an AMX B
// tile).  k is padded with zero rows to a multiple of `depth_multiple`: 2 for
// the AVX512_BF16 kernel, amx::kDepth for AMX, whose tiles are 32 deep.
#pragma once

#include <cstdint>

namespace lltm_cpu {
namespace gemm_bf16 {

constexpr int64_t kBlock = 16;  // columns per packed block: one vector of floats, one AMX tile

// The distance, in elements, between consecutive packed blocks.  Defined
// here, so that each kernel's object stands alone (the LLTM_CPU_JIT build
// makes each a library of its own).
constexpr int64_t block_stride(int64_t k, int64_t depth_multiple) {
  return (k + depth_multiple - 1) / depth_multiple * depth_multiple * kBlock;
}

// The length of pack()'s output for a k x n operand.
constexpr int64_t packed_elements(int64_t n, int64_t k, int64_t depth_multiple) {
  return (n + kBlock - 1) / kBlock * block_stride(k, depth_multiple);
}

// op(B) (k x n; B stored n x k if trans_b) into the packed layout.
void pack(bool trans_b, int64_t n, int64_t k, const uint16_t* b, int64_t ldb, uint16_t* packed,
          int64_t depth_multiple);

// C (m x n, float) = A (m x k, bfloat16) times B packed with depth_multiple 2,
// plus C if accumulate.
void multiply(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* packed,
              bool accumulate, float* c, int64_t ldc);

namespace amx {

constexpr int64_t kDepth = 32;  // k of one tile product: 16 row pairs

// The CPU has AMX-BF16 and the kernel lets this process use its tiles
// (Linux asks each process to request them; the request is made here, once).
bool usable();

// The length of multiply()'s scratch for up to max_m rows of A.
int64_t scratch_elements(int64_t max_m, int64_t k);

// C (m x n, float) = A (m x k, bfloat16) times B packed with depth_multiple
// kDepth, plus C if accumulate.  `scratch` (scratch_elements long) holds A
// padded to whole tiles where m is not a multiple of 16 or k of kDepth.
void multiply(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* packed,
              bool accumulate, float* c, int64_t ldc, uint16_t* scratch);

}  // namespace amx
}  // namespace gemm_bf16
}  // namespace lltm_cpu
