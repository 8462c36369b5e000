"""How lltm_cpu's C++ library is compiled; read by setup.py and by the LLTM_CPU_JIT build.

Paths are relative to the distribution root (backends/lltm_cpu), which both readers need: this
reads the target torch from its lltm_build.py, so an installed wheel never imports it.
"""

import platform
import runpy
from pathlib import Path

# TORCH_TARGET_VERSION: only the stable ABI of the target torch is visible, so an ATen or c10
# header, or a stable function newer than the target, fails to compile.  The target is lltm-cuda's
# too: both read it from lltm_build.py beside setup.py.
_TARGET_MACRO = runpy.run_path(str(Path(__file__).resolve().parents[1] / "lltm_build.py"))["TARGET_MACRO"]

#: Compiled with COMPILE_FLAGS only, into the library's first objects.
SOURCES = [
    "csrc/lltm.cpp",
    "csrc/cpu/lltm_kernels.cpp",
    "csrc/cpu/lltm_sequence.cpp",
    "csrc/cpu/blas.cpp",
    "csrc/cpu/tuning.cpp",
    "csrc/cpu/cpu_runtime.cpp",
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
        # lltm-cpu's float32 micro-kernel (blas.cpp calls it only where the CPU has AVX2 and FMA).
        "csrc/cpu/gemm_f32_avx2.cpp": ["-mavx2", "-mfma"],
        "csrc/cpu/pointwise_avx512.cpp": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"],
        # lltm-cpu's bfloat16 micro-kernel (blas.cpp calls it only where the CPU has AVX512_BF16).
        "csrc/cpu/gemm_bf16_avx512.cpp": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16"],
        # Its AMX kernel (where the CPU has AMX-BF16 and Linux grants the tiles); GCC 11 or clang 12 on.
        "csrc/cpu/gemm_bf16_amx.cpp": ["-mamx-tile", "-mamx-bf16"],
    }
    if platform.machine().lower() in ("x86_64", "amd64")
    else {}
)

# -g0: a release library carries no debug sections (they were 95% of its size).
# LLTM_CPU_AVX2_FMA, LLTM_CPU_AVX512_BF16, LLTM_CPU_AMX_BF16: gemm_f32_avx2.cpp,
# gemm_bf16_avx512.cpp and gemm_bf16_amx.cpp are among the objects (x86-64).
COMPILE_FLAGS = ["-O3", "-g0", _TARGET_MACRO,
                 *(["-DLLTM_CPU_AVX2_FMA", "-DLLTM_CPU_AVX512_BF16", "-DLLTM_CPU_AMX_BF16"] if ISA_SOURCES else [])]
# -s: no symbol table beyond the dynamic one, which loading needs.
LINK_FLAGS = ["-s"]
