// The pointwise passes for CPUs with AVX-512 F/BW/VL/DQ (16 floats per
// vector).  Compiled with the flags ATen uses for its own AVX-512 kernels
// (see lltm_cpu/_build_config.py); called only where the CPU has them (cpu_capability(), cpu_runtime.cpp).
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512DQ__)
#error "pointwise_avx512.cpp must be compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma"
#endif
#define CPU_CAPABILITY AVX512
#define CPU_CAPABILITY_AVX512
#include "pointwise_impl.h"
