"""lltm-cpu's compiled library: where it is, the checks before it is loaded, loading it (or, with
``LLTM_CPU_JIT=1``, compiling it from the source tree), and what it reports (its GEMM routes, the
kernels a build left out).  The same checks serve lltm-cpu's Python side and ``python -m lltm_cpu
--library``, so a C++ program is never handed a library Python would refuse."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import shutil
import warnings
from pathlib import Path

import torch

_DISTRIBUTION = "lltm-cpu"
_HERE = Path(__file__).resolve().parent
_jit_library: str | None = None  # the library LLTM_CPU_JIT=1 built, once it has

_NEVER_BUILT = ("lltm_cpu was never built (no lltm_cpu/_build_info.py): "
                "pip install --no-build-isolation ./backends/lltm_cpu, or set LLTM_CPU_JIT=1")
_REINSTALL = ("reinstall lltm-cpu (pip install --force-reinstall --no-deps lltm-cpu, or from a source tree "
              "pip install --no-build-isolation ./backends/lltm_cpu)")
# What setup.py records of the library in _build_info.py (backends/lltm_build.py).
_RECORD_FIELDS = ("LIBRARY_NAME", "LIBRARY_SIZE", "LIBRARY_SHA256", "TARGET_TORCH", "TORCH_VERSION")


class _Unusable(Exception):
    """Why the built library must not be used, and what to do (the message)."""


def _build_info():
    """The build's record of its library (lltm_cpu/_build_info.py), or _Unusable saying what to do:
    never built, or a record an interrupted install or an edit broke."""
    path = _HERE / "_build_info.py"
    try:
        from . import _build_info as info
    except ModuleNotFoundError as exc:
        if exc.name == f"{__package__}._build_info":
            raise _Unusable(_NEVER_BUILT) from exc
        raise _Unusable(f"its build record {path} cannot be imported ({exc}): {_REINSTALL}") from exc
    except Exception as exc:  # a SyntaxError, a NameError, ...: the file is damaged
        raise _Unusable(f"its build record {path} is broken ({type(exc).__name__}: {exc}): {_REINSTALL}") from exc
    missing = [name for name in _RECORD_FIELDS if not hasattr(info, name)]
    if missing:
        raise _Unusable(f"its build record {path} is broken (it lacks {', '.join(missing)}): {_REINSTALL}")
    return info


def _built_library_problem() -> str | None:
    """Why the installed library must not be loaded, or None: checked before loading, because a
    library for a newer stable ABI, or a truncated file, may crash the process as it loads."""
    from lltm_core.extension import library_damage, torch_too_old

    try:
        info = _build_info()
    except _Unusable as exc:
        return str(exc)
    return (torch_too_old(info.TARGET_TORCH, _DISTRIBUTION)
            or library_damage(_HERE / info.LIBRARY_NAME, info.LIBRARY_SIZE, info.LIBRARY_SHA256, _DISTRIBUTION))


def library_path() -> str:
    """The shared library that registers the ``lltm_cpu`` operators: what a C++ program loads
    (``dlopen``, or ``torch::inductor`` runners after loading it) to run them without Python.
    Raises RuntimeError, saying what to do, where lltm-cpu itself would refuse to load it."""
    if os.environ.get("LLTM_CPU_JIT") == "1":
        if _load_library() is None and _jit_library is not None:
            return _jit_library
        raise RuntimeError(f"lltm_cpu: LLTM_CPU_JIT=1 built no library: {_load_library()}")
    problem = _built_library_problem()
    if problem is not None:
        raise RuntimeError(f"lltm_cpu: {problem}")
    return str(_HERE / _build_info().LIBRARY_NAME)


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
      ``source`` (``"measured"``, ``"deterministic"`` (under torch.use_deterministic_algorithms,
      nothing timed), ``"the only one"``, ``"LLTM_CPU_GEMM"`` or ``"LLTM_CPU_SPLIT"``) and
      ``measured_us`` ({candidate: microseconds}, empty unless measured).
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
        info = _build_info()
    except _Unusable as exc:
        return f"none: {exc}"
    left_out = "".join(f"; built without its {route} kernel: {why}" for route, why in kernels_left_out().items())
    if os.environ.get("LLTM_CPU_JIT") == "1":
        return "LLTM_CPU_JIT=1: compiled from this source tree for the running torch" + left_out
    target = ".".join(map(str, info.TARGET_TORCH))
    return (f"stable ABI, for torch >= {target} (built with torch {info.TORCH_VERSION}): "
            f"the only build lltm-cpu has, and it runs on any such torch" + left_out)


def kernels_left_out() -> dict[str, str]:
    """{GEMM route: why} for each of lltm-cpu's own GEMM kernels (``avx2-fma``, ``avx512-fma``,
    ``avx512-bf16``, ``amx-bf16``) that the library was built without (a compiler that lacks the
    instructions, or a CPU architecture other than x86-64): those routes are never offered, on any CPU."""
    if os.environ.get("LLTM_CPU_JIT") == "1":
        from . import _build_config as config

        return dict(config.KERNELS_LEFT_OUT)
    try:
        info = _build_info()
    except _Unusable:
        return {}
    return dict(getattr(info, "KERNELS_LEFT_OUT", {}))


@functools.cache
def _load_library() -> str | None:
    """Registers the lltm_cpu operators; ``None`` on success, else why they are unusable."""
    if os.environ.get("LLTM_CPU_JIT") == "1":
        unavailable = _build_jit()
    else:
        unavailable = _load_built_library()
    if unavailable is not None:
        return unavailable
    # A bad LLTM_CPU_GEMM or LLTM_CPU_SPLIT, or a route this CPU lacks, would fail every call: say
    # so once, here.
    path = _jit_library if os.environ.get("LLTM_CPU_JIT") == "1" else library_path()
    settings = _c_function("lltm_cpu_settings_error", path)().decode()
    if settings:
        return settings
    # A torch that hides the deterministic flag from the library leaves the kernels usable, but
    # torch.use_deterministic_algorithms would then change nothing in them: say so, once (this is cached).
    flag = _c_function("lltm_cpu_deterministic_flag_error", path)().decode()
    if flag:
        from lltm_core.extension import user_stacklevel

        warnings.warn(f"lltm_cpu: {flag}", RuntimeWarning, stacklevel=user_stacklevel(os.path.dirname(__file__)))
    return None


def _load_built_library() -> str | None:
    problem = _built_library_problem()
    if problem is not None:
        return problem
    path = _HERE / _build_info().LIBRARY_NAME
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as exc:
        return f"cannot load the compiled kernels ({path}): {exc}"
    return None


def _build_jit() -> str | None:
    from torch.utils import cpp_extension

    root = _HERE.parent
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
