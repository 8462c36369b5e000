"""The emulated build itself: that its launches run what a GPU would, and the review's fixes it can see.

Runs on the emulated build (lltm_cuda_emulated, `nox -s cuda_emulated`, LLTM_CUDA_TEST_EMULATED=1);
elsewhere it skips, saying so.  The emulated GPU is whatever the LLTM_CUDA_EMULATE_* variables
set (csrc/cuda/lltm_runtime.cuh); the tests hold for any settings.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from _emulated import import_or_skip

lltm_cuda_emulated = import_or_skip()
import lltm_core  # noqa: E402
from lltm_core.testing import make_inputs, make_sequence_inputs, max_rel_error, tolerance  # noqa: E402
from lltm_core.testing.memory import can_measure, check_inference_memory  # noqa: E402

assert lltm_cuda_emulated.unavailable_reason() is None, lltm_cuda_emulated.unavailable_reason()
emulation = torch.ops.lltm_cuda_emulation
pytestmark = pytest.mark.usefixtures("lltm_seed")


def _settings():
    multiprocessors, blocks_per_multiprocessor, threads_per_block, order, seed = emulation.settings()
    return multiprocessors, blocks_per_multiprocessor, threads_per_block, order, seed


def _counters():
    queries_sm, queries_occupancy, launches, threads = emulation.counters()
    return {"multiprocessor_queries": queries_sm, "occupancy_queries": queries_occupancy, "launches": launches,
            "threads": threads}


def test_the_settings_are_the_environments():
    names = ("MULTIPROCESSORS", "BLOCKS_PER_MULTIPROCESSOR", "THREADS_PER_BLOCK", "ORDER", "SEED")
    for name, value in zip(names, _settings()):
        if f"LLTM_CUDA_EMULATE_{name}" in os.environ:
            assert str(value) == os.environ[f"LLTM_CUDA_EMULATE_{name}"], name


def test_every_thread_of_the_grid_runs_once_and_the_loops_go_round():
    """A cell forward on the element path (odd S) with 4x as many elements as the grid can hold at
    once: two launches of the full wave (X = [old_h | input], then the cell), every thread of each
    run, and each thread doing 4 elements or more."""
    multiprocessors, blocks_per_multiprocessor, threads_per_block, _, _ = _settings()
    wave = multiprocessors * blocks_per_multiprocessor * threads_per_block
    S = 5
    B = 4 * wave // S + 1  # B*S >= 4 * wave
    inputs = make_inputs(B, 3, S, requires_grad=False)
    before = _counters()
    got = torch.ops.lltm_cuda.forward(*inputs)
    after = _counters()
    assert after["launches"] - before["launches"] == 2
    assert after["threads"] - before["threads"] == 2 * wave, "a launch must run every thread of its grid, once"
    want = lltm_core.lltm(*inputs, backend="ref")
    for g, w in zip(got[:2], want):
        assert max_rel_error(g, w) <= tolerance(torch.float32)


def test_the_runtime_is_asked_once_per_device_and_kernel():
    """grid_size() caches the multiprocessor count and each kernel's occupancy: a second call of the
    same kernels asks nothing (before the fix every step kernel call asked both)."""
    multiprocessors, blocks_per_multiprocessor, threads_per_block, _, _ = _settings()
    B = 2 * multiprocessors * threads_per_block  # S = 1: more blocks than multiprocessors, so occupancy is asked
    inputs = make_inputs(B, 2, 1)
    lltm_core.lltm(*inputs, backend="cuda_emulated")[0].sum().backward()  # every kernel of a call, once
    before = _counters()
    for _ in range(3):
        out = lltm_core.lltm(*inputs, backend="cuda_emulated")
        (out[0].sum() + out[1].sum()).backward()
    after = _counters()
    assert after["launches"] - before["launches"] == 9  # [old_h | input], the cell forward, its backward
    assert after["multiprocessor_queries"] == before["multiprocessor_queries"], (before, after)
    assert after["occupancy_queries"] == before["occupancy_queries"], (before, after)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_each_buffer_is_checked_for_its_own_vectors_alignment(dtype):
    """A half kernel moves 8 elements at a time; its float cell state is then read as Vec<float, 8>,
    32 bytes, so a float buffer 16 bytes past a 32-byte boundary must send the kernel down the
    element path (vectorizable() checked 16 bytes for every buffer)."""
    vec = 16 // torch.empty(0, dtype=dtype).element_size()
    S = 4 * vec
    aligned = torch.empty(64 + 16, dtype=dtype)  # the allocator's 64-byte alignment
    opmath = torch.empty(64 + 16, dtype=torch.float32 if dtype != torch.float64 else torch.float64)
    assert aligned.data_ptr() % 64 == 0 and opmath.data_ptr() % 64 == 0
    assert emulation.vector_width(dtype, S, [aligned, opmath]) == vec
    opmath_need = vec * opmath.element_size()  # 32 bytes for the half types' float state
    off = opmath[16 // opmath.element_size():]  # 16 bytes in
    expect = vec if 16 % opmath_need == 0 else 1
    assert emulation.vector_width(dtype, S, [aligned, off]) == expect
    assert emulation.vector_width(dtype, S + 1, [aligned, opmath]) == 1  # a vector would cross a row


_RUN = """
import torch, lltm_core
from lltm_core.testing import make_sequence_inputs
torch.manual_seed(0)
inputs = make_sequence_inputs(6, 5, 3, 7, requires_grad=True)
out = lltm_core.lltm_sequence(*inputs, lengths=torch.tensor([6, 2, 5, 1, 6]), reverse=True, backend="cuda_emulated")
grads = torch.autograd.grad(sum(t.sum() for t in out), inputs)
torch.save([t.detach() for t in (*out, *grads)], {path!r})
"""


def _run(tmp_path, name: str, **env) -> list[torch.Tensor]:
    path = tmp_path / f"{name}.pt"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LLTM_CUDA_EMULATE_")}
    subprocess.run([sys.executable, "-c", _RUN.format(path=str(path))], check=True, env={**environ, **env})
    return torch.load(path)


def test_the_result_does_not_depend_on_the_thread_order_or_the_grid(tmp_path):
    """No kernel reads what another thread writes: every order and grid gives the same bits."""
    want = _run(tmp_path, "forward", LLTM_CUDA_EMULATE_ORDER="forward")
    for name, env in {
        "reverse": {"LLTM_CUDA_EMULATE_ORDER": "reverse"},
        "shuffle": {"LLTM_CUDA_EMULATE_ORDER": "shuffle", "LLTM_CUDA_EMULATE_SEED": "12345",
                    "LLTM_CUDA_EMULATE_MULTIPROCESSORS": "1", "LLTM_CUDA_EMULATE_BLOCKS_PER_MULTIPROCESSOR": "2",
                    "LLTM_CUDA_EMULATE_THREADS_PER_BLOCK": "3"},
    }.items():
        for g, w in zip(_run(tmp_path, name, **env), want):
            assert torch.equal(g, w), name


def test_a_bad_setting_is_an_error_that_names_it(tmp_path):
    with pytest.raises(subprocess.CalledProcessError) as failed:
        subprocess.run([sys.executable, "-c", _RUN.format(path=str(tmp_path / "x.pt"))], check=True,
                       capture_output=True, text=True, env={**os.environ, "LLTM_CUDA_EMULATE_ORDER": "backwards"})
    assert "LLTM_CUDA_EMULATE_ORDER=backwards: expected forward, reverse or shuffle" in failed.value.stderr



@pytest.mark.skipif(not can_measure(), reason="needs Linux's /proc/self/clear_refs")
def test_inference_memory_is_the_output_and_a_bounded_workspace():
    """Contract v3: under no_grad one LLTMLayer forward at T512 B64 I64 S512 raises the peak resident
    memory by at most 1.25x (input + output), measured exactly as lltm-core's own test measures ref
    and cpu (lltm_core.testing.memory), here on lltm-cuda's host code: the gates a chunk of
    steps at a time, no tanh(c_t)."""
    check_inference_memory("cuda_emulated")
