"""A call traced by torch.compile or torch.export: which backend, and what the graph holds for it.

The backend is chosen while tracing and baked into the graph.  Reading the
registry's ``compile_hint`` / ``compile_generation`` makes Dynamo guard on
them, so a later ``use_backend()`` block or ``refresh()`` retraces.

What the graph holds follows one rule (``lltm_core.backend``, "Traced graphs
and deployment"), decided by :func:`_route`:

* ``OPERATOR``: the backend's kernels are ``torch.library`` operators; the
  graph calls them, and ``_ops.register_operator_autograd`` gives them their
  backward.  No Python is needed to run such a graph.
* ``COMPOSITE``: under torch.export for inference (nothing needs a gradient),
  a backend of ATen compositions is traced through.
* ``WRAPPED``: lltm's Python custom operator ``lltm::<name>_*``
  (``_ops.register``).  When ``backend=`` named nothing it checks at run time
  that lltm would still choose the traced backend (``_ops.check_traced_choice``).
* ``LOOP`` (sequences only): a backend without sequence kernels runs the
  cell once per step, each step traced as the cell is.

lltm_core imports this module only when a call is first traced (Dynamo runs
that import for real): ``torch.compiler.assume_constant_result`` imports
torch._dynamo, over a second, which eager calls never need.  It imports
neither ``_cell`` nor ``_sequence``, which import it.
"""

from __future__ import annotations

import warnings

import torch

from . import _ops, _registry
from ._callers import user_stacklevel
from ._ops import OPS, Op
from .backend import Backend, Call

OPERATOR, COMPOSITE, WRAPPED, LOOP = "operator", "composite", "wrapped", "loop"


def forward(op: Op, tensors: tuple, extra: tuple, backend):
    """The traced forward of ``op``; returns the kernel's outputs, or None for ``LOOP`` (the caller loops the cell).

    ``tensors`` are (input, weights, bias, h, c), contiguous; ``extra`` the
    sequence's (lengths, reverse).
    """
    needs = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    input, h = tensors[0], tensors[3]
    device_type, dtype = input.device.type, input.dtype
    sizes = _traced_sizes(op, device_type, dtype, backend, input, h.shape[1])
    route, name, operator, takes_needs_backward = _route(op.name, device_type, dtype, backend, sizes, needs,
                                                         _registry.compile_hint, _registry.compile_generation)
    if route == LOOP:
        return None
    if route == OPERATOR:  # "namespace::name.overload"
        namespace, rest = operator.split("::")
        op_name, overload = rest.split(".")
        kernel = getattr(getattr(getattr(torch.ops, namespace), op_name), overload)
        return kernel(*tensors, *extra, *((needs,) if takes_needs_backward else ()))
    if route == COMPOSITE:  # torch.export traces the kernels themselves (non-strict export runs this Python)
        chosen = _registry.choose(device_type, dtype, backend, _call(op, device_type, dtype, sizes, needs))
        if op.has_steps and any(isinstance(size, torch.SymInt) for size in input.shape[:2]):
            # Its time loop is Python: export would unroll it for one length, then fail on the Dim.
            raise _registry.BackendError(
                f"lltm: backend {chosen.name!r} runs a sequence as a Python loop over its steps, which "
                f"torch.export unrolls, so the time and batch sizes cannot be dynamic (torch.export.Dim). "
                f"Export with static shapes, or on a backend with compiled operators (lltm info lists them, "
                f"e.g. LLTMLayer(..., backend='cpu'))"
            )
        return _ops.run_forward(chosen.kernels[op.name], (*tensors, *extra), needs)
    named = backend if isinstance(backend, str) else backend.name if isinstance(backend, Backend) else None
    return getattr(torch.ops.lltm, op.operator_name(name, "forward"))(*tensors, *extra, named, needs)


def _traced_sizes(op: Op, device_type, dtype, backend, input, state_size):
    """The call's sizes, (batch, input_features, state_size, steps), as constants; None when the choice cannot
    depend on them.

    A plain tuple: what assume_constant_result passes through intact (:func:`_call` makes the Call).
    Only a choice that depends on the call specializes the graph on the shape:
    where no candidate declines calls, dynamic shapes stay dynamic.
    """
    if not _depends_on_call(device_type, dtype, backend, _registry.compile_hint, _registry.compile_generation):
        return None
    # Dynamo turns a symbolic size into a constant (guarding on its value, so another size
    # retraces) when it is formatted; int() alone leaves it symbolic, which
    # assume_constant_result cannot take.  The guard is the point: the choice depends on the size.
    steps, (batch, features) = (input.shape[0], input.shape[1:]) if op.has_steps else (None, input.shape)
    return (int(f"{batch}"), int(f"{features}"), int(f"{state_size}"), None if steps is None else int(f"{steps}"))


def _call(op: Op, device_type: str, dtype: torch.dtype, sizes: tuple | None, needs: bool) -> Call | None:
    return None if sizes is None else Call(op.name, device_type, dtype, *sizes, bool(needs))


@torch.compiler.assume_constant_result
def _depends_on_call(device_type: str, dtype: torch.dtype, backend, compile_hint, compile_generation) -> bool:
    return _registry.depends_on_call(device_type, dtype, backend)


@torch.compiler.assume_constant_result
def _route(op_name: str, device_type: str, dtype: torch.dtype, backend, sizes, needs: bool, compile_hint,
           compile_generation) -> tuple:
    """``(route, backend name, its operator or None, whether that takes needs_backward)``, constant in the graph.

    The hint arguments are read so that Dynamo guards on them.
    """
    op = OPS[op_name]
    chosen = _registry.choose(device_type, dtype, backend, _call(op, device_type, dtype, sizes, needs))
    kernels = chosen.kernels.get(op.name)
    if kernels is None:
        return (LOOP, chosen.name, None, False)
    if _ops.has_operators(kernels):
        _ops.register_operator_autograd(chosen)
        return (OPERATOR, chosen.name, f"{kernels.forward._schema.name}.{kernels.forward._overloadname}",
                kernels.takes_needs_backward)
    exporting = torch.compiler.is_exporting()
    # Traced through for inference only: with a backward to follow, autograd would have to see
    # through the kernels' out= operators, and the backend's own backward would not run.
    if exporting and chosen.composite and not needs:
        return (COMPOSITE, chosen.name, None, False)
    if exporting:
        hint = (" Export under torch.no_grad() to trace its ATen operators instead." if chosen.composite else
                " To deploy without Python, export on a backend with compiled operators (lltm info lists "
                "them), e.g. LLTMLayer(..., backend='cpu').")
        warnings.warn(
            f"lltm: backend {chosen.name!r} has Python kernels, so the exported graph calls lltm's Python "
            f"operator lltm::{op.operator_name(chosen.name, 'forward')}: it runs where "
            f"Python runs (torch._inductor.aoti_load_package) but not from C++.{hint}",
            stacklevel=user_stacklevel(),
        )
    _ops.register(op, chosen)  # registers torch.ops.lltm.<name>_<op>forward on first use
    return (WRAPPED, chosen.name, None, False)
