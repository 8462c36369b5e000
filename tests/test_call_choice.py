"""Contract v3: backends that decline calls (can_run / should_run), explain(), and older backends unchanged.

The fake backends (tests/conftest.py) are lltm-ref's kernels with per-call answers added; each
declines state sizes above 64, so a call at S=32 and one at S=128 tell the two paths apart.
"""

from __future__ import annotations

import logging

import pytest
import torch

import lltm_core
from lltm_core import BackendError, Call
from lltm_core.testing import make_inputs


def _cell(S: int, *, backend=None, requires_grad=False):
    args = make_inputs(3, 5, S, dtype=torch.float32, requires_grad=requires_grad)
    return lltm_core.lltm(*args, backend=backend)


def _sequence_call(S: int, **changes) -> Call:
    fields = dict(op="sequence", device_type="cpu", dtype=torch.float32, batch=4, input_features=5, state_size=S,
                  steps=6, needs_backward=True)
    return Call(**{**fields, **changes})


def _chosen_for(S: int, op: str = "sequence") -> str:
    return next(t.name for t in lltm_core.explain(_sequence_call(S, op=op, steps=6 if op == "sequence" else None))
                if t.verdict == "chosen")


def _spy(monkeypatch, backend_name: str) -> list:
    """Records each sequence_forward/forward call that reaches ``backend_name``'s kernels."""
    seen = []
    backend = lltm_core.get_backend(backend_name)  # the loaded object that every later choice returns
    real_seq, real_cell = backend.sequence_forward, backend.forward

    def seq(*args):
        seen.append("sequence")
        return real_seq(*args)

    def cell(*args):
        seen.append("cell")
        return real_cell(*args)

    object.__setattr__(backend, "sequence_forward", seq)
    object.__setattr__(backend, "forward", cell)
    backend.__post_init__()  # rebuilds backend.kernels, the per-op map lltm-core runs, from the fields
    return seen


def test_a_declining_backend_passes_calls_on(fake_backends, monkeypatch):
    fake_backends("lltm-fake", {"small_only": "small_only"})
    seen = _spy(monkeypatch, "small_only")
    layer_small, layer_big = lltm_core.LLTMLayer(5, 32), lltm_core.LLTMLayer(5, 128)
    x = torch.randn(6, 4, 5)
    layer_small(x)
    assert seen == ["sequence"]
    layer_big(x)  # should_run declines S=128: lltm-ref runs it
    assert seen == ["sequence"]
    assert _chosen_for(32) == "small_only" and _chosen_for(128) == "ref"
    # The cell is asked too.
    _cell(32)
    _cell(128)
    assert seen == ["sequence", "cell"]


def test_selection_is_memoized_per_call(fake_backends):
    fake_backends("lltm-fake", {"counting": "counting"})
    import lltm_fake_backends

    asked = lltm_fake_backends._asked
    layer = lltm_core.LLTMLayer(5, 16)
    x = torch.randn(6, 4, 5)
    for _ in range(3):
        layer(x)
    with torch.no_grad():
        layer(x)
    # One question per distinct call: with and without backward.
    assert [c.needs_backward for c in asked] == [True, False], asked
    assert asked[0] == _sequence_call(16)._replace(state_size=16)
    layer(torch.randn(7, 4, 5))  # another length: another call
    assert len(asked) == 3 and asked[-1].steps == 7


def test_the_memo_is_bounded(fake_backends, monkeypatch):
    """An answer pushed out of the bounded memo is asked again; one still in it is not."""
    import lltm_core._registry as registry

    fake_backends("lltm-fake", {"counting": "counting"})
    import lltm_fake_backends

    asked = lltm_fake_backends._asked
    monkeypatch.setattr(registry, "MEMO_SIZE", 8)
    for T in range(1, 30):
        lltm_core.lltm_sequence(*_sequence_args(T))
    assert len(asked) == 29
    lltm_core.lltm_sequence(*_sequence_args(29))  # the newest: remembered
    assert len(asked) == 29
    lltm_core.lltm_sequence(*_sequence_args(1))  # the oldest: forgotten, asked again
    assert len(asked) == 30 and asked[-1].steps == 1


def _sequence_args(T: int, S: int = 16, B: int = 2, I: int = 3):
    return (torch.randn(T, B, I), torch.randn(3 * S, S + I), torch.randn(3 * S), torch.randn(B, S), torch.randn(B, S))


def test_can_run_declines_even_a_named_backend_with_its_reason(fake_backends):
    fake_backends("lltm-fake", {"small_can": "small_can", "small_only": "small_only"})
    # should_run is skipped for a backend the user named ...
    out, _, _ = lltm_core.lltm_sequence(*_sequence_args(4, S=128), backend="small_only")
    assert out.shape == (4, 2, 128)
    # ... can_run is not, and the error names the backend and gives its reason.
    with pytest.raises(BackendError) as err:
        lltm_core.lltm_sequence(*_sequence_args(4, S=128), backend="small_can")
    msg = str(err.value)
    assert "lltm backend 'small_can' (asked for by backend=) cannot run sequence T4 B2 I3 S128" in msg
    assert "state_size 128 > 64: too big for this backend" in msg
    with pytest.raises(BackendError, match="small_can.*LLTM_BACKEND=small_can.*state_size 128 > 64"):
        with pytest.MonkeyPatch.context() as env:
            env.setenv("LLTM_BACKEND", "small_can")
            _cell(128)
    with pytest.raises(BackendError, match=r"asked for by use_backend\(\)"):
        with lltm_core.use_backend("small_can"):
            lltm_core.LLTMLayer(3, 128)(torch.randn(2, 2, 3))
    # A Backend object passed as backend= is held to its can_run too.
    with pytest.raises(BackendError, match="passed as backend=.*cannot run cell B3 I5 S128"):
        _cell(128, backend=lltm_core.get_backend("small_can"))


def test_when_nothing_can_run_the_error_lists_every_candidate(fake_backends, monkeypatch):
    fake_backends("lltm-fake", {"small_can": "small_can", "small_both": "small_both"})
    monkeypatch.setenv("LLTM_DISABLE_BACKENDS", "ref")
    with pytest.raises(BackendError) as err:
        _cell(128)
    msg = str(err.value)
    assert "no lltm backend can run cell B3 I5 S128, cpu float32, inference" in msg
    assert "small_both: declined: priority 90; can_run: no cell kernels worth running" in msg
    assert "small_can: declined: priority 80; can_run: state_size 128 > 64: too big for this backend" in msg
    assert "ref: unavailable: disabled: hidden by LLTM_DISABLE_BACKENDS" in msg


def test_a_raising_or_malformed_answer_is_a_reported_decline(fake_backends, caplog):
    fake_backends("lltm-fake", {"raising": "raising", "answers_none": "answers_none"})
    with caplog.at_level(logging.WARNING, logger="lltm_core"):
        new_h, _ = _cell(16)  # the call is not broken: lltm-ref runs it
    assert new_h.shape == (3, 16)
    assert "should_run raised ZeroDivisionError: a bug in should_run (counted as a decline" in caplog.text
    trace = {t.name: t for t in lltm_core.explain(_sequence_call(16))}
    assert trace["raising"].verdict == "declined"
    assert "should_run raised ZeroDivisionError: a bug in should_run" in trace["raising"].reason
    assert trace["answers_none"].verdict == "declined"
    assert "can_run returned None; it must return True, False or a reason string" in trace["answers_none"].reason
    assert trace["ref"].verdict == "chosen"


def test_explain_gives_every_backend_in_order(fake_backends):
    fake_backends("lltm-fake", {"small_only": "small_only", "counting": "counting", "gpu_only": "gpu_only",
                                "nogpu": "nogpu"})
    trace = lltm_core.explain(_sequence_call(128))
    assert [(t.name, t.verdict) for t in trace] == [
        ("counting", "chosen"),
        ("small_only", "declined"),
        ("ref", "lower priority"),
        ("gpu_only", "not for this device/dtype"),
        ("nogpu", "unavailable"),
    ]
    assert trace[0].reason == "priority 85, the highest that accepts the call"
    assert trace[1].reason == "priority 80; should_run: state_size 128 > 64: too big for this backend"
    assert trace[2].reason == "priority 0 < counting's 85; it would run it"
    assert trace[3].reason == "it runs on cuda, not cpu"
    assert trace[4].reason == "unavailable: no CUDA device visible"
    with lltm_core.use_backend("small_only"):  # named: should_run is not asked, the others are not asked
        named = lltm_core.explain(_sequence_call(128))
    assert named[0][:2] == ("small_only", "chosen")
    # Named: the others are neither asked nor loaded.
    assert {(t.name, t.verdict) for t in named[1:]} == {
        ("counting", "not asked"), ("gpu_only", "not asked"), ("nogpu", "not asked"), ("ref", "not asked")}
    assert named[0].reason == "asked for by use_backend()"
    with pytest.raises(TypeError, match="explain\\(\\) takes an lltm_core.Call"):
        lltm_core.explain(("sequence", "cpu"))


def test_per_call_answers_need_interface_version_3(fake_backends):
    fake_backends("lltm-fake", {"no_v3": "no_v3"})
    report = {r["name"]: r for r in lltm_core.backend_report()}
    assert report["no_v3"]["status"] == "unavailable"
    assert "should_run came with interface version 3, but interface_versions is (1, 2): add 3" in report["no_v3"]["reason"]


def test_a_v2_backend_runs_as_before(fake_backends):
    """A version-2 backend is called without needs_backward; core drops what it saved for inference."""
    fake_backends("lltm-fake", {"v2_only": "v2_only"})
    import lltm_fake_backends

    assert not lltm_core.get_backend("v2_only").takes_needs_backward
    layer = lltm_core.LLTMLayer(5, 8, backend="v2_only")
    ref = lltm_core.LLTMLayer(5, 8, backend="ref")
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(6, 4, 5, requires_grad=True)
    out, _ = layer(x)
    out.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    ref(x)[0].sum().backward()
    torch.testing.assert_close(grad, x.grad)
    with torch.no_grad():
        torch.testing.assert_close(layer(x)[0], ref(x)[0])
    assert lltm_fake_backends._v2_calls == [False, False]  # called with grad mode off (the autograd.Function), twice
    assert lltm_core.explain(_sequence_call(8))[0].name == "ref"  # v2: no answers, it runs what it declares
    trace = lltm_core.explain(_sequence_call(8)._replace(dtype=torch.float32))
    assert {t.name: t.verdict for t in trace}["v2_only"] == "lower priority"


def test_a_v1_backend_runs_as_before(fake_backends):
    fake_backends("lltm-fake", {"v1_only": "v1_only"})
    backend = lltm_core.get_backend("v1_only")
    assert not backend.has_sequence_kernels and not backend.declines_calls
    layer = lltm_core.LLTMLayer(5, 8, backend="v1_only")
    ref = lltm_core.LLTMLayer(5, 8, backend="ref")
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(6, 4, 5)
    torch.testing.assert_close(layer(x)[0], ref(x)[0])


def test_inference_keeps_nothing_on_a_v3_backend():
    """Under no_grad, lltm-ref's sequence_forward is told so, and returns empty saved slots."""
    backend = lltm_core.get_backend("ref")
    args = _sequence_args(9, S=6, B=3, I=4)
    out_train = backend.sequence_forward(*args, None, False, True)
    out_infer = backend.sequence_forward(*args, None, False, False)
    assert [t.numel() for t in out_infer[3:]] == [0, 0]
    for a, b in zip(out_train[:3], out_infer[:3]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_follows_the_per_call_choice(fake_backends, dynamic):
    """Under torch.compile(fullgraph=True) the per-call choice is made while tracing, for the traced shape."""
    fake_backends("lltm-fake", {"small_only": "small_only"})
    torch._dynamo.reset()

    def run(x, weights, bias, h0, c0):
        return lltm_core.lltm_sequence(x, weights, bias, h0, c0)

    compiled = torch.compile(run, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for S, expect in ((32, "small_only"), (128, "ref")):
        args = _sequence_args(5, S=S)
        args[0].requires_grad_()
        graphs = []
        out = torch.compile(run, fullgraph=True, dynamic=dynamic,
                            backend=lambda gm, _: graphs.append(str(gm.graph)) or gm)(*args)
        assert f"lltm.{expect}_sequence_forward" in graphs[0], graphs[0]
        torch.testing.assert_close(out[0], run(*args)[0])
        out = compiled(*args)
        out[0].sum().backward()
    torch._dynamo.reset()


def test_the_worked_example_in_writing_a_backend_runs_as_shown(tmp_path, monkeypatch, capsys):
    """docs/writing-a-backend.md's declining backend, installed as an entry point, prints the trace shown there."""
    import importlib
    import re
    from pathlib import Path

    from conftest import write_distribution
    from lltm_core.cli import main

    doc = (Path(__file__).parents[1] / "docs" / "writing-a-backend.md").read_text()
    section = doc[doc.index("A worked example"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    console = re.search(r"```console\n\$ lltm (.*?)\n(.*?)```", section, re.S)
    (tmp_path / "lltm_small_example.py").write_text(code)
    write_distribution(tmp_path, "lltm-small-example", {"small": "lltm_small_example:load_backend"})
    monkeypatch.syspath_prepend(str(tmp_path))
    from importlib import metadata

    real = metadata.entry_points
    monkeypatch.setattr(metadata, "entry_points", lambda **sel: real(**sel) if sel.get("group") != "lltm.backends"
                        else metadata.EntryPoints(ep for ep in real(**sel)
                                                  if ep.dist.metadata["Name"] in ("lltm-ref", "lltm-small-example")))
    importlib.invalidate_caches()
    lltm_core.refresh()
    try:
        assert main(console.group(1).split()) == 0
        shown = capsys.readouterr().out
        assert shown == console.group(2), shown
        x = make_inputs(2, 3, 4, dtype=torch.float64)
        with pytest.raises(BackendError, match="cannot run cell B2 I3 S4, cpu float64.*no float64 cell kernel"):
            lltm_core.lltm(*x, backend="small")
    finally:
        monkeypatch.undo()
        lltm_core.refresh()


@pytest.mark.parametrize("call, error, pattern", [
    (Call("seq", "cpu", torch.float32, 3, 5, 7, 4), ValueError, r"Call.op must be 'cell' or 'sequence', got 'seq'"),
    (Call("sequence", "cpu", "float32", 3, 5, 7, 4), TypeError, r"Call.dtype must be a torch.dtype .*got 'float32'"),
    (Call("cell", "cuda:0", torch.float32, 3, 5, 7), ValueError, r"Call.device_type is a device type .*'cuda:0'"),
    (Call("sequence", "cpu", torch.float32, 3, 5, 7), ValueError, r"Call.steps must be a non-negative integer, got None"),
    (Call("cell", "cpu", torch.float32, 3, 5, 7, 4), ValueError, r"Call.steps is None for the cell"),
    (Call("cell", "cpu", torch.float32, 3, 5.0, 7), ValueError, r"Call.input_features must be a non-negative integer"),
], ids=["op", "dtype-string", "device-with-index", "sequence-without-steps", "cell-with-steps", "float-size"])
def test_explain_names_the_field_of_a_call_it_cannot_describe(call, error, pattern):
    # A string dtype was answered "it takes bfloat16, float32, float64, not float32", and an unknown op as a cell.
    with pytest.raises(error, match=pattern):
        lltm_core.explain(call)


def test_explain_takes_numpy_integers_as_sizes():
    # As torch does for sizes: an np.int64 batch (from a numpy shape, say) is an integer, not a wrong field.
    np = pytest.importorskip("numpy")
    trace = lltm_core.explain(Call("sequence", "cpu", torch.float32, np.int64(3), 5, 7, np.int32(4)))
    assert [t.verdict for t in trace].count("chosen") == 1
