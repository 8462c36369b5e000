"""The kernels called directly, against lltm-ref's kernels in float64 (which the kit checks against autograd).

Both sequence variants (W_h resident, W_h streamed), with and without lengths, forward and reverse,
with and without a backward to follow, in every dtype, and the cell, at the GPU's tile sizes
(``_config.tile_scale = 1``: several blocks in every loop, partial last blocks), which the
interpreter otherwise enlarges to save time (the kit runs those).
"""

from __future__ import annotations

import warnings

import pytest
import torch

import lltm_core
import lltm_ref
from _helpers import DEVICE, DTYPES, INTERPRETER, TOLERANCE, rel_error
from lltm_core.testing import make_inputs, make_sequence_inputs
from lltm_triton import _cell, _config, _fit, _policy, _sequence

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


#: On a GPU cuBLAS picks its GEMM kernel by M: a chunk's projection may differ from the whole one's by an ulp.
#: Sized by nudging every projected element 1 ulp under the interpreter (1200 runs): float32 moved by <= 1.5e-6
#: with |c| up to 12; bfloat16 passed at 2 and 4 of its ulps at 1 (rtol, atol), not at 2 and 2.
CHUNKED_GEMM_TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=1.6e-2, atol=3.2e-2)}


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
    # Between chunks the state waits in float32, as on chip: under the interpreter (numpy's GEMM) the
    # results agree bit for bit; on a GPU within CHUNKED_GEMM_TOLERANCE.
    tolerance = dict(rtol=0, atol=0) if INTERPRETER else CHUNKED_GEMM_TOLERANCE[dtype]
    for got, want in zip(chunked[:3], trained[:3]):
        torch.testing.assert_close(got, want, **tolerance)
    for got, want in zip(whole[:3], trained[:3]):
        torch.testing.assert_close(got, want, **tolerance)


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
    assert _policy.resident(128, torch.bfloat16) and not _policy.resident(129, torch.bfloat16)
    assert _policy.resident(128, torch.float16) and not _policy.resident(129, torch.float16)
    # float32 at S_PAD 128 (192 KB) did not fit an H200's shared memory in the backward
    assert _policy.resident(64, torch.float32) and not _policy.resident(65, torch.float32)
    assert _policy.resident(64, torch.float64) and not _policy.resident(65, torch.float64)
    assert _sequence.resident is _policy.resident


def _edges(ladder):
    return [t.get("S_PAD") or t["BLOCK_S"] for t in ladder]


def test_sequence_ladder(gpu_tiles):
    """What the sequence wrappers try, largest first: resident where _policy says so, then streaming tiles
    from STREAM_TILE (32 in float64, whose 64 overflowed an H200) halved down to 16."""
    assert _edges(_sequence._tiles(torch.float32, 64)) == [64, 64, 32, 16]
    assert _edges(_sequence._tiles(torch.float32, 128)) == [64, 32, 16]
    assert _edges(_sequence._tiles(torch.bfloat16, 100)) == [128, 64, 32, 16]
    assert _edges(_sequence._tiles(torch.float64, 64)) == [64, 32, 16]
    assert _edges(_sequence._tiles(torch.float64, 1031)) == [32, 16]
    assert _edges(_sequence._tiles(torch.float64, 9)) == [16, 16, 16]  # the same tiles are tried once
    assert all(t["BLOCK_K"] == t["BLOCK_S"] for t in _sequence._tiles(torch.float64, 1031))
    assert _sequence._tiles(torch.bfloat16, 128)[0] == dict(S_PAD=128, num_warps=16)
    assert _fit.halvings(dict(B=32, S=64)) == [dict(B=32, S=64), dict(B=16, S=32), dict(B=16, S=16)]


# --- launches that do not fit the GPU's shared memory ----------------------------------
# The interpreter compiles nothing, so OutOfResources never comes by itself: these raise it where a GPU
# would, as the kernel loads (before it runs), and test_gpu.py meets a real one.


@pytest.fixture
def too_large(monkeypatch):
    """_fit's memory of what did not fit, empty for the test; and refuse(kernel, when) makes kernel.run
    raise OutOfResources, as Triton does, for the launches whose keyword arguments when() accepts.
    Returns (memory, tried): tried lists (kernel name, BLOCK_S or S_PAD) of every launch attempted."""
    from triton.runtime.errors import OutOfResources

    memory = {}
    monkeypatch.setattr(_fit, "too_large", memory)
    tried = []

    def refuse(kernel, when=lambda kw: True):
        run = kernel.run

        def refusing(*args, _run=run, **kw):
            tried.append((kernel.__name__, kw.get("S_PAD") or kw["BLOCK_S"]))
            if when(kw):
                raise OutOfResources(311296, 232448, "shared memory")
            return _run(*args, **kw)

        monkeypatch.setattr(kernel, "run", refusing)

    return memory, tried, refuse


def _own(recorded) -> list:
    """lltm-triton's warnings among those recorded (an interpreter may add NumPy's deprecations)."""
    return [w for w in recorded if str(w.message).startswith("lltm-triton")]


def test_sequence_falls_back_and_remembers(too_large, gpu_tiles):
    """W_h resident refused, then streaming at 64: the backward runs streaming at 32, right, with a warning
    the first time; the next call goes straight to 32."""
    memory, tried, refuse = too_large
    refuse(_sequence._backward_resident)
    refuse(_sequence._backward_streaming, lambda kw: kw["BLOCK_S"] == 64)
    refuse(_sequence._forward_resident, lambda kw: False)  # recorded, not refused
    inputs, lengths = _sequence_case((3, 18, 3, 40, [3, 1] * 9), torch.float32, False)
    x, weights, _, h0, _ = inputs
    want = lltm_ref.sequence_forward(*[t.double() for t in inputs], lengths, False)
    for attempt in range(2):
        tried.clear()
        got = _sequence.sequence_forward(*inputs, lengths, False, True)
        grads = [torch.randn_like(t) for t in got[:3]]
        with warnings.catch_warnings(record=True) as recorded:
            warnings.simplefilter("always")
            got_b = _sequence.sequence_backward(*grads, weights, x, h0, got[0], lengths, *got[3:], False, True)
        caught = _own(recorded)
        want_b = lltm_ref.sequence_backward(*[g.double() for g in grads], weights.double(), x.double(),
                                            h0.double(), want[0], lengths, *want[3:], False, True)
        errors = {n: rel_error(g, w) for n, g, w in zip(("output", "h_n", "c_n"), got, want)}
        errors.update({n: rel_error(g, w) for n, g, w in zip(("grad_input", "grad_weights", "grad_bias", "grad_h0",
                                                               "grad_c0"), got_b, want_b)})
        _assert_close(errors, torch.float32, f"fallen back, call {attempt + 1}")
        if attempt == 0:
            assert tried == [("_forward_resident", 64), ("_backward_resident", 64), ("_backward_streaming", 64),
                             ("_backward_streaming", 32)], tried
            assert [str(w.message).split(" with ")[0] for w in caught] == ["lltm-triton: _backward_resident",
                                                                          "lltm-triton: _backward_streaming"]
            assert "311296" in str(caught[0].message)
        else:
            assert tried == [("_forward_resident", 64), ("_backward_streaming", 32)], tried
            assert not caught, [str(w.message) for w in caught]
    assert sorted(key[0] for key in memory) == ["_backward_resident", "_backward_streaming"]
    assert all(key[1:4] == (str(x.device), torch.float32, 40) for key in memory), list(memory)


def test_inference_falls_back_once_for_all_chunks(too_large, gpu_tiles, monkeypatch):
    """Without a backward each chunk launches: the first one's fallback serves the others."""
    memory, tried, refuse = too_large
    refuse(_sequence._forward_resident)
    refuse(_sequence._forward_streaming, lambda kw: False)
    monkeypatch.setattr(_sequence, "_projection_chunk", lambda T, B: 2)
    inputs, lengths = _sequence_case((5, 4, 3, 9, [2, 5, 1, 4]), torch.float32, True)
    with pytest.warns(UserWarning, match="_forward_resident .* does not fit this GPU"):
        got = _sequence.sequence_forward(*inputs, lengths, True, False)
    assert tried == [("_forward_resident", 16)] + [("_forward_streaming", 16)] * 3, tried
    want = lltm_ref.sequence_forward(*[t.double() for t in inputs], lengths, True)
    _assert_close({n: rel_error(g, w) for n, g, w in zip(("output", "h_n", "c_n"), got, want)}, torch.float32,
                  "inference, fallen back")
    assert len(memory) == 1


def test_the_fallback_warning_names_the_callers_line(too_large, gpu_tiles):
    """However deep the launch (lltm-core's lltm_sequence, its autograd Function, lltm-triton's wrapper),
    the warning points at the user's line, not at a frame of lltm-triton's."""
    _, _, refuse = too_large
    refuse(_sequence._forward_resident)
    inputs, lengths = _sequence_case((5, 4, 3, 9, [2, 5, 1, 4]), torch.float32, False)
    with pytest.warns(UserWarning, match="_forward_resident .* does not fit this GPU") as caught:
        lltm_core.lltm_sequence(*inputs, lengths=lengths, backend="triton")
    assert [w.filename for w in _own(caught)] == [__file__]


def test_nothing_fits_says_use_lltm_cuda(too_large, gpu_tiles):
    memory, tried, refuse = too_large
    refuse(_sequence._backward_resident)
    refuse(_sequence._backward_streaming)
    inputs, _ = _sequence_case((2, 3, 2, 40, None), torch.float64, False)
    out = _sequence.sequence_forward(*inputs, None, False, True)
    grads = [torch.randn_like(t) for t in out[:3]]
    with pytest.warns(UserWarning), pytest.raises(RuntimeError) as raised:
        _sequence.sequence_backward(*grads, inputs[1], inputs[0], inputs[3], out[0], None, *out[3:], False, True)
    message = str(raised.value)
    assert message.startswith("lltm-triton: _backward_streaming at S=40 in torch.float64 does not fit this GPU "
                              "even at its smallest tiles {'BLOCK_S': 16, 'BLOCK_K': 16"), message
    assert "Required: 311296, Hardware limit: 232448" in message
    assert message.endswith('use lltm-cuda instead (backend="cuda")'), message
    assert [edge for _, edge in tried] == [64, 32, 16]
    tried.clear()
    with pytest.raises(RuntimeError, match="use lltm-cuda"):  # remembered: no launch tried again
        _sequence.sequence_backward(*grads, inputs[1], inputs[0], inputs[3], out[0], None, *out[3:], False, True)
    assert tried == []


def test_cell_falls_back(too_large, gpu_tiles):
    """The cell's tiles halve too: forward refused at BLOCK_S 64, backward at BLOCK_N 64."""
    memory, tried, refuse = too_large
    refuse(_cell._forward_kernel, lambda kw: kw["BLOCK_S"] == 64)
    refuse(_cell._backward_kernel, lambda kw: kw["BLOCK_N"] == 64)
    inputs = [t.detach() for t in make_inputs(33, 5, 70, dtype=torch.float32, device=DEVICE)]
    with pytest.warns(UserWarning, match="_forward_kernel"):
        got = _cell.forward(*inputs)
    grads = torch.randn_like(got[0]), torch.randn_like(got[1])
    with pytest.warns(UserWarning, match="_backward_kernel"):
        got_b = _cell.backward(*grads, inputs[1], *got[2:], True)
    assert [edge for _, edge in tried] == [64, 32, 32, 16]
    want = lltm_ref.forward(*[t.double() for t in inputs])
    want_b = lltm_ref.backward(*[g.double() for g in grads], inputs[1].double(), *want[2:], True)
    errors = {n: rel_error(g, w) for n, g, w in zip(("new_h", "new_cell", "X"), got, want)}
    errors.update({n: rel_error(g, w) for n, g, w in zip(("grad_X", "grad_weights", "grad_bias", "grad_old_cell"),
                                                          got_b, want_b)})
    _assert_close(errors, torch.float32, "cell, fallen back")
    assert len(memory) == 2
