// The pointwise passes for CPUs with AVX2 and FMA (8 floats per vector).
// Compiled with the flags ATen uses for its own AVX2 kernels (see
// lltm_cpu/_build_config.py); called only where the CPU has AVX2 and FMA (cpu_capability()).
#if !defined(__AVX2__) || !defined(__FMA__)
#error "pointwise_avx2.cpp must be compiled with -mavx2 -mfma -mf16c"
#endif
#define CPU_CAPABILITY AVX2
#define CPU_CAPABILITY_AVX2
#include "pointwise_impl.h"
