"""The training example runs end to end, learns, and resumes exactly (one process; tests/test_distributed.py has torchrun)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lltm_core

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_sequence.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_sequence", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_example_loss_falls(example):
    losses = example.train(40, batch=16, length=20, quiet=True, seed=1)
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.5 * first, (first, last)


def test_resumed_run_gives_the_uninterrupted_losses(example, tmp_path):
    # Dropout draws from torch's RNG and the batches from the example's generator: a resume must restore both.
    config = dict(batch=8, length=10, bidirectional=True, dropout=0.3, quiet=True, seed=2)
    uninterrupted = example.train(12, **config)
    part = example.train(5, save=str(tmp_path / "ckpt.pt"), **config)
    torch.manual_seed(12345)  # whatever ran in between, the checkpoint's states are what count
    resumed = example.train(12, resume=str(tmp_path / "ckpt.pt"), **config)
    assert part == uninterrupted[:5]
    assert resumed[5:] == uninterrupted[5:]  # exactly: same arithmetic, same random numbers
    assert resumed[:5] == part  # the history comes back with the checkpoint


def test_resume_refuses_another_model(example, tmp_path):
    example.train(2, batch=4, length=5, layers=1, save=str(tmp_path / "ckpt.pt"), quiet=True)
    with pytest.raises(ValueError, match="layers 1 there, 2 here"):
        example.train(4, batch=4, length=5, layers=2, resume=str(tmp_path / "ckpt.pt"), quiet=True)


def test_plain_command_line_run(tmp_path):
    # Run plainly, without torchrun's variables: one process, no process group; it says what it uses.
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    args = [sys.executable, str(EXAMPLE), "--steps", "3", "--layers", "1", "--bidirectional", "--log-every", "1"]
    first = subprocess.run([*args, "--save", "ckpt.pt"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    best = lltm_core.get_backend(device="cpu", dtype=torch.float32).name
    assert f"training on cpu, 1 process, with lltm backend {best!r}" in first.stdout, first.stdout
    assert "mean loss of the first 3 steps" in first.stdout, first.stdout
    again = subprocess.run([*args[:3], "5", *args[4:], "--resume", "ckpt.pt"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming from ckpt.pt at step 3" in again.stdout and "step    5" in again.stdout, again.stdout


@pytest.mark.parametrize("arguments, message", [
    (["--steps", "0"], "--steps must be at least 1, got 0"),  # was a ZeroDivisionError after the run
    (["--batch", "0"], "--batch must be at least 1, got 0"),  # was a run whose losses were all nan
    (["--log-every", "0"], "--log-every must be at least 1, got 0"),  # was a ZeroDivisionError
    (["--save-every", "-1"], "--save-every must be 0 (only at the end) or more, got -1"),
    (["--save", "/nonexistent/folder/ckpt.pt"], "its folder does not exist"),  # failed after training
    (["--resume", "/nonexistent.pt"], "--resume /nonexistent.pt: no such file"),
    (["--device", "mps:x"], "--device takes cpu or cuda, got 'mps:x'"),
    (["--backend", "nosuch"], "--backend nosuch: lltm backend 'nosuch' (asked for by get_backend()) is not installed"),
], ids=["steps", "batch", "log-every", "save-every", "save-folder", "resume", "device", "backend"])
def test_bad_arguments_are_named_before_training(example, monkeypatch, capsys, arguments, message):
    monkeypatch.setattr(sys, "argv", ["train_sequence.py", *arguments])
    monkeypatch.setattr(example, "train", lambda *a, **k: pytest.fail("trained with a bad argument"))
    with pytest.raises(SystemExit) as exited:
        example.main()
    err = capsys.readouterr().err
    assert exited.value.code == 2 and message in err and "Traceback" not in err, err
