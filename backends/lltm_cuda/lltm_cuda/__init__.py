"""lltm-cuda: the LLTM on CUDA, with one fused pointwise kernel per direction.

The GEMMs go through cuBLAS (torch's addmm/mm, through the stable C shim); the
kernels live in ``csrc/cuda/lltm_kernels.cu`` (one step) and
``csrc/cuda/lltm_sequence.cu`` (a whole sequence, the time loop in C++: contract
versions 2 and 3) and are registered as ``torch.ops.lltm_cuda.*`` when the
compiled library is loaded with ``torch.ops.load_library``.  The library is
built on torch's stable ABI for torch >= 2.10 and holds no Python: a C++
program loads the same file (:func:`library_path`, ``python -m lltm_cuda
--library``).  Nothing is loaded at ``import lltm_cuda``: :func:`load_backend`,
called by lltm-core, first checks that the library can run here (torch new
enough, the same CUDA major, the file the build recorded) and reports why not
instead of crashing.

The same package is also the test-only emulated build (``LLTM_CUDA_EMULATE=1`` at build time,
see setup.py): installed as ``lltm_cuda_emulated``, its library is these very kernels compiled
for the CPU with every thread of a launch a fiber (csrc/emulation/lltm_emulator.h), and it
declares the backend ``cuda_emulated`` on CPU tensors.  Its build records ``EMULATED = True``.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch
# lltm-core's standard saved layouts (the pre-activation gates and tanh(c) a step: the GEMMs'
# own output, csrc/cuda/lltm_sequence.cu); re-exported as lltm_cuda's own names.
from lltm_core.extension import saved_layout, sequence_saved_layout

from . import _build_info

__all__ = ["saved_layout", "sequence_saved_layout", "library_path", "unavailable_reason", "load_backend",
           "sequence_path"]

#: Whether this is the emulated build (the kernels on the CPU, for lltm-cuda's tests).
EMULATED = getattr(_build_info, "EMULATED", False)
DISTRIBUTION = "lltm-cuda-emulated" if EMULATED else "lltm-cuda"
#: The emulated build only: a library to load instead of its own _C, a variant of the same
#: sources (the planted-defect tests build such variants and run the conformance kit on them).
ENV_EMULATED_LIBRARY = "LLTM_CUDA_EMULATED_LIBRARY"


def arch_mismatch(arch_list: str, capability: tuple[int, int]) -> str | None:
    """None if a library built for TORCH_CUDA_ARCH_LIST ``arch_list`` runs on a GPU of ``capability``.

    Machine code for X.Y runs on X.Z with Z >= Y (not on another major);
    PTX (``+PTX``) is compiled by the driver for any newer GPU.  An ``a`` suffix (9.0a,
    architecture-specific) runs on that GPU only; an ``f`` suffix (10.0f, family-specific) on
    the GPUs of its family, the same major with Z >= Y (sm_100f on sm_103), its PTX too.
    Entries this cannot read (architecture names such as "Hopper"), or none at all, give None: no guess.
    """
    entries = [entry for entry in arch_list.replace(" ", ";").split(";") if entry]
    if not entries:
        return None
    for entry in entries:
        ptx = entry.endswith("+PTX")
        number = entry.removesuffix("+PTX")
        specific = number.endswith("a")  # sm_90a and the like: that GPU only
        family = number.endswith("f")  # sm_100f: its family, the same major
        try:
            built = tuple(int(part) for part in number.removesuffix("a").removesuffix("f").split("."))
        except ValueError:
            return None
        if len(built) != 2:
            return None
        same_major_newer = built[0] == capability[0] and built[1] <= capability[1]
        if built == capability or (not specific and same_major_newer) or (
                not specific and not family and ptx and built <= capability):
            return None
    major, minor = capability
    return (
        f"this GPU is sm_{major}{minor} but lltm-cuda was built for TORCH_CUDA_ARCH_LIST={arch_list!r}, "
        f"which has no code that runs on it: rebuild with TORCH_CUDA_ARCH_LIST={major}.{minor} "
        f"(pip install --no-build-isolation --force-reinstall ./backends/lltm_cuda)"
    )


def library_path() -> str:
    """The operator library's path: what a C++ program loads (dlopen, or torch::ops's loader)
    before it runs an exported model that calls torch.ops.lltm_cuda.*.  It needs libtorch loaded
    first (and for the real build libtorch_cuda), never libpython."""
    return str(Path(__file__).with_name(_build_info.LIBRARY_NAME))


def _library_problem() -> str | None:
    """Why the recorded library must not be loaded (missing, truncated, replaced), or None."""
    from lltm_core.extension import library_damage

    return library_damage(library_path(), _build_info.LIBRARY_SIZE, _build_info.LIBRARY_SHA256, DISTRIBUTION)


def _load_library() -> None:
    variant = os.environ.get(ENV_EMULATED_LIBRARY) if EMULATED else None
    # dlopen runs the library's STABLE_TORCH_LIBRARY registrations; loading twice is a no-op.
    torch.ops.load_library(variant or library_path())
    _register_fakes()


@functools.cache
def _register_fakes() -> None:
    # The operators' shapes for FakeTensorMode, torch.compile and torch.export (see lltm_core.extension).
    from lltm_core.extension import register_fake_kernels

    register_fake_kernels("lltm_cuda", saved_layout, sequence_saved_layout)


def _cuda_major(version: str | None) -> str | None:
    return version.split(".")[0] if version else None


def _target() -> str:
    """The oldest torch the library loads on, as text ("2.10")."""
    return ".".join(map(str, _build_info.TARGET_TORCH))


def unavailable_reason() -> str | None:
    """None if the kernels can run here, else why not and what to do, most fundamental first."""
    from lltm_core.extension import torch_too_old

    # Before loading the library: the stable ABI it uses must be there, and the file must be whole
    # (a truncated library can crash the process at dlopen).
    too_old = torch_too_old(_build_info.TARGET_TORCH, DISTRIBUTION)
    if too_old is not None:
        return too_old
    if not (EMULATED and os.environ.get(ENV_EMULATED_LIBRARY)):
        damage = _library_problem()
        if damage is not None:
            return damage
    if EMULATED:
        try:
            _load_library()
        except (ImportError, OSError, RuntimeError) as exc:
            return f"the emulated library failed to load: {exc}"
        return None
    built_cuda = _build_info.CUDA_VERSION
    if torch.version.cuda is None:
        return (
            f"the running torch {torch.__version__} is a CPU-only build: install a CUDA {_cuda_major(built_cuda)}.x "
            f"build of torch (>= {_target()}), the CUDA major lltm-cuda was built for"
        )
    if _cuda_major(torch.version.cuda) != _cuda_major(built_cuda):
        return (
            f"lltm-cuda was built for CUDA {_cuda_major(built_cuda)} (CUDA {built_cuda}), and the running torch "
            f"{torch.__version__} uses CUDA {torch.version.cuda}: install the lltm-cuda wheel built for CUDA "
            f"{_cuda_major(torch.version.cuda)}, or build it against this torch (pip install --no-build-isolation "
            f"./backends/lltm_cuda from an lltm source tree)"
        )
    if not torch.cuda.is_available():
        return "no CUDA device visible (torch.cuda.is_available() is False: no GPU, no driver, or CUDA_VISIBLE_DEVICES hides it)"
    # Else it would report itself available and fail at the first launch with "no kernel image".
    for index in range(torch.cuda.device_count()):
        mismatch = arch_mismatch(_build_info.ARCH_LIST, torch.cuda.get_device_capability(index))
        if mismatch is not None:
            return f"cuda:{index}: {mismatch}"
    try:
        _load_library()
    except (ImportError, OSError) as exc:
        return f"the compiled library {library_path()} failed to load: {exc}"
    return None


# torch's ScalarType numbers, which the library's C function takes.
_SCALAR_TYPES = {torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.bfloat16: 15}


def sequence_path(dtype: torch.dtype, batch: int, state_size: int, device: int = 0) -> tuple[str, int, str]:
    """Which path a sequence call of these sizes takes on cuda:``device``, as the library decides it
    (csrc/cuda/lltm_persistent.cu, plan_sequence): ``("persistent", cluster blocks, why)``,
    ``("grid", cooperative grid blocks, why)`` or ``("per-step", 1, why)``.  LLTM_CUDA_SEQUENCE
    (persistent, grid, per-step, auto) and LLTM_CUDA_CLUSTER force a choice; a forced choice that
    cannot run raises RuntimeError, as the call would."""
    import ctypes

    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"{DISTRIBUTION} cannot run here: {reason}")
    variant = os.environ.get(ENV_EMULATED_LIBRARY) if EMULATED else None
    plan = ctypes.CDLL(variant or library_path()).lltm_cuda_sequence_plan
    plan.restype = ctypes.c_int
    plan.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64),
                     ctypes.c_char_p, ctypes.c_size_t]
    blocks = ctypes.c_int64(1)
    why = ctypes.create_string_buffer(1024)
    path = plan(device, _SCALAR_TYPES[dtype], batch, state_size, ctypes.byref(blocks), why, len(why))
    text = why.value.decode()
    if path < 0:
        raise RuntimeError(text)
    return _SEQUENCE_PATHS[path], blocks.value, text


# lltm_cuda_sequence_plan's answer (csrc/cuda/lltm_persistent.cu) to the path's name.
_SEQUENCE_PATHS = ("per-step", "persistent", "grid")

def load_backend():
    from lltm_core.backend import Backend
    from lltm_core.extension import operator_kernels

    reason = unavailable_reason()
    # The registered C++ operators themselves (no Python frame per call), or stand-ins that say why not.
    forward, backward, sequence_forward, sequence_backward = operator_kernels("lltm_cuda", "cuda", reason)
    if EMULATED:
        name, devices, priority = "cuda_emulated", {"cpu"}, -1  # test-only: under lltm-ref (0), it runs when named
        description = (f"lltm-cuda's kernels compiled for the CPU, every GPU thread a fiber (test-only; "
                       f"stable ABI for torch >= {_target()}, built with {_build_info.TORCH_VERSION})")
    else:
        name, devices, priority = "cuda", {"cuda"}, 100
        description = (f"fused CUDA kernels + cuBLAS, a sequence's time loop in one launch where W_h fits on chip "
                       f"(python -m lltm_cuda --explain T,B,I,S) (stable ABI for torch >= {_target()}, "
                       f"CUDA {_cuda_major(_build_info.CUDA_VERSION)}, arch {_build_info.ARCH_LIST}; built with "
                       f"torch {_build_info.TORCH_VERSION})")
    return Backend(
        name=name,
        forward=forward,
        backward=backward,
        saved_layout=saved_layout,
        devices=frozenset(devices),
        # float16 and bfloat16 are stored as such and computed in float32.
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64}),
        priority=priority,
        # 3: sequence_forward takes needs_backward (False: nothing kept, the input projected in chunks).
        interface_versions=(1, 2, 3),
        availability=lambda: reason,
        description=description,
        sequence_forward=sequence_forward,
        sequence_backward=sequence_backward,
        sequence_saved_layout=sequence_saved_layout,
        operator_library=None if reason is not None else (
            (os.environ.get(ENV_EMULATED_LIBRARY) if EMULATED else None) or library_path()),
        describe_call=None if reason is not None else _describe_call,
    )


def _describe_call(call) -> str | None:
    """The sequence path a call takes (lltm info --explain shows it): what plan_sequence decides."""
    if call.op != "sequence":
        return None
    device = 0 if EMULATED else torch.cuda.current_device()  # a Call names a device type, not an index
    return f"lltm-cuda's sequence path: {sequence_path(call.dtype, call.batch, call.state_size, device)[2]}"
