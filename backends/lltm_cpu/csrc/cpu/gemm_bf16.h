// lltm-cpu's bfloat16 micro-kernel (gemm_bf16_avx512.cpp, compiled with
// AVX512_BF16 and called only where the CPU has it: see blas.cpp).  bfloat16
// values are passed as their 16 bits.
#pragma once

#include <cstdint>

namespace lltm_cpu {
namespace gemm_bf16 {

// The length of pack()'s output for a k x n operand.
int64_t packed_elements(int64_t n, int64_t k);

// op(B) (k x n; B stored n x k if trans_b) into the kernel's layout.
void pack(bool trans_b, int64_t n, int64_t k, const uint16_t* b, int64_t ldb, uint16_t* packed);

// C (m x n, float) = A (m x k, bfloat16) times the packed B, plus C if accumulate.
void multiply(int64_t m, int64_t n, int64_t k, const uint16_t* a, int64_t lda, const uint16_t* packed,
              bool accumulate, float* c, int64_t ldc);

}  // namespace gemm_bf16
}  // namespace lltm_cpu
