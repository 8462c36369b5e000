"""The operator layer: how lltm-core runs a backend's kernels, written once for every op.

An op is a kind of call, named as :attr:`lltm_core.Call.op` names it: ``"cell"``
(one step) or ``"sequence"`` (one layer over a sequence).  :data:`OPS` holds one
:class:`Op` record for each: its operator schemas, what its autograd node saves
and how it turns output gradients into input gradients, and its fake kernels.
A backend's kernels for an op are ``backend.kernels[op]``
(:class:`lltm_core.backend.Kernels`: forward, backward, saved_layout,
takes_needs_backward).

Two routes lead to the same kernels, and both save the same tensors and call
the backend's own backward, never autograd through a reference:

* Eager calls go through :class:`_KernelFunction`, a plain
  ``torch.autograd.Function``: at the seed's size a call is a few dozen
  microseconds, and a Python custom operator's dispatcher round trip and
  per-call checks would cost more than the arithmetic.
* Under ``torch.compile`` the call is an operator.  Python kernels are wrapped
  in lltm-core's ``lltm::<backend>_forward`` / ``_backward`` (the sequence's
  ``lltm::<backend>_sequence_forward`` / ``_backward``), made by
  :func:`register` with fake kernels built from the backend's saved layout; a
  backend's own ``torch.library`` operators get the same autograd formula
  (:func:`register_operator_autograd`).  :func:`formula` is that formula, and
  the eager Function runs its two halves too.  ``opcheck`` checks these operators.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import torch
import torch.autograd.forward_ad as _forward_ad

from . import _discovery, _fake, _flops, _registry
from ._registry import BackendError
from .backend import Backend, Call, Kernels

# `named`: the backend the caller named with backend=, or None when lltm chose it, in which case
# the operator checks that lltm would still choose it.  `needs_backward`: whether the traced call
# needed a gradient; the choice may depend on it (can_run/should_run), so the check uses it.
_CELL_FORWARD_SCHEMA = (
    "(Tensor input, Tensor weights, Tensor bias, Tensor old_h, Tensor old_cell, str? named=None, "
    "bool needs_backward=True) -> Tensor[]"
)
_CELL_BACKWARD_SCHEMA = (
    "(Tensor grad_new_h, Tensor grad_new_cell, Tensor weights, Tensor[] saved, bool needs_grad_X) -> Tensor[]"
)
_SEQUENCE_FORWARD_SCHEMA = (
    "(Tensor input, Tensor weights, Tensor bias, Tensor h0, Tensor c0, Tensor? lengths, bool reverse, "
    "str? named=None, bool needs_backward=True) -> Tensor[]"
)
_SEQUENCE_BACKWARD_SCHEMA = (
    "(Tensor grad_output, Tensor grad_h_n, Tensor grad_c_n, Tensor weights, Tensor input, Tensor h0, "
    "Tensor output, Tensor? lengths, Tensor[] saved, bool reverse, bool needs_grad_input) -> Tensor[]"
)


@dataclass(frozen=True)
class Op:
    """What lltm-core needs to know about one op to run any backend's kernels for it."""

    name: str  # Call.op, and the key of Backend.kernels
    operator_prefix: str  # lltm::<backend>_<prefix>forward, lltm::<backend>_<prefix>backward
    forward_schema: str
    backward_schema: str
    #: The forward's arguments before ``named``: the five tensors, then the op's own (lengths, reverse).
    arguments: int
    #: The outputs a caller sees; the forward returns the saved tensors after them.
    outputs: int
    #: Where the backward takes the saved tensors (one list in lltm's operator, spread in the kernel),
    #: and how many arguments follow them.
    saved_at: int
    after_saved: int
    #: Whether the input has a leading time dimension.
    has_steps: bool
    #: ``save(ctx, args, output)``: what the backward needs, onto ``ctx``.
    save: Callable
    #: ``gradients(ctx, grads, run_backward, needs) -> one gradient per forward argument``: ``grads``
    #: has no None; ``run_backward`` has the backward kernel's signature; ``needs`` the forward
    #: arguments' needs_input_grad.
    gradients: Callable
    #: ``fake_forward(kernels, args, needs_backward)``, ``fake_backward(*backward operator args)``.
    fake_forward: Callable
    fake_backward: Callable

    def call(self, device_type: str, dtype: torch.dtype, input, state_size, needs_backward: bool) -> Call:
        """The :class:`Call` of ``input`` with a state of ``state_size``."""
        steps, (batch, features) = (input.shape[0], input.shape[1:]) if self.has_steps else (None, input.shape)
        return Call(self.name, device_type, dtype, batch, features, state_size, steps, needs_backward)

    def operator_name(self, backend_name: str, half: str) -> str:
        """``lltm::<name>_forward`` and the like, without the namespace: ``half`` is "forward" or "backward"."""
        return f"{backend_name}_{self.operator_prefix}{half}"


def _split_grad_X(grad_X: torch.Tensor, state_size: int, needs_grad_X: bool):
    """X = cat([old_h, input]) -> (grad_input, grad_old_h); (None, None) if it was not computed."""
    if not needs_grad_X:
        return None, None
    grad_old_h, grad_input = grad_X.split_with_sizes([state_size, grad_X.shape[1] - state_size], 1)
    return grad_input, grad_old_h


def _cell_save(ctx, args, output):
    ctx.save_for_backward(args[1], *output[2:])  # weights, then the backend's saved tensors


def _cell_gradients(ctx, grads, run_backward, needs):
    weights, *saved = ctx.saved_tensors
    needs_grad_X = needs[0] or needs[3]  # input or old_h
    grad_X, grad_weights, grad_bias, grad_old_cell = run_backward(grads[0], grads[1], weights, *saved,
                                                                  needs_grad_X)
    grad_input, grad_old_h = _split_grad_X(grad_X, grad_old_cell.shape[1], needs_grad_X)
    return grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell


def _sequence_save(ctx, args, output):
    input, weights, _, h0, _, lengths, reverse = args[:7]
    ctx.lengths, ctx.reverse = lengths, reverse
    # input, weights, h0 and output autograd holds anyway; then the backend's saved tensors
    ctx.save_for_backward(input, weights, h0, output[0], *output[3:])


def _sequence_gradients(ctx, grads, run_backward, needs):
    input, weights, h0, output, *saved = ctx.saved_tensors
    needs_input = needs[0]
    grad_input, grad_weights, grad_bias, grad_h0, grad_c0 = run_backward(
        grads[0], grads[1], grads[2], weights, input, h0, output, ctx.lengths, *saved, ctx.reverse, needs_input)
    return (grad_input if needs_input else None), grad_weights, grad_bias, grad_h0, grad_c0, None, None


CELL = Op(
    "cell", "", _CELL_FORWARD_SCHEMA, _CELL_BACKWARD_SCHEMA, arguments=5, outputs=2, saved_at=3, after_saved=1,
    has_steps=False, save=_cell_save, gradients=_cell_gradients,
    fake_forward=lambda kernels, args, needs_backward: _fake.cell_forward(kernels.saved_layout, args[0], args[3]),
    fake_backward=lambda grad_new_h, grad_new_cell, weights, saved, needs_grad_X:
    _fake.cell_backward(grad_new_h, weights, needs_grad_X),
)
SEQUENCE = Op(
    "sequence", "sequence_", _SEQUENCE_FORWARD_SCHEMA, _SEQUENCE_BACKWARD_SCHEMA, arguments=7, outputs=3,
    saved_at=8, after_saved=2, has_steps=True, save=_sequence_save, gradients=_sequence_gradients,
    # a version-2 backend saves what it always saves; lltm-core drops it
    fake_forward=lambda kernels, args, needs_backward: _fake.sequence_forward(
        kernels.saved_layout, args[0], args[3], needs_backward or not kernels.takes_needs_backward),
    fake_backward=lambda grad_output, grad_h_n, grad_c_n, weights, input, h0, output, lengths, saved, reverse,
    needs_grad_input: _fake.sequence_backward(input, weights, h0, needs_grad_input),
)
OPS = {op.name: op for op in (CELL, SEQUENCE)}


_NOTHING_SAVED = Kernels(None, None, lambda *sizes: {}, False)


def on_meta(op: Op, args: tuple) -> tuple:
    """``op``'s outputs for meta tensors: their shapes and dtype, nothing computed (nn.LSTM runs on meta too)."""
    return tuple(op.fake_forward(_NOTHING_SAVED, args, False)[:op.outputs])


def run_forward(kernels: Kernels, args: tuple, needs_backward: bool):
    """``kernels.forward`` on ``args`` with the signature its interface version has (v3 sequences: needs_backward)."""
    if kernels.takes_needs_backward:
        return kernels.forward(*args, needs_backward)
    return kernels.forward(*args)


# --- eager: one autograd.Function for every op ---------------------------------

_DOUBLE_BACKWARD = (
    "lltm: double backward (differentiating lltm's gradients again) is not supported: "
    "the backends' backward kernels are not differentiable"
)


def fail_if_differentiated(grads, sources):
    """``grads``, given a grad_fn that raises lltm's error if they are differentiated again.

    For a backward run with create_graph=True (the only time autograd runs one
    with grad mode on): the gradients themselves are fine; differentiating them
    again is what cannot work.  The error node's edges lead to ``sources`` (the
    call's arguments and incoming gradients that require grad), so that
    ``torch.autograd.grad(g, inputs)`` reaches it and raises, rather than finding
    ``inputs`` unused (or, with allow_unused=True, answering None for a gradient
    that is not zero).  As torch's once_differentiable does, but not it: that
    costs microseconds on every call, its message does not say which function
    refused, and its gradients lead to fresh leaves only.
    """
    sources = [t for t in sources if isinstance(t, torch.Tensor) and t.requires_grad]
    fail = torch._C._functions.DelayedError(_DOUBLE_BACKWARD.encode(), len(grads) + len(sources))
    with torch.enable_grad():
        return fail(*(g if g is None else g.detach().requires_grad_() for g in grads), *sources)[:len(grads)]


class _KernelFunction(torch.autograd.Function):
    """``apply(op, backend, *args)``: ``op``'s forward on ``backend``'s kernels, its backward on theirs."""

    @staticmethod
    def forward(ctx, op: Op, backend: Backend, *args):
        kernels = backend.kernels[op.name]
        output = kernels.forward(*args, True) if kernels.takes_needs_backward else kernels.forward(*args)
        ctx.op, ctx.kernels, ctx.args = op, kernels, args  # args: see fail_if_differentiated
        op.save(ctx, args, output)
        return tuple(output[:op.outputs])

    @staticmethod
    def backward(ctx, *grads):
        op = ctx.op
        if not torch.is_grad_enabled():
            return (None, None, *op.gradients(ctx, grads, ctx.kernels.backward, ctx.needs_input_grad[2:]))
        with torch.no_grad():  # create_graph=True: see fail_if_differentiated
            gradients = op.gradients(ctx, grads, ctx.kernels.backward, ctx.needs_input_grad[2:])
        return (None, None, *fail_if_differentiated(gradients, (*ctx.args, *grads)))

    @staticmethod
    def jvp(ctx, *tangents):
        raise RuntimeError(
            "lltm: forward-mode AD (torch.autograd.forward_ad, torch.func.jvp) is not supported: "
            "the backends have no forward-mode derivative"
        )


# Function.apply's Python wrapper only adds support for functorch transforms
# (vmap, grad), which this Function does not implement anyway (no
# setup_context); skipping it saves about 10 us a call at the seed's size.
# needs_autograd() raises lltm's own error where a transform would need it.
apply = super(torch.autograd.Function, _KernelFunction).apply
_functorch_active = torch._C._are_functorch_transforms_active

_FUNCTORCH = (
    "lltm: torch.func transforms (grad, jvp, vjp, jacrev, and vmap over a call that needs a gradient) "
    "cannot differentiate lltm: the backends' kernels have only the backward that torch.autograd runs. "
    "Use .backward() or torch.autograd.grad; vmap works on calls that need no gradient (under torch.no_grad())"
)


def needs_autograd(input, weights, bias, h, c) -> bool:
    """Whether a call on these tensors must go through :func:`apply` (else: the kernels alone).

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


# --- operators, for torch.compile and torch.export -----------------------------


def formula(op: Op, run_backward):
    """(setup_context, backward) for ``torch.library.register_autograd`` on a forward operator of ``op``.

    Shared by lltm's wrapper operators and a backend's own: both save what the
    eager Function saves, and ``backward(ctx, grads)`` calls ``run_backward``,
    the backend's backward kernel with its own signature (saved tensors spread).
    """

    def setup_context(ctx, inputs, output):
        op.save(ctx, inputs, output)
        ctx.output_shapes = [t.shape for t in output[:op.outputs]]

    def backward(ctx, grads):
        # One gradient per argument the operator was called with: the dispatcher drops trailing
        # arguments equal to their defaults, so when lltm chose the backend (named=None) there
        # may be fewer than the schema has.
        n_args = len(ctx.needs_input_grad)
        grads = grads[:op.outputs]
        given = [g for g in grads if g is not None]
        if not given:
            return (None,) * n_args
        # torch hands an operator's backward zeros for an output nobody differentiated (torch 2.13
        # does, test_one_output_used checks the results); torch.library does not promise it.
        grads = [given[0].new_zeros(shape) if g is None else g for g, shape in zip(grads, ctx.output_shapes)]
        return (*op.gradients(ctx, grads, run_backward, ctx.needs_input_grad), None, None)[:n_args]

    return setup_context, backward


_registered_ops: dict[tuple[str, str], list] = {}  # (op, backend name) -> [its kernels now, forward_op, backward_op]
_registered_ops_lock = threading.Lock()


def register(op: Op, backend: Backend):
    """(forward_op, backward_op) of lltm's operators ``lltm::<name>_<op>*`` for ``backend``, made once.

    torch.library cannot replace an operator, so the operators call the kernels
    stored here.  Those follow the registry: after refresh() an entry point's
    factory may return new kernel objects for the same backend, and they take
    over.  Any other backend with the same name but other kernels (one built by
    hand and passed as backend=) is refused rather than given the first one's.
    """
    key = (op.name, backend.name)
    kernels = backend.kernels[op.name]
    entry = _registered_ops.get(key)
    if entry is None:
        with _registered_ops_lock:
            entry = _registered_ops.get(key)
            if entry is None:
                entry = _registered_ops[key] = [kernels, *_define(op, backend.name, lambda: _registered_ops[key][0])]
    if entry[0] != kernels:
        if not _registry.is_loaded_from_entry_point(backend):
            raise BackendError(
                f"lltm: the custom operators lltm::{backend.name}_* of this process already run "
                f"another backend named {backend.name!r}, and torch.library cannot replace them: "
                f"give this backend a name of its own"
            )
        entry[0] = kernels
    return entry[1], entry[2]


def register_graph_operators(backend: Backend) -> None:
    """lltm's operators ``lltm::<name>_*`` for ``backend``'s kernels that are not operators of their own: what
    a graph traced on it calls, and what ``torch.export.load`` must find registered (:func:`register`)."""
    for op in OPS.values():
        kernels = backend.kernels.get(op.name)
        if kernels is not None and not has_operators(kernels):
            register(op, backend)


def get_backend(name: str | None = None, *, device=None, dtype=None) -> Backend:
    """The backend called ``name``, or the one lltm-core would choose.

    ``device`` and ``dtype`` (default: ``torch.get_default_dtype()``) say which
    tensors the backend must take.  The default device is the CPU, except for a
    named backend that does not run there: ``get_backend("cuda")`` means
    lltm-cuda for CUDA tensors, and is checked on the first device it declares.
    With a name, the named backend is checked against them and an error says
    why it cannot take them; it is never swapped for another.

    The backend is then loaded, with every operator a traced graph of it calls
    (its own library's, or lltm's ``lltm::<name>_*`` for Python kernels): call
    it before ``torch.export.load`` of a saved program, since ``import lltm_core``
    loads no backend and tracing nothing registers nothing.
    """
    device_type = torch.device(device).type if device is not None else _default_device_type(name)
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    chosen = _registry.select(device_type, dtype, name, source="get_backend()")
    register_graph_operators(chosen)
    return chosen


def _default_device_type(name: str | None) -> str:
    rec = _discovery.resolve(name) if name is not None else None
    if rec is not None and rec.available and "cpu" not in rec.backend.devices:
        return min(rec.backend.devices)
    return "cpu"  # an unavailable or unknown backend: select() says why


def _forward_arguments(op: Op, args: tuple):
    """(the op's own arguments, named, needs_backward) of a call of its forward operator.

    The dispatcher drops trailing arguments equal to their defaults: those are filled in here.
    """
    rest = args[op.arguments:]
    return args[:op.arguments], (rest[0] if rest else None), (rest[1] if len(rest) > 1 else True)


def _define(op: Op, name: str, kernels_now: Callable[[], Kernels]):
    def forward_impl(*args):
        args, named, needs_backward = _forward_arguments(op, args)
        if named is None:
            input = args[0]
            check_traced_choice(name, op.call(input.device.type, input.dtype, input, args[3].shape[1], needs_backward))
        return list(run_forward(kernels_now(), args, needs_backward))

    def backward_impl(*args):
        return list(kernels_now().backward(*args[:op.saved_at], *args[op.saved_at], *args[op.saved_at + 1:]))

    forward_op = torch.library.custom_op(f"lltm::{op.operator_name(name, 'forward')}", forward_impl,
                                         mutates_args=(), schema=op.forward_schema)
    backward_op = torch.library.custom_op(f"lltm::{op.operator_name(name, 'backward')}", backward_impl,
                                          mutates_args=(), schema=op.backward_schema)

    @forward_op.register_fake
    def _(*args):
        args, _, needs_backward = _forward_arguments(op, args)
        return op.fake_forward(kernels_now(), args, needs_backward)

    backward_op.register_fake(op.fake_backward)

    def run_backward(*args):  # the kernel's signature, onto the operator's (its saved tensors in one list)
        saved_end = len(args) - op.after_saved
        return backward_op(*args[:op.saved_at], list(args[op.saved_at:saved_end]), *args[saved_end:])

    setup_context, backward = formula(op, run_backward)
    forward_op.register_autograd(lambda ctx, grads: backward(ctx, grads), setup_context=setup_context)
    _flops.register_wrappers(op, name)  # FlopCounterMode then counts the GEMMs of the kernels inside, not 0
    return forward_op, backward_op


def check_traced_choice(traced: str, call: Call) -> None:
    """Raise unless lltm would still choose ``traced`` for this call (see _registry.compile_hint)."""
    now = _registry.select(call.device_type, call.dtype, call=call)  # raises itself if nothing can take it
    if now.name != traced:
        raise BackendError(
            f"lltm: this torch.compile'd code was traced to run backend {traced!r}, but lltm now chooses "
            f"{now.name!r} ({_registry.why_chosen(now)}). A compiled graph keeps the backend chosen when it was traced: call "
            f"torch._dynamo.reset() after changing LLTM_BACKEND, LLTM_DISABLE_BACKENDS or the installed "
            f"backends, or pass backend= to lltm()"
        )


def has_operators(kernels: Kernels | None) -> bool:
    """Whether ``kernels`` are a backend's own ``torch.library`` operators (forward and backward)."""
    return (kernels is not None and isinstance(kernels.forward, torch._ops.OpOverload)
            and isinstance(kernels.backward, torch._ops.OpOverload))


_given_autograd: set = set()  # the backends' forward operators given a backward here
_given_autograd_lock = threading.Lock()


def register_operator_autograd(backend: Backend) -> None:
    """Give ``backend``'s own forward operators lltm's backward :func:`formula`, once.

    Done when a graph first holds them, not when the backend loads: an eager
    call skips torch.library's Python autograd kernel, a few microseconds.
    """
    for op in OPS.values():
        kernels = backend.kernels.get(op.name)
        if not has_operators(kernels):
            continue
        with _given_autograd_lock:
            if kernels.forward in _given_autograd:
                continue
            setup_context, backward = formula(op, kernels.backward)
            torch.library.register_autograd(kernels.forward, lambda ctx, *grads, _b=backward: _b(ctx, grads),
                                            setup_context=setup_context)
            _given_autograd.add(kernels.forward)
