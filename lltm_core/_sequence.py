"""``lltm_sequence``: one LLTM layer in one direction over a whole sequence.

Check, choose, apply: the routes to a backend's sequence kernels are the
operator layer's (``_ops``), the same as the step's.  A backend without
sequence kernels (any version-1 backend) runs :func:`_loop_steps`: its step
kernels, one autograd node per step, which is correct and slower.
"""

from __future__ import annotations

import functools
import logging

import torch

from . import _ops, _registry
from ._cell import lltm
from ._checks import check_sequence_args
from ._ops import SEQUENCE
from .backend import Backend

log = logging.getLogger("lltm_core")

# The sequence's autograd.Function, called as (backend, input, weights, bias, h0, c0, lengths, reverse).
# A module global, so that benchmarks/core_overhead.py can put a C++ node in its place.
_apply_without_functorch = functools.partial(_ops.apply, SEQUENCE)


def run_forward(backend: Backend, input, weights, bias, h0, c0, lengths, reverse, needs_backward):
    """``backend``'s sequence forward alone, with the signature its interface version has: for benchmarks and the kit."""
    return _ops.run_forward(backend.kernels["sequence"], (input, weights, bias, h0, c0, lengths, reverse),
                            needs_backward)


def lltm_sequence(input, weights, bias, h0, c0, *, lengths=None, reverse=False, backend: str | Backend | None = None):
    """One LLTM layer, one direction, over a sequence; returns ``(output, h_n, c_n)``.

    Shapes: input (T, B, I), weights (3S, S+I), bias (3S,) or (1, 3S), h0 and
    c0 (B, S); output (T, B, S), h_n and c_n (B, S).  ``lengths`` (an integer
    tensor (B,), values in [1, T]) limits sequence b to its first lengths[b]
    steps: its later outputs are zero and h_n, c_n are its state after its own
    last step; its inputs past them reach nothing, gradients included.
    ``reverse`` runs the steps from T-1 down to 0 (from each sequence's own
    last valid step, with lengths).  Differentiable in input, weights, bias, h0
    and c0.  ``backend`` as for :func:`lltm_core.lltm`.
    """
    compiling = torch.compiler.is_compiling()
    check_sequence_args(input, weights, bias, h0, c0, lengths, reverse, check_values=not compiling)
    if reverse.__class__ is not bool:  # numpy's bool, which the check lets through: the kernels take Python's
        reverse = bool(reverse)
    if bias.dim() == 2:  # (1, 3S), as pytorch/extension-cpp passes it; autograd reshapes its gradient back
        bias = bias.view(-1)
    if lengths is not None:
        lengths = lengths.to(device=input.device, dtype=torch.int64).contiguous()
        input = _without_padding(input, lengths, compiling)
    args = (input.contiguous(), weights.contiguous(), bias.contiguous(), h0.contiguous(), c0.contiguous())
    if compiling:
        from . import _trace  # imports torch._dynamo: on the first trace only (see _trace's docstring)

        out = _trace.forward(SEQUENCE, args, (lengths, reverse), backend)
        if out is None:  # no sequence kernels: each step is traced as lltm() is
            return _loop_steps(backend, *args, lengths, reverse)
        return out[0], out[1], out[2]
    return run_checked(args, lengths, reverse, backend)


def run_checked(args: tuple, lengths, reverse: bool, backend):
    """Choose and apply, in eager mode, for arguments already checked and contiguous: ``lltm_sequence``'s
    second half, which LLTMLayer's commonest call enters directly after checking its own arguments once."""
    input = args[0]
    device_type = "cpu" if input.is_cpu else input.device.type  # .device builds an object: skip it for CPU
    if device_type == "meta":  # shape inference: no backend runs on meta
        return _ops.on_meta(SEQUENCE, (*args, lengths, reverse))
    needs = _ops.needs_autograd(*args)
    chosen = _registry.choose(device_type, input.dtype, backend)
    if chosen.declines_calls or _registry.measuring():  # the choice depends on the call: only then is it described
        chosen = _registry.choose(device_type, input.dtype, backend,
                                  SEQUENCE.call(device_type, input.dtype, input, args[3].shape[1], needs))
    if not chosen.has_sequence_kernels:
        log.debug("lltm_sequence: backend %s has no sequence kernels; looping its step kernels", chosen.name)
        return _loop_steps(chosen, *args, lengths, reverse)
    if needs:
        return _apply_without_functorch(chosen, *args, lengths, reverse)
    out = _ops.run_forward(chosen.kernels["sequence"], (*args, lengths, reverse), False)
    return out[0], out[1], out[2]


def _without_padding(input, lengths, compiling: bool):
    """``input`` with the steps past each row's length zeroed; ``input`` itself when no row is short.

    Rows take no part in those steps, but a kernel's GEMMs still multiply their inputs by zero
    gradients, and NaN * 0 is NaN: zeroed here, nothing there reaches a result or a gradient.
    """
    if input.is_meta:  # shape inference: no values to zero, nor any to test
        return input
    past = torch.arange(input.shape[0], device=input.device).unsqueeze(1) >= lengths  # (T, B)
    if not compiling and not past.any():  # a traced graph cannot branch on the values: it always masks
        return input
    return input.masked_fill(past.unsqueeze(2), 0)


def _loop_steps(backend, input, weights, bias, h0, c0, lengths, reverse):
    """The sequence as T calls of the step: for backends without sequence kernels.

    Each step is ``lltm()`` (autograd, or the step's custom operator under
    torch.compile); rows past their length keep their state and output zero.
    """
    h, c = h0, c0
    outputs = [None] * input.shape[0]
    steps = range(input.shape[0] - 1, -1, -1) if reverse else range(input.shape[0])
    for t in steps:
        new_h, new_c = lltm(input[t], weights, bias, h, c, backend=backend)
        if lengths is None:
            h, c = new_h, new_c
            outputs[t] = new_h
        else:
            valid = (lengths > t).unsqueeze(1)
            h, c = torch.where(valid, new_h, h), torch.where(valid, new_c, c)
            outputs[t] = torch.where(valid, new_h, torch.zeros_like(new_h))
    return torch.stack(outputs), h, c
