"""lltm-cpu: the LLTM as fused, vectorised C++ kernels for CPU tensors.

The kernels are the operators ``torch.ops.lltm_cpu.forward`` and
``torch.ops.lltm_cpu.backward`` (one step), and
``torch.ops.lltm_cpu.sequence_forward`` and ``.sequence_backward`` (one layer
over a whole sequence, the time loop in C++), in the compiled library
``lltm_cpu/_C.abi3.so``.  It is built against torch's stable ABI of 2.10, so
it loads on every torch from 2.10 on, and it has no Python in it: this module
loads it with ``torch.ops.load_library``, and a C++ program (an AOTInductor
runner, say) with ``dlopen``; ``library_path()`` or ``python -m lltm_cpu
--library`` says where it is.
lltm-core finds this backend through the ``lltm.backends`` entry point
``cpu = lltm_cpu:load_backend``.

With ``LLTM_CPU_JIT=1`` the library is instead compiled from this source tree
on first use (torch.utils.cpp_extension.load, with ninja), for working on the
C++ without reinstalling.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import shutil
from pathlib import Path

import torch

__all__ = ["saved_layout", "sequence_saved_layout", "load_backend", "cpu_info", "gemm_routes", "kernels_left_out",
           "library_path"]

_DISTRIBUTION = "lltm-cpu"
_HERE = Path(__file__).resolve().parent
_jit_library: str | None = None  # the library LLTM_CPU_JIT=1 built, once it has


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
    their code (AVX2, AVX-512, AVX512_BF16, AMX) and the L1 data cache that sizes the float32 kernel's
    blocks, e.g. "AuthenticAMD AMD EPYC: AVX2, AVX-512, AVX512_BF16, no AMX, L1d 48K (ATen's kernels: AVX512)"."""
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
    l1 = _l1_data_cache()  # sizes the float32 kernel's slices of B (csrc/cpu/gemm_f32_avx2.cpp)
    isa += [f"L1d {l1}"] if l1 else []
    return f"{vendor + ' ' if vendor else ''}{model}: {', '.join(isa)} (ATen's kernels: {capability})"


def _l1_data_cache() -> str | None:
    """The first CPU's L1 data cache size as Linux reports it ("48K"), or None."""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "level").read_text().strip() == "1" and (index / "type").read_text().strip() == "Data":
                return (index / "size").read_text().strip()
        except OSError:
            return None
    return None


def library_path() -> str:
    """The shared library that registers the ``lltm_cpu`` operators: what a C++ program loads
    (``dlopen``, or ``torch::inductor`` runners after loading it) to run them without Python."""
    if os.environ.get("LLTM_CPU_JIT") == "1":
        if _load_library() is None and _jit_library is not None:
            return _jit_library
        raise RuntimeError(f"lltm_cpu: LLTM_CPU_JIT=1 built no library: {_load_library()}")
    try:
        from ._build_info import LIBRARY_NAME
    except ImportError as exc:
        raise RuntimeError(f"lltm_cpu: {_NEVER_BUILT}") from exc
    return str(_HERE / LIBRARY_NAME)


def gemm_routes() -> list[dict]:
    """The GEMM routes and time-loop splits this process's kernels chose so far, one record
    each (empty before the first call; see csrc/cpu/tuning.h and blas.h):

    - ``kind``: ``"recurrent"`` (a step's GEMM: ``m``, ``n``, ``k``, ``b_transposed``,
      ``threads`` of ``torch_threads``), ``"all steps"`` (a GEMM over all steps, or the
      per-step cell's: ``m``, ``n``, ``k`` as timed, ``size_class`` the [M, N, K] class the choice
      serves (each size rounded up to 1, 2, 3, 4, 6, 8, 12, ...), ``a_transposed``, ``b_transposed``,
      the ``threads`` it can use; a route named "... 1 thread" keeps to the calling thread) or
      ``"time loop"`` (the split: ``batch``, ``state_size``, ``threads``, ``direction``,
      ``row_blocks``, ``column_blocks``);
    - ``dtype``, ``key`` (the choice's identity, one line), ``chosen`` (the route or split),
      ``source`` (``"measured"``, ``"the only one"``, ``"LLTM_CPU_GEMM"`` or ``"LLTM_CPU_SPLIT"``)
      and ``measured_us`` ({candidate: microseconds}, empty unless measured).
    """
    unavailable = _load_library()
    if unavailable is not None:
        raise RuntimeError(f"lltm_cpu: {unavailable}")
    return json.loads(_c_function("lltm_cpu_gemm_routes_json")().decode())


def _c_function(name: str, path: str | None = None):
    """One of the library's C functions (csrc/lltm.cpp), returning a C string."""
    function = getattr(ctypes.CDLL(path or library_path()), name)
    function.restype = ctypes.c_char_p
    function.argtypes = []
    return function


def variant() -> str:
    """Which build of the library this process loads, and why (for ``lltm info``)."""
    try:
        from . import _build_info as info
    except ImportError:
        return "none: " + _NEVER_BUILT
    left_out = "".join(f"; built without its {route} kernel: {why}" for route, why in kernels_left_out().items())
    if os.environ.get("LLTM_CPU_JIT") == "1":
        return "LLTM_CPU_JIT=1: compiled from this source tree for the running torch" + left_out
    target = ".".join(map(str, info.TARGET_TORCH))
    return (f"stable ABI, for torch >= {target} (built with torch {info.TORCH_VERSION}): "
            f"the only build lltm-cpu has, and it runs on any such torch" + left_out)


def kernels_left_out() -> dict[str, str]:
    """{GEMM route: why} for each of lltm-cpu's own GEMM kernels (``avx2-fma``, ``avx512-bf16``,
    ``amx-bf16``) that the library was built without (a compiler that lacks the instructions, or a
    CPU architecture other than x86-64): those routes are never offered, on any CPU."""
    if os.environ.get("LLTM_CPU_JIT") == "1":
        from . import _build_config as config

        return dict(config.KERNELS_LEFT_OUT)
    try:
        from . import _build_info as info
    except ImportError:
        return {}
    return dict(getattr(info, "KERNELS_LEFT_OUT", {}))


_NEVER_BUILT = ("lltm_cpu was never built (no lltm_cpu/_build_info.py): "
                "pip install --no-build-isolation ./backends/lltm_cpu, or set LLTM_CPU_JIT=1")


@functools.cache
def _load_library() -> str | None:
    """Registers the lltm_cpu operators; ``None`` on success, else why they are unusable."""
    if os.environ.get("LLTM_CPU_JIT") == "1":
        unavailable = _build_jit()
    else:
        unavailable = _load_built_library()
    if unavailable is not None:
        return unavailable
    # A bad LLTM_CPU_GEMM or LLTM_CPU_SPLIT would fail every call: say so once, here.
    path = _jit_library if os.environ.get("LLTM_CPU_JIT") == "1" else library_path()
    settings = _c_function("lltm_cpu_settings_error", path)().decode()
    return settings or None


def _load_built_library() -> str | None:
    try:
        from . import _build_info as info
    except ImportError:
        return _NEVER_BUILT
    from lltm_core.extension import library_damage, torch_too_old

    # Both checked before loading: a library for a newer stable ABI, or a
    # truncated file, may crash the process as it loads.
    too_old = torch_too_old(info.TARGET_TORCH, _DISTRIBUTION)
    if too_old is not None:
        return too_old
    path = _HERE / info.LIBRARY_NAME
    damaged = library_damage(path, info.LIBRARY_SIZE, info.LIBRARY_SHA256, _DISTRIBUTION)
    if damaged is not None:
        return damaged
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as exc:
        return f"cannot load the compiled kernels ({path}): {exc}"
    return None


def _build_jit() -> str | None:
    from torch.utils import cpp_extension

    root = Path(__file__).resolve().parent.parent
    if not (root / "csrc").is_dir():
        return f"LLTM_CPU_JIT=1 compiles the C++ sources of a source tree, and there are none in {root}/csrc"
    from . import _build_config as config  # reads root/lltm_build.py: a source tree's only
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
        global _jit_library
        _jit_library = cpp_extension.load(
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
        description=(f"fused C++ kernels, vectorised per CPU instruction set; this CPU: {cpu_info()}; "
                     f"library: {variant()}"),
        sequence_forward=sequence_forward,
        sequence_backward=sequence_backward,
        sequence_saved_layout=sequence_saved_layout,
        operator_library=library_path() if unavailable is None else None,
    )
