"""lltm-cpu: the LLTM as fused, vectorised C++ kernels for CPU tensors.

The kernels are the operators ``torch.ops.lltm_cpu.forward`` and
``torch.ops.lltm_cpu.backward`` (one step), and
``torch.ops.lltm_cpu.sequence_forward`` and ``.sequence_backward`` (one layer
over a whole sequence, the time loop in C++), in the compiled library
``lltm_cpu._C``.
lltm-core finds this backend through the ``lltm.backends`` entry point
``cpu = lltm_cpu:load_backend``.

With ``LLTM_CPU_JIT=1`` the library is instead compiled from this source tree
on first use (torch.utils.cpp_extension.load, with ninja), for working on the
C++ without reinstalling.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import torch

__all__ = ["saved_layout", "sequence_saved_layout", "load_backend", "cpu_info", "gemm_routes"]

_DISTRIBUTION = "lltm-cpu"


def saved_layout(batch: int, input_features: int, state_size: int) -> dict:
    # Why these and not others: see csrc/cpu/lltm_kernels.cpp.
    return {
        "X": (batch, state_size + input_features),  # cat([old_h, input]), for grad_weights
        "gates": (batch, 3 * state_size),  # [sigmoid(i) | sigmoid(o) | elu(z)]
        "tanh_cell": (batch, state_size),  # tanh(new_cell)
    }


def sequence_saved_layout(steps: int, batch: int, input_features: int, state_size: int) -> dict:
    # lltm-ref's: with the input and output lltm_core holds, (5S + I)·T·B
    # elements, under the (6S + I)·T·B the contract allows.  See
    # csrc/cpu/lltm_sequence.cpp.
    return {
        "gates": (steps, batch, 3 * state_size),  # per step [sigmoid(i) | sigmoid(o) | elu(z)]
        "tanh_cell": (steps, batch, state_size),  # per step tanh(c_t)
    }


@functools.cache
def cpu_info() -> str:
    """This CPU as the kernels see it: vendor and model, and the instruction sets that choose
    their code (AVX2, AVX-512, AVX512_BF16, AMX), e.g. "AuthenticAMD AMD EPYC: AVX2, AVX-512, AVX512_BF16, no AMX"."""
    vendor = model = ""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:  # not Linux: torch's own view of the instruction sets only
        pass
    import platform

    model = model or platform.processor() or platform.machine()
    capability = torch.backends.cpu.get_cpu_capability()
    if flags:
        isa = [name for flag, name in (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("avx512_bf16", "AVX512_BF16"))
               if flag in flags]
        isa.append("AMX-BF16" if "amx_bf16" in flags else "no AMX")
    else:
        isa = [capability]
    return f"{vendor + ' ' if vendor else ''}{model}: {', '.join(isa)} (ATen's kernels: {capability})"


def gemm_routes() -> list[str]:
    """The GEMM routes this process's sequence kernels chose so far, one line per shape, and
    their time loops' splits (``"time loop float32 B64 S512 threads 2 forward: columns (measured:
    rows .. us, columns .. us)"``), with the timings that chose them (empty before the first
    sequence call; see csrc/cpu/blas.h)."""
    unavailable = _load_library()
    if unavailable is not None:
        raise RuntimeError(f"lltm_cpu: {unavailable}")
    return list(torch.ops.lltm_cpu.gemm_routes())


@functools.cache
def _load_library() -> str | None:
    """Registers the lltm_cpu operators; ``None`` on success, else why they are unusable."""
    if os.environ.get("LLTM_CPU_JIT") == "1":
        return _build_jit()
    try:
        from ._build_info import TORCH_VERSION
    except ImportError:
        return (
            "lltm_cpu was never built (no lltm_cpu/_build_info.py): "
            "pip install --no-build-isolation ./backends/lltm_cpu, or set LLTM_CPU_JIT=1"
        )
    from lltm_core.extension import torch_mismatch

    # Checked before loading: a library built for another torch may crash on load.
    mismatch = torch_mismatch(TORCH_VERSION, _DISTRIBUTION)
    if mismatch is not None:
        return mismatch
    library = _library_file()
    if library is None:
        return f"the compiled kernels (lltm_cpu/_C*.so) are missing from {Path(__file__).parent}: reinstall lltm-cpu"
    try:
        torch.ops.load_library(str(library))  # loading it registers the operators
    except OSError as exc:
        return f"cannot load the compiled kernels ({library}): {exc}"
    return None


def _library_file() -> Path | None:
    import importlib.machinery

    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (here / f"_C{suffix}").is_file():
            return here / f"_C{suffix}"
    return None


def _build_jit() -> str | None:
    from torch.utils import cpp_extension

    from . import _build_config as config

    root = Path(__file__).resolve().parent.parent
    if not (root / "csrc").is_dir():
        return f"LLTM_CPU_JIT=1 compiles the C++ sources of a source tree, and there are none in {root}/csrc"
    if not cpp_extension.is_ninja_available():
        return "LLTM_CPU_JIT=1 needs ninja to compile the kernels: pip install ninja"
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"LLTM_CPU_JIT=1 needs a C++ compiler: {compiler!r} was not found (install g++ or set CXX)"
    try:
        # load() gives all sources of a library one set of flags, so each
        # instruction set's pointwise passes become a library of their own,
        # which the main library then links.
        isa_libraries = [
            cpp_extension.load(
                f"lltm_cpu_jit_{Path(source).stem}",
                [str(root / source)],
                extra_cflags=config.COMPILE_FLAGS + isa_flags,
                extra_ldflags=config.LINK_FLAGS,
                is_python_module=False,
            )
            for source, isa_flags in config.ISA_SOURCES.items()
        ]
        cpp_extension.load(
            "lltm_cpu_jit",
            [str(root / source) for source in config.SOURCES],
            extra_cflags=config.COMPILE_FLAGS,
            extra_ldflags=config.LINK_FLAGS + isa_libraries,
            is_python_module=False,
        )
    except Exception as exc:  # a compile error must reach the user as the reason, not a crash
        return f"LLTM_CPU_JIT=1 build failed: {type(exc).__name__}: {exc}"
    return None


@functools.cache
def _register_fakes() -> None:
    # The operators' shapes for FakeTensorMode, torch.compile and torch.export (see lltm_core.extension).
    from lltm_core.extension import register_fake_kernels

    register_fake_kernels("lltm_cpu", saved_layout, sequence_saved_layout)


def library_path() -> str:
    """The shared library that registers the lltm_cpu operators: what a C++ program loads
    (for example before running an AOTInductor package of an LLTM model)."""
    unavailable = _load_library()
    if unavailable is not None:
        raise RuntimeError(f"lltm_cpu: {unavailable}")
    return str(_library_file())


def load_backend():
    from lltm_core.backend import Backend

    from lltm_core.extension import unavailable_kernel

    unavailable = _load_library()
    if unavailable is None:
        # The registered operators themselves: no Python frame per call (a few
        # us of a ~50 us step at the tutorial's size).
        ops = torch.ops.lltm_cpu
        forward, backward = ops.forward.default, ops.backward.default
        sequence_forward, sequence_backward = ops.sequence_forward.default, ops.sequence_backward.default
        _register_fakes()
    else:
        forward = backward = sequence_forward = sequence_backward = unavailable_kernel("cpu", unavailable)
    return Backend(
        name="cpu",
        forward=forward,
        backward=backward,
        saved_layout=saved_layout,
        devices=frozenset({"cpu"}),
        dtypes=frozenset({torch.float32, torch.float64, torch.bfloat16}),
        priority=100,
        interface_versions=(1, 2, 3),
        availability=lambda: unavailable,
        # Its GEMM routes are chosen per shape at the first call: lltm_cpu.gemm_routes() lists them.
        description=f"fused C++ kernels, vectorised per CPU instruction set; this CPU: {cpu_info()}",
        sequence_forward=sequence_forward,
        sequence_backward=sequence_backward,
        sequence_saved_layout=sequence_saved_layout,
        operator_library=library_path() if unavailable is None else None,
    )
