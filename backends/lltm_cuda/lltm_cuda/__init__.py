"""lltm-cuda: the LLTM on CUDA, with one fused pointwise kernel per direction.

The GEMMs go through cuBLAS (ATen's addmm/mm); the kernels live in
``csrc/cuda/lltm_kernels.cu`` (one step) and ``csrc/cuda/lltm_sequence.cu``
(a whole sequence, the time loop in C++: contract version 2) and are
registered as ``torch.ops.lltm_cuda.*`` when the compiled library
``lltm_cuda._C`` is imported.  Nothing is loaded at
``import lltm_cuda``: :func:`load_backend`, called by lltm-core, first checks
that the library can run here and reports why not instead of crashing.
"""

from __future__ import annotations

import torch

from . import _build_info

__all__ = ["saved_layout", "sequence_saved_layout", "unavailable_reason", "load_backend"]

DISTRIBUTION = "lltm-cuda"


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
    PTX (``+PTX``) is compiled by the driver for any newer GPU.  Entries this
    cannot read (architecture names such as "Hopper"), or none at all, give None: no guess.
    """
    entries = [entry for entry in arch_list.replace(" ", ";").split(";") if entry]
    if not entries:
        return None
    for entry in entries:
        ptx = entry.endswith("+PTX")
        number = entry.removesuffix("+PTX")
        specific = number.endswith(("a", "f"))  # sm_90a and the like: that GPU only
        try:
            built = tuple(int(part) for part in number.rstrip("af").split("."))
        except ValueError:
            return None
        if len(built) != 2:
            return None
        if built == capability or (not specific and (
                (built[0] == capability[0] and built[1] <= capability[1]) or (ptx and built <= capability))):
            return None
    major, minor = capability
    return (
        f"this GPU is sm_{major}{minor} but lltm-cuda was built for TORCH_CUDA_ARCH_LIST={arch_list!r}, "
        f"which has no code that runs on it: rebuild with TORCH_CUDA_ARCH_LIST={major}.{minor} "
        f"(pip install --no-build-isolation --force-reinstall ./backends/lltm_cuda)"
    )


def _load_library() -> None:
    from . import _C  # noqa: F401  (importing runs the operator registrations)


def unavailable_reason() -> str | None:
    """None if the kernels can run here, else why not and what to do, most fundamental first."""
    from lltm_core.extension import torch_mismatch

    # Before loading the library: one built for another torch may crash the process.
    mismatch = torch_mismatch(_build_info.TORCH_VERSION, DISTRIBUTION)
    if mismatch is not None:
        return mismatch
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
    return Backend(
        name="cuda",
        forward=forward,
        backward=backward,
        saved_layout=saved_layout,
        devices=frozenset({"cuda"}),
        # float16 and bfloat16 are stored as such and computed in float32.
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64}),
        priority=100,
        interface_versions=(1, 2),
        availability=lambda: reason,
        description=f"fused CUDA kernels + cuBLAS (built for torch {_build_info.TORCH_VERSION}, arch {_build_info.ARCH_LIST})",
        sequence_forward=sequence_forward,
        sequence_backward=sequence_backward,
        sequence_saved_layout=sequence_saved_layout,
    )
