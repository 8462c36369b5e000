"""Backend.describe_call: a backend with paths of its own adds the one a call takes to the chosen
entry of explain() (lltm-cuda: the persistent or the per-step sequence); the rule is unchanged."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import lltm_core
from lltm_core import _discovery, _registry


@pytest.fixture
def describing(monkeypatch):
    """"describing" (lltm-ref's kernels, priority 1000, CPU), its describe_call answering per op."""
    answers = {"cell": None, "sequence": "the two-path sequence, path A"}

    def describe(call):
        answer = answers[call.op]
        if isinstance(answer, Exception):
            raise answer
        return answer

    backend = dataclasses.replace(lltm_core.get_backend("ref"), name="describing", priority=1000,
                                  devices=frozenset({"cpu"}), describe_call=describe)
    record = _discovery.BackendRecord("describing", "(this test)", "0", "-", backend=backend, status="available")
    monkeypatch.setitem(_discovery.records_by_name(), "describing", [record])
    _registry.forget_choices()
    yield answers
    _registry.forget_choices()


def _chosen(call):
    (entry,) = [e for e in lltm_core.explain(call) if e.verdict == "chosen"]
    return entry


def test_the_chosen_entry_says_which_path(describing):
    sequence = lltm_core.Call("sequence", "cpu", torch.float32, 3, 4, 5, 7, True)
    entry = _chosen(sequence)
    assert entry.name == "describing"
    assert entry.reason == "priority 1000, the highest that accepts the call; the two-path sequence, path A"
    # None adds nothing: the cell's entry is the rule's own.
    cell = lltm_core.Call("cell", "cpu", torch.float32, 3, 4, 5, None, True)
    assert _chosen(cell).reason == "priority 1000, the highest that accepts the call"


def test_a_path_that_would_fail_is_said_not_raised(describing):
    describing["sequence"] = RuntimeError("LLTM_X=forced, but it does not fit")
    entry = _chosen(lltm_core.Call("sequence", "cpu", torch.float32, 3, 4, 5, 7, True))
    assert entry.reason.endswith("; the call would fail: LLTM_X=forced, but it does not fit")


def test_describe_call_must_be_callable():
    with pytest.raises(TypeError, match="describe_call must be callable or None"):
        dataclasses.replace(lltm_core.get_backend("ref"), describe_call="persistent")
