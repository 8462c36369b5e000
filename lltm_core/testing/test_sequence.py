"""Conformance tests of sequences: LLTMLayer and lltm_sequence on every backend, and its sequence kernels.

Every backend runs LLTMLayer, through its own sequence kernels or, for one
without (interface version 1), through its step kernels looped by lltm-core.
The oracle is :func:`lltm_core.testing.reference_layer`: the tutorial's cell
looped in Python over each sequence on its own, in float64, differentiated by
autograd.  The tests of the sequence kernels themselves (their contract, opcheck,
the memory they keep) apply to backends that have them, and skip, saying so,
for those that do not.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import lltm_core
from lltm_core.testing import make_sequence_inputs, max_rel_error, reference_layer, reference_sequence
from lltm_core.testing._kit import backend  # noqa: F401  (a fixture)
from lltm_core.testing._kit import assert_close, check_returned, check_untouched, snapshot
from lltm_core._sequence import run_forward

# (name, T, B, I, S, num_layers, bidirectional, layout, lengths): layout is how the input reaches
# LLTMLayer: "time" (T, B, I), "batch" (batch_first), "unbatched" (T, I), "packed" (a
# PackedSequence of unsorted lengths, one of them 1), or "no-state" (time-major, state=None).
LAYER_CASES = [
    ("T1", 1, 3, 4, 5, 1, False, "time", None),
    ("odd-sizes", 7, 5, 3, 13, 1, False, "time", None),
    # S a multiple of 8: a fused backend's vectorised pointwise path, in every dtype (odd S takes the scalar one).
    ("S16-vector", 4, 3, 2, 16, 1, True, "time", None),
    ("S1031", 3, 2, 5, 1031, 1, False, "time", None),
    ("L2-bidirectional-batch-first", 5, 3, 4, 6, 2, True, "batch", None),
    ("packed-unsorted", 6, 4, 3, 7, 2, True, "packed", [4, 6, 1, 3]),
    ("unbatched", 6, 1, 3, 5, 2, True, "unbatched", None),
    ("no-state", 4, 3, 2, 9, 1, True, "no-state", None),
]


def _requires_sequence_kernels(backend):
    if not backend.has_sequence_kernels:
        pytest.skip(f"backend {backend.name!r} has no sequence kernels (interface version 1): LLTMLayer loops its "
                    f"step kernels, which the LLTMLayer tests here check")


def _layer(backend, I, S, num_layers, bidirectional, dtype, device, **kwargs):
    return lltm_core.LLTMLayer(I, S, num_layers, bidirectional=bidirectional, backend=backend.name,
                               device=device, dtype=dtype, **kwargs)


@pytest.mark.parametrize("case", LAYER_CASES, ids=[c[0] for c in LAYER_CASES])
def test_layer_matches_reference(backend, lltm_device, lltm_dtype, case):
    """Outputs, h_n, c_n and every gradient (input, h_0, c_0, each parameter) against the float64 oracle."""
    errors = layer_errors(backend, lltm_device, lltm_dtype, case)
    assert_close(errors, lltm_dtype, f"LLTMLayer on {backend.name}, case {case[0]}")


def layer_errors(backend, device, dtype, case) -> dict[str, float]:
    """{quantity: relative error} of LLTMLayer on one of LAYER_CASES, fresh random values from torch's
    generator (also what benchmarks/kit_errors.py samples over many seeds to size the tolerances)."""
    _, T, B, I, S, L, bidirectional, layout, lengths = case
    D = 2 if bidirectional else 1
    layer = _layer(backend, I, S, L, bidirectional, dtype, device, batch_first=layout == "batch")
    with torch.no_grad():  # fresh values, scaled as make_inputs scales them: both sides of elu, real curvature
        for p in layer.parameters():
            scale = 1.5 / p.shape[1] ** 0.5 if p.dim() == 2 else 0.5
            p.copy_(torch.randn(p.shape, dtype=torch.float64) * scale)
    x = torch.randn(T, B, I, dtype=torch.float64).to(device, dtype).requires_grad_()
    h0 = torch.randn(L * D, B, S, dtype=torch.float64).to(x).requires_grad_()
    c0 = torch.randn(L * D, B, S, dtype=torch.float64).to(x).requires_grad_()
    lengths_t = torch.tensor(lengths) if lengths else None

    if layout == "time":
        output, (h_n, c_n) = layer(x, (h0, c0))
    elif layout == "batch":
        output, (h_n, c_n) = layer(x.transpose(0, 1), (h0, c0))
        output = output.transpose(0, 1)
    elif layout == "unbatched":
        output, (h_n, c_n) = layer(x[:, 0], (h0[:, 0], c0[:, 0]))
        output, h_n, c_n = output.unsqueeze(1), h_n.unsqueeze(1), c_n.unsqueeze(1)
    elif layout == "packed":
        packed_output, (h_n, c_n) = layer(pack_padded_sequence(x, lengths_t, enforce_sorted=False), (h0, c0))
        output, out_lengths = pad_packed_sequence(packed_output, total_length=T)
        assert out_lengths.tolist() == lengths
    else:
        output, (h_n, c_n) = layer(x)
    assert output.shape == (T, B, D * S) and h_n.shape == c_n.shape == (L * D, B, S)
    inputs = [x] if layout == "no-state" else [x, h0, c0]
    params = list(layer.parameters())
    upstream = [torch.randn(t.shape, dtype=torch.float64).to(t) for t in (output, h_n, c_n)]
    grads = torch.autograd.grad((output, h_n, c_n), inputs + params, upstream)

    ref_x, ref_h0, ref_c0 = (t.detach().double().requires_grad_() for t in (x, h0, c0))
    if layout == "no-state":
        ref_h0, ref_c0 = torch.zeros_like(ref_h0), torch.zeros_like(ref_c0)
    ref_params = {name: p.detach().double().requires_grad_() for name, p in layer.named_parameters()}
    want = reference_layer(ref_params, L, bidirectional, ref_x, ref_h0, ref_c0, lengths=lengths_t)
    ref_inputs = [ref_x] if layout == "no-state" else [ref_x, ref_h0, ref_c0]
    want_grads = torch.autograd.grad(want, ref_inputs + list(ref_params.values()),
                                     [u.double() for u in upstream])

    names = ["output", "h_n", "c_n"] + [f"grad_{n}" for n in ("input", "h_0", "c_0")[: len(inputs)]] + [
        f"grad_{n}" for n, _ in layer.named_parameters()]
    return {n: max_rel_error(g, w) for n, g, w in zip(names, (output, h_n, c_n, *grads), (*want, *want_grads))}


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_lltm_sequence_matches_reference(backend, lltm_device, lltm_dtype, reverse, with_lengths):
    T, B, I, S = 5, 4, 3, 9
    inputs = make_sequence_inputs(T, B, I, S, dtype=lltm_dtype, device=lltm_device)
    lengths = torch.tensor([2, 5, 1, 4], device=lltm_device) if with_lengths else None
    got = lltm_core.lltm_sequence(*inputs, lengths=lengths, reverse=reverse, backend=backend.name)
    upstream = [torch.randn(t.shape, dtype=torch.float64).to(t) for t in got]
    grads = torch.autograd.grad(got, inputs, upstream)
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    want = reference_sequence(*ref_inputs, lengths=lengths, reverse=reverse)
    want_grads = torch.autograd.grad(want, ref_inputs, [u.double() for u in upstream])
    names = ("output", "h_n", "c_n", "grad_input", "grad_weights", "grad_bias", "grad_h0", "grad_c0")
    errors = {n: max_rel_error(g, w) for n, g, w in zip(names, (*got, *grads), (*want, *want_grads))}
    assert_close(errors, lltm_dtype, f"lltm_sequence on {backend.name}, reverse={reverse}, lengths={lengths}")


def test_sequence_gradcheck_float64(lltm_backend_name, lltm_device):
    """Finite differences against the backend's own backward (its sequence kernels, if it has them)."""
    backend = lltm_core.get_backend(lltm_backend_name, device=lltm_device, dtype=torch.float64)
    inputs = make_sequence_inputs(4, 3, 2, 3, dtype=torch.float64, device=lltm_device)
    lengths = torch.tensor([4, 1, 3], device=lltm_device)
    for reverse in (False, True):
        assert torch.autograd.gradcheck(
            lambda *a: lltm_core.lltm_sequence(*a, lengths=lengths, reverse=reverse, backend=backend.name), inputs)


def test_empty_batch(backend, lltm_device, lltm_dtype):
    layer = _layer(backend, 3, 5, 2, True, lltm_dtype, lltm_device)
    output, (h_n, c_n) = layer(torch.randn(4, 0, 3, device=lltm_device, dtype=lltm_dtype))
    assert output.shape == (4, 0, 10) and h_n.shape == c_n.shape == (4, 0, 5)
    (output.sum() + h_n.sum() + c_n.sum()).backward()
    for p in layer.parameters():
        assert p.grad is not None and not p.grad.any()


@pytest.mark.parametrize("num_layers, bidirectional, batch_first", [(2, True, False), (1, False, True)],
                         ids=["2-layers-bidirectional", "1-layer-batch-first"])  # the second: LLTMLayer's fast path
def test_layer_compile_fullgraph(lltm_backend_name, lltm_device, num_layers, bidirectional, batch_first):
    """torch.compile(fullgraph=True) of LLTMLayer, forward and backward, agrees with eager."""
    backend = lltm_core.get_backend(lltm_backend_name, device=lltm_device, dtype=torch.float32)
    torch._dynamo.reset()
    layer = _layer(backend, 3, 6, num_layers, bidirectional, torch.float32, lltm_device, batch_first=batch_first)
    eager_layer = copy.deepcopy(layer)
    x = torch.randn(*((2, 5) if batch_first else (5, 2)), 3, device=lltm_device, requires_grad=True)
    lengths = torch.tensor([5, 2], device=lltm_device)

    def run(module, x):
        output, (h_n, c_n) = module(x)
        # lltm_sequence with lengths too: the packed path's kernel call, without PackedSequence's
        # data-dependent bookkeeping (which is torch's, and graph-breaks in torch's own RNNs too).
        masked, h, c = lltm_core.lltm_sequence(x.transpose(0, 1) if batch_first else x, module.weights_l0,
                                               module.bias_l0, h_n[0], c_n[0],
                                               lengths=lengths, reverse=True)
        return output.sum() + h_n.sum() + c_n.sum() + masked.sum() + h.sum() + c.sum()

    compiled = torch.compile(run, fullgraph=True)
    # Compile for real: torch's on-disk caches key on the graph, not on the custom operators' code.
    with lltm_core.use_backend(backend.name), torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        got = compiled(layer, x)
        got_grads = torch.autograd.grad(got, [x, *layer.parameters()])
        want = run(eager_layer, x)
        want_grads = torch.autograd.grad(want, [x, *eager_layer.parameters()])
    for g, w in zip((got, *got_grads), (want, *want_grads)):
        torch.testing.assert_close(g, w)


# --- the sequence kernels themselves ------------------------------------------


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("needs_grad_input", [True, False], ids=["needs_grad_input", "no_grad_input"])
def test_sequence_kernels_keep_the_contract(backend, lltm_device, lltm_dtype, reverse, with_lengths,
                                            needs_grad_input):
    """sequence_forward and sequence_backward called directly: what they return and what they leave alone."""
    _requires_sequence_kernels(backend)
    T, B, I, S = 4, 3, 2, 5
    x, weights, bias, h0, c0 = (t.detach() for t in make_sequence_inputs(T, B, I, S, dtype=lltm_dtype,
                                                                          device=lltm_device))
    lengths = torch.tensor([4, 1, 2], device=lltm_device) if with_lengths else None
    saved_shapes = {f"saved {k!r}": tuple(v) for k, v in backend.sequence_saved_layout(T, B, I, S).items()}
    forward_args = {"input": x, "weights": weights, "bias": bias, "h0": h0, "c0": c0,
                    **({"lengths": lengths} if with_lengths else {})}
    before = snapshot(forward_args)
    out = run_forward(backend, x, weights, bias, h0, c0, lengths, reverse, True)
    what = f"{backend.name}.sequence_forward (reverse={reverse}, lengths={with_lengths})"
    check_returned(what, out, {"output": (T, B, S), "h_n": (B, S), "c_n": (B, S), **saved_shapes}, x, forward_args)
    check_untouched(what, forward_args, before)

    grads = {"grad_output": torch.randn_like(out[0]), "grad_h_n": torch.randn_like(out[1]),
             "grad_c_n": torch.randn_like(out[2])}
    saved = dict(zip(saved_shapes, out[3:]))
    backward_args = {**grads, "weights": weights, "input": x, "h0": h0, "output": out[0], **saved,
                     **({"lengths": lengths} if with_lengths else {})}
    before = snapshot(backward_args)
    got = backend.sequence_backward(grads["grad_output"], grads["grad_h_n"], grads["grad_c_n"], weights, x, h0,
                                    out[0], lengths, *out[3:], reverse, needs_grad_input)
    what = f"{backend.name}.sequence_backward (needs_grad_input={needs_grad_input})"
    expected = {"grad_input": (T, B, I) if needs_grad_input else None, "grad_weights": tuple(weights.shape),
                "grad_bias": tuple(bias.shape), "grad_h0": (B, S), "grad_c0": (B, S)}
    check_returned(what, got, expected, x, backward_args)
    if not needs_grad_input:
        assert got[0].numel() == 0, (f"{what}: with needs_grad_input=False, grad_input must be an empty tensor "
                                     f"(weights.new_empty(0)), got shape {tuple(got[0].shape)}")
    check_untouched(what, backward_args, before)


def _requires_v3(backend):
    _requires_sequence_kernels(backend)
    if not backend.takes_needs_backward:
        pytest.skip(f"backend {backend.name!r} implements interface {list(backend.interface_versions)}: its "
                    f"sequence_forward takes no needs_backward (version 3), so lltm-core drops what it saves")


# Lengths and direction each once per dtype: the reference tests cover every pairing, and this
# 301-step sequence is among the kit's slowest tests under Triton's interpreter.
@pytest.mark.parametrize("with_lengths, reverse", [(False, False), (True, True)], ids=["full-forward", "lengths-reverse"])
def test_inference_forward_keeps_nothing(backend, lltm_device, lltm_dtype, reverse, with_lengths):
    """needs_backward=False: the same results as with a backward to follow, and every saved slot empty.

    T·B = 2107 rows, more than one chunk of steps for a backend that projects the input 2048 rows
    at a time (lltm-ref), with a last chunk shorter than the rest.
    """
    _requires_v3(backend)
    T, B, I, S = 301, 7, 2, 5
    x, weights, bias, h0, c0 = (t.detach() for t in make_sequence_inputs(T, B, I, S, dtype=lltm_dtype,
                                                                          device=lltm_device))
    lengths = torch.tensor([T, 1, 150, 2, T - 1, 77, 200], device=lltm_device) if with_lengths else None
    forward_args = {"input": x, "weights": weights, "bias": bias, "h0": h0, "c0": c0,
                    **({"lengths": lengths} if with_lengths else {})}
    before = snapshot(forward_args)
    out = backend.sequence_forward(x, weights, bias, h0, c0, lengths, reverse, False)
    what = f"{backend.name}.sequence_forward (needs_backward=False, reverse={reverse}, lengths={with_lengths})"
    n_saved = len(backend.sequence_saved_layout(T, B, I, S))
    check_returned(what, out, {"output": (T, B, S), "h_n": (B, S), "c_n": (B, S),
                               **{f"saved slot {i}": (0,) for i in range(n_saved)}}, x, forward_args)
    check_untouched(what, forward_args, before)
    want = run_forward(backend, x, weights, bias, h0, c0, lengths, reverse, True)
    errors = {name: max_rel_error(got, w) for name, got, w in zip(("output", "h_n", "c_n"), out, want)}
    assert_close(errors, lltm_dtype, f"{what} against needs_backward=True")


def test_per_call_answers_are_well_formed(backend, lltm_device, lltm_dtype):
    """can_run / should_run: True, False or a reason string, the same each time they are asked."""
    if not backend.declines_calls:
        pytest.skip(f"backend {backend.name!r} has no can_run or should_run: it runs every call it declares")
    device_type = torch.device(lltm_device).type
    calls = [lltm_core.Call(op, device_type, lltm_dtype, B, I, S, T if op == "sequence" else None, needs)
             for op in ("cell", "sequence") for B, I, S, T in ((1, 1, 1, 1), (16, 32, 128, 64), (3, 7, 1031, 5),
                                                                (256, 1024, 1024, 64), (0, 4, 8, 3))
             for needs in (True, False)]
    for question in ("can_run", "should_run"):
        ask = getattr(backend, question)
        if ask is None:
            continue
        for call in calls:
            first, second = ask(call), ask(call)
            assert first is True or first is False or isinstance(first, str), (
                f"{backend.name}.{question}({call}) returned {first!r}: it must return True, False or a reason string")
            assert first == second, f"{backend.name}.{question}({call}) answered {first!r}, then {second!r}"


def test_sequence_opcheck(backend, lltm_device, lltm_dtype):
    """The sequence custom operators torch.compile sees: schema, fake kernels, autograd registration."""
    _requires_sequence_kernels(backend)
    from lltm_core._ops import SEQUENCE, register

    forward_op, backward_op = register(SEQUENCE, backend)
    inputs = make_sequence_inputs(3, 4, 2, 5, dtype=lltm_dtype, device=lltm_device)
    for lengths, reverse in ((None, False), (torch.tensor([3, 1, 2, 3], device=lltm_device), True)):
        torch.library.opcheck(forward_op, (*inputs, lengths, reverse, backend.name))
        if backend.takes_needs_backward:  # the inference form: empty saved slots, in the fake kernel too
            x, weights, bias, h0, c0 = (t.detach() for t in inputs)
            torch.library.opcheck(forward_op, (x, weights, bias, h0, c0, lengths, reverse, backend.name, False))
        x, weights, bias, h0, c0 = (t.detach() for t in inputs)
        out = forward_op(x, weights, bias, h0, c0, lengths, reverse, backend.name)
        grads = [torch.randn_like(t) for t in out[:3]]
        for needs_grad_input in (True, False):
            torch.library.opcheck(backward_op, (*grads, weights, x, h0, out[0], lengths, out[3:], reverse,
                                                needs_grad_input))


def _saved_elements(run) -> tuple[int, int]:
    """(elements in the distinct storages autograd saved while ``run()`` ran, times the pack hook ran)."""
    storages: dict[int, int] = {}
    calls = [0]

    def pack(t):
        calls[0] += 1
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(storages.values()), calls[0]


def test_sequence_keeps_at_most_the_bound(backend, lltm_device, lltm_dtype):
    """At most (6S + I)·T·B saved elements per layer and direction besides the weights; none under no_grad."""
    _requires_sequence_kernels(backend)
    T, B, I, S, L = 6, 5, 7, 11, 2
    layer = _layer(backend, I, S, L, True, lltm_dtype, lltm_device).requires_grad_(False)
    x = torch.randn(T, B, I, device=lltm_device, dtype=lltm_dtype, requires_grad=True)
    # Parameters that need no gradient are still saved (the backward needs the weights): count them apart.
    weights = sum(p.numel() for p in layer.parameters())
    saved, calls = _saved_elements(lambda: layer(x))
    per_layer_direction = [(6 * S + (I if layer_index == 0 else 2 * S)) * T * B for layer_index in range(L)]
    bound = 2 * sum(per_layer_direction) + weights
    assert calls > 0, "nothing was saved for backward: the test did not see the sequence's autograd node"
    assert saved <= bound, (f"{backend.name}: LLTMLayer({I}, {S}, {L}, bidirectional=True) at T={T} B={B} saved "
                            f"{saved} elements, more than the bound (6S + I_k)·T·B per layer and direction plus "
                            f"the weights = {bound}")
    with torch.no_grad():
        saved, calls = _saved_elements(lambda: layer(x))
    assert calls == 0 and saved == 0, f"{backend.name}: under torch.no_grad() {calls} tensors were saved"
