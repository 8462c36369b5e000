"""How lltm_cpu's C++ library is compiled; read by setup.py and by the LLTM_CPU_JIT build.

Paths are relative to the distribution root (backends/lltm_cpu).
"""

import platform

import torch

#: Compiled with COMPILE_FLAGS only, into the library's first objects.
SOURCES = [
    "csrc/lltm.cpp",
    "csrc/cpu/lltm_kernels.cpp",
    "csrc/cpu/lltm_sequence.cpp",
    "csrc/cpu/blas.cpp",
    "csrc/cpu/pointwise_default.cpp",
]

#: The same pointwise passes for wider instruction sets, each with the flags
#: ATen compiles its own kernels of that set with.  Their objects are linked
#: after SOURCES, narrowest first: where two objects define the same inline
#: function the linker keeps the first, so code that runs on any CPU can never
#: end up calling an AVX-512 build of a shared helper.
ISA_SOURCES = (
    {
        "csrc/cpu/pointwise_avx2.cpp": ["-mavx2", "-mfma", "-mf16c"],
        "csrc/cpu/pointwise_avx512.cpp": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"],
        # lltm-cpu's bfloat16 micro-kernel (blas.cpp calls it only where the CPU has AVX512_BF16).
        "csrc/cpu/gemm_bf16_avx512.cpp": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16"],
    }
    if platform.machine().lower() in ("x86_64", "amd64")
    else {}
)

# at::parallel_for is a header template: with torch's OpenMP backend it only
# runs threads if this code is compiled with OpenMP too.  The libgomp it links
# is torch's own (same soname, already loaded), so both share one thread pool.
_OPENMP = ["-fopenmp"] if torch.backends.openmp.is_available() else []

# -Wno-unknown-pragmas: at::vec's headers carry "#pragma unroll", which GCC
# does not know and would warn about a hundred times (ATen builds with it too).
# LLTM_CPU_AVX512_BF16: gemm_bf16_avx512.cpp is among the objects (x86-64).
COMPILE_FLAGS = ["-O3", "-Wno-unknown-pragmas", *_OPENMP, *(["-DLLTM_CPU_AVX512_BF16"] if ISA_SOURCES else [])]
LINK_FLAGS = [*_OPENMP]
