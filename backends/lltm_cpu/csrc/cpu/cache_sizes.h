// This CPU's cache sizes, for the kernels that ask for data ahead only where
// it pays: the sequence's pointwise passes (their gates) and the float32 GEMM
// kernel (its packed B).  In an unnamed namespace, so that each object,
// whatever instruction set it is compiled for, has its own copy.
#pragma once

#include <unistd.h>

#include <cstdint>

namespace lltm_cpu {
namespace {

// Whether `bytes` outgrow the L2 cache; false where its size is unknown.
inline bool beyond_l2(int64_t bytes) {
#ifdef _SC_LEVEL2_CACHE_SIZE
  static const long l2_bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return l2_bytes > 0 && bytes > l2_bytes;
#else
  return false;
#endif
}

// Whether `bytes` fit the L1 data cache; false where its size is unknown.
inline bool fits_l1(int64_t bytes) {
#ifdef _SC_LEVEL1_DCACHE_SIZE
  static const long l1_bytes = sysconf(_SC_LEVEL1_DCACHE_SIZE);
  return l1_bytes > 0 && bytes <= l1_bytes;
#else
  return false;
#endif
}

}  // namespace
}  // namespace lltm_cpu
