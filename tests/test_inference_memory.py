"""Contract v3's promise for inference: one LLTMLayer forward under no_grad costs its output plus a bounded workspace.

Measured as a process's resident memory, in a subprocess of its own: the peak (VmHWM) is reset
(/proc/self/clear_refs) after a warm-up call at the same batch and sizes, so thread pools and a
backend's first-call work (lltm-cpu times its GEMM routes then) are not counted, and the peak
during one forward is compared with the resident size before it.  The bound is the issue's:
at most 1.25x (input + output) more.  A forward that kept what a backward needs (gates and
tanh(c_t), 4S per row on top of the output's S) would raise it by about 5x the output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import lltm_core

T, B, I, S = 512, 64, 64, 512
BOUND = 1.25

_MEASURE = """
import json, sys, torch, lltm_core

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)

T, B, I, S, name, mode = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
torch.manual_seed(0)
layer = lltm_core.LLTMLayer(I, S, backend=name)
x = torch.randn(T, B, I)
with torch.no_grad():
    layer(torch.randn(2, B, I))  # warm-up at the same B, I, S
    if mode == "grad":
        torch.set_grad_enabled(True)
        x.requires_grad_()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident size restarts from the current one
    before = status("VmRSS")
    output, _ = layer(x)
    peak = status("VmHWM")
print(json.dumps({"raise": peak - before, "input": x.nbytes, "output": output.nbytes}))
"""


def _cpu_backends() -> list[str]:
    return [n for n in ("ref", "cpu") if n in lltm_core.available_backends()]


def _measure(name: str, mode: str) -> dict:
    run = subprocess.run([sys.executable, "-c", _MEASURE, str(T), str(B), str(I), str(S), name, mode],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("name", _cpu_backends())
def test_inference_forward_raises_peak_memory_by_at_most_the_bound(name):
    got = _measure(name, "no_grad")
    limit = BOUND * (got["input"] + got["output"])
    assert got["raise"] <= limit, (
        f"LLTMLayer({I}, {S}) on {name} at T{T} B{B}, float32, under torch.no_grad(): the forward raised peak "
        f"resident memory by {got['raise'] / 2**20:.1f} MiB, more than {BOUND}x (input + output) = "
        f"{limit / 2**20:.1f} MiB")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_the_measurement_sees_what_a_training_forward_keeps():
    """The same measurement with a backward to follow exceeds the bound: it can fail."""
    got = _measure("ref", "grad")
    assert got["raise"] > 2 * BOUND * (got["input"] + got["output"]), got
