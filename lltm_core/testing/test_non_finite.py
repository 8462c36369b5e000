"""The rule for non-finite values (``lltm_core.backend``, "Non-finite values"), on the step and the sequence.

Non-finite entries in the weights must reach the outputs exactly as in the
reference: NaN where it has NaN, the same infinities, the finite values close.
The one freedom: from a state ``h`` that is zero everywhere, a backend may skip
the product ``W_h @ h`` (for a sequence, at the first step only), so that
``0 * inf`` there comes out as 0 instead of NaN.  Each element must then be
the reference's, or what the reference gives with that product taken as zero.
"""

from __future__ import annotations

import math

import pytest
import torch

import lltm_core
from lltm_core.testing import make_inputs, make_sequence_inputs, reference_lltm, reference_sequence, tolerance
from lltm_core.testing._kit import backend  # noqa: F401  (a fixture)


def _poison(weights: torch.Tensor, S: int) -> torch.Tensor:
    """weights with inf and -inf in W_h (the state's columns) and inf in W_x.

    Input gate row 1 gets inf and -inf on state columns 0 and 1: with h[:, 0] and h[:, 1] positive
    (see _state) that is inf - inf, NaN in the reference; candidate row 0 gets inf on state column
    0, an infinite cell; the output gate's saturate.
    """
    w = weights.detach().clone()
    w[1, 0], w[1, 1] = math.inf, -math.inf  # input gate, W_h
    w[2 * S, 0] = math.inf  # candidate, W_h
    w[S + 2, S - 1] = -math.inf  # output gate, W_h
    w[S + 3, S] = math.inf  # output gate, W_x
    return w


def _state(h: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "zero":
        return torch.zeros_like(h)
    h = h.clone()
    h[:, :2] = h[:, :2].abs() + 0.1
    return h


def _matches(got: torch.Tensor, want: torch.Tensor, dtype) -> torch.Tensor:
    """Per element: both NaN, the same infinity, or both finite and close (relative to want's finite scale)."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    finite = torch.isfinite(want)
    scale = want[finite].abs().max().item() if finite.any() else 1.0
    close = torch.isclose(got, want, rtol=tolerance(dtype), atol=tolerance(dtype) * max(scale, 1.0))
    return (got.isnan() & want.isnan()) | (got.isinf() & (got == want)) | (finite & torch.isfinite(got) & close)


def _check(what: str, got, wants, dtype):
    for name, g, *alternatives in zip(("first", "second", "third"), got, *wants):
        ok = torch.zeros(g.shape, dtype=torch.bool)
        for w in alternatives:
            ok |= _matches(g, w, dtype)
        assert ok.all(), (f"{what}: output {name} differs from the reference at {(~ok).sum().item()} of "
                          f"{ok.numel()} elements (NaN pattern: got {g.isnan().sum().item()} NaN, reference "
                          f"{alternatives[0].isnan().sum().item()})")


def _zero_state_product(w: torch.Tensor, S: int) -> torch.Tensor:
    w = w.clone()
    w[:, :S] = 0  # W_h @ 0 taken as zero: what skipping the product computes
    return w


@pytest.mark.parametrize("state", ["random", "zero"])
def test_step_propagates_non_finite_weights(backend, lltm_device, lltm_dtype, state):
    B, I, S = 3, 5, 7
    input, weights, bias, old_h, old_cell = (t.detach() for t in make_inputs(B, I, S, dtype=lltm_dtype,
                                                                            device=lltm_device))
    old_h = _state(old_h, state)
    weights = _poison(weights, S)
    with torch.no_grad():
        got = lltm_core.lltm(input, weights, bias, old_h, old_cell, backend=backend.name)
    args64 = [t.double() for t in (input, weights, bias, old_h, old_cell)]
    wants = [reference_lltm(*args64)]
    if state == "zero":
        wants.append(reference_lltm(args64[0], _zero_state_product(args64[1], S), *args64[2:]))
    else:
        assert wants[0][0].isnan().any(), "the poisoned weights must give NaN in the reference, or this test is void"
        assert wants[0][1].isinf().any(), "... and infinities"
    _check(f"lltm on {backend.name}, {state} old_h", got, wants, lltm_dtype)


@pytest.mark.parametrize("state", ["random", "zero"])
def test_sequence_propagates_non_finite_weights(backend, lltm_device, lltm_dtype, state):
    T, B, I, S = 4, 3, 5, 7
    input, weights, bias, h0, c0 = (t.detach() for t in make_sequence_inputs(T, B, I, S, dtype=lltm_dtype,
                                                                             device=lltm_device))
    h0 = _state(h0, state)
    weights = _poison(weights, S)
    with torch.no_grad():
        got = lltm_core.lltm_sequence(input, weights, bias, h0, c0, backend=backend.name)
    x, w, b, h, c = (t.double() for t in (input, weights, bias, h0, c0))
    wants = [reference_sequence(x, w, b, h, c)]
    if state == "zero":  # the first step without W_h @ h0, then the reference from its state
        h1, c1 = reference_lltm(x[0], _zero_state_product(w, S), b, h, c)
        rest, h_n, c_n = reference_sequence(x[1:], w, b, h1, c1)
        wants.append((torch.cat([h1.unsqueeze(0), rest]), h_n, c_n))
    _check(f"lltm_sequence on {backend.name}, {state} h0", got, wants, lltm_dtype)


@pytest.mark.parametrize("reverse", [False, True])
def test_padding_reaches_no_gradient(backend, lltm_device, lltm_dtype, reverse):
    """Inputs past a row's length take part in nothing: NaN there changes no output and no gradient.

    lltm-core zeroes them before the kernels, so every backend is held to it through lltm_sequence.
    """
    T, B, I, S = 5, 3, 4, 6
    lengths = torch.tensor([5, 2, 3], device=lltm_device)
    inputs = make_sequence_inputs(T, B, I, S, dtype=lltm_dtype, device=lltm_device)
    padded = inputs[0].detach().clone()
    for b, length in enumerate(lengths.tolist()):
        padded[length:, b] = math.nan
    results = []
    for x in (inputs[0].detach().masked_fill(padded.isnan(), 0.0), padded):
        leaves = [x.requires_grad_(), *(t.detach().requires_grad_() for t in inputs[1:])]
        out, h_n, c_n = lltm_core.lltm_sequence(*leaves, lengths=lengths, reverse=reverse, backend=backend.name)
        (out.sum() + h_n.sum() + 2 * c_n.sum()).backward()
        results.append([out, h_n, c_n, *(t.grad for t in leaves)])
    names = ["output", "h_n", "c_n", "grad input", "grad weights", "grad bias", "grad h0", "grad c0"]
    for name, with_zeros, with_nan in zip(names, *results):
        assert torch.isfinite(with_nan).all(), (
            f"lltm_sequence on {backend.name}, lengths={lengths.tolist()}, reverse={reverse}: NaN in padded "
            f"inputs reached {name} ({with_nan.isnan().sum().item()} of {with_nan.numel()} entries NaN)")
        torch.testing.assert_close(with_nan, with_zeros, msg=f"{name} on {backend.name} depends on padded inputs")
    assert (results[1][3][padded.isnan()] == 0).all(), "the gradient of a padded input must be zero"
