"""lltm-ref: the LLTM in plain PyTorch operators, with a hand-written backward.

It runs wherever PyTorch runs (any device, any floating dtype) and is the
fallback lltm-core chooses when no fused backend can take a call.  This module
must not import lltm_core at import time: lltm-core depends on lltm-ref, so the
import happens inside :func:`load_backend`, which only lltm-core calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["forward", "backward", "saved_layout", "load_backend"]

# The derivative kernels autograd itself uses, bound once: resolving
# torch.ops.aten.<name> on every call costs more than the arithmetic here.
_tanh_backward = torch.ops.aten.tanh_backward.default
_sigmoid_backward = torch.ops.aten.sigmoid_backward.default
_elu_backward = torch.ops.aten.elu_backward.default


def saved_layout(batch: int, input_features: int, state_size: int) -> dict:
    return {
        "X": (batch, state_size + input_features),  # cat([old_h, input]), for grad_weights
        "sig_gates": (batch, 2 * state_size),  # [sigmoid(input gate) | sigmoid(output gate)]
        "candidate": (batch, state_size),  # elu(candidate gate); elu' is recovered from it
        "tanh_cell": (batch, state_size),  # tanh(new_cell)
    }


def forward(input, weights, bias, old_h, old_cell):
    # Fewer, larger ops than the textbook version: both sigmoids in one call,
    # addcmul for the cell update.  At the seed's size (B16 S128) per-op
    # dispatch cost, not arithmetic, is what the time is made of.
    S = old_h.shape[1]
    X = torch.cat([old_h, input], dim=1)
    sig_pre, candidate_pre = F.linear(X, weights, bias).split([2 * S, S], dim=1)
    sig_gates = torch.sigmoid(sig_pre)
    input_gate, output_gate = sig_gates.chunk(2, dim=1)
    candidate = F.elu(candidate_pre)
    new_cell = torch.addcmul(old_cell, candidate, input_gate)
    tanh_cell = torch.tanh(new_cell)
    new_h = tanh_cell * output_gate
    return new_h, new_cell, X, sig_gates, candidate, tanh_cell


def backward(grad_h, grad_cell, weights, X, sig_gates, candidate, tanh_cell, needs_grad_X):
    input_gate, output_gate = sig_gates.chunk(2, dim=1)
    # d new_cell: through new_h = tanh(new_cell) * o, plus the direct gradient.
    grad_new_cell = _tanh_backward(grad_h * output_gate, tanh_cell).add_(grad_cell)
    grad_sig = _sigmoid_backward(
        torch.cat([candidate * grad_new_cell, tanh_cell * grad_h], dim=1), sig_gates
    )
    # elu'(u) from the result: 1 where elu(u) > 0, elu(u) + 1 elsewhere.
    grad_candidate = _elu_backward(input_gate * grad_new_cell, 1.0, 1.0, 1.0, True, candidate)
    grad_gates = torch.cat([grad_sig, grad_candidate], dim=1)
    return (
        grad_gates.mm(weights) if needs_grad_X else weights.new_empty(0),
        grad_gates.t().mm(X),
        grad_gates.sum(0),
        grad_new_cell,
    )


def load_backend():
    from lltm_core.backend import Backend

    return Backend(
        name="ref",
        forward=forward,
        backward=backward,
        saved_layout=saved_layout,
        devices=frozenset({"cpu", "cuda", "mps", "xpu"}),
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64}),
        priority=0,
        interface_versions=(1,),
        description="plain PyTorch operators (the fallback; runs anywhere)",
    )
