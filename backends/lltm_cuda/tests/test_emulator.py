"""The emulator itself (csrc/emulation/lltm_emulator.h), through the probe kernels of
csrc/emulation/emulator_probes.cpp: barriers, shared memory, warp operations, atomics, clusters,
cooperative grids, and a barrier not every thread reaches, reported as an error that names the kernel.

Runs on the emulated build (`nox -s cuda_emulated`); elsewhere it skips, saying so.  The tests hold
for any LLTM_CUDA_EMULATE_* settings; the ones about the order run a child with their own.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from _emulated import import_or_skip

lltm_cuda_emulated = import_or_skip()
assert lltm_cuda_emulated.unavailable_reason() is None, lltm_cuda_emulated.unavailable_reason()
probe = torch.ops.lltm_cuda_emulation


@pytest.mark.parametrize("threads", [2, 32, 256])
def test_a_block_reduction_is_right_with_its_barriers_and_wrong_without(threads):
    x = torch.randn(3 * threads)
    want = x.view(3, threads).sum(1)
    torch.testing.assert_close(probe.probe_block_sum(x, threads, True), want)
    # Without the barriers the first thread to run reads a value nobody wrote yet: the NaN fill shows it.
    assert probe.probe_block_sum(x, threads, False).isnan().all()


def test_warp_shuffles_and_votes():
    x = torch.randn(2 * 64)  # two blocks of two warps
    out = probe.probe_warp(x, 64).view(-1, 5)
    warps = x.view(-1, 32)
    for w in range(warps.shape[0]):
        lanes = out[32 * w:32 * (w + 1)]
        torch.testing.assert_close(lanes[:, 0], warps[w].sum().expand(32), rtol=1e-5, atol=1e-5)
        assert torch.equal(lanes[:, 1], warps[w][3].expand(32))
        bits = sum(1 << lane for lane in range(32) if warps[w][lane] > 0)
        assert torch.equal(lanes[:, 2], torch.full((32,), float(bits)))
        assert torch.equal(lanes[:, 3], torch.full((32,), float(bool((warps[w] > 0).all()))))
        assert torch.equal(lanes[:, 4], torch.full((32,), float(bool((warps[w] > 0).any()))))


def test_atomics_add_every_threads_term():
    x = torch.randint(-50, 50, (5 * 16,)).float()  # integers: the sum is exact in any order
    assert probe.probe_atomic(x, 16).item() == x.sum().item()


@pytest.mark.parametrize("cluster", [1, 2, 4, 8])
def test_a_cluster_reads_its_peers_shared_memory_by_rank(cluster):
    threads = 8
    x = torch.randn(2 * cluster * threads)  # two clusters
    out, ranks = probe.probe_cluster(x, threads, cluster)
    assert ranks.tolist() == list(range(cluster)) * 2
    want = x.view(2, cluster, threads).roll(-1, dims=1).reshape(-1)
    assert torch.equal(out, want)


def _grid_capacity() -> int:
    multiprocessors, blocks_per_multiprocessor, *_ = probe.settings()
    return multiprocessors * blocks_per_multiprocessor


@pytest.mark.parametrize("blocks", [1, 2, "all"])
def test_a_cooperative_grid_exchanges_global_memory_across_its_barrier_and_not_without(blocks):
    """Every block of a cooperative launch runs together: after the grid barrier each thread reads
    what the next block posted.  Without the barrier the first thread to run (in the shuffled order
    of the cuda_emulated session, or any other) reads an unwritten (NaN) value."""
    blocks = _grid_capacity() if blocks == "all" else blocks
    threads = 8
    x = torch.randn(blocks * threads)
    want = x.view(blocks, threads).roll(-1, dims=0).reshape(-1)
    assert torch.equal(probe.probe_grid(x, threads, True), want)
    if blocks > 1:
        assert probe.probe_grid(x, threads, False).isnan().any()


def test_a_grid_barrier_needs_a_cooperative_launch_that_fits_the_device():
    x = torch.randn(2 * 4)
    with pytest.raises(RuntimeError, match="kernel grid_kernel waits at the grid barrier, but it was not launched "
                                           "cooperatively"):
        probe.probe_grid(x, 4, True, cooperative=False)
    too_many = torch.randn((_grid_capacity() + 1) * 4)
    with pytest.raises(RuntimeError, match=r"cooperative launch of grid_kernel with \d+ blocks, more than the \d+ "
                                           r"the device holds at once"):
        probe.probe_grid(too_many, 4, True)


def test_shared_memory_starts_as_nan():
    assert probe.probe_unwritten_shared(torch.empty(0), 64).isnan().all()


def test_shared_memory_over_the_per_block_limit_is_an_error_naming_the_kernel():
    limit = int(os.environ.get("LLTM_CUDA_EMULATE_SHARED_PER_BLOCK", 232448))  # an H100's 227 KB by default
    probe.probe_unwritten_shared(torch.empty(0), limit - 64)  # with its 16 static bytes: within the limit
    with pytest.raises(RuntimeError, match=r"kernel unwritten_shared_kernel asks for \d+ bytes of dynamic shared"):
        probe.probe_unwritten_shared(torch.empty(0), limit + 1)
    with pytest.raises(RuntimeError, match=r"kernel unwritten_shared_kernel needs \d+ bytes of shared memory a block"):
        probe.probe_unwritten_shared(torch.empty(0), limit - 8)  # the static array no longer fits


@pytest.mark.parametrize("scope", ["block", "cluster", "grid"])
def test_a_barrier_not_every_thread_reaches_is_an_error_not_a_hang(scope):
    barrier = {"block": "__syncthreads", "cluster": "the cluster barrier", "grid": "the grid barrier"}[scope]
    with pytest.raises(RuntimeError, match=rf"kernel skipped_barrier_kernel: a barrier that not every thread .*{barrier}"):
        probe.probe_skipped_barrier(4, 2 if scope == "cluster" else 1, grid=scope == "grid")
    # The process goes on: the next launch runs.
    x = torch.randn(8)
    torch.testing.assert_close(probe.probe_block_sum(x, 8, True), x.sum().view(1))


_ORDER = """
import torch, lltm_cuda_emulated
assert lltm_cuda_emulated.unavailable_reason() is None
print(torch.ops.lltm_cuda_emulation.probe_resume_order(torch.empty(0), 16).view(16, 2).T.tolist())
"""


def _tickets(order: str, seed: int) -> list[list[int]]:
    env = {**os.environ, "LLTM_CUDA_EMULATE_ORDER": order, "LLTM_CUDA_EMULATE_SEED": str(seed)}
    run = subprocess.run([sys.executable, "-c", _ORDER], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    return eval(run.stdout)  # noqa: S307 - our own child's list of lists


def test_the_order_knobs_set_the_resume_order_after_each_barrier():
    assert _tickets("forward", 0) == [list(range(16))] * 2
    assert _tickets("reverse", 0) == [list(range(15, -1, -1))] * 2
    shuffled = _tickets("shuffle", 5)
    assert shuffled == _tickets("shuffle", 5), "a seed must repeat its orders"
    before, after = shuffled
    assert sorted(before) == sorted(after) == list(range(16))
    assert before != after and before != list(range(16)), "each barrier must reshuffle the threads"
