"""The backend as lltm-core sees it: metadata, why it is unavailable, and its answers per call."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from importlib import metadata

import pytest
import torch

import lltm_core
import lltm_triton
from lltm_core import Call
from lltm_triton import _policy


def test_entry_point():
    (ep,) = [ep for ep in metadata.entry_points(group="lltm.backends") if ep.name == "triton"]
    assert ep.value == "lltm_triton:load_backend"
    requires = " ".join(metadata.distribution("lltm-triton").requires)
    assert "lltm-core" in requires and "torch" in requires and "triton" in requires


def test_metadata(monkeypatch):
    backend = lltm_triton.load_backend()
    assert backend.name == "triton"
    assert backend.dtypes == {torch.float16, torch.bfloat16, torch.float32, torch.float64}
    assert backend.interface_versions == (1, 2, 3) and backend.takes_needs_backward
    assert backend.has_sequence_kernels
    assert backend.can_run is _policy.can_run and backend.should_run is _policy.should_run
    assert backend.saved_layout(2, 3, 5) == {"X": (2, 8), "gates": (2, 15), "tanh_cell": (2, 5)}
    assert backend.sequence_saved_layout(7, 2, 3, 5) == {"gates": (7, 2, 15), "tanh_cell": (7, 2, 5)}
    if lltm_triton.interpreting():
        assert backend.devices == {"cuda", "cpu"} and backend.priority == -10
    else:
        assert backend.devices == {"cuda"} and backend.priority == 200
    # Either way: below lltm-ref's 0 on the interpreter, above lltm-cuda's 100 on a GPU.
    assert lltm_triton.INTERPRETER_PRIORITY < 0 < 100 < lltm_triton.PRIORITY


def test_declares_cpu_only_under_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    backend = lltm_triton.load_backend()
    assert backend.devices == {"cuda"} and backend.priority == 200
    assert backend.availability().startswith("no GPU visible")
    with pytest.raises(RuntimeError, match="no GPU visible"):  # the kernels say why, if called anyway
        backend.forward()


@pytest.mark.parametrize("T, B, I, S", [(1, 1, 1, 1), (64, 16, 32, 128), (3, 5, 1024, 7)])
def test_sequence_saves_within_the_bound(T, B, I, S):
    saved = sum(math.prod(shape) for shape in lltm_triton.sequence_saved_layout(T, B, I, S).values())
    assert saved + (I + S) * T * B <= (6 * S + I) * T * B


# --- unavailable_reason: each branch, on any machine ---------------------------


def test_triton_not_installed(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    assert lltm_triton.unavailable_reason().startswith("triton is not installed: pip install triton")


def test_no_gpu_and_no_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = lltm_triton.unavailable_reason()
    assert reason.startswith("no GPU visible") and "TRITON_INTERPRET=1" in reason


def test_gpu_older_than_triton_supports(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0) if i == 0 else (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "Tesla T4")
    monkeypatch.setattr(torch.version, "hip", None)
    reason = lltm_triton.unavailable_reason()
    assert reason.startswith("cuda:1 (Tesla T4) is sm_75; Triton supports NVIDIA GPUs from sm_80"), reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    assert lltm_triton.unavailable_reason() is None


def test_interpreter_needs_the_variable_before_triton(monkeypatch):
    """TRITON_INTERPRET=1 set after triton was imported does nothing: say so, rather than fail in a kernel."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(lltm_triton, "_interpreter_active", lambda: False)
    reason = lltm_triton.unavailable_reason()
    assert reason.startswith("TRITON_INTERPRET=1 was set after triton was imported"), reason


def test_gpu_tests_run_where_there_is_a_gpu(monkeypatch):
    """test_gpu.py's skip mark as a GPU machine builds it: a False condition, and a reason string, without
    which pytest errs at setup on every test there instead of running it."""
    import importlib.util
    from pathlib import Path

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("LLTM_REQUIRE_GPU", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    spec = importlib.util.spec_from_file_location("test_gpu_on_a_gpu", Path(__file__).with_name("test_gpu.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (skipif,) = [mark for mark in module.pytestmark if mark.name == "skipif"]
    assert skipif.args == (False,) and isinstance(skipif.kwargs.get("reason"), str), skipif


def test_lltm_info_names_the_reason():
    """On a machine without a GPU, `lltm info` lists triton as unavailable with its reason."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the no-GPU reason cannot show here (test_metadata covers it)")
    info = subprocess.run([sys.executable, "-m", "lltm_core", "info"], env=env, capture_output=True, text=True,
                          check=True).stdout
    (line,) = [line for line in info.splitlines() if line.strip().startswith("triton ")]
    assert "unavailable" in line and "no GPU visible" in line, line


# --- can_run and should_run ------------------------------------------------------


def _call(op="sequence", device="cuda", dtype=torch.bfloat16, B=16, I=32, S=128, T=64, needs_backward=True):
    return Call(op, device, dtype, B, I, S, T if op == "sequence" else None, needs_backward)


@pytest.mark.parametrize("dtype, S", [(torch.bfloat16, 128), (torch.float16, 128), (torch.float32, 64),
                                      (torch.float64, 64)])
def test_should_run_the_tutorial_size(dtype, S):
    """T64 B16 I32 at the largest S whose W_h stays on chip."""
    assert _policy.should_run(_call(dtype=dtype, S=S)) is True
    assert _policy.should_run(_call(dtype=dtype, S=S, needs_backward=False)) is True
    assert _policy.should_run(_call(op="cell", dtype=dtype, S=S)) is True


@pytest.mark.parametrize("T, B, I, S, dtype, kb", [
    (256, 32, 128, 256, torch.bfloat16, 384), (256, 32, 128, 256, torch.float32, 768),
    (64, 256, 1024, 1024, torch.bfloat16, 6144), (64, 256, 1024, 1024, torch.float32, 12288),
    (64, 16, 32, 128, torch.float64, 384), (64, 16, 32, 129, torch.float32, 768),
    (64, 16, 32, 128, torch.float32, 192), (64, 16, 32, 65, torch.float64, 384)])
def test_should_run_declines_w_h_off_chip(T, B, I, S, dtype, kb):
    reason = _policy.should_run(_call(dtype=dtype, B=B, I=I, S=S, T=T))
    assert isinstance(reason, str) and f"is {kb} KB" in reason and "over the 96 KB kept on chip" in reason, reason
    # The GPU's facts come from the device (an H100/H200's, so named, where none is visible).
    gpu = _policy.gpu()
    assert (f"192 KB of W_h needs 304 KB of shared memory; a block may have {gpu.shared_bytes_per_block // 1024} KB "
            f"on {gpu.name}") in reason, reason


def test_should_run_declines_more_rows_than_one_wave():
    gpu = _policy.gpu()  # 132 SMs where no CUDA device is visible
    assert _policy.should_run(_call(B=16 * gpu.sms)) is True
    reason = _policy.should_run(_call(B=16 * gpu.sms + 1))
    assert isinstance(reason, str) and f"{gpu.sms + 1} programs" in reason, reason
    assert f"the {gpu.sms} SMs of {gpu.name}" in reason, reason


def test_should_run_declines_the_cpu_and_big_cells():
    assert "interpreter" in _policy.should_run(_call(device="cpu"))
    reason = _policy.should_run(_call(op="cell", B=256, I=1024, S=1024))
    assert isinstance(reason, str) and "multiply-adds" in reason


def test_can_run_declines_32_bit_overflow():
    assert _policy.can_run(_call(B=1 << 12, S=1024, T=1 << 10)) is not True
    assert "32-bit offsets" in _policy.can_run(_call(B=1 << 12, S=1024, T=1 << 10))
    assert _policy.can_run(_call(B=256, I=1024, S=1024, T=64)) is True
    assert _policy.can_run(_call(op="cell", dtype=torch.float64, B=3, I=2, S=1031)) is True


def test_explain_on_the_benchmark_shapes():
    """lltm_core.explain() shows should_run's verdict for a shape (here on the CPU: the interpreter's decline)."""
    if not lltm_triton.interpreting():
        pytest.skip("on a GPU the benchmark script shows the choice between triton and cuda")
    trace = {e.name: e for e in lltm_core.explain(Call("sequence", "cpu", torch.float32, 16, 32, 128, 64, True))}
    # Another backend takes it (lltm-ref, or lltm-cpu where that is installed too), never triton.
    assert [e.name for e in trace.values() if e.verdict == "chosen"] in (["ref"], ["cpu"]), trace
    assert trace["triton"].verdict in ("declined", "lower priority", "not asked"), trace
