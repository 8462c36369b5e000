"""``explain(call)``: the trace of the choice for one call, from the rule itself (``_registry.rank``, ``decide``).

No state of its own: it asks the rule afresh (answers come from the rule's
memo), and says nothing in warnings, as ``lltm info --explain`` lists the
unavailable backends with their reasons.
"""

from __future__ import annotations

import numbers

import torch

from . import _registry
from ._device import device_unavailable_reason
from ._discovery import BackendError
from ._registry import TraceEntry
from .backend import Call


def explain(call: Call) -> list[TraceEntry]:
    """The trace of the choice for ``call``: every backend in order, with its verdict and the reason.

    As Hugging Face kernels reports its variants: which one was chosen, and
    why each other one was declined or not considered.  Honors
    ``LLTM_BACKEND`` and ``use_backend()``; never raises for a call nothing
    can run (then no entry is "chosen"), but for a call on a device this torch
    cannot make tensors on (``cuda`` on a CPU-only build): a BackendError says
    why and what to do, since no backend's answer would mean anything there.
    """
    if not isinstance(call, Call):
        raise TypeError(f"explain() takes an lltm_core.Call, got {type(call).__name__}")
    _check_call(call)
    unusable = _unusable_device(call.device_type)
    if unusable:
        raise BackendError(f"explain(): this torch cannot make {call.device_type} tensors, so no backend is "
                           f"asked: {unusable}")
    name, source = _registry.requested()
    ranking = _registry.rank(call.device_type, call.dtype, name, source)
    if ranking.error and name is not None:
        return [TraceEntry(name, "unavailable", ranking.error), *ranking.passed_over]
    chosen, trace = _registry.decide(ranking, call)
    if chosen is None or chosen.describe_call is None:
        return trace
    try:
        path = chosen.describe_call(call)
    except Exception as exc:  # a forced path that cannot run says so here, as the call would raise
        path = f"the call would fail: {exc}"
    return [entry._replace(reason=f"{entry.reason}; {path}") if entry.verdict == "chosen" and path else entry
            for entry in trace]


def _unusable_device(device_type: str) -> str | None:
    try:
        device = torch.device(device_type)
    except RuntimeError:  # a type torch does not know: the backends say they do not run on it
        return None
    return device_unavailable_reason(device)


def _check_call(call: Call) -> None:
    """Fields a caller may get wrong, named: the rule would answer any tuple, a string dtype with
    "it takes ... float32, ..., not float32" and an op it does not know as if it were the cell."""
    if call.op not in ("cell", "sequence"):
        raise ValueError(f"explain(): Call.op must be 'cell' or 'sequence', got {call.op!r}")
    if not isinstance(call.device_type, str) or ":" in call.device_type:
        raise ValueError(f"explain(): Call.device_type is a device type such as 'cpu' or 'cuda' (no index), "
                         f"got {call.device_type!r}")
    if not isinstance(call.dtype, torch.dtype):
        raise TypeError(f"explain(): Call.dtype must be a torch.dtype (torch.float32, say), got {call.dtype!r}")
    sizes = {"batch": call.batch, "input_features": call.input_features, "state_size": call.state_size}
    if call.op == "sequence":
        sizes["steps"] = call.steps
    elif call.steps is not None:
        raise ValueError(f"explain(): Call.steps is None for the cell (one step), got {call.steps!r}")
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:  # numpy's too
            raise ValueError(f"explain(): Call.{name} must be a non-negative integer, got {value!r}"
                             + (" (a sequence's number of time steps)" if name == "steps" else ""))
