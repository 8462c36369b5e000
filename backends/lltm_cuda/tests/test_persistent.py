"""The persistent sequence paths (csrc/cuda/lltm_persistent.cu) on the emulated build: clusters of 1,
2, 4 and 8 blocks, and the cooperative grid (LLTM_CUDA_SEQUENCE=grid), against the reference in
three dtypes, the launch count flat in T, a deterministic backward, and the choice of path
(lltm_cuda.sequence_path, LLTM_CUDA_SEQUENCE, LLTM_CUDA_CLUSTER).

Runs on the emulated build (`nox -s cuda_emulated`); elsewhere it skips, saying so.  The kit runs on
this path too (the cuda_emulated session forces it); this file checks what the kit cannot see.
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
from lltm_core.testing import make_sequence_inputs, max_rel_error, reference_sequence, tolerance  # noqa: E402

assert lltm_cuda_emulated.unavailable_reason() is None, lltm_cuda_emulated.unavailable_reason()
emulation = torch.ops.lltm_cuda_emulation
pytestmark = pytest.mark.usefixtures("lltm_seed")


@pytest.fixture
def persistent(monkeypatch):
    """Forces the persistent path; returns a setter for the cluster size (the library reads both per call)."""
    monkeypatch.setenv("LLTM_CUDA_SEQUENCE", "persistent")
    return lambda blocks: monkeypatch.setenv("LLTM_CUDA_CLUSTER", str(blocks))


@pytest.fixture
def grid(monkeypatch):
    """Forces the grid path: a cooperative launch of one block a multiprocessor of the emulated GPU."""
    monkeypatch.setenv("LLTM_CUDA_SEQUENCE", "grid")
    monkeypatch.delenv("LLTM_CUDA_CLUSTER", raising=False)


def _launches() -> int:
    return emulation.counters()[2]


def _run(inputs, lengths, reverse):
    """output, h_n, c_n and every input's gradient through lltm_sequence on cuda_emulated."""
    out = lltm_core.lltm_sequence(*inputs, lengths=lengths, reverse=reverse, backend="cuda_emulated")
    grads = [torch.randn_like(t) for t in out]
    torch.autograd.backward(out, grads)
    got = [t.detach() for t in out] + [t.grad for t in inputs]
    for t in inputs:
        t.grad = None
    return got, grads


def _matches_the_reference(dtype, label, sizes=(5, 3, 4, 13)):
    """T, B, I, S = sizes.  S = 13 splits unevenly over any number of blocks up to 13 (8 blocks: five
    of two units, three of one); lengths and reverse together take every branch of the kernels."""
    steps, batch = sizes[:2]
    inputs = make_sequence_inputs(*sizes, dtype=dtype)
    lengths = torch.tensor([5, 2, 4]) if sizes == (5, 3, 4, 13) else torch.randint(1, steps + 1, (batch,))
    for reverse in (False, True):
        got, grads = _run(inputs, lengths, reverse)
        wide = [t.detach().double().requires_grad_() for t in inputs]
        want = reference_sequence(*wide, lengths=lengths, reverse=reverse)
        torch.autograd.backward(want, [g.double() for g in grads])
        want = [t.detach() for t in want] + [t.grad for t in wide]
        for name, g, w in zip(("output", "h_n", "c_n", "input", "weights", "bias", "h0", "c0"), got, want):
            assert max_rel_error(g, w) <= tolerance(dtype), (name, label, reverse)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("blocks", [1, 2, 4, 8])
def test_each_cluster_size_matches_the_reference(persistent, blocks, dtype):
    persistent(blocks)
    _matches_the_reference(dtype, f"cluster of {blocks}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_grid_path_matches_the_reference(grid, dtype):
    path, blocks, why = lltm_cuda_emulated.sequence_path(dtype, 3, 13)
    assert path == "grid" and blocks == min(13, emulation.settings()[0]), why
    _matches_the_reference(dtype, f"grid of {blocks}")


# The cases a GPU's block of 256 threads cuts differently from the emulated GPU's 8-thread blocks
# (kernel comment on Tiling): (path, cluster, T, B, I, S).  B16 S128 over 8 blocks (the benchmark's
# shape) splits the forward's sums in four and the backward's in two; B64 S64 over one block gives a
# thread several whole tiles; B5 S37 over 2 blocks, or the grid, splits with odd edges.  On the
# grid, the 16-bit types' tensor-core tiles go to the block's 8 warps: B40 S70 over 3 blocks is 3
# row tiles by 5 column tiles forward (two groups), B150 S21 is 10 row tiles, more than the warps.
_GPU_BLOCK_CASES = [("persistent", 8, 3, 16, 5, 128), ("persistent", 1, 3, 64, 3, 64), ("persistent", 2, 4, 5, 3, 37),
                    ("grid", 0, 4, 5, 3, 37), ("grid", 0, 3, 40, 3, 70), ("grid", 0, 2, 150, 3, 21)]


def _in_a_child(script: str, **settings: str) -> str:
    """Runs `script` in a child with these emulator settings (read once per process), after a
    prelude that imports os, sys, torch and this file as `t` and seeds torch as this test is seeded,
    from the default choice of path (no LLTM_CUDA_SEQUENCE or LLTM_CUDA_CLUSTER); asserts it
    succeeds and returns its stdout."""
    prelude = ("import os, sys, torch\n"
               f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
               "import test_persistent as t\n"
               "torch.manual_seed(int(sys.argv[1]))\n")
    env = {name: value for name, value in os.environ.items() if name not in ("LLTM_CUDA_SEQUENCE", "LLTM_CUDA_CLUSTER")}
    env.update(settings)
    run = subprocess.run([sys.executable, "-c", prelude + script, str(torch.initial_seed() % 2**31)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def test_at_a_gpus_block_size_the_tiles_match_the_reference():
    """The persistent kernels' products at 256 threads a block, as on a GPU, in a child that reads
    its own emulator settings: each case of _GPU_BLOCK_CASES, three dtypes, against the reference."""
    script = ("for path, cluster, *sizes in t._GPU_BLOCK_CASES:\n"
              "    os.environ.update(LLTM_CUDA_SEQUENCE=path, LLTM_CUDA_CLUSTER=str(cluster))\n"
              "    for dtype in (torch.float32, torch.bfloat16, torch.float16):\n"
              "        t._matches_the_reference(dtype, f'{path} {cluster} {sizes}', tuple(sizes))\n"
              "print('matched', len(t._GPU_BLOCK_CASES) * 3)\n")
    out = _in_a_child(script, LLTM_CUDA_EMULATE_THREADS_PER_BLOCK="256")
    assert f"matched {len(_GPU_BLOCK_CASES) * 3}" in out, out


def test_on_the_tensor_cores_the_grid_splits_the_batch_and_the_units():
    """In 16-bit types the grid splits the batch too (kernel comment on plan_grid).  On an
    H100-sized device, T64 B256 S1024 bfloat16 takes 32 groups of units (as few as shared memory
    allows) by 4 of the batch; on a 6-multiprocessor one, B40 S30 runs 2 by 3, the last batch group
    part padding, against the reference in both 16-bit types."""
    ask = ("os.environ['LLTM_CUDA_SEQUENCE'] = 'grid'\n"
           "print(*t.lltm_cuda_emulated.sequence_path(torch.bfloat16, 256, 1024)[1:], sep='|')\n")
    blocks, why = _in_a_child(ask, LLTM_CUDA_EMULATE_MULTIPROCESSORS="132").strip().split("|")
    assert blocks == "128" and "the units split 32 ways, the batch 4" in why, why
    script = (
        "os.environ['LLTM_CUDA_SEQUENCE'] = 'grid'\n"
        "print(*t.lltm_cuda_emulated.sequence_path(torch.bfloat16, 40, 30)[1:], sep='|')\n"
        "for dtype in (torch.bfloat16, torch.float16):\n"
        "    t._matches_the_reference(dtype, 'grid 2 x 3', (3, 40, 3, 30))\n")
    blocks, why = _in_a_child(script, LLTM_CUDA_EMULATE_MULTIPROCESSORS="6").strip().split("|")
    assert blocks == "6" and "the units split 2 ways, the batch 3" in why, why


@pytest.mark.parametrize("path", ["persistent", "grid"])
def test_the_launch_count_does_not_grow_with_the_steps(persistent, path):
    """One launch for the forward's time loop and one for the backward's, whatever T (the GEMMs
    are torch's and not counted); the per-step path, for contrast, launches one kernel a step each way."""
    persistent(4)
    os.environ["LLTM_CUDA_SEQUENCE"] = path  # the fixture restores it
    counts = {}
    for steps in (2, 7, 19):
        inputs = make_sequence_inputs(steps, 3, 4, 8)
        before = _launches()
        _run(inputs, None, False)
        counts[steps] = _launches() - before
    assert counts == {2: 2, 7: 2, 19: 2}, counts
    os.environ["LLTM_CUDA_SEQUENCE"] = "per-step"  # the fixture restores it
    before = _launches()
    _run(make_sequence_inputs(7, 3, 4, 8), None, False)
    assert _launches() - before == 2 * 7


def _state_copies(path: str, dtype: torch.dtype) -> int:
    """The copies of a (B, S) tensor that lltm-cuda's sequence operators make, forward and backward,
    on `path`, conversions to another dtype included: each would be a kernel on a GPU (torch's
    profiler sees them here too)."""
    os.environ["LLTM_CUDA_SEQUENCE"] = path  # the fixture restores it
    inputs = make_sequence_inputs(4, 3, 2, 8, dtype=dtype)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        out = lltm_core.lltm_sequence(*inputs, backend="cuda_emulated")
        torch.autograd.backward(out, [torch.randn_like(t) for t in out])

    def in_the_operators(event) -> bool:
        while event is not None and not event.name.startswith("lltm_cuda::sequence_"):
            event = event.cpu_parent
        return event is not None

    return sum(1 for e in prof.events() if e.name == "aten::copy_" and e.input_shapes[0] == [3, 8] and in_the_operators(e))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("path", ["persistent", "grid"])
def test_the_persistent_kernels_read_and_write_the_state_themselves(persistent, path, dtype):
    """h0 and c0 forward, the gradients of h_n and c_n backward: read by the kernels at their first
    step, not copied into the running buffers first; c_n forward, the gradients of h0 and c0
    backward: written by the kernels at their last step in the input's dtype, not converted from
    the float running state after them.  Each copy or conversion is a kernel, and a kernel
    boundary, on a GPU.  The per-step path, for contrast, copies all four in, and in a 16-bit type
    converts the two cells out."""
    persistent(2)
    assert _state_copies(path, dtype) == 0
    assert _state_copies("per-step", dtype) == (4 if dtype == torch.float32 else 6)


@pytest.mark.parametrize("path", ["persistent", "grid"])
def test_the_backward_is_deterministic(persistent, path):
    """The partial d_h of each block are summed in rank order (the grid's d_h over W_h's columns in
    row order): the same bits whatever order the threads run in (each launch runs in a new order
    under LLTM_CUDA_EMULATE_ORDER=shuffle)."""
    persistent(8)
    os.environ["LLTM_CUDA_SEQUENCE"] = path  # the fixture restores it
    inputs = make_sequence_inputs(6, 4, 3, 16)
    first, grads = _run(inputs, None, True)
    out = lltm_core.lltm_sequence(*inputs, reverse=True, backend="cuda_emulated")
    torch.autograd.backward(out, grads)
    for a, b in zip(first[3:], [t.grad for t in inputs]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("path", ["persistent", "grid"])
def test_inference_projects_in_chunks_and_keeps_the_state_across_launches(persistent, path):
    """Without a backward the input is projected 2048 rows at a time: one launch a chunk, each
    starting from the state the one before left."""
    persistent(2)
    os.environ["LLTM_CUDA_SEQUENCE"] = path  # the fixture restores it
    # 2560 rows: two chunks (16 steps and 4).  Few steps: float32's rounding grows with them, and
    # at T40 B64 it passed the kit's bound on every path, the per-step one included, for about one
    # seed in twenty (at most 2.6e-05 over 60 seeds); here at most 5.3e-06.
    inputs = make_sequence_inputs(20, 128, 2, 4, requires_grad=False)
    before = _launches()
    with torch.no_grad():
        got = lltm_core.lltm_sequence(*inputs, backend="cuda_emulated")
    assert _launches() - before == 2
    want = reference_sequence(*(t.double() for t in inputs))
    for g, w in zip(got, want):
        assert max_rel_error(g, w) <= tolerance(torch.float32)


def test_the_default_choice_and_its_reasons(monkeypatch):
    monkeypatch.delenv("LLTM_CUDA_SEQUENCE", raising=False)
    monkeypatch.delenv("LLTM_CUDA_CLUSTER", raising=False)
    path, blocks, why = lltm_cuda_emulated.sequence_path(torch.float32, 16, 128)
    assert (path, blocks) == ("persistent", 8) and "over a cluster of 8 blocks" in why
    assert lltm_cuda_emulated.sequence_path(torch.float32, 16, 3)[:2] == ("persistent", 2), "no block without a unit"
    path, _, why = lltm_cuda_emulated.sequence_path(torch.float64, 16, 128)
    assert path == "per-step" and "float64" in why
    path, _, why = lltm_cuda_emulated.sequence_path(torch.bfloat16, 256, 1024)
    assert path == "per-step" and "bytes of shared memory a block over a cluster of 8" in why
    # The grid path runs such shapes too, but is the default only once a GPU measures it faster.
    assert "LLTM_CUDA_SEQUENCE=grid" in why and "measurement decides" in why, why
    monkeypatch.setenv("LLTM_CUDA_SEQUENCE", "per-step")
    assert lltm_cuda_emulated.sequence_path(torch.float32, 16, 128)[0] == "per-step"


def test_a_forced_path_that_cannot_run_is_an_error_not_a_fallback(persistent):
    with pytest.raises(RuntimeError, match="LLTM_CUDA_SEQUENCE=persistent, but the persistent kernel takes float32"):
        lltm_cuda_emulated.sequence_path(torch.float64, 4, 8)
    inputs = make_sequence_inputs(3, 2, 2, 1031)
    with pytest.raises(RuntimeError, match="LLTM_CUDA_SEQUENCE=persistent, but W_h's rows and the state need"):
        lltm_core.lltm_sequence(*inputs, backend="cuda_emulated")
    persistent(3)
    with pytest.raises(RuntimeError, match="LLTM_CUDA_CLUSTER=3: expected 1, 2, 4, 8, 16"):
        lltm_cuda_emulated.sequence_path(torch.float32, 4, 8)


def test_a_forced_grid_that_cannot_run_is_an_error_naming_the_shape_and_the_path(grid):
    with pytest.raises(RuntimeError, match=r"LLTM_CUDA_SEQUENCE=grid, but the grid-persistent path cannot run at "
                                           r"batch 4, state size 8, Double: it takes float32"):
        lltm_cuda_emulated.sequence_path(torch.float64, 4, 8)
    inputs = make_sequence_inputs(3, 2, 2, 1031)  # a block's rows of W_h over the emulated GPU's few blocks
    with pytest.raises(RuntimeError, match=r"grid-persistent path cannot run at batch 2, state size 1031, Float: a "
                                           r"block's rows of W_h need \d+ bytes of shared memory"):
        lltm_core.lltm_sequence(*inputs, backend="cuda_emulated")


def test_without_clusters_the_default_is_per_step_and_a_forced_cluster_of_one_runs():
    """An sm_80-like device (LLTM_CUDA_EMULATE_CLUSTERS=0), in a child that reads its own settings."""
    script = (
        "m = t.lltm_cuda_emulated\n"
        "assert m.sequence_path(torch.float32, 16, 128)[0] == 'per-step'\n"
        "os.environ['LLTM_CUDA_SEQUENCE'] = 'persistent'\n"
        "assert m.sequence_path(torch.float32, 16, 64)[:2] == ('persistent', 1)\n"
        "os.environ['LLTM_CUDA_CLUSTER'] = '2'\n"
        "try:\n    m.sequence_path(torch.float32, 16, 64)\nexcept RuntimeError as e:\n    print(e)\n")
    out = _in_a_child(script, LLTM_CUDA_EMULATE_CLUSTERS="0")
    assert "LLTM_CUDA_CLUSTER=2 on a device without thread-block clusters" in out, out


def test_a_cluster_the_device_cannot_co_schedule_shrinks_by_default_and_is_an_error_when_forced():
    """A GPU whose GPCs co-schedule 4 blocks (LLTM_CUDA_EMULATE_CLUSTER_BLOCKS=4), in a child that reads
    its own settings: the default cluster halves to 4 and still matches the reference; a shape whose
    W_h needs 8 blocks runs per step, saying why; a forced 8 is an error."""
    script = (
        "m = t.lltm_cuda_emulated\n"
        "path, blocks, why = m.sequence_path(torch.float32, 3, 13)\n"
        "assert (path, blocks) == ('persistent', 4) and 'co-schedules no cluster of 8 blocks' in why, why\n"
        "t._matches_the_reference(torch.float32, 'the default cluster, halved')\n"
        "path, _, why = m.sequence_path(torch.float32, 16, 300)\n"
        "assert path == 'per-step' and 'a cluster of 4 would need' in why, why\n"
        "os.environ['LLTM_CUDA_SEQUENCE'] = 'persistent'\n"
        "os.environ['LLTM_CUDA_CLUSTER'] = '8'\n"
        "try:\n    m.sequence_path(torch.float32, 3, 13)\nexcept RuntimeError as e:\n    print(e)\n")
    out = _in_a_child(script, LLTM_CUDA_EMULATE_CLUSTER_BLOCKS="4")
    assert "LLTM_CUDA_SEQUENCE=persistent, but the device co-schedules no cluster of 8 blocks" in out, out


def test_explain_names_the_sequence_path(monkeypatch):
    """lltm info --explain's trace adds the path lltm-cuda takes to the chosen entry, a forced path
    that cannot run included; the cell has one path, so its entry stays as the rule wrote it."""
    call = lltm_core.Call("sequence", "cpu", torch.float32, 16, 32, 128, 64, True)
    with lltm_core.use_backend("cuda_emulated"):
        (chosen,) = [e for e in lltm_core.explain(call) if e.verdict == "chosen"]
        assert "sequence path: persistent" in chosen.reason, chosen
        monkeypatch.setenv("LLTM_CUDA_SEQUENCE", "per-step")
        (chosen,) = [e for e in lltm_core.explain(call) if e.verdict == "chosen"]
        assert "sequence path: per-step: LLTM_CUDA_SEQUENCE=per-step" in chosen.reason, chosen
        monkeypatch.setenv("LLTM_CUDA_SEQUENCE", "persistent")
        float64 = call._replace(dtype=torch.float64)
        (chosen,) = [e for e in lltm_core.explain(float64) if e.verdict == "chosen"]
        assert "the call would fail" in chosen.reason and "float64" in chosen.reason, chosen
        monkeypatch.setenv("LLTM_CUDA_SEQUENCE", "grid")
        (chosen,) = [e for e in lltm_core.explain(call) if e.verdict == "chosen"]
        assert "sequence path: grid: one cooperative launch" in chosen.reason, chosen
        cell = lltm_core.Call("cell", "cpu", torch.float32, 16, 32, 128, None, True)
        (chosen,) = [e for e in lltm_core.explain(cell) if e.verdict == "chosen"]
        assert "path" not in chosen.reason, chosen
