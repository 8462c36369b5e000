"""The operator layer (lltm_core._ops): one record per op, the imports around it, and meta tensors."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import lltm_core
from lltm_core import _ops
from lltm_core.testing import make_sequence_inputs

CORE = pathlib.Path(lltm_core.__file__).parent


def _imports(module: str) -> set[str]:
    """The lltm_core modules ``module`` imports, at its top level or inside a function."""
    tree = ast.parse((CORE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def test_the_public_modules_and_the_traced_route_import_no_module_that_imports_them():
    modules = ("_cell", "_sequence", "_trace")
    imported_by = {m: _imports(m) for m in modules}
    for module in modules:
        for other in imported_by[module]:
            if (CORE / f"{other}.py").exists():
                assert module not in _imports(other), f"{module} imports {other}, which imports {module}"


def test_every_op_is_a_call_op_and_a_backend_names_its_kernels_by_op():
    assert set(_ops.OPS) == {"cell", "sequence"}
    ref = lltm_core.get_backend("ref")
    assert set(ref.kernels) == set(_ops.OPS)
    assert ref.kernels["sequence"].forward is ref.sequence_forward
    assert ref.kernels["cell"].saved_layout is ref.saved_layout
    assert ref.kernels["sequence"].takes_needs_backward and not ref.kernels["cell"].takes_needs_backward


def test_the_layout_declared_once_is_the_reference_backends():
    from lltm_core import extension

    ref = lltm_core.get_backend("ref")
    assert ref.saved_layout is extension.saved_layout
    assert ref.sequence_saved_layout is extension.sequence_saved_layout
    x, w, b, h, c = (torch.randn(3, 4), torch.randn(15, 9), torch.randn(15), torch.randn(3, 5), torch.randn(3, 5))
    saved = ref.forward(x, w, b, h, c)[2:]
    assert [tuple(t.shape) for t in saved] == list(extension.saved_layout(3, 4, 5).values())


@pytest.mark.parametrize("bidirectional", [False, True])
def test_meta_tensors_give_the_shapes_nn_lstm_gives(bidirectional):
    """nn.LSTM runs on meta for shape inference; LLTM and LLTMLayer do too, computing nothing."""
    T, B, I, S = 7, 3, 4, 5
    layer = lltm_core.LLTMLayer(I, S, num_layers=2, bidirectional=bidirectional, batch_first=True, device="meta")
    lstm = torch.nn.LSTM(I, S, num_layers=2, bidirectional=bidirectional, batch_first=True, device="meta")
    x = torch.empty(B, T, I, device="meta")
    out, (h, c) = layer(x)
    want, (want_h, want_c) = lstm(x)
    assert [(t.shape, t.device.type, t.dtype) for t in (out, h, c)] == [
        (t.shape, "meta", torch.float32) for t in (want, want_h, want_c)]
    cell = lltm_core.LLTM(I, S, device="meta", dtype=torch.float64)
    new_h, new_c = cell(torch.empty(B, I, device="meta", dtype=torch.float64))
    assert [(t.shape, t.device.type, t.dtype) for t in (new_h, new_c)] == [((B, S), "meta", torch.float64)] * 2
    # The shapes of the functions too, with lengths.
    args = [torch.empty(s, device="meta") for s in ((T, B, I), (3 * S, S + I), (3 * S,), (B, S), (B, S))]
    out, h_n, c_n = lltm_core.lltm_sequence(*args, reverse=True)
    assert (out.shape, h_n.shape, c_n.shape) == ((T, B, S), (B, S), (B, S))
    # With lengths (and so a packed input) they raised "Tensor.item() cannot be called on meta tensors".
    out, h_n, c_n = lltm_core.lltm_sequence(*args, lengths=torch.tensor([T, 2, 1]), reverse=True)
    assert [(tuple(t.shape), t.device.type) for t in (out, h_n, c_n)] == [
        ((T, B, S), "meta"), ((B, S), "meta"), ((B, S), "meta")]
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([T, 2, 1]), batch_first=True)
    out, (h, c) = layer(packed)
    want, (want_h, want_c) = lstm(packed)
    assert [(t.shape, t.device.type) for t in (out.data, h, c)] == [
        (t.shape, "meta") for t in (want.data, want_h, want_c)]


# --- FlopCounterMode (lltm_core._flops) ----------------------------------------

T, B, I, S = 5, 3, 4, 6
GEMM = 2 * B * 3 * S * (S + I)  # one step's: (B, S + I) x (S + I, 3S), as torch counts mm


def _flops(run) -> dict[str, int]:
    with FlopCounterMode(display=False) as counter:
        run()
    return {str(op): flops for op, flops in counter.get_flop_counts().get("Global", {}).items()}


@pytest.mark.skipif("cpu" not in lltm_core.available_backends(),
                    reason="lltm-cpu is not installed here: its operators' formulas need its library")
@pytest.mark.parametrize("input_grad", [False, True], ids=["weights_grad", "input_grad"])
def test_flop_counter_counts_lltm_cpus_operators_as_the_formula_and_ref_say(input_grad):
    # lltm-cpu's operators counted 0: FlopCounterMode sees only operators it has formulas for.
    torch.manual_seed(0)
    x = torch.randn(T, B, I, requires_grad=input_grad)
    counts = {}
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # lltm-cpu's first call of a shape then times no GEMM routes
    try:
        for backend in ("cpu", "ref"):
            layer, cell = lltm_core.LLTMLayer(I, S, backend=backend), lltm_core.LLTM(I, S, backend=backend)
            counts[backend] = (_flops(lambda: layer(x)), _flops(lambda: layer(x)[0].sum().backward()),
                               _flops(lambda: cell(x[0])), _flops(lambda: sum(cell(x[0])).sum().backward()))
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    sequence_backward = T * (GEMM + 2 * B * 3 * S * (S + (I if input_grad else 0)))  # W_h always, W_x if asked
    cell_backward = GEMM * (2 if input_grad else 1)  # grad_X only when input (or the state) needs it
    assert counts["cpu"] == (
        {"lltm_cpu.sequence_forward": T * GEMM},
        {"lltm_cpu.sequence_forward": T * GEMM, "lltm_cpu.sequence_backward": sequence_backward},
        {"lltm_cpu.forward": GEMM},
        {"lltm_cpu.forward": GEMM, "lltm_cpu.backward": cell_backward},
    )
    # lltm-ref's ATen operators count the same (its sequence forward's in-place addmm_ too: _flops.IN_PLACE_GEMMS).
    assert counts["ref"] == ({"aten.addmm_": T * GEMM}, {"aten.addmm_": T * GEMM, "aten.mm": sequence_backward},
                             {"aten.addmm": GEMM}, {"aten.addmm": GEMM, "aten.mm": cell_backward})


@pytest.mark.parametrize("lengths", [None, [7, 2, 5]], ids=["full", "lengths"])
@pytest.mark.parametrize("input_grad", [False, True], ids=["weights_grad", "input_grad"])
def test_flop_counter_counts_lltm_refs_gemms_as_the_formula_says(input_grad, lengths, monkeypatch):
    # lltm-ref's sequence forward added its GEMMs in place (addmm_), which torch counted 0.
    import lltm_ref

    T, B, I, S = 7, 3, 5, 11  # odd sizes: the counts must follow each dimension
    gemm = 2 * B * 3 * S * (S + I)
    torch.manual_seed(0)
    x = torch.randn(T, B, I, requires_grad=input_grad)
    lengths = torch.tensor(lengths) if lengths else None
    layer, cell = lltm_core.LLTMLayer(I, S, backend="ref"), lltm_core.LLTM(I, S, backend="ref")
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False) if lengths is not None else x

    def total(run) -> int:
        with FlopCounterMode(display=False) as counter:
            run()
        return counter.get_total_flops()

    sequence_backward = T * (gemm + 2 * B * 3 * S * (S + (I if input_grad else 0)))
    assert total(lambda: layer(packed)) == T * gemm
    assert total(lambda: layer(packed)[1][0].sum().backward()) == T * gemm + sequence_backward
    monkeypatch.setattr(lltm_ref, "INFERENCE_CHUNK_ROWS", 2 * B)  # inference: its input projected 2 steps at a time
    with torch.no_grad():
        assert total(lambda: layer(packed)) == T * gemm
    assert total(lambda: cell(x[0])) == gemm
    assert total(lambda: sum(cell(x[0])).sum().backward()) == gemm * (3 if input_grad else 2)


def test_flop_counter_counts_lltms_wrapper_operators_even_when_made_inside_the_counter():
    # lltm::<backend>_* run Python kernels inside one operator (under torch.compile), opaque to the counter;
    # a backend loads at its first call, often inside the counter, after it copied torch's formulas.
    backend = dataclasses.replace(lltm_core.get_backend("ref"), name="flops_counted")
    x, weights, bias, h0, c0 = make_sequence_inputs(T, B, I, S, requires_grad=False)
    with FlopCounterMode(display=False) as counter:
        forward, backward = _ops.register(_ops.SEQUENCE, backend)  # defines them: the first time here
        output, h_n, c_n, *saved = forward(x, weights, bias, h0, c0, None, False, backend.name)
        backward(output, h_n, c_n, weights, x, h0, output, None, saved, False, True)
    assert {str(op): n for op, n in counter.get_flop_counts().get("Global", {}).items()} == {
        "lltm.flops_counted_sequence_forward": T * GEMM, "lltm.flops_counted_sequence_backward": 2 * T * GEMM}
