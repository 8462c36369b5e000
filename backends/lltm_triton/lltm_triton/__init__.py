"""lltm-triton: the LLTM in Triton, with the sequence's whole time loop in one GPU launch each way.

Pure Python: Triton compiles the kernels at their first call.  ``_cell.py`` has the step (one launch
forward, one backward), ``_sequence.py`` the persistent sequence kernels, ``_policy.py`` can_run and
should_run with the on-chip arithmetic behind them.

It runs on CUDA GPUs that Triton supports (compute capability 8.0 or later).  With
``TRITON_INTERPRET=1`` (set before the first lltm call) Triton's numpy interpreter runs the same
kernels on CPU tensors: slow, for checking them without a GPU.  The backend then declares the CPU
too, at a priority below lltm-ref's and with should_run declining it, so only a call that names
``backend="triton"`` goes there.

Nothing is imported at ``import lltm_triton``: :func:`load_backend` first says why the kernels
cannot run, if they cannot, instead of failing at the first call.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from ._layout import saved_layout, sequence_saved_layout

__all__ = ["saved_layout", "sequence_saved_layout", "unavailable_reason", "interpreting", "load_backend"]

#: Triton's NVIDIA backend supports compute capability 8.0 (Ampere) and later.
MIN_CAPABILITY = (8, 0)
#: On CUDA: above lltm-cuda's 100, so that should_run decides between the two.
PRIORITY = 200
#: Under the interpreter: below lltm-ref's 0, so that a CPU call never comes here unless named.
INTERPRETER_PRIORITY = -10


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1, as Triton itself reads it)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _interpreter_active() -> bool:
    """Whether Triton itself defined its functions for the interpreter (it reads TRITON_INTERPRET once, at
    each @triton.jit, its own tl.zeros included: torch imports triton early, so the variable must be in the
    environment before Python starts)."""
    from triton.language import standard
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(standard.zeros, InterpretedFunction)


def unavailable_reason() -> str | None:
    """None if the kernels can run here, else why not and what to do, most fundamental first."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed: pip install triton (Linux wheels; lltm-triton's own dependency)"
    if interpreting():
        if not _interpreter_active():
            return ("TRITON_INTERPRET=1 was set after triton was imported (torch imports it), so Triton compiles "
                    "for a GPU: set it in the environment before Python starts")
        return None
    if not torch.cuda.is_available():
        return ("no GPU visible (torch.cuda.is_available() is False) and Triton's interpreter is off: "
                "set TRITON_INTERPRET=1 to run the kernels on the CPU, slowly, to check them")
    if torch.version.hip is None:  # NVIDIA: Triton's lowest supported architecture
        for index in range(torch.cuda.device_count()):
            capability = torch.cuda.get_device_capability(index)
            if tuple(capability) < MIN_CAPABILITY:
                major, minor = capability
                return (f"cuda:{index} ({torch.cuda.get_device_name(index)}) is sm_{major}{minor}; Triton supports "
                        f"NVIDIA GPUs from sm_{MIN_CAPABILITY[0]}{MIN_CAPABILITY[1]} (Ampere): use lltm-cuda there")
    return None


def load_backend():
    from lltm_core.backend import Backend
    from lltm_core.extension import unavailable_kernel

    from . import _policy

    reason = unavailable_reason()
    if reason is None:
        from . import _cell, _sequence

        kernels = (_cell.forward, _cell.backward, _sequence.sequence_forward, _sequence.sequence_backward)
    else:
        kernels = (unavailable_kernel("triton", reason),) * 4
    forward, backward, sequence_forward, sequence_backward = kernels
    interpreter = interpreting()
    mode = "Triton's interpreter on CPU tensors (TRITON_INTERPRET=1; slow, for checking)" if interpreter \
        else "Triton on the GPU"
    return Backend(
        name="triton",
        forward=forward,
        backward=backward,
        saved_layout=saved_layout,
        devices=frozenset({"cuda", "cpu"} if interpreter else {"cuda"}),
        # float16 and bfloat16 are stored as such and computed in float32; float64 in float64.
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64}),
        priority=INTERPRETER_PRIORITY if interpreter else PRIORITY,
        interface_versions=(1, 2, 3),
        availability=lambda: reason,
        description=f"Triton kernels, the sequence's time loop in one launch ({mode})",
        sequence_forward=sequence_forward,
        sequence_backward=sequence_backward,
        sequence_saved_layout=sequence_saved_layout,
        can_run=_policy.can_run,
        should_run=_policy.should_run,
    )
