"""LLTMLayer under torch.distributed: DistributedDataParallel over gloo, two CPU processes on this machine.

Two ways in, both plain torch: ``torch.multiprocessing`` processes that meet
through a file in the test's tmp dir (the layer's own checks), and ``torchrun``
on the example (what a user types).  Every launch has a deadline, so a hang
fails the test instead of blocking CI, and every torchrun gets a port of its
own.  Comparisons are made here, in the pytest process, from what the ranks
saved.  The layers use whichever backend lltm-core picks for CPU tensors (the
best installed), as the example does.
"""

from __future__ import annotations

import datetime
import gc
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
# Before any process group exists (why: examples/train_sequence.py, at its import of torch._dynamo).
import torch._dynamo
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import lltm_core

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_sequence.py"
WORLD = 2
DEADLINE_S = 150  # per launch; the slowest, torch.compile's, takes 10-30 s here

# The layer of the gradient and parameter checks: 2 layers, bidirectional, float64, a global batch of 6.
T, B, I, S, LAYERS = 5, 6, 3, 4, 2
SHAPE = dict(num_layers=LAYERS, bidirectional=True, dtype=torch.float64)


# --- launching --------------------------------------------------------------------------------------


def _run_ranks(worker, tmp_path: Path, *args) -> None:
    """worker(rank, tmp_path, *args) in WORLD spawned processes joined in one gloo group; fails on error or hang."""
    context = mp.start_processes(_rank_main, args=(worker, str(tmp_path), args), nprocs=WORLD, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):  # raises a rank's exception
            if time.monotonic() >= deadline:
                pytest.fail(f"{worker.__name__}: {WORLD} processes still running after {DEADLINE_S} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


def _rank_main(rank: int, worker, tmp: str, args: tuple) -> None:
    torch.set_num_threads(1)  # two processes on two cores
    # The rendezvous is a file in the test's tmp dir: no port to pick, nothing shared between tests.
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    try:
        worker(rank, Path(tmp), *args)
    finally:
        # A DDP model freed after its group is destroyed can hang (torch 2.13, gloo: its reducer frees the
        # group with the GIL held while a gloo thread waits for the GIL).  The worker's eager models went
        # when it returned; a compiled one lives on in Dynamo's caches and reference cycles: drop it now.
        torch._dynamo.reset()
        gc.collect()
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(cwd: Path, *args: str) -> str:
    """`torchrun --nproc-per-node 2 EXAMPLE *args` (python -m torch.distributed.run: this venv's); its stdout."""
    launcher = ("--nproc-per-node", str(WORLD), "--master-addr", "127.0.0.1", "--master-port", str(_free_port()))
    return _run_together(cwd, [[sys.executable, "-m", "torch.distributed.run", *launcher, str(EXAMPLE), *args]])[0]


def _run_together(cwd: Path, commands: list[list[str]]) -> list[str]:
    """Run the commands at once, each in its own process group (killed whole at the deadline); their stdouts."""
    # One thread per process, as torchrun sets for more than one process per node: two cores, and the
    # same arithmetic in every launch.
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           # lltm-cpu picks each GEMM's route and its time loop's split by timing them in each
           # process, so two launches may round differently; bit-for-bit equal runs need every route
           # and the split fixed, as the README's training section says.  (Harmless where lltm-cpu
           # is not installed; with one thread the loop is not split.)
           "LLTM_CPU_GEMM": "aten", "LLTM_CPU_SPLIT": "rows"}
    procs = [subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for cmd in commands]
    deadline = time.monotonic() + DEADLINE_S
    results = []
    try:
        for proc in procs:
            results.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired as late:
        # What each launch had printed when stopped: where a hang stands, or how far a slow run got.
        for proc in procs[len(results):]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            results.append(proc.communicate())
        said = "\n".join(f"--- {' '.join(proc.args[3:])}\nstdout:\n{out[-2000:]}\nstderr:\n{err[-4000:]}"
                         for proc, (out, err) in zip(procs, results))
        pytest.fail(f"{' '.join(late.cmd)}: still running after {DEADLINE_S} s\n{said}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    for proc, (out, err) in zip(procs, results):
        assert proc.returncode == 0, f"{' '.join(proc.args)} exited {proc.returncode}\n{out}\n{err[-4000:]}"
    return [out for out, _ in results]


# --- the layer under DDP, spawned ------------------------------------------------------------------


def _loss(output, h_n, c_n, target):
    # Every term a mean over tensors split along the batch: equal slices' means average to the whole's.
    return F.mse_loss(output, target) + h_n.pow(2).mean() + c_n.pow(2).mean()


def _batches(seed: int, count: int):
    """The same global batches wherever they are drawn: input, h_0, c_0, target."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(T, B, I, generator=g, dtype=torch.float64),
             torch.randn(LAYERS * 2, B, S, generator=g, dtype=torch.float64),
             torch.randn(LAYERS * 2, B, S, generator=g, dtype=torch.float64),
             torch.randn(T, B, 2 * S, generator=g, dtype=torch.float64)) for _ in range(count)]


def _shard(batch, rank: int):
    """This rank's slice of the batch dimension (1 for the time-major input, the states and the target)."""
    per = B // WORLD
    return tuple(t[:, rank * per:(rank + 1) * per] for t in batch)


def _layer_from(state: dict) -> lltm_core.LLTMLayer:
    layer = lltm_core.LLTMLayer(I, S, **SHAPE)
    layer.load_state_dict(state)
    return layer


def _ddp_training_worker(rank: int, tmp: Path, steps: int) -> None:
    setup = torch.load(tmp / "setup.pt", weights_only=True)
    layer = _layer_from(setup["state"])
    model = DistributedDataParallel(layer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    saved = {"backend": lltm_core.get_backend(device="cpu", dtype=torch.float64).name}
    for step, batch in enumerate(_batches(setup["seed"], steps)):
        x, h_0, c_0, target = _shard(batch, rank)
        output, (h_n, c_n) = model(x, (h_0, c_0))
        optimizer.zero_grad()
        _loss(output, h_n, c_n, target).backward()
        if step == 0:
            saved["grads"] = {name: p.grad.clone() for name, p in layer.named_parameters()}
        optimizer.step()
    saved["params"] = {name: p.detach().clone() for name, p in layer.named_parameters()}
    torch.save(saved, tmp / f"rank{rank}.pt")


def _single_process_training(setup: dict, steps: int):
    """What the ranks did together, done by one process on the whole batches."""
    layer = _layer_from(setup["state"])
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    for step, (x, h_0, c_0, target) in enumerate(_batches(setup["seed"], steps)):
        output, (h_n, c_n) = layer(x, (h_0, c_0))
        optimizer.zero_grad()
        _loss(output, h_n, c_n, target).backward()
        if step == 0:
            grads = {name: p.grad.clone() for name, p in layer.named_parameters()}
        optimizer.step()
    return grads, {name: p.detach().clone() for name, p in layer.named_parameters()}


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).abs().max() / want.abs().max()).item()


@pytest.fixture(scope="module")
def ddp_training(tmp_path_factory):
    """Two ranks train a 2-layer bidirectional LLTMLayer (float64) under DDP for 4 steps; what each saved."""
    tmp = tmp_path_factory.mktemp("ddp")
    seed = random.SystemRandom().randrange(2**31)  # fresh values every run; the seed is in the messages
    torch.manual_seed(seed)
    setup = {"seed": seed, "state": lltm_core.LLTMLayer(I, S, **SHAPE).state_dict()}
    torch.save(setup, tmp / "setup.pt")
    steps = 4
    _run_ranks(_ddp_training_worker, tmp, steps)
    ranks = [torch.load(tmp / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    return setup, steps, ranks


def test_ddp_gradients_equal_the_whole_batch_gradients(ddp_training):
    setup, steps, ranks = ddp_training
    want, _ = _single_process_training(setup, steps)
    assert len(want) == 4 * LAYERS  # weights and bias, both directions, every layer
    for rank, saved in enumerate(ranks):
        for name, grad in saved["grads"].items():
            error = _relative_error(grad, want[name])
            assert error <= 1e-10, (f"rank {rank}, {name}: DDP gradient off the whole batch's by {error:.3g} "
                                    f"(relative; backend {saved['backend']}, seed {setup['seed']})")


def test_parameters_identical_across_ranks_after_several_steps(ddp_training):
    setup, steps, ranks = ddp_training
    first = ranks[0]["params"]
    for name, p in first.items():
        assert not torch.equal(p, setup["state"][name]), f"{name} never moved: the optimiser did not run"
        for rank in range(1, WORLD):
            assert torch.equal(ranks[rank]["params"][name], p), \
                f"{name}: rank {rank} differs from rank 0 after {steps} steps (seed {setup['seed']})"
    # ... and they are what one process training on the whole batches reaches.
    _, want = _single_process_training(setup, steps)
    for name, p in first.items():
        assert _relative_error(p, want[name]) <= 1e-10, (name, setup["seed"])


# --- torch.compile of the DDP-wrapped layer -------------------------------------------------------


def _compile_worker(rank: int, tmp: Path) -> None:
    from torch._dynamo.utils import counters

    setup = torch.load(tmp / "setup.pt", weights_only=True)
    layer = lltm_core.LLTMLayer(I, S, bidirectional=True, dtype=torch.float64)
    layer.load_state_dict(setup["state"])
    model = DistributedDataParallel(layer)
    compiled = torch.compile(model)
    saved = []
    # Two calls: the first compiles, the second runs the cached graph; each compared with eager DDP, whose
    # gradients are averaged over the ranks: a compiled backward that skipped DDP's all-reduce would differ.
    for x, target in setup["batches"]:
        x, target = _shard((x, target), rank)
        results = []
        for run in (compiled, model):
            layer.zero_grad()
            output, (h_n, c_n) = run(x)
            _loss(output, h_n, c_n, target).backward()
            results.append({"output": output.detach(), **{n: p.grad.clone() for n, p in layer.named_parameters()}})
        saved.append(results)
    torch.save({"results": saved, "graphs": counters["stats"]["unique_graphs"]}, tmp / f"rank{rank}.pt")


def test_torch_compile_of_the_ddp_model_matches_eager(tmp_path):
    # One layer, not two: a cold compile of the 2-layer bidirectional graph takes a minute on 2 busy cores.
    seed = random.SystemRandom().randrange(2**31)
    torch.manual_seed(seed)
    layer = lltm_core.LLTMLayer(I, S, bidirectional=True, dtype=torch.float64)
    batches = [(torch.randn(T, B, I, dtype=torch.float64), torch.randn(T, B, 2 * S, dtype=torch.float64))
               for _ in range(2)]
    torch.save({"state": layer.state_dict(), "batches": batches}, tmp_path / "setup.pt")
    # Both ranks would compile the same C++ kernels at once, on two cores (half a minute); compiled here
    # first, on the bare layer and a shard's shapes, they come from inductor's on-disk cache there.  Each
    # rank still traces and compiles the DDP-wrapped model itself.
    x, target = _shard(batches[0], 0)
    output, (h_n, c_n) = torch.compile(layer)(x)
    _loss(output, h_n, c_n, target).backward()
    torch._dynamo.reset()
    _run_ranks(_compile_worker, tmp_path)
    for rank in range(WORLD):
        saved = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert saved["graphs"] >= 1, f"rank {rank}: Dynamo compiled no graph"
        for call, (compiled, eager) in enumerate(saved["results"]):
            for name in eager:
                error = _relative_error(compiled[name], eager[name])
                assert error <= 1e-10, f"rank {rank}, call {call}, {name}: compiled off eager by {error:.3g} (seed {seed})"


# --- the example under torchrun -------------------------------------------------------------------


def _summary(stdout: str) -> tuple[float, float]:
    match = re.search(r"mean loss of the first 10 steps ([0-9.]+), of the last 10 steps ([0-9.]+)", stdout)
    assert match, stdout
    return float(match[1]), float(match[2])


def _step_lines(stdout: str) -> dict[int, str]:
    """{step: its printed loss}, the timing left out."""
    return {int(m[1]): m[2] for m in re.finditer(r"^step +(\d+) +loss (\S+)", stdout, re.MULTILINE)}


@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    """`torchrun --nproc-per-node 2 examples/train_sequence.py --steps 30`, logging every step, saving at the end."""
    tmp = tmp_path_factory.mktemp("example")
    stdout = _torchrun(tmp, "--steps", "30", "--log-every", "1", "--save", "full.pt")
    return tmp, stdout


def test_torchrun_example_trains_and_its_loss_falls(example_run):
    _, stdout = example_run
    best = lltm_core.get_backend(device="cpu", dtype=torch.float32).name
    headers = [line for line in stdout.splitlines() if line.startswith("training on")]
    assert len(headers) == 1, f"only rank 0 prints:\n{stdout}"
    assert f"2 processes (gloo), with lltm backend {best!r}" in headers[0], stdout
    assert sorted(_step_lines(stdout)) == list(range(1, 31)), stdout
    first, last = _summary(stdout)
    assert last < 0.7 * first, stdout


def _assert_same_state(got, want, where: str) -> None:
    """Nested checkpoints equal exactly: tensors bit for bit, everything else by ==."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            _assert_same_state(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), where
        for i, (a, b) in enumerate(zip(got, want)):
            _assert_same_state(a, b, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def test_resumed_run_prints_and_saves_what_the_uninterrupted_one_did(example_run):
    # Dropout (the example's default 0.1) draws from each rank's own torch RNG; the batches from the
    # data generator: both must be restored, on each rank, for the losses to come out equal.
    tmp, uninterrupted = example_run
    _torchrun(tmp, "--steps", "15", "--save", "part.pt")
    resumed = _torchrun(tmp, "--steps", "30", "--log-every", "1", "--resume", "part.pt", "--save", "resumed.pt")
    assert "resuming from part.pt at step 15" in resumed, resumed
    want = {step: loss for step, loss in _step_lines(uninterrupted).items() if step > 15}
    assert _step_lines(resumed) == want
    full = torch.load(tmp / "full.pt", weights_only=True)
    again = torch.load(tmp / "resumed.pt", weights_only=True)
    assert len(full["losses"]) == 30 and len(full["rank_rng"]) == WORLD
    _assert_same_state(again, full, "checkpoint")  # losses, weights, optimiser, every random state


def test_multi_node_form_two_agents_one_machine(example_run, tmp_path):
    # What the README gives for several machines, as two torchrun agents of one process each, here.
    _, uninterrupted = example_run
    endpoint = f"127.0.0.1:{_free_port()}"
    # torchrun's default (static) rendezvous: node 0 serves it at the endpoint, --node-rank orders the nodes.
    commands = [[sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                 "--nproc-per-node", "1", "--rdzv-endpoint", endpoint,
                 str(EXAMPLE), "--steps", "5", "--log-every", "1"] for node in range(2)]
    node0, node1 = _run_together(tmp_path, commands)
    assert "training on" not in node1, node1  # rank 1 prints nothing
    assert "2 processes (gloo)" in node0, node0
    # The same two shards as the one-machine run, so the same losses.
    want = {step: loss for step, loss in _step_lines(uninterrupted).items() if step <= 5}
    assert _step_lines(node0) == want, node0
