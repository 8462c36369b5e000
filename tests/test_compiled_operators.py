"""What a compiled graph that holds a backend's own torch.library operators promises (docs/usage.md,
"How a backend is chosen"): it runs the backend chosen at trace time until Dynamo retraces.

Dynamo guards on use_backend() and refresh(), so those retrace.  It cannot guard on LLTM_BACKEND or
LLTM_DISABLE_BACKENDS: such a graph keeps calling the traced backend's operators, with no Python of
lltm-core's at run time to check again (that is what lets it run from C++), until
torch._dynamo.reset().  Graphs of lltm's own wrapper operators check instead (tests/test_compile.py).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import lltm_core
import lltm_ref
from lltm_core import _discovery, _registry
from lltm_core.extension import contract_schemas, register_fake_kernels
from lltm_core.testing import make_inputs

_NAMESPACE = "lltm_test_opbacked"
_ran: list[str] = []

# A backend whose kernels are torch.library operators, as lltm-cpu's are, on lltm-ref's arithmetic.
# Its operators have the contract's schemas (lltm_schema.h), as a compiled backend's must.
_library = torch.library.Library(_NAMESPACE, "DEF")
_library.define(contract_schemas()["forward"])
_library.define(contract_schemas()["backward"])


def _forward(*args):
    _ran.append("forward")
    return tuple(t.clone() for t in lltm_ref.forward(*args))


def _backward(*args):
    return tuple(lltm_ref.backward(*args))


_library.impl("forward", _forward, "CPU")
_library.impl("backward", _backward, "CPU")
register_fake_kernels(_NAMESPACE, lltm_core.extension.saved_layout)


@pytest.fixture
def operator_backend():
    """"opbacked" (priority 1000, CPU float32 and float64), installed beside the others, chosen by default."""
    ops = getattr(torch.ops, _NAMESPACE)
    backend = dataclasses.replace(lltm_core.get_backend("ref"), name="opbacked", priority=1000, composite=False,
                                  forward=ops.forward.default, backward=ops.backward.default,
                                  sequence_forward=None, sequence_backward=None, sequence_saved_layout=None,
                                  devices=frozenset({"cpu"}), dtypes=frozenset({torch.float32, torch.float64}))
    record = _discovery.BackendRecord("opbacked", "(this test)", "0", "-", backend=backend, status="available")
    _discovery.records_by_name()["opbacked"] = [record]
    _registry.forget_choices()
    torch._dynamo.reset()
    _ran.clear()
    yield backend
    torch._dynamo.reset()
    lltm_core.refresh()


def test_an_operator_graph_keeps_its_backend_until_dynamo_retraces(operator_backend, monkeypatch):
    assert lltm_core.get_backend().name == "opbacked"
    graphs = []

    def record(gm, example_inputs):
        graphs.append(sorted({str(n.target) for n in gm.graph.nodes if "forward" in str(n.target)}))
        return gm.forward

    compiled = torch.compile(lambda *args: lltm_core.lltm(*args), backend=record, fullgraph=True)
    inputs = make_inputs(3, 4, 5)
    want = lltm_core.lltm(*inputs, backend="ref")
    torch.testing.assert_close(compiled(*inputs), want)
    assert graphs == [[f"{_NAMESPACE}.forward.default"]] and _ran == ["forward"]

    # Dynamo guards on use_backend(): the block retraces for lltm-ref's (wrapped) operator.
    with lltm_core.use_backend("ref"):
        compiled(*inputs)
    assert graphs[-1] == ["lltm.ref_forward"]

    # Not on the environment: the graph runs what it was traced for, without a word.
    for variable, value in (("LLTM_BACKEND", "ref"), ("LLTM_DISABLE_BACKENDS", "opbacked")):
        with monkeypatch.context() as env:
            env.setenv(variable, value)
            _ran.clear()
            torch.testing.assert_close(compiled(*inputs), want)
            assert _ran == ["forward"], f"{variable}={value}: the traced operator is no longer what runs"
            assert len(graphs) == 2
            # torch._dynamo.reset() makes the next call trace again, with the choice of now.
            torch._dynamo.reset()
            _ran.clear()
            torch.testing.assert_close(compiled(*inputs), want, rtol=1e-4, atol=1e-5)
            assert _ran == [] and graphs[-1] != graphs[0]
        torch._dynamo.reset()
        compiled(*inputs)
        graphs[:] = graphs[:2]
