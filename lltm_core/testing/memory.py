"""How much memory one LLTMLayer forward adds: contract v3's inference promise, measured.

A process's resident memory, in a subprocess of its own: the peak (VmHWM) is reset
(/proc/self/clear_refs, Linux) after a warm-up call at the same batch and sizes, so thread pools
and a backend's first-call work (lltm-cpu times its GEMM routes then) are not counted, and the
peak during one forward is compared with the resident size before it.  Under ``torch.no_grad()``
a version-3 backend must add at most :data:`INFERENCE_BOUND` x (input + output); one that kept what
a backward needs (gates and tanh(c_t), 4S per row beside the output's S) adds about 5x the output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

#: At most this many times (input + output) more resident memory for one inference forward.
INFERENCE_BOUND = 1.25
#: The size the bound is checked at: T512 B64 I64 S512, float32 (a 64 MiB output).
INFERENCE_SIZE = (512, 64, 64, 512)

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


def can_measure() -> bool:
    """Whether this system can reset a process's peak resident size (Linux's /proc/self/clear_refs)."""
    return Path("/proc/self/clear_refs").exists()


def forward_memory(backend: str, mode: str = "no_grad", size: tuple = INFERENCE_SIZE) -> dict:
    """{"raise", "input", "output"} in bytes: what one LLTMLayer(I, S) forward on ``backend`` adds.

    ``mode`` "no_grad" runs it under ``torch.no_grad()``, "grad" with the input requiring grad.
    """
    T, B, I, S = size
    run = subprocess.run([sys.executable, "-c", _MEASURE, str(T), str(B), str(I), str(S), backend, mode],
                         capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise RuntimeError(f"measuring LLTMLayer's forward memory on {backend} failed:\n{run.stderr}")
    return json.loads(run.stdout.splitlines()[-1])


def check_inference_memory(backend: str) -> dict:
    """Assert the bound for ``backend`` at :data:`INFERENCE_SIZE`; returns the measurement."""
    got = forward_memory(backend, "no_grad")
    limit = INFERENCE_BOUND * (got["input"] + got["output"])
    T, B, I, S = INFERENCE_SIZE
    assert got["raise"] <= limit, (
        f"LLTMLayer({I}, {S}) on {backend} at T{T} B{B}, float32, under torch.no_grad(): the forward raised peak "
        f"resident memory by {got['raise'] / 2**20:.1f} MiB, more than {INFERENCE_BOUND}x (input + output) = "
        f"{limit / 2**20:.1f} MiB")
    return got
