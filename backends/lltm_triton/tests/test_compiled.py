"""lltm-triton's kernels as Triton compiles them for an H100/H200 (sm_90), checked on any machine.

The interpreter compiles nothing; a GPU is not always at hand.  compile_for_gpu.py compiles every
variant each wrapper may launch with Triton's own compiler and ptxas for sm_90, no GPU or driver
needed, and these tests check what a GPU's loader would: that each compiles, and that its shared
memory is within the limits _policy and _fit.py rely on.  One process compiles them all (161
kernels: two to three minutes on one core with Triton's cache empty, seconds with it warm).  On a
GPU, test_gpu.py loads the kernels for real; benchmarks/gpu_check.sh leaves this module out there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lltm_triton import _policy

#: What an sm_86/sm_89 card (an RTX 30x0/40x0) lets one block have: 99 KB, the least of the GPUs
#: _fit.py falls back for.  The last variant of every ladder must load there.
SMALLEST_GPU_SHARED_BYTES = 99 * 1024


def _has_nvidia_backend() -> bool:
    from triton.backends import backends

    return "nvidia" in backends


pytestmark = pytest.mark.skipif(not _has_nvidia_backend(),
                                reason="this Triton has no NVIDIA backend (its compiler and ptxas) to compile with")


@pytest.fixture(scope="module")
def variants() -> list[dict]:
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("compile_for_gpu.py")
    done = subprocess.run([sys.executable, str(script), "--arch", "90", "--json"], env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.stdout.strip(), f"compile_for_gpu.py printed nothing (exit {done.returncode}):\n{done.stderr[-4000:]}"
    found = json.loads(done.stdout)
    assert found, "compile_for_gpu.py reached no launch site: the recorder no longer sees the wrappers' launches"
    return found


def _name(v: dict) -> str:
    return f"{v['kernel']} {v['dtype']} ({v['call']}), variant {v['rank'] + 1} of {v['ladder']} {v['tiles']}"


def test_every_variant_compiles_for_sm90(variants):
    failed = [f"{_name(v)}: {v['error']}" for v in variants if v["error"]]
    assert not failed, "Triton cannot compile these for sm_90:\n" + "\n".join(failed)


def test_every_launch_site_was_reached(variants):
    kernels = {v["kernel"] for v in variants}
    assert kernels == {"_forward_resident", "_forward_streaming", "_backward_resident", "_backward_streaming",
                       "_forward_kernel", "_backward_kernel"}, kernels
    assert {v["dtype"] for v in variants} == {"float32", "bfloat16", "float16", "float64"}


def test_an_h100_loads_the_first_variant(variants):
    """The variant should_run's reasoning assumes (W_h resident where _policy says it fits) is the one an
    H100/H200 loads: none of them falls back there."""
    over = [f"{_name(v)}: {v['shared']} bytes" for v in variants
            if v["rank"] == 0 and not v["error"] and v["shared"] > _policy.SHARED_BYTES]
    assert not over, f"over the {_policy.SHARED_BYTES} bytes a block of an H100/H200:\n" + "\n".join(over)


def test_every_ladder_ends_in_a_variant_smaller_gpus_load(variants):
    over = [f"{_name(v)}: {v['shared']} bytes" for v in variants
            if v["rank"] == v["ladder"] - 1 and not v["error"] and v["shared"] > SMALLEST_GPU_SHARED_BYTES]
    assert not over, f"the smallest variant is over {SMALLEST_GPU_SHARED_BYTES} bytes a block:\n" + "\n".join(over)
