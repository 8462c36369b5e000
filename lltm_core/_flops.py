"""FLOP formulas for ``torch.utils.flop_counter.FlopCounterMode``: lltm's operators count their GEMMs.

FlopCounterMode counts the ATen operators it has formulas for (mm, addmm, ...) and sees any other
operator as opaque, counting 0: a backend's own (``torch.ops.lltm_cpu.sequence_forward``) and
lltm-core's wrappers of Python kernels (``lltm::ref_sequence_forward``, under torch.compile).
Each gets a formula here, that counts what torch counts for mm, 2*M*N*K a GEMM, and leaves the
pointwise work out, as torch leaves out an LSTM's.  With G = 2 * B * 3S * (S + I), the GEMM of
one step (the gates, from [h, x] and the weights, (3S, S + I)):

* cell forward: G
* cell backward: G for grad_weights, and G more for grad_X (grad of [old_h, input]) when
  ``needs_grad_X``
* sequence forward: T * G
* sequence backward: T * G for grad_weights, T * 2 * B * 3S * S for the gradient through W_h that
  carries the state back step by step, and T * 2 * B * 3S * I for grad_input when
  ``needs_grad_input``

so a backward that computes every input's gradient counts twice its forward.  These are the
contract's GEMMs whatever a backend does (one input projection for all steps, or one a step):
lltm-ref's ATen operators count the same, its sequence's in-place ``addmm_`` included
(:data:`IN_PLACE_GEMMS`).
"""

from __future__ import annotations

import torch
from torch.utils import _python_dispatch, flop_counter


def _gemm(batch: int, weights) -> int:
    """2*M*N*K of the step's GEMM: (batch, S + I) x (S + I, 3S), ``weights`` the shape (3S, S + I)."""
    return 2 * batch * weights[0] * weights[1]


def _sequence_backward(a) -> int:
    steps, batch, features = a["input"]
    three_s, total = a["weights"]
    through_weights = total if a["needs_grad_input"] else total - features  # W_h always, W_x if asked
    return steps * (_gemm(batch, a["weights"]) + 2 * batch * three_s * through_weights)


#: The contract's operator names (lltm_core/include/lltm_schema.h) -> FLOPs, from their arguments
#: by name (tensors as their shapes).  lltm's wrapper operators take the same names.
FORMULAS = {
    "forward": lambda a: _gemm(a["input"][0], a["weights"]),
    "backward": lambda a: _gemm(a["grad_new_h"][0], a["weights"]) * (2 if a["needs_grad_X"] else 1),
    "sequence_forward": lambda a: a["input"][0] * _gemm(a["input"][1], a["weights"]),
    "sequence_backward": _sequence_backward,
}


#: In-place GEMMs torch's flop counter has no formula for -> the operator whose formula counts them.
#: lltm-ref's sequence forward adds each step's GEMM into its gates buffer with ``addmm_``, which torch
#: counts 0; a counted operator there (``mm`` then ``add_``, or ``addmm`` and the steps stacked) would
#: cost an allocation a step.  Given here, once lltm-core is imported, for every FlopCounterMode made after.
IN_PLACE_GEMMS = {torch.ops.aten.addmm_: torch.ops.aten.addmm}
for _in_place, _counted_as in IN_PLACE_GEMMS.items():
    flop_counter.flop_registry.setdefault(_in_place, flop_counter.flop_registry[_counted_as])


def register(packet: torch._ops.OpOverloadPacket, kind: str) -> None:
    """Give the operator ``packet`` the formula of ``kind`` (a key of :data:`FORMULAS`), once.

    A FlopCounterMode copies torch's formulas when it is made, and a backend loads at its first
    call, often inside the mode (``with FlopCounterMode(): model(x)`` in a fresh process): the
    modes active now learn the formula too.  One made earlier and entered later does not.
    """
    if packet in flop_counter.flop_registry:
        return
    schema = packet.default._schema
    names = [argument.name for argument in schema.arguments]
    defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    formula = FORMULAS[kind]

    def flops(*args, out_shape=None, **kwargs) -> int:
        return formula({**defaults, **dict(zip(names, args)), **kwargs})

    counted = flop_counter.register_flop_formula(packet)(flops)
    active_modes = getattr(_python_dispatch, "_get_current_dispatch_mode_stack", list)  # torch's, private
    for mode in active_modes():
        counter = getattr(mode, "counter", None)  # the FlopCounterMode of its dispatch mode
        if isinstance(counter, flop_counter.FlopCounterMode):
            counter.flop_registry.setdefault(packet, counted)


def register_namespace(namespace: str, kinds) -> None:
    """The formulas of a backend's operators ``torch.ops.<namespace>.<kind>``, for each of ``kinds``."""
    for kind in kinds:
        register(getattr(getattr(torch.ops, namespace), kind), kind)


def register_wrappers(op, backend_name: str) -> None:
    """lltm-core's operators ``lltm::<backend>_<op>forward`` and ``_backward`` (``_ops.register``): the op's formulas."""
    for half in ("forward", "backward"):
        register(getattr(torch.ops.lltm, op.operator_name(backend_name, half)), op.operator_prefix + half)
