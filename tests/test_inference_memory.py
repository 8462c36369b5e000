"""Contract v3's promise for inference: one LLTMLayer forward under no_grad costs its output plus a bounded workspace.

The measurement is lltm_core.testing.memory's (a subprocess's peak resident memory); the bound is
the issue's, 1.25x (input + output) at T512 B64 I64 S512 float32.
"""

from __future__ import annotations

import pytest

import lltm_core
from lltm_core.testing.memory import INFERENCE_BOUND, can_measure, check_inference_memory, forward_memory

pytestmark = pytest.mark.skipif(not can_measure(), reason="needs Linux's /proc/self/clear_refs")


@pytest.mark.parametrize("name", [n for n in ("ref", "cpu") if n in lltm_core.available_backends()])
def test_inference_forward_raises_peak_memory_by_at_most_the_bound(name):
    check_inference_memory(name)


def test_the_measurement_sees_what_a_training_forward_keeps():
    """The same measurement with a backward to follow exceeds the bound: it can fail."""
    got = forward_memory("ref", "grad")
    assert got["raise"] > 2 * INFERENCE_BOUND * (got["input"] + got["output"]), got
