"""Autograd and operator registration around a backend's kernels.

Two routes lead to the same kernels:

* Eager calls go through :class:`_LLTMFunction`, a plain
  ``torch.autograd.Function``.  At the seed's size a call is a few dozen
  microseconds, and the dispatcher round trip plus per-call checks of a
  Python custom operator would cost more than the arithmetic.
* Under ``torch.compile`` the call goes through custom operators
  ``lltm::<backend>_forward`` / ``lltm::<backend>_backward`` registered here
  with ``torch.library``: a fake kernel built from the backend's
  ``saved_layout`` lets the compiler trace shapes without running anything, and
  ``register_autograd`` routes the backward to the backend's own backward
  kernel.  These are the operators ``torch.library.opcheck`` checks.

Both routes save the same tensors and call the backend's backward kernel, never
autograd through the reference.  The conformance kit runs both.
"""

from __future__ import annotations

import threading

import torch
import torch.autograd.forward_ad as _forward_ad

from . import _fake, _registry
from ._registry import BackendError
from .backend import Backend

# `named`: the backend the caller named with backend=, or None when lltm chose
# it, in which case the operator checks that lltm would still choose it.
# `needs_backward`: whether the traced call needed a gradient; the backend's
# choice may depend on it (Backend.can_run/should_run), so the check uses it.
_FORWARD_SCHEMA = (
    "(Tensor input, Tensor weights, Tensor bias, Tensor old_h, Tensor old_cell, str? named=None, "
    "bool needs_backward=True) -> Tensor[]"
)
_BACKWARD_SCHEMA = (
    "(Tensor grad_new_h, Tensor grad_new_cell, Tensor weights, Tensor[] saved, bool needs_grad_X) -> Tensor[]"
)


def _split_grad_X(grad_X: torch.Tensor, state_size: int, needs_grad_X: bool):
    """X = cat([old_h, input]) -> (grad_input, grad_old_h); (None, None) if it was not computed."""
    if not needs_grad_X:
        return None, None
    grad_old_h, grad_input = grad_X.split_with_sizes([state_size, grad_X.shape[1] - state_size], 1)
    return grad_input, grad_old_h


# torch hands a custom operator's backward zeros for an output nobody
# differentiated (torch 2.13 does, test_one_output_used checks the results);
# torch.library does not promise it, hence None is handled too.
def _grad_or_zeros(grad, like):
    return torch.zeros_like(like) if grad is None else grad


_DOUBLE_BACKWARD = (
    "lltm: double backward (differentiating lltm's gradients again) is not supported: "
    "the backends' backward kernels are not differentiable"
)


def fail_if_differentiated(grads):
    """``grads``, given a grad_fn that raises lltm's error if they are differentiated again.

    For a backward run with create_graph=True (the only time autograd runs one
    with grad mode on): the gradients themselves are fine; differentiating them
    again is what cannot work.
    """
    fail = torch._C._functions.DelayedError(_DOUBLE_BACKWARD.encode(), len(grads))
    with torch.enable_grad():
        return fail(*(g if g is None else g.detach().requires_grad_() for g in grads))


class _LLTMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, backend: Backend, input, weights, bias, old_h, old_cell):
        new_h, new_cell, *saved = backend.forward(input, weights, bias, old_h, old_cell)
        ctx.backend = backend
        ctx.save_for_backward(weights, *saved)
        return new_h, new_cell

    @staticmethod
    def backward(ctx, grad_new_h, grad_new_cell):
        if not torch.is_grad_enabled():
            return _backward(ctx, grad_new_h, grad_new_cell)
        # create_graph=True (the only time autograd runs a backward with grad
        # mode on).  The gradients themselves are fine; differentiating them
        # again is what cannot work, so, as torch's once_differentiable does,
        # they get a grad_fn that raises only then.  Not once_differentiable
        # itself: it costs ~9 us on every call and its message does not say
        # which function refused.
        with torch.no_grad():
            grads = _backward(ctx, grad_new_h, grad_new_cell)
        return fail_if_differentiated(grads)

    @staticmethod
    def jvp(ctx, *tangents):
        raise RuntimeError(
            "lltm: forward-mode AD (torch.autograd.forward_ad, torch.func.jvp) is not supported: "
            "the backends have no forward-mode derivative"
        )


def _backward(ctx, grad_new_h, grad_new_cell):
    weights, *saved = ctx.saved_tensors
    _, needs_input, _, _, needs_old_h, _ = ctx.needs_input_grad
    needs_grad_X = needs_input or needs_old_h
    grad_X, grad_weights, grad_bias, grad_old_cell = ctx.backend.backward(
        grad_new_h, grad_new_cell, weights, *saved, needs_grad_X
    )
    grad_input, grad_old_h = _split_grad_X(grad_X, grad_old_cell.shape[1], needs_grad_X)
    return None, grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell


# Function.apply's Python wrapper only adds support for functorch transforms
# (vmap, grad), which this Function does not implement anyway (no
# setup_context); skipping it saves about 10 us a call at the seed's size.
# With a transform active and a derivative needed, lltm raises its own error
# rather than torch's generic one about setup_context.
_apply_without_functorch = super(torch.autograd.Function, _LLTMFunction).apply
_functorch_active = torch._C._are_functorch_transforms_active

_FUNCTORCH = (
    "lltm: torch.func transforms (grad, jvp, vjp, jacrev, and vmap over a call that needs a gradient) "
    "cannot differentiate lltm: the backends' kernels have only the backward that torch.autograd runs. "
    "Use .backward() or torch.autograd.grad; vmap works on calls that need no gradient (under torch.no_grad())"
)


def needs_autograd(input, weights, bias, h, c) -> bool:
    """Whether a call on these tensors must go through its autograd.Function (else: the kernels alone).

    Raises lltm's own error under a torch.func transform that would differentiate it.
    """
    # Written out, not any() over a generator: this is on the per-step hot path,
    # where a generator over five tensors costs a measurable share of the call.
    if torch.is_grad_enabled() and (
        input.requires_grad or weights.requires_grad or bias.requires_grad or h.requires_grad or c.requires_grad
    ) or _forward_ad._current_level >= 0:  # inside forward_ad.dual_level(): the Function's jvp says no
        if _functorch_active():
            raise RuntimeError(_FUNCTORCH)
        return True
    return False


def apply_eager(backend: Backend, needs: bool, input, weights, bias, old_h, old_cell):
    """The step on ``backend``: through its autograd.Function when ``needs`` (see needs_autograd)."""
    if needs:
        return _apply_without_functorch(backend, input, weights, bias, old_h, old_cell)
    # Nothing to differentiate: skip the Function (and the saved tensors' lifetime).
    out = backend.forward(input, weights, bias, old_h, old_cell)
    return out[0], out[1]


# --- custom operators, one pair per backend and kernel family, made on first use ---

_ops: dict[tuple[str, str], list] = {}  # (family, name) -> [the kernels they run now, forward_op, backward_op]
_ops_lock = threading.Lock()


def registered_ops(family: str, backend: Backend, kernels: tuple, register):
    """(forward_op, backward_op) of ``family`` ("cell" or "sequence") for ``backend``, registered once.

    torch.library cannot replace an operator, so the operators call the kernels
    stored here (``register(name, current_kernels)`` builds them, and
    ``current_kernels()`` returns what is stored).  Those follow the registry:
    after refresh() an entry point's factory may return new kernel objects for
    the same backend, and they take over.  Any other backend with the same name
    but other kernels (one built by hand and passed as backend=) is refused
    rather than given the first one's.
    """
    key = (family, backend.name)
    entry = _ops.get(key)
    if entry is None:
        with _ops_lock:
            entry = _ops.get(key)
            if entry is None:
                entry = _ops[key] = [kernels, *register(backend.name, lambda: _ops[key][0])]
    if entry[0] != kernels:
        if not _registry.is_loaded_from_entry_point(backend):
            raise BackendError(
                f"lltm: the custom operators lltm::{backend.name}_* of this process already run "
                f"another backend named {backend.name!r}, and torch.library cannot replace them: "
                f"give this backend a name of its own"
            )
        entry[0] = kernels
    return entry[1], entry[2]


def ops_for(backend: Backend):
    """(forward_op, backward_op) of the step: ``lltm::<name>_forward`` and ``lltm::<name>_backward``."""
    return registered_ops("cell", backend, (backend.forward, backend.backward, backend.saved_layout), _register)


def check_traced_choice(traced: str, input: torch.Tensor, call: tuple | None) -> None:
    """Raise unless lltm would still choose ``traced`` for this call (see _registry.compile_hint)."""
    now = _registry.select(input.device.type, input.dtype, call=call)  # raises itself if nothing can take it
    if now.name != traced:
        raise BackendError(
            f"lltm: this torch.compile'd code was traced to run backend {traced!r}, but lltm now chooses "
            f"{now.name!r} ({_registry.why_chosen(now)}). A compiled graph keeps the backend chosen when it was traced: call "
            f"torch._dynamo.reset() after changing LLTM_BACKEND, LLTM_DISABLE_BACKENDS or the installed "
            f"backends, or pass backend= to lltm()"
        )


def _register(name: str, kernels):
    # kernels() -> (forward, backward, saved_layout) of backend `name` now: see registered_ops
    def forward_impl(input, weights, bias, old_h, old_cell, named=None, needs_backward=True):
        if named is None:
            check_traced_choice(name, input, ("cell", *input.shape, old_h.shape[1], None, needs_backward))
        return list(kernels()[0](input, weights, bias, old_h, old_cell))

    def backward_impl(grad_new_h, grad_new_cell, weights, saved, needs_grad_X):
        return list(kernels()[1](grad_new_h, grad_new_cell, weights, *saved, needs_grad_X))

    forward_op = torch.library.custom_op(
        f"lltm::{name}_forward", forward_impl, mutates_args=(), schema=_FORWARD_SCHEMA
    )
    backward_op = torch.library.custom_op(
        f"lltm::{name}_backward", backward_impl, mutates_args=(), schema=_BACKWARD_SCHEMA
    )

    @forward_op.register_fake
    def _(input, weights, bias, old_h, old_cell, named=None, needs_backward=True):
        return _fake.cell_forward(kernels()[2], input, old_h)

    @backward_op.register_fake
    def _(grad_new_h, grad_new_cell, weights, saved, needs_grad_X):
        return _fake.cell_backward(grad_new_h, weights, needs_grad_X)

    setup_context, backward = cell_formula(lambda grad_h, grad_c, weights, saved, needs_grad_X: backward_op(
        grad_h, grad_c, weights, saved, needs_grad_X))
    forward_op.register_autograd(lambda ctx, grads: backward(ctx, grads), setup_context=setup_context)
    return forward_op, backward_op


def cell_formula(run_backward):
    """(setup_context, backward) for torch.library.register_autograd on a step's forward operator.

    Shared by lltm's wrapper operators and a backend's own (see _trace): both
    save the weights and the forward's saved outputs, and ``backward(ctx,
    grads)`` calls ``run_backward(grad_new_h, grad_new_cell, weights, saved,
    needs_grad_X)``, the backend's backward kernel.
    """

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[1], *output[2:])  # weights, then the backend's saved tensors

    def backward(ctx, grads):
        # One gradient per argument the operator was called with.  The
        # dispatcher drops trailing arguments equal to their defaults, so when
        # lltm chose the backend (named=None) there are five or six, not seven.
        n_args = len(ctx.needs_input_grad)
        weights, *saved = ctx.saved_tensors
        grad_new_h, grad_new_cell = grads[0], grads[1]
        if grad_new_h is None and grad_new_cell is None:
            return (None,) * n_args
        like = grad_new_cell if grad_new_h is None else grad_new_h
        needs_input, _, _, needs_old_h = ctx.needs_input_grad[:4]
        needs_grad_X = needs_input or needs_old_h
        grad_X, grad_weights, grad_bias, grad_old_cell = run_backward(
            _grad_or_zeros(grad_new_h, like), _grad_or_zeros(grad_new_cell, like), weights, saved, needs_grad_X
        )
        grad_input, grad_old_h = _split_grad_X(grad_X, grad_old_cell.shape[1], needs_grad_X)
        return (grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell, None, None)[:n_args]

    return setup_context, backward
