"""lltm under torch.compile: which backend a compiled graph runs, and when it is chosen again."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

import lltm_core
from lltm_core import BackendError
from lltm_core.testing import make_inputs


@pytest.fixture
def compiled_lltm():
    """lltm compiled with fullgraph=True, and a list of the lltm operators in each graph Dynamo made."""
    torch._dynamo.reset()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(sorted({str(n.target) for n in gm.graph.nodes if str(n.target).startswith("lltm.")}))
        return gm.forward

    yield torch.compile(lambda *args, **kw: lltm_core.lltm(*args, **kw), backend=record, fullgraph=True), graphs
    torch._dynamo.reset()


@pytest.fixture
def fast_and_ref(fake_backends):
    """Two backends for CPU float32: "fast" (priority 50) is the default choice, "ref" the other."""
    fake_backends("lltm-fake-fast", {"fast": "fast"})
    assert lltm_core.get_backend().name == "fast"


def test_use_backend_retraces_for_the_backend_it_names(fast_and_ref, compiled_lltm):
    compiled_lltm, graphs = compiled_lltm
    inputs = make_inputs(3, 4, 5)
    compiled_lltm(*inputs)
    with lltm_core.use_backend("ref"):
        compiled_lltm(*inputs)
    compiled_lltm(*inputs)  # outside the block again: the first graph, no third trace
    assert graphs == [["lltm.fast_forward"], ["lltm.ref_forward"]]


def test_a_request_naming_nothing_installed_fails_under_compile_too(fast_and_ref, compiled_lltm, monkeypatch):
    compiled_lltm, graphs = compiled_lltm
    monkeypatch.setenv("LLTM_BACKEND", "nosuch")
    with pytest.raises(Exception, match="lltm backend 'nosuch'"):
        compiled_lltm(*make_inputs(3, 4, 5))
    with pytest.raises(BackendError, match="lltm backend 'nosuch'"):  # use_backend() says so on entry
        with lltm_core.use_backend("nosuch"):
            pass


def test_a_graph_whose_choice_went_stale_refuses_to_run(fast_and_ref, compiled_lltm, monkeypatch):
    """LLTM_BACKEND is not something Dynamo can guard on: the operator checks the choice when it runs."""
    compiled_lltm, graphs = compiled_lltm
    inputs = make_inputs(3, 4, 5)
    compiled_lltm(*inputs)
    monkeypatch.setenv("LLTM_BACKEND", "ref")
    with pytest.raises(BackendError, match=r"traced to run backend 'fast', but lltm now chooses 'ref' "
                                           r"\(asked for by LLTM_BACKEND=ref\).*torch._dynamo.reset\(\)"):
        compiled_lltm(*inputs)
    torch._dynamo.reset()
    compiled_lltm(*inputs)
    assert graphs[-1] == ["lltm.ref_forward"]


def test_backend_argument_is_not_second_guessed_by_the_operator(fast_and_ref, compiled_lltm, monkeypatch):
    compiled_lltm, graphs = compiled_lltm
    inputs = make_inputs(3, 4, 5)
    compiled_lltm(*inputs, backend="ref")
    monkeypatch.setenv("LLTM_BACKEND", "fast")  # backend= outranks it, traced or not
    new_h, _ = compiled_lltm(*inputs, backend="ref")
    torch.testing.assert_close(new_h, lltm_core.lltm(*inputs, backend="ref")[0])
    assert graphs == [["lltm.ref_forward"]]


def test_refresh_retraces(fast_and_ref, compiled_lltm):
    compiled_lltm, graphs = compiled_lltm
    inputs = make_inputs(3, 4, 5)
    compiled_lltm(*inputs)
    lltm_core.refresh()
    compiled_lltm(*inputs)
    assert len(graphs) == 2


def test_refresh_with_a_factory_that_returns_new_kernels(fake_backends, compiled_lltm):
    """After refresh() an entry point's factory may build new kernel objects (closures): they are the
    same backend, and its operators run them instead of refusing them as another backend."""
    fake_backends("lltm-fake-fresh", {"fresh": "fresh"})
    compiled_lltm, graphs = compiled_lltm
    inputs = make_inputs(3, 4, 5)
    want = lltm_core.lltm(*inputs, backend="ref")
    torch.testing.assert_close(compiled_lltm(*inputs), want)
    lltm_core.refresh()
    torch.testing.assert_close(compiled_lltm(*inputs), want)
    assert graphs == [["lltm.fresh_forward"], ["lltm.fresh_forward"]]


def test_two_backends_with_one_name_cannot_share_its_operators():
    import lltm_ref

    from lltm_core._ops import CELL, register

    ref = lltm_ref.load_backend()
    register(CELL, ref)
    impostor = dataclasses.replace(ref, forward=lambda *args: lltm_ref.forward(*args))
    with pytest.raises(BackendError, match="already run another backend named 'ref'.*a name of its own"):
        register(CELL, impostor)
    # same kernels: same operators
    assert register(CELL, dataclasses.replace(ref, priority=7)) == register(CELL, ref)


_FIRST_TRACE_IN_A_FRESH_PROCESS = """
import sys, torch, lltm_core
assert "torch._dynamo" not in sys.modules, "import lltm_core imported torch._dynamo"
torch.manual_seed(0)
cell, layer = lltm_core.LLTM(7, 5), lltm_core.LLTMLayer(7, 5, bidirectional=True)
x, h, c = torch.randn(3, 7), torch.randn(3, 5), torch.randn(3, 5)
xs = torch.randn(4, 3, 7, requires_grad=True)
cell_eager, (layer_eager, _) = cell(x, (h, c)), layer(xs)
layer_eager.sum().backward()
assert "torch._dynamo" not in sys.modules, "an eager call imported torch._dynamo"
torch.testing.assert_close(torch.compile(cell, backend="eager", fullgraph=True)(x, (h, c)), cell_eager)
got, _ = torch.compile(layer, backend="eager", fullgraph=True)(xs)
torch.testing.assert_close(got, layer_eager)
torch.testing.assert_close(torch.autograd.grad(got.sum(), xs)[0], xs.grad)
print("traced on", lltm_core.get_backend().name)
"""


def test_import_leaves_dynamo_to_the_first_trace():
    """Neither ``import lltm_core`` nor an eager call imports torch._dynamo (over a second): lltm's
    tracing module is imported by the first trace, from inside Dynamo, which then compiles the cell
    and the layer with fullgraph=True.  In a fresh process, where nothing has traced yet."""
    done = subprocess.run([sys.executable, "-c", _FIRST_TRACE_IN_A_FRESH_PROCESS], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "traced on" in done.stdout
