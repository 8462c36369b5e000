"""The kernels called directly, against lltm-ref's kernels in float64 (which the kit checks against autograd).

Both sequence variants (W_h resident, W_h streamed), with and without lengths, forward and reverse,
with and without a backward to follow, in every dtype, and the cell, at the GPU's tile sizes
(``_config.tile_scale = 1``: several blocks in every loop, partial last blocks), which the
interpreter otherwise enlarges to save time (the kit runs those).
"""

from __future__ import annotations

import pytest
import torch

import lltm_ref
from _helpers import DEVICE, DTYPES, TOLERANCE, rel_error
from lltm_core.testing import make_inputs, make_sequence_inputs
from lltm_triton import _cell, _config, _policy, _sequence

pytestmark = pytest.mark.usefixtures("lltm_seed")


@pytest.fixture
def gpu_tiles(monkeypatch):
    """The GPU's tile sizes (the kit runs the interpreter's larger ones)."""
    monkeypatch.setattr(_config, "tile_scale", 1)


@pytest.fixture(params=["resident", "streaming"])
def variant(request, monkeypatch):
    """The sequence kernels' two variants; the streaming one at the GPU's tile sizes (the resident
    one has no tiles but the whole state)."""
    if request.param == "streaming":
        monkeypatch.setattr(_sequence, "resident", lambda S, dtype: False)
        monkeypatch.setattr(_config, "tile_scale", 1)
    return request.param


def _assert_close(errors: dict, dtype, what: str):
    bad = {k: f"{v:.2e}" for k, v in errors.items() if not v <= TOLERANCE[dtype]}
    assert not bad, f"{what}: errors over {TOLERANCE[dtype]:.0e} in {dtype}: {bad}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1), (33, 5, 70), (3, 40, 17)], ids=lambda s: "B{}-I{}-S{}".format(*s))
def test_cell(dtype, shape, gpu_tiles):
    inputs = [t.detach() for t in make_inputs(*shape, dtype=dtype, device=DEVICE)]
    got = _cell.forward(*inputs)
    want = lltm_ref.forward(*[t.double() for t in inputs])
    grads = torch.randn_like(got[0]), torch.randn_like(got[1])
    errors = {n: rel_error(g, w) for n, g, w in zip(("new_h", "new_cell"), got, want)}
    errors["X"] = rel_error(got[2], want[2])
    for needs_grad_X in (True, False):
        got_b = _cell.backward(*grads, inputs[1], *got[2:], needs_grad_X)
        want_b = lltm_ref.backward(*[g.double() for g in grads], inputs[1].double(), *want[2:], needs_grad_X)
        for name, g, w in zip(("grad_X", "grad_weights", "grad_bias", "grad_old_cell"), got_b, want_b):
            errors[f"{name} (needs_grad_X={needs_grad_X})"] = rel_error(g, w)
        assert needs_grad_X or got_b[0].numel() == 0
    _assert_close(errors, dtype, f"cell at B,I,S={shape}, the GPU's tiles")


SEQUENCE_CASES = [
    # (T, B, I, S, lengths): rows past their length; more than one program of rows and a state past
    # one 64-wide tile (two tiles at the GPU's sizes, the second partial).  (The kit has T=1.)
    (5, 4, 3, 9, [2, 5, 1, 4]),
    (4, 19, 2, 70, None),
    (3, 18, 3, 70, [3, 1] * 9),
]


def _sequence_case(case, dtype, reverse):
    T, B, I, S, lengths = case
    inputs = [t.detach() for t in make_sequence_inputs(T, B, I, S, dtype=dtype, device=DEVICE)]
    lengths = torch.tensor(lengths, device=DEVICE) if lengths else None
    return inputs, lengths


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", SEQUENCE_CASES,
                         ids=lambda c: "T{}-B{}-I{}-S{}".format(*c[:4]) + ("-lengths" if c[4] else ""))
def test_sequence(case, dtype, reverse, variant):
    inputs, lengths = _sequence_case(case, dtype, reverse)
    got = _sequence.sequence_forward(*inputs, lengths, reverse, True)
    want = lltm_ref.sequence_forward(*[t.double() for t in inputs], lengths, reverse)
    errors = {n: rel_error(g, w) for n, g, w in zip(("output", "h_n", "c_n", "gates", "tanh_cell"), got, want)}
    grads = [torch.randn_like(t) for t in got[:3]]
    x, weights, _, h0, _ = inputs
    for needs_grad_input in (True, False):
        got_b = _sequence.sequence_backward(*grads, weights, x, h0, got[0], lengths, *got[3:], reverse,
                                            needs_grad_input)
        want_b = lltm_ref.sequence_backward(*[g.double() for g in grads], weights.double(), x.double(), h0.double(),
                                            want[0], lengths, *want[3:], reverse, needs_grad_input)
        for name, g, w in zip(("grad_input", "grad_weights", "grad_bias", "grad_h0", "grad_c0"), got_b, want_b):
            errors[f"{name} (needs_grad_input={needs_grad_input})"] = rel_error(g, w)
    _assert_close(errors, dtype, f"sequence {case}, reverse={reverse}, {variant}")


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_inference_saves_nothing_and_chunks(dtype, reverse, variant, monkeypatch):
    """needs_backward=False: empty saved slots; the projection in chunks (here of 2 steps, so several chunks
    and a partial last one) gives the same result as one projection of all T steps."""
    inputs, lengths = _sequence_case((5, 4, 3, 9, [2, 5, 1, 4]), dtype, reverse)
    whole = _sequence.sequence_forward(*inputs, lengths, reverse, False)
    assert len(whole) == 5 and all(t.numel() == 0 for t in whole[3:])
    assert whole[3] is not whole[4]  # custom-op outputs may not alias, empty ones included
    calls = []
    chunk = _sequence._projection_chunk
    monkeypatch.setattr(_sequence, "_projection_chunk", lambda T, B: calls.append(chunk(T, B)) or 2)
    chunked = _sequence.sequence_forward(*inputs, lengths, reverse, False)
    assert calls == [5]  # T=5 at B=4 would have been one chunk
    assert all(t.numel() == 0 for t in chunked[3:])
    trained = _sequence.sequence_forward(*inputs, lengths, reverse, True)
    # Between chunks the state waits in float32, as on chip: the results agree bit for bit.
    for got, want in zip(chunked[:3], trained[:3]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    for got, want in zip(whole[:3], trained[:3]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_projection_chunk_rows():
    assert _sequence._projection_chunk(512, 64) == 32  # 2048 rows a GEMM
    assert _sequence._projection_chunk(3, 64) == 3
    assert _sequence._projection_chunk(10, 10000) == 1


def test_empty_batch():
    inputs, _ = _sequence_case((3, 0, 2, 5, None), torch.float32, False)
    out = _sequence.sequence_forward(*inputs, None, False, True)
    assert [tuple(t.shape) for t in out] == [(3, 0, 5), (0, 5), (0, 5), (3, 0, 15), (3, 0, 5)]
    grads = [torch.zeros_like(t) for t in out[:3]]
    got = _sequence.sequence_backward(*grads, inputs[1], inputs[0], inputs[3], out[0], None, *out[3:], False, True)
    assert got[0].shape == (3, 0, 2) and not got[1].any() and not got[2].any()


@pytest.mark.parametrize("allow_tf32, dtype, want", [
    (False, torch.float32, "ieee"), (True, torch.float32, "tf32"),
    (True, torch.bfloat16, "ieee"), (True, torch.float64, "ieee"), (True, torch.float16, "ieee")])
def test_dot_precision_follows_torch(monkeypatch, allow_tf32, dtype, want):
    """tl.dot's precision is the one torch gives cuBLAS: TF32 only for float32 and only where allowed,
    and the kernels are launched with it."""
    old = torch.backends.cuda.matmul.allow_tf32  # a property of torch's, not an attribute monkeypatch can set
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    try:
        _check_precision(monkeypatch, dtype, want)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def _check_precision(monkeypatch, dtype, want):
    assert _config.dot_precision(dtype) == want
    seen = []
    for kernel in (_sequence._forward_resident, _sequence._backward_resident):
        run = kernel.run
        monkeypatch.setattr(kernel, "run", lambda *a, _run=run, **kw: seen.append(kw["PRECISION"]) or _run(*a, **kw))
    inputs, _ = _sequence_case((2, 3, 2, 5, None), dtype, False)
    out = _sequence.sequence_forward(*inputs, None, False, True)
    _sequence.sequence_backward(*[torch.randn_like(t) for t in out[:3]], inputs[1], inputs[0], inputs[3], out[0],
                                None, *out[3:], False, False)
    assert seen == [want, want]


def test_policy_arithmetic():
    """The figures _policy's docstring tabulates, and which variant each gets."""
    assert _policy.w_h_bytes(128, torch.bfloat16) == 96 * 1024
    assert _policy.w_h_bytes(128, torch.float32) == 192 * 1024
    assert _policy.w_h_bytes(100, torch.float32) == 192 * 1024  # padded to 128
    assert _policy.w_h_bytes(256, torch.bfloat16) == 384 * 1024
    assert _policy.w_h_bytes(64, torch.float64) == 96 * 1024
    assert _policy.resident(128, torch.float32) and not _policy.resident(129, torch.float32)
    assert _policy.resident(64, torch.float64) and not _policy.resident(128, torch.float64)
    assert _sequence.resident is _policy.resident
