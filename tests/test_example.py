"""The training example runs end to end and learns."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_sequence.py"


def test_training_example_loss_falls():
    spec = importlib.util.spec_from_file_location("train_sequence", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    losses = example.train(40, batch=16, length=20, quiet=True, seed=1)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.5 * first, (first, last)
