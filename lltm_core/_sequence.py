"""``lltm_sequence``: one LLTM layer in one direction over a whole sequence.

A backend with sequence kernels (interface version 2) runs the time loop
itself; the routes to its kernels are those of the step (see ``_autograd``):

* eager calls go through :class:`_SequenceFunction`;
* under ``torch.compile`` the call becomes the custom operator
  ``lltm::<backend>_sequence_forward``, with a fake kernel built from the
  backend's ``sequence_saved_layout`` and ``register_autograd`` routing the
  backward to its ``sequence_backward``.  ``opcheck`` checks these operators.

Both save the same tensors: the input, weights, h0 and output, which autograd
holds anyway, plus the backend's own.  A backend without sequence kernels (any
version-1 backend) runs :func:`_loop_steps`: its step kernels, one autograd
node per step, which is correct and slower.
"""

from __future__ import annotations

import logging

import torch

from . import _autograd, _fake, _registry
from ._cell import lltm
from ._checks import check_sequence_args
from .backend import Backend

log = logging.getLogger("lltm_core")

_FORWARD_SCHEMA = (
    "(Tensor input, Tensor weights, Tensor bias, Tensor h0, Tensor c0, Tensor? lengths, bool reverse, "
    "str? named=None, bool needs_backward=True) -> Tensor[]"
)
_BACKWARD_SCHEMA = (
    "(Tensor grad_output, Tensor grad_h_n, Tensor grad_c_n, Tensor weights, Tensor input, Tensor h0, "
    "Tensor output, Tensor? lengths, Tensor[] saved, bool reverse, bool needs_grad_input) -> Tensor[]"
)


def lltm_sequence(input, weights, bias, h0, c0, *, lengths=None, reverse=False, backend: str | Backend | None = None):
    """One LLTM layer, one direction, over a sequence; returns ``(output, h_n, c_n)``.

    Shapes: input (T, B, I), weights (3S, S+I), bias (3S,) or (1, 3S), h0 and
    c0 (B, S); output (T, B, S), h_n and c_n (B, S).  ``lengths`` (an integer
    tensor (B,), values in [1, T]) limits sequence b to its first lengths[b]
    steps: its later outputs are zero and h_n, c_n are its state after its own
    last step.  ``reverse`` runs the steps from T-1 down to 0 (from each
    sequence's own last valid step, with lengths).  Differentiable in input,
    weights, bias, h0 and c0.  ``backend`` as for :func:`lltm_core.lltm`.
    """
    compiling = torch.compiler.is_compiling()
    check_sequence_args(input, weights, bias, h0, c0, lengths, reverse, check_values=not compiling)
    if bias.dim() == 2:  # (1, 3S), as pytorch/extension-cpp passes it; autograd reshapes its gradient back
        bias = bias.view(-1)
    if lengths is not None:
        lengths = lengths.to(device=input.device, dtype=torch.int64).contiguous()
    args = (input.contiguous(), weights.contiguous(), bias.contiguous(), h0.contiguous(), c0.contiguous())
    T, B, I = input.shape
    S = h0.shape[1]
    if compiling:
        from . import _trace  # on first trace only: see _trace's module docstring

        needs = torch.is_grad_enabled() and any(t.requires_grad for t in args)
        out = _trace.forward("sequence", args, (lengths, reverse), backend, needs, steps=T)
        if out is None:  # no sequence kernels: each step is traced as lltm() is
            return _loop_steps(backend, *args, lengths, reverse)
        return out[0], out[1], out[2]
    needs = _autograd.needs_autograd(*args)
    device_type = "cpu" if input.is_cpu else input.device.type  # .device builds an object: skip it for CPU
    chosen = _registry.choose(device_type, input.dtype, backend, ("sequence", B, I, S, T, needs))
    if not chosen.has_sequence_kernels:
        log.debug("lltm_sequence: backend %s has no sequence kernels; looping its step kernels", chosen.name)
        return _loop_steps(chosen, *args, lengths, reverse)
    if needs:
        return _apply_without_functorch(chosen, *args, lengths, reverse)
    out = run_forward(chosen, *args, lengths, reverse, False)
    return out[0], out[1], out[2]


def run_forward(backend: Backend, input, weights, bias, h0, c0, lengths, reverse, needs_backward):
    """``backend.sequence_forward`` with the signature its interface version has (v3: needs_backward)."""
    if backend.takes_needs_backward:
        return backend.sequence_forward(input, weights, bias, h0, c0, lengths, reverse, needs_backward)
    return backend.sequence_forward(input, weights, bias, h0, c0, lengths, reverse)


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


class _SequenceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, backend: Backend, input, weights, bias, h0, c0, lengths, reverse):
        output, h_n, c_n, *saved = run_forward(backend, input, weights, bias, h0, c0, lengths, reverse, True)
        ctx.backend, ctx.lengths, ctx.reverse = backend, lengths, reverse
        ctx.save_for_backward(input, weights, h0, output, *saved)
        return output, h_n, c_n

    @staticmethod
    def backward(ctx, grad_output, grad_h_n, grad_c_n):
        if not torch.is_grad_enabled():
            return _eager_backward(ctx, grad_output, grad_h_n, grad_c_n)
        with torch.no_grad():  # create_graph=True: see _autograd.fail_if_differentiated
            grads = _eager_backward(ctx, grad_output, grad_h_n, grad_c_n)
        return _autograd.fail_if_differentiated(grads)

    @staticmethod
    def jvp(ctx, *tangents):
        raise RuntimeError(
            "lltm: forward-mode AD (torch.autograd.forward_ad, torch.func.jvp) is not supported: "
            "the backends have no forward-mode derivative"
        )


# As for the step (see _autograd): Function.apply's Python wrapper only serves torch.func
# transforms, which needs_autograd() has already refused; skipping it saves about 10 us a call.
_apply_without_functorch = super(torch.autograd.Function, _SequenceFunction).apply


def _eager_backward(ctx, grad_output, grad_h_n, grad_c_n):
    input, weights, h0, output, *saved = ctx.saved_tensors
    needs_input = ctx.needs_input_grad[1]
    grad_input, grad_weights, grad_bias, grad_h0, grad_c0 = ctx.backend.sequence_backward(
        grad_output, grad_h_n, grad_c_n, weights, input, h0, output, ctx.lengths, *saved, ctx.reverse, needs_input
    )
    return None, (grad_input if needs_input else None), grad_weights, grad_bias, grad_h0, grad_c0, None, None


# --- custom operators, for torch.compile -------------------------------------


def sequence_ops_for(backend: Backend):
    """(forward_op, backward_op): ``lltm::<name>_sequence_forward`` and ``lltm::<name>_sequence_backward``."""
    kernels = (backend.sequence_forward, backend.sequence_backward, backend.sequence_saved_layout,
               backend.takes_needs_backward)
    return _autograd.registered_ops("sequence", backend, kernels, _register)


def _register(name: str, kernels):
    # kernels() -> (sequence_forward, sequence_backward, sequence_saved_layout, takes_needs_backward)
    # of backend `name` now
    def forward_impl(input, weights, bias, h0, c0, lengths, reverse, named=None, needs_backward=True):
        if named is None:
            T, B, I = input.shape
            _autograd.check_traced_choice(name, input, ("sequence", B, I, h0.shape[1], T, needs_backward))
        forward, _, _, takes_needs_backward = kernels()
        if takes_needs_backward:
            return list(forward(input, weights, bias, h0, c0, lengths, reverse, needs_backward))
        return list(forward(input, weights, bias, h0, c0, lengths, reverse))

    def backward_impl(grad_output, grad_h_n, grad_c_n, weights, input, h0, output, lengths, saved, reverse,
                      needs_grad_input):
        return list(kernels()[1](grad_output, grad_h_n, grad_c_n, weights, input, h0, output, lengths, *saved,
                                 reverse, needs_grad_input))

    forward_op = torch.library.custom_op(
        f"lltm::{name}_sequence_forward", forward_impl, mutates_args=(), schema=_FORWARD_SCHEMA
    )
    backward_op = torch.library.custom_op(
        f"lltm::{name}_sequence_backward", backward_impl, mutates_args=(), schema=_BACKWARD_SCHEMA
    )

    @forward_op.register_fake
    def _(input, weights, bias, h0, c0, lengths, reverse, named=None, needs_backward=True):
        # a version-2 backend saves what it always saves; lltm drops it
        return _fake.sequence_forward(kernels()[2], input, h0, needs_backward or not kernels()[3])

    @backward_op.register_fake
    def _(grad_output, grad_h_n, grad_c_n, weights, input, h0, output, lengths, saved, reverse, needs_grad_input):
        return _fake.sequence_backward(input, weights, h0, needs_grad_input)

    setup_context, backward = sequence_formula(backward_op)
    forward_op.register_autograd(lambda ctx, grads: backward(ctx, grads), setup_context=setup_context)
    return forward_op, backward_op


def sequence_formula(run_backward):
    """(setup_context, backward) for torch.library.register_autograd on a sequence forward operator.

    Shared by lltm's wrapper operators and a backend's own (see _trace):
    ``run_backward(grad_output, grad_h_n, grad_c_n, weights, input, h0, output,
    lengths, saved, reverse, needs_grad_input)`` is the backend's backward kernel.
    """

    def setup_context(ctx, inputs, output):
        input, weights, _, h0, _, lengths, reverse = inputs[:7]
        ctx.lengths, ctx.reverse = lengths, reverse
        ctx.save_for_backward(input, weights, h0, output[0], *output[3:])

    def backward(ctx, grads):
        n_args = len(ctx.needs_input_grad)  # trailing defaults are dropped by the dispatcher: see _autograd
        input, weights, h0, output, *saved = ctx.saved_tensors
        grad_output, grad_h_n, grad_c_n = grads[0], grads[1], grads[2]
        if grad_output is None and grad_h_n is None and grad_c_n is None:
            return (None,) * n_args
        needs_input = ctx.needs_input_grad[0]
        grad_input, grad_weights, grad_bias, grad_h0, grad_c0 = run_backward(
            _autograd._grad_or_zeros(grad_output, output), _autograd._grad_or_zeros(grad_h_n, h0),
            _autograd._grad_or_zeros(grad_c_n, h0), weights, input, h0, output, ctx.lengths, saved, ctx.reverse,
            needs_input,
        )
        return ((grad_input if needs_input else None), grad_weights, grad_bias, grad_h0, grad_c0, None, None,
                None, None)[:n_args]

    return setup_context, backward
