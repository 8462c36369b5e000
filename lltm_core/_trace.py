"""A call traced by torch.compile or torch.export: which backend, and what the graph holds for it.

The backend is chosen while tracing and baked into the graph.  Reading the
registry's ``compile_hint`` / ``compile_generation`` makes Dynamo guard on
them, so a later ``use_backend()`` block or ``refresh()`` retraces.

What the graph holds follows one rule (``lltm_core.backend``, "Traced graphs
and deployment"), decided by :func:`_route`:

* ``OPERATOR``: the backend's kernels are ``torch.library`` operators; the
  graph calls them, and :func:`register_operator_autograd` gives them their
  backward here.  No Python is needed to run such a graph.
* ``COMPOSITE``: under torch.export for inference (nothing needs a gradient),
  a backend of ATen compositions is traced through.
* ``WRAPPED``: lltm's Python custom operator ``lltm::<name>_*``
  (``_autograd.ops_for``, ``_sequence.sequence_ops_for``).  When ``backend=``
  named nothing it checks at run time that lltm would still choose the traced
  backend (``_autograd.check_traced_choice``).
* ``LOOP`` (sequences only): a backend without sequence kernels runs the
  cell once per step, each step traced as the cell is.

lltm_core imports this module only when a call is first traced (Dynamo runs
that import for real): ``torch.compiler.assume_constant_result`` imports
torch._dynamo, over a second, which eager calls never need.
"""

from __future__ import annotations

import threading
import warnings

import torch

from . import _autograd, _registry
from .backend import Backend

OPERATOR, COMPOSITE, WRAPPED, LOOP = "operator", "composite", "wrapped", "loop"


def forward(family: str, tensors: tuple, extra: tuple, backend, needs: bool, steps: int | None = None):
    """The traced forward of ``family`` ("cell" or "sequence"); returns the kernel's outputs.

    ``tensors`` are (input, weights, bias, h, c), contiguous; ``extra`` the
    sequence's (lengths, reverse); ``needs`` whether a backward will follow.
    Returns None for ``LOOP``: the caller loops the cell.
    """
    input, h = tensors[0], tensors[3]
    batch, features = (input.shape[1], input.shape[2]) if family == "sequence" else input.shape
    call = _traced_call(family, input.device.type, input.dtype, backend, batch, features, h.shape[1], steps, needs)
    route, *where = _route(family, input.device.type, input.dtype, backend, call, bool(needs),
                           _registry.compile_hint, _registry.compile_generation)
    if route == LOOP:
        return None
    if route == OPERATOR:
        namespace, name, overload, takes_needs_backward = where
        kernel = getattr(getattr(getattr(torch.ops, namespace), name), overload)
        return kernel(*tensors, *extra, *((needs,) if takes_needs_backward else ()))
    if route == COMPOSITE:  # torch.export traces the kernels themselves (non-strict export runs this Python)
        chosen = _registry.choose(input.device.type, input.dtype, backend, call)
        if family == "cell":
            return chosen.forward(*tensors)
        if any(isinstance(size, torch.SymInt) for size in input.shape[:2]):
            # Its time loop is Python: export would unroll it for one length, then fail on the Dim.
            raise _registry.BackendError(
                f"lltm: backend {chosen.name!r} runs a sequence as a Python loop over its steps, which "
                f"torch.export unrolls, so the time and batch sizes cannot be dynamic (torch.export.Dim). "
                f"Export with static shapes, or on a backend with compiled operators (lltm info lists them, "
                f"e.g. LLTMLayer(..., backend='cpu'))"
            )
        from ._sequence import run_forward

        return run_forward(chosen, *tensors, *extra, needs)
    (name,) = where
    named = backend if isinstance(backend, str) else backend.name if isinstance(backend, Backend) else None
    op = getattr(torch.ops.lltm, f"{name}_forward" if family == "cell" else f"{name}_sequence_forward")
    return op(*tensors, *extra, named, needs)


def _traced_call(family, device_type, dtype, backend, batch, input_features, state_size, steps, needs_backward):
    """The call tuple for the choice; None when the choice cannot depend on it.

    Only a choice that depends on the call specializes the graph on the shape:
    where no candidate declines calls, dynamic shapes stay dynamic.
    """
    if not _depends_on_call(device_type, dtype, backend, _registry.compile_hint, _registry.compile_generation):
        return None
    # Dynamo turns a symbolic size into a constant (guarding on its value, so another size
    # retraces) when it is formatted; int() alone leaves it symbolic, which
    # assume_constant_result cannot take.  The guard is the point: the choice depends on the size.
    sizes = [int(f"{d}") for d in (batch, input_features, state_size) + ((steps,) if steps is not None else ())]
    return (family, *sizes[:3], sizes[3] if steps is not None else None, bool(needs_backward))


@torch.compiler.assume_constant_result
def _depends_on_call(device_type: str, dtype: torch.dtype, backend, compile_hint, compile_generation) -> bool:
    return _registry.depends_on_call(device_type, dtype, backend)


@torch.compiler.assume_constant_result
def _route(family: str, device_type: str, dtype: torch.dtype, backend, call, needs: bool, compile_hint,
           compile_generation) -> tuple:
    """``(route, *where)``, constant in the graph; the hint arguments are read so that Dynamo guards on them."""
    chosen = _registry.choose(device_type, dtype, backend, call)
    if family == "sequence" and not chosen.has_sequence_kernels:
        return (LOOP, chosen.name)
    forward_kernel, backward_kernel = ((chosen.forward, chosen.backward) if family == "cell"
                                       else (chosen.sequence_forward, chosen.sequence_backward))
    if isinstance(forward_kernel, torch._ops.OpOverload) and isinstance(backward_kernel, torch._ops.OpOverload):
        register_operator_autograd(chosen)
        namespace, name = forward_kernel._schema.name.split("::")
        takes_needs_backward = family == "sequence" and chosen.takes_needs_backward
        return (OPERATOR, namespace, name, forward_kernel._overloadname, takes_needs_backward)
    exporting = torch.compiler.is_exporting()
    # Traced through for inference only: with a backward to follow, autograd would have to see
    # through the kernels' out= operators, and the backend's own backward would not run.
    if exporting and chosen.composite and not needs:
        return (COMPOSITE, chosen.name)
    if exporting:
        hint = (" Export under torch.no_grad() to trace its ATen operators instead." if chosen.composite else
                " To deploy without Python, export on a backend with compiled operators (lltm info lists "
                "them), e.g. LLTMLayer(..., backend='cpu').")
        warnings.warn(
            f"lltm: backend {chosen.name!r} has Python kernels, so the exported graph calls lltm's Python "
            f"operator lltm::{chosen.name}_{'' if family == 'cell' else 'sequence_'}forward: it runs where "
            f"Python runs (torch._inductor.aoti_load_package) but not from C++.{hint}",
            stacklevel=2,
        )
    if family == "cell":
        _autograd.ops_for(chosen)  # registers torch.ops.lltm.<name>_forward on first use
    else:
        from ._sequence import sequence_ops_for

        sequence_ops_for(chosen)
    return (WRAPPED, chosen.name)


# --- autograd on a backend's own operators -------------------------------------

_registered: set = set()  # the forward operators given a backward here
_registered_lock = threading.Lock()


def register_operator_autograd(backend: Backend) -> None:
    """Give ``backend``'s forward operators (those that are OpOverloads) lltm's backward formula, once.

    Done when a graph first holds them, not when the backend loads: an eager
    call skips torch.library's Python autograd kernel, a few microseconds.
    """
    from ._sequence import sequence_formula

    # the formulas hand the backward kernel its saved tensors as one list, at this position
    pairs = [(backend.forward, backend.backward, _autograd.cell_formula, 3)]
    if backend.has_sequence_kernels:
        pairs.append((backend.sequence_forward, backend.sequence_backward, sequence_formula, 8))
    for forward_op, backward_op, formula, saved_at in pairs:
        if not (isinstance(forward_op, torch._ops.OpOverload) and isinstance(backward_op, torch._ops.OpOverload)):
            continue
        with _registered_lock:
            if forward_op in _registered:
                continue
            setup_context, backward = formula(_splat_saved(backward_op, saved_at))
            torch.library.register_autograd(forward_op, lambda ctx, *grads, _b=backward: _b(ctx, grads),
                                            setup_context=setup_context)
            _registered.add(forward_op)


def _splat_saved(backward_op, saved_at: int):
    """The backward operator, called with the list of saved tensors at ``saved_at`` spread out."""
    def run(*args):
        return backward_op(*args[:saved_at], *args[saved_at], *args[saved_at + 1:])

    return run
