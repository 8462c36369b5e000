"""How lltm_cpu's C++ library is compiled; read by setup.py and by the LLTM_CPU_JIT build.

Paths are relative to the distribution root (backends/lltm_cpu), which both readers need: this
reads the target torch from its lltm_build.py, so an installed wheel never imports it.
"""

import os
import platform
import runpy
import shlex
import subprocess
import sys
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
    "csrc/cpu/gemm_routes.cpp",  # blas.h: the routes and their timing
    "csrc/cpu/mkl_binding.cpp",
    "csrc/cpu/cpu_features.cpp",
    "csrc/cpu/right_operand.cpp",
    "csrc/cpu/tuning.cpp",
    "csrc/cpu/cpu_runtime.cpp",
    "csrc/cpu/pointwise_default.cpp",
    "csrc/cpu/gemm_kernels_absent.cpp",  # stand-ins for the GEMM kernels a build leaves out
]

#: The sources for wider instruction sets, each with its own flags (the pointwise
#: passes with those ATen compiles its own kernels of that set with).  Their
#: objects are linked after SOURCES, narrowest first: where two objects define
#: the same inline function the linker keeps the first, so code that runs on
#: any CPU can never end up calling an AVX-512 build of a shared helper.
#:
#: lltm-cpu's own GEMM kernels (those with a route) are optional: each is one
#: more route that gemm_routes.cpp offers where its macro is defined and the CPU has
#: the instructions, and a compiler without those instructions leaves it out
#: (KERNELS_LEFT_OUT says why).  `use` uses the instructions the source
#: needs, for that check; `needs` is a kernel whose object it relies on.
_ISA_CANDIDATES = [
    # (source, flags, route, macro, use, needs)
    ("csrc/cpu/pointwise_avx2.cpp", ["-mavx2", "-mfma", "-mf16c"], None, None, None, None),
    ("csrc/cpu/gemm_f32_avx2.cpp", ["-mavx2", "-mfma"], "avx2-fma", "LLTM_CPU_AVX2_FMA",
     "__m256 f(__m256 a) { return _mm256_fmadd_ps(a, a, a); }", None),
    ("csrc/cpu/pointwise_avx512.cpp", ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"], None, None,
     None, None),
    ("csrc/cpu/gemm_f32_avx512.cpp", ["-mavx512f", "-mfma"], "avx512-fma", "LLTM_CPU_AVX512_FMA",
     "__m512 f(__m512 a) { return _mm512_fmadd_ps(a, a, a); }", None),
    # GCC 10 or clang 9 on.
    ("csrc/cpu/gemm_bf16_avx512.cpp", ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16"],
     "avx512-bf16", "LLTM_CPU_AVX512_BF16", "__m512 f(__m512 a, __m512bh b) { return _mm512_dpbf16_ps(a, b, b); }",
     None),
    # GCC 11 or clang 12 on.  It reads B as the AVX512_BF16 kernel's object packs it (gemm_bf16.h).
    ("csrc/cpu/gemm_bf16_amx.cpp", ["-mamx-tile", "-mamx-bf16"], "amx-bf16", "LLTM_CPU_AMX_BF16",
     "void f() { _tile_dpbf16ps(0, 4, 6); _tile_release(); }", "avx512-bf16"),
]


def compiler_error(flags: list[str], use: str) -> str | None:
    """None if the C++ compiler that builds the library (torch's choice: $CXX, else c++) compiles
    ``use`` with ``flags``; else why not, in a line."""
    compiler = os.environ.get("CXX", "c++")
    try:
        result = subprocess.run([*shlex.split(compiler), *flags, "-x", "c++", "-fsyntax-only", "-"],
                                input="#include <immintrin.h>\n" + use + "\n", capture_output=True, text=True,
                                timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{compiler} could not be run: {exc}"
    if result.returncode == 0:
        return None
    first_error = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr.strip())
    return f"{compiler} {' '.join(flags)} fails: {first_error.strip()[:200]}"


# A GEMM kernel's inner loop is about 110 bytes: aligned to 64 it spans two of the front end's
# 64-byte fetch windows, else often three, which cost the float32 kernel a measurable share of its
# rate (benchmarks/results/cpu_sequence.md, "the float32 kernel's stores").  Where the compiler takes
# the flag.
_LOOP_ALIGNMENT = ["-falign-loops=64"] if compiler_error(["-falign-loops=64"], "") is None else []

ISA_SOURCES: dict[str, list[str]] = {}
#: {route: why this build has no kernel for it}: recorded in _build_info.py for lltm_cpu and its tests.
KERNELS_LEFT_OUT: dict[str, str] = {}
_KERNEL_MACROS: list[str] = []
for _source, _flags, _route, _macro, _use, _needs in _ISA_CANDIDATES:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        _error = f"{platform.machine()} is not x86-64"
    elif _needs in KERNELS_LEFT_OUT:
        _error = f"it needs the {_needs} kernel, which this build lacks"
    else:
        _error = None if _route is None else compiler_error(_flags, _use)
    if _error is None:
        ISA_SOURCES[_source] = _flags if _route is None else [*_flags, *_LOOP_ALIGNMENT]
        if _macro is not None:
            _KERNEL_MACROS.append(f"-D{_macro}")
    elif _route is not None:
        KERNELS_LEFT_OUT[_route] = _error
        print(f"lltm-cpu: building without its {_route} GEMM kernel: {_error}", file=sys.stderr)

# -g0: a release library carries no debug sections (they were 95% of its size).
COMPILE_FLAGS = ["-O3", "-g0", _TARGET_MACRO, *_KERNEL_MACROS]
# -s: no symbol table beyond the dynamic one, which loading needs.
LINK_FLAGS = ["-s"]
