"""The measured choice (select_by_measurement(), LLTM_SELECT=measure): the fastest backend that accepts
a call runs it, timed once per shape class; a named backend runs untimed."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest
import torch

import lltm_core
import lltm_ref
from lltm_core import _discovery, _registry
from lltm_core.testing import make_inputs

# Seconds each fake backend's forward costs: the tests set them, SLOW for one and FAST for the other.
# SLOW is several scheduler ticks: on a loaded machine a process can lose a whole 4 ms tick in a call,
# and at 4 ms the faster backend's median of five rounds once measured slower than the other's.
COSTS = {"steady": 0.0, "nimble": 0.0}
SLOW, FAST = 0.03, 0.0005
RAN: list[str] = []


def _costly(name: str, kernel):
    def run(*args):
        RAN.append(name)
        time.sleep(COSTS[name])
        return kernel(*args)

    return run


@pytest.fixture
def two_backends(monkeypatch):
    """"steady" (priority 60) and "nimble" (priority 50), lltm-ref's arithmetic at the costs COSTS says,
    the only backends not hidden."""
    ref = lltm_core.get_backend("ref")
    records = _discovery.records_by_name()
    hidden = sorted(records)
    for name, priority in (("steady", 60), ("nimble", 50)):
        backend = dataclasses.replace(ref, name=name, priority=priority, forward=_costly(name, lltm_ref.forward),
                                      sequence_forward=_costly(name, lltm_ref.sequence_forward))
        records[name] = [_discovery.BackendRecord(name, "(this test)", "0", "-", backend=backend,
                                                  status="available")]
    monkeypatch.setenv("LLTM_DISABLE_BACKENDS", ",".join(hidden))
    _registry.forget_choices()
    RAN.clear()
    yield
    lltm_core.select_by_measurement(False)
    lltm_core.refresh()


def _sequence_args(T=6, B=2, I=3, S=4, requires_grad=True):
    return [torch.randn(shape, requires_grad=requires_grad) for shape in ((T, B, I), (3 * S, S + I), (3 * S,),
                                                                       (B, S), (B, S))]


def _chosen(trace):
    return next(t for t in trace if t.verdict == "chosen")


def test_the_faster_runs_and_the_slower_when_the_costs_swap(two_backends):
    COSTS.update(steady=SLOW, nimble=FAST)
    args = _sequence_args()
    call = lltm_core.Call("sequence", "cpu", torch.float32, 2, 3, 4, 6)
    assert _chosen(lltm_core.explain(call)).name == "steady"  # by priority: nothing is timed
    assert RAN == []
    with lltm_core.select_by_measurement():
        out, h, c = lltm_core.lltm_sequence(*args)
        assert RAN[-1] == "nimble" and {"steady", "nimble"} <= set(RAN)  # both timed, the faster ran the call
        (out.sum() + h.sum()).backward()
        trace = {t.name: t for t in lltm_core.explain(call)}
        assert trace["nimble"].verdict == "chosen" and "the fastest measured" in trace["nimble"].reason
        assert trace["steady"].verdict == "slower" and "against nimble's" in trace["steady"].reason
        RAN.clear()
        lltm_core.lltm_sequence(*_sequence_args(T=7))  # T=7 is in T=6's class (up to 8): no timing again
        assert RAN == ["nimble"]
    # The choice by priority is back outside the block.
    RAN.clear()
    lltm_core.lltm_sequence(*args)
    assert RAN == ["steady"]

    COSTS.update(steady=FAST, nimble=SLOW)
    _registry.forget_choices()  # forgets the measured times (as refresh() does), as a new process would
    with lltm_core.select_by_measurement():
        RAN.clear()
        lltm_core.lltm_sequence(*args)
        assert RAN[-1] == "steady"
        assert _chosen(lltm_core.explain(call)).name == "steady"


def test_the_cell_and_inference_are_measured_too(two_backends):
    COSTS.update(steady=SLOW, nimble=FAST)
    lltm_core.select_by_measurement()  # as a plain call: on for the process (the fixture turns it off)
    assert _registry.measuring()
    new_h, _ = lltm_core.lltm(*make_inputs(3, 4, 5))
    assert RAN[-1] == "nimble"
    with torch.no_grad():
        lltm_core.lltm_sequence(*_sequence_args(requires_grad=False))
    assert RAN[-1] == "nimble"
    trace = lltm_core.explain(lltm_core.Call("cell", "cpu", torch.float32, 3, 4, 5))
    assert _chosen(trace).name == "nimble"


def test_a_named_backend_runs_untimed(two_backends):
    COSTS.update(steady=SLOW, nimble=FAST)
    with lltm_core.select_by_measurement():
        lltm_core.lltm_sequence(*_sequence_args(), backend="steady")
        with lltm_core.use_backend("steady"):
            lltm_core.lltm_sequence(*_sequence_args())
        assert RAN == ["steady", "steady"]
        trace = lltm_core.explain(lltm_core.Call("sequence", "cpu", torch.float32, 2, 3, 4, 6))
        assert _chosen(trace).name == "nimble"


def test_under_compile_the_measured_choice_is_made_while_tracing(two_backends):
    COSTS.update(steady=SLOW, nimble=FAST)
    graphs = []

    def record(gm, example_inputs):
        graphs.append(sorted({str(n.target) for n in gm.graph.nodes if str(n.target).startswith("lltm.")}))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: lltm_core.lltm_sequence(*a), backend=record, fullgraph=True)
    try:
        args = _sequence_args()
        compiled(*args)
        with lltm_core.select_by_measurement():  # Dynamo guards on the setting: this traces again
            compiled(*args)
        assert graphs == [["lltm.steady_sequence_forward"], ["lltm.nimble_sequence_forward"]]
    finally:
        torch._dynamo.reset()


def test_the_variable_turns_it_on_and_a_wrong_value_says_so():
    code = "import lltm_core, lltm_core._registry as r; print(r.measuring())"
    env = {**os.environ, "LLTM_SELECT": "measure"}
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == "True"
    env["LLTM_SELECT"] = "fastest"
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"
    assert "LLTM_SELECT='fastest' means nothing to lltm: its one value is 'measure'" in done.stderr
    assert done.stderr.startswith("<string>:1: UserWarning"), done.stderr  # the import's line, not lltm_core's
