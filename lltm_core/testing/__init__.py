"""The conformance kit: checks any lltm backend against the reference math.

Run it against an installed backend with::

    pytest --pyargs lltm_core.testing --lltm-backend NAME [--lltm-device cuda] [--lltm-dtype float16]

The oracle is :func:`reference_lltm`, the tutorial's eager PyTorch formula
differentiated by autograd in float64: independent of every backend's
hand-written backward, lltm-ref's included.

This module also holds the helpers the kit, the benchmarks and the CLI share.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "reference_lltm", "SeedLLTM", "make_inputs", "tolerance", "max_rel_error", "compare_with_reference",
    "reference_sequence", "reference_layer", "make_sequence_inputs",
]


def reference_lltm(input, weights, bias, old_h, old_cell):
    """The tutorial's LLTM forward in plain PyTorch operators (autograd does the backward)."""
    X = torch.cat([old_h, input], dim=1)
    gate_weights = F.linear(X, weights, bias)
    gates = gate_weights.chunk(3, dim=1)
    input_gate = torch.sigmoid(gates[0])
    output_gate = torch.sigmoid(gates[1])
    candidate_cell = F.elu(gates[2])
    new_cell = old_cell + candidate_cell * input_gate
    new_h = torch.tanh(new_cell) * output_gate
    return new_h, new_cell


class SeedLLTM(torch.nn.Module):
    """The tutorial's pure-PyTorch module: the baseline every benchmark compares against.

    Same parameter names and shapes as :class:`lltm_core.LLTM`, so their
    state_dicts are interchangeable.
    """

    def __init__(self, input_features: int, state_size: int, *, device=None, dtype=None):
        super().__init__()
        self.input_features = input_features
        self.state_size = state_size
        self.weights = torch.nn.Parameter(
            torch.empty(3 * state_size, input_features + state_size, device=device, dtype=dtype)
        )
        self.bias = torch.nn.Parameter(torch.empty(3 * state_size, device=device, dtype=dtype))
        stdv = 1.0 / math.sqrt(state_size)
        for p in self.parameters():
            p.data.uniform_(-stdv, +stdv)

    def forward(self, input, state):
        old_h, old_cell = state
        return reference_lltm(input, self.weights, self.bias, old_h, old_cell)


def make_inputs(batch, input_features, state_size, *, dtype=torch.float32, device="cpu", generator=None, requires_grad=True):
    """Fresh random (input, weights, bias, old_h, old_cell).

    Weights are scaled so the gates land on both sides of zero and in the
    sigmoids' curved region: both branches of elu and real tanh/sigmoid
    derivatives get exercised, never just the linear part near zero.
    """
    S, I, B = state_size, input_features, batch

    def randn(*shape, scale=1.0):
        t = torch.randn(*shape, generator=generator, dtype=torch.float64) * scale
        return t.to(device=device, dtype=dtype).requires_grad_(requires_grad)

    return (
        randn(B, I),
        randn(3 * S, S + I, scale=1.5 / math.sqrt(S + I)),
        randn(3 * S, scale=0.5),
        randn(B, S),
        randn(B, S),
    )


# Largest error, relative to the largest reference magnitude (at least 1), that
# each dtype may show against the float64 oracle on the same (rounded) inputs.
# The half types get ten units of their rounding (finfo.eps): over 1000 seeds of every layer case
# lltm-ref's worst is 7.0 (float16) and 6.5 (bfloat16) units, benchmarks/results/kit_errors.md.
_TOLERANCE = {
    torch.float64: 1e-10,
    torch.float32: 2e-5,
    torch.float16: 10 * torch.finfo(torch.float16).eps,
    torch.bfloat16: 10 * torch.finfo(torch.bfloat16).eps,
}


def tolerance(dtype: torch.dtype) -> float:
    return _TOLERANCE[dtype]


def max_rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.shape != want.shape:
        raise AssertionError(f"shape {tuple(got.shape)} != expected {tuple(want.shape)}")
    if want.numel() == 0:
        return 0.0
    want = want.double()
    scale = max(1.0, want.abs().max().item())
    # A NaN in either is an infinite error, so that `error > tol`, `error <= tol` and max() all
    # see it: a NaN compares false both ways and would slip through the first and the last.
    diff = (got.double() - want).abs().nan_to_num(nan=math.inf)
    return diff.max().item() / scale


GRAD_NAMES = ("input", "weights", "bias", "old_h", "old_cell")


def compare_with_reference(backend, inputs, *, grad_h=None, grad_cell=None):
    """Run ``lltm_core.lltm(..., backend=backend)`` and the oracle on the same inputs.

    Returns ``{quantity: relative error}`` for new_h, new_cell and the gradient
    of each input (for the upstream gradients given, random if None).
    """
    from .. import lltm

    inputs = [t.detach().requires_grad_() for t in inputs]
    new_h, new_cell = lltm(*inputs, backend=backend)
    if grad_h is None:
        grad_h = torch.randn(new_h.shape, dtype=torch.float64).to(new_h)
    if grad_cell is None:
        grad_cell = torch.randn(new_cell.shape, dtype=torch.float64).to(new_cell)
    grads = torch.autograd.grad((new_h, new_cell), inputs, (grad_h, grad_cell), allow_unused=False)

    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    ref_h, ref_cell = reference_lltm(*ref_inputs)
    ref_grads = torch.autograd.grad((ref_h, ref_cell), ref_inputs, (grad_h.double(), grad_cell.double()))

    errors = {"new_h": max_rel_error(new_h, ref_h), "new_cell": max_rel_error(new_cell, ref_cell)}
    for name, got, want in zip(GRAD_NAMES, grads, ref_grads):
        errors[f"grad_{name}"] = max_rel_error(got, want)
    return errors


# --- sequences ---------------------------------------------------------------


def reference_sequence(input, weights, bias, h0, c0, *, lengths=None, reverse=False):
    """The tutorial's cell looped in Python over each sequence on its own: the oracle of ``lltm_sequence``.

    Sequence b runs its first ``lengths[b]`` steps only (all T without
    lengths), in reverse order if ``reverse``, from its own h0[b], c0[b]; its
    outputs past its length are zero.  No sequence is masked: the sequences of
    one length run together, as a batch of rows that never mix (each row's
    products are its own), so each runs exactly its steps, however backends
    mask.  Returns (output (T, B, S), h_n (B, S), c_n (B, S)).
    """
    T, B, _ = input.shape
    S = h0.shape[1]
    if B == 0:
        return input.new_zeros(T, 0, S), h0.clone(), c0.clone()
    steps_of = [T] * B if lengths is None else [int(n) for n in lengths]
    outputs, h_n, c_n, order = [], [], [], []
    for steps in sorted(set(steps_of)):
        rows = [b for b in range(B) if steps_of[b] == steps]
        index = torch.tensor(rows, device=input.device)
        h, c = h0[index], c0[index]
        per_step = [input.new_zeros(len(rows), S)] * T
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            h, c = reference_lltm(input[t, index], weights, bias, h, c)
            per_step[t] = h
        outputs.append(torch.stack(per_step))
        h_n.append(h)
        c_n.append(c)
        order += rows
    back = torch.tensor(order, device=input.device).argsort()  # row b of the batch is row back[b] of the groups
    return torch.cat(outputs, dim=1)[:, back], torch.cat(h_n)[back], torch.cat(c_n)[back]


def reference_layer(parameters: dict, num_layers: int, bidirectional: bool, input, h0, c0, *, lengths=None):
    """The oracle of ``LLTMLayer`` (no dropout), time-major, from its named parameters.

    ``parameters`` maps ``weights_l{k}[_reverse]``/``bias_l{k}[_reverse]`` to
    tensors, as ``LLTMLayer.named_parameters()`` gives them; input (T, B, I),
    h0 and c0 (L*D, B, S).  Returns (output (T, B, D*S), h_n, c_n), each
    layer's directions concatenated as nn.LSTM does.
    """
    suffixes = ("", "_reverse") if bidirectional else ("",)
    h_n, c_n = [], []
    layer_input = input
    for layer in range(num_layers):
        outputs = []
        for direction, suffix in enumerate(suffixes):
            index = layer * len(suffixes) + direction
            output, h, c = reference_sequence(
                layer_input, parameters[f"weights_l{layer}{suffix}"], parameters[f"bias_l{layer}{suffix}"],
                h0[index], c0[index], lengths=lengths, reverse=direction == 1,
            )
            outputs.append(output)
            h_n.append(h)
            c_n.append(c)
        layer_input = torch.cat(outputs, dim=2)
    return layer_input, torch.stack(h_n), torch.stack(c_n)


def make_sequence_inputs(steps, batch, input_features, state_size, *, dtype=torch.float32, device="cpu",
                         generator=None, requires_grad=True):
    """Fresh random (input (T, B, I), weights, bias, h0, c0), scaled as :func:`make_inputs` scales them."""
    x, weights, bias, h0, c0 = make_inputs(batch, input_features, state_size, dtype=torch.float64,
                                           generator=generator, requires_grad=False)
    x = torch.randn(steps, batch, input_features, generator=generator, dtype=torch.float64)
    return tuple(t.to(device=device, dtype=dtype).requires_grad_(requires_grad) for t in (x, weights, bias, h0, c0))
