"""lltm-cuda: the LLTM on CUDA, with one fused pointwise kernel per direction.

The GEMMs go through cuBLAS (ATen's addmm/mm); the kernels live in
``csrc/cuda/lltm_kernels.cu`` (one step) and ``csrc/cuda/lltm_sequence.cu``
(a whole sequence, the time loop in C++: contract versions 2 and 3) and are
registered as ``torch.ops.lltm_cuda.*`` when the compiled library
``lltm_cuda._C`` is imported.  Nothing is loaded at
``import lltm_cuda``: :func:`load_backend`, called by lltm-core, first checks
that the library can run here and reports why not instead of crashing.

The same package is also the test-only emulated build (``LLTM_CUDA_EMULATE=1`` at build time,
see setup.py): installed as ``lltm_cuda_emulated``, its library is these very kernels compiled
for the CPU with every launch run serially, and it declares the backend ``cuda_emulated`` on CPU
tensors.  Its build records ``EMULATED = True``.
"""

from __future__ import annotations

import os

import torch

from . import _build_info

__all__ = ["saved_layout", "sequence_saved_layout", "unavailable_reason", "load_backend"]

#: Whether this is the emulated build (the kernels on the CPU, for lltm-cuda's tests).
EMULATED = getattr(_build_info, "EMULATED", False)
DISTRIBUTION = "lltm-cuda-emulated" if EMULATED else "lltm-cuda"
#: The emulated build only: a library to load instead of its own _C, a variant of the same
#: sources (the planted-defect tests build such variants and run the conformance kit on them).
ENV_EMULATED_LIBRARY = "LLTM_CUDA_EMULATED_LIBRARY"


def saved_layout(batch: int, input_features: int, state_size: int) -> dict:
    # csrc/cuda/lltm_kernels.cu explains the choice: the gates are the GEMM's
    # own output (free to keep), tanh_cell the one extra write.
    return {
        "X": (batch, state_size + input_features),  # cat([old_h, input]), for grad_weights
        "gates": (batch, 3 * state_size),  # pre-activation gates; the backward recomputes i, o, elu(z)
        "tanh_cell": (batch, state_size),  # tanh(new_cell)
    }


def sequence_saved_layout(steps: int, batch: int, input_features: int, state_size: int) -> dict:
    # csrc/cuda/lltm_sequence.cu explains the choice: (5S + I)·T·B elements with the input and
    # output lltm-core holds, under the contract's (6S + I)·T·B.
    return {
        "gates": (steps, batch, 3 * state_size),  # per step, before activation: the GEMMs' own output
        "tanh_cell": (steps, batch, state_size),  # per step tanh(c_t)
    }


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


def _load_library() -> None:
    variant = os.environ.get(ENV_EMULATED_LIBRARY) if EMULATED else None
    if variant:
        torch.ops.load_library(variant)
        return
    from . import _C  # noqa: F401  (importing runs the operator registrations)


def unavailable_reason() -> str | None:
    """None if the kernels can run here, else why not and what to do, most fundamental first."""
    from lltm_core.extension import torch_mismatch

    # Before loading the library: one built for another torch may crash the process.
    mismatch = torch_mismatch(_build_info.TORCH_VERSION, DISTRIBUTION)
    if mismatch is not None and EMULATED:
        return (f"built for torch {_build_info.TORCH_VERSION}, running {torch.__version__}: rebuild the emulated "
                f"build against this torch (from an lltm source tree: LLTM_CUDA_EMULATE=1 pip install "
                f"--no-build-isolation --no-deps --force-reinstall ./backends/lltm_cuda)")
    if mismatch is not None:
        return mismatch
    if EMULATED:
        try:
            _load_library()
        except (ImportError, OSError, RuntimeError) as exc:
            return f"the emulated library failed to load: {exc}"
        return None
    if torch.version.cuda is None:
        return (
            f"the running torch {torch.__version__} is a CPU-only build: install the CUDA build "
            f"lltm-cuda was built for, torch {_build_info.TORCH_VERSION}"
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
        return f"the compiled library lltm_cuda._C failed to load: {exc}"
    return None


def load_backend():
    from lltm_core.backend import Backend
    from lltm_core.extension import unavailable_kernel

    reason = unavailable_reason()
    if reason is None:
        # The registered C++ operators themselves: no Python frame per call.
        ops = torch.ops.lltm_cuda
        forward, backward = ops.forward.default, ops.backward.default
        sequence_forward, sequence_backward = ops.sequence_forward.default, ops.sequence_backward.default
    else:
        forward = backward = sequence_forward = sequence_backward = unavailable_kernel("cuda", reason)
    if EMULATED:
        name, devices, priority = "cuda_emulated", {"cpu"}, -1  # test-only: under lltm-ref (0), it runs when named
        description = (f"lltm-cuda's kernels compiled for the CPU, every launch run serially (test-only; "
                       f"built for torch {_build_info.TORCH_VERSION})")
    else:
        name, devices, priority = "cuda", {"cuda"}, 100
        description = (f"fused CUDA kernels + cuBLAS (built for torch {_build_info.TORCH_VERSION}, "
                       f"arch {_build_info.ARCH_LIST})")
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
    )
