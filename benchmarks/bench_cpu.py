"""lltm-cpu against eager PyTorch, torch.compile and lltm-ref; and against its own GEMMs.

Run from the repository root (the Markdown report goes to --output)::

    python benchmarks/bench_cpu.py --output benchmarks/results/cpu.md

All candidates run in one process, interleaved: each round runs every
candidate for --steps steps in turn, and a candidate's figure is the median of
all its steps, so drift in the machine's speed hits every candidate alike.
A step is one LLTM forward and one backward of new_h.sum() + new_cell.sum(),
timed separately, as in the extension tutorial's benchmark (and lltm bench),
with the gradients reset to None before each step.
The small size runs twice: as in the tutorial, where only the parameters
require grad, and with every input requiring grad, as in an unrolled sequence
where old_h and old_cell come from the previous step.  The lltm kernels
compute grad_X = grad_gates @ weights either way (the backend contract asks
for it), while autograd skips that GEMM for the eager module in the first case.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time

import torch

import lltm_core
from lltm_core.testing import SeedLLTM  # the tutorial's pure-PyTorch module

SMALL = dict(batch=16, input_features=32, state_size=128)  # the seed's benchmark size
LARGE = dict(batch=256, input_features=256, state_size=1024)

TARGETS = {  # candidate time / baseline time must be at most this
    "forward": 0.35,
    "backward": 0.50,
    "large": 1.15,
}


NOTES = """\
## What would close the gaps

- The GEMMs are the floor of the kernel: MKL runs them close to one core's peak
  at this size, and no other ATen entry point is faster (F.linear, addmm, mm,
  mm into a preallocated output: all within 1 us of each other; splitting the
  forward GEMM across the two cores gains nothing, MKL already uses both).
  Pre-transposing the weights saves ~2 us per GEMM but costs a full copy of
  them per call.  What is left of the kernel beyond its GEMMs is the fused
  pointwise pass, the X = cat copy, output allocations and the operator call.
- Most of the time at B16 is outside the kernel: lltm_core's argument checks,
  backend choice and the autograd.Function around it (about 15 us after the
  cuts measured in benchmarks/results/core_overhead.md), plus autograd's own
  work.  Past that, only a faster GEMM could close the forward target (e.g.
  MKL's packed GEMM with the packed weights cached across the steps of a
  sequence, or one input-projection GEMM for a whole sequence: both API
  changes).
- Backward: the backward kernel skips the grad_X GEMM when neither input nor
  old_h needs a gradient (the tutorial's benchmark), as eager autograd does;
  what remains is grad_weights' GEMM, the fused pass and autograd's engine."""


def make_step(module, batch, input_features, state_size, inputs_require_grad):
    """A function running one timed step of ``module``: (forward ns, backward ns)."""
    input = torch.randn(batch, input_features, requires_grad=inputs_require_grad)
    state = tuple(torch.randn(batch, state_size, requires_grad=inputs_require_grad) for _ in range(2))
    leaves = [input, *state, *module.parameters()]

    def step():
        # As optimizer.zero_grad() does: backward then stores each gradient
        # instead of adding it to the last one (at B256 that add alone is
        # several ms of memory traffic, part of no one's kernel).
        for t in leaves:
            t.grad = None
        start = time.perf_counter_ns()
        new_h, new_cell = module(input, state)
        mid = time.perf_counter_ns()
        (new_h.sum() + new_cell.sum()).backward()
        return mid - start, time.perf_counter_ns() - mid

    return step


def make_kernel_step(batch, input_features, state_size):
    """torch.ops.lltm_cpu.forward and .backward called directly: no lltm_core, no autograd."""
    weights = torch.randn(3 * state_size, state_size + input_features) / math.sqrt(state_size)
    args = (torch.randn(batch, input_features), weights, torch.randn(3 * state_size),
            torch.randn(batch, state_size), torch.randn(batch, state_size))
    ones = torch.ones(batch, state_size)

    def step():
        start = time.perf_counter_ns()
        _, _, *saved = torch.ops.lltm_cpu.forward(*args)
        mid = time.perf_counter_ns()
        torch.ops.lltm_cpu.backward(ones, ones, weights, *saved, True)
        return mid - start, time.perf_counter_ns() - mid

    return step


def make_gemm_step(batch, input_features, state_size):
    """The GEMMs of one LLTM step and nothing else: addmm forward, two mm backward."""
    X = torch.randn(batch, state_size + input_features)
    weights = torch.randn(3 * state_size, state_size + input_features)
    bias = torch.randn(3 * state_size)
    grad_gates = torch.randn(batch, 3 * state_size)

    def step():
        start = time.perf_counter_ns()
        torch.addmm(bias, X, weights.t())
        mid = time.perf_counter_ns()
        grad_gates.t().mm(X)
        grad_gates.mm(weights)
        return mid - start, time.perf_counter_ns() - mid

    return step


def busy_cpu_seconds() -> float | None:
    """CPU time all processes have used since boot (Linux), to tell whether others ran meanwhile."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle, iowait = fields[3], fields[4]
    return (sum(fields[:8]) - idle - iowait) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def measure(steps: dict, rounds: int, steps_per_round: int, warmup: int) -> tuple[dict, float]:
    """Times the candidates interleaved.

    Returns {name: (median forward us, median backward us, median step us)} and
    the CPU-seconds other processes used meanwhile (0 where unknown): a busy
    machine makes every figure, the ratios too, less trustworthy.
    """
    times = {name: [] for name in steps}
    for step in steps.values():
        for _ in range(warmup):
            step()
    busy_before, own_before = busy_cpu_seconds(), own_cpu_seconds()
    for _ in range(rounds):
        for name, step in steps.items():
            times[name].extend(step() for _ in range(steps_per_round))
    others = 0.0
    if busy_before is not None:
        others = max((busy_cpu_seconds() - busy_before) - (own_cpu_seconds() - own_before), 0.0)
    medians = {}
    for name, samples in times.items():
        forward, backward = zip(*samples)
        whole_steps = [f + b for f, b in samples]
        medians[name] = tuple(statistics.median(ns) / 1e3 for ns in (forward, backward, whole_steps))
    return medians, others


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def small_size_table(small: dict) -> list[str]:
    base_fwd, base_bwd, _ = small["eager PyTorch"]
    lines = [
        "| candidate | forward (us) | backward (us) | forward / eager | backward / eager |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, (fwd, bwd, _) in small.items():
        lines.append(f"| {name} | {fwd:.1f} | {bwd:.1f} | {fwd / base_fwd:.2f} | {bwd / base_bwd:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # Many short rounds: a burst of noise from elsewhere then hits every candidate alike.
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10, help="steps per candidate per round (small size)")
    parser.add_argument("--output", help="write the Markdown report here as well as to stdout")
    args = parser.parse_args()
    torch.manual_seed(0)

    eager = SeedLLTM(SMALL["input_features"], SMALL["state_size"])
    modules = {
        "eager PyTorch": eager,
        "torch.compile(eager)": torch.compile(eager),
        "lltm cpu": lltm_core.LLTM(SMALL["input_features"], SMALL["state_size"], backend="cpu"),
        "lltm ref": lltm_core.LLTM(SMALL["input_features"], SMALL["state_size"], backend="ref"),
    }
    for name in ("lltm cpu", "lltm ref"):  # same parameters as the eager module
        modules[name].load_state_dict(eager.state_dict())
    lltm_core.get_backend("cpu")  # loads the torch.ops.lltm_cpu operators
    floors = {"lltm_cpu ops alone": make_kernel_step(**SMALL), "GEMMs alone": make_gemm_step(**SMALL)}
    small, others = {}, 0.0
    for inputs_require_grad in (False, True):
        steps = {name: make_step(m, **SMALL, inputs_require_grad=inputs_require_grad) for name, m in modules.items()}
        small[inputs_require_grad], busy = measure({**steps, **floors}, args.rounds, args.steps, warmup=100)
        others += busy

    large_model = lltm_core.LLTM(LARGE["input_features"], LARGE["state_size"], backend="cpu")
    large, busy = measure(
        {
            # Inputs require grad, so the step runs all three GEMMs the floor counts.
            "lltm cpu": make_step(large_model, **LARGE, inputs_require_grad=True),
            "GEMMs alone": make_gemm_step(**LARGE),
        },
        # Ten warm-up steps: until then fresh multi-MB allocations page-fault
        # (glibc adapts its mmap threshold), which a training loop pays only once.
        max(args.rounds // 10, 1), 3, warmup=10,
    )
    others += busy

    tutorial = small[False]
    base_fwd, base_bwd, _ = tutorial["eager PyTorch"]
    cpu_fwd, cpu_bwd, _ = tutorial["lltm cpu"]
    compiled_fwd, compiled_bwd, _ = tutorial["torch.compile(eager)"]
    checks = [
        ("forward vs eager", cpu_fwd / base_fwd, TARGETS["forward"]),
        ("backward vs eager", cpu_bwd / base_bwd, TARGETS["backward"]),
        ("B256 step vs its GEMMs alone", large["lltm cpu"][2] / large["GEMMs alone"][2], TARGETS["large"]),
    ]
    size = f"B{SMALL['batch']} I{SMALL['input_features']} S{SMALL['state_size']}"
    lines = [
        "# lltm-cpu benchmark",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"torch {torch.__version__}, {cpu_model()}, {torch.get_num_threads()} threads, "
        f"ATen CPU capability {torch.backends.cpu.get_cpu_capability()}, Python {platform.python_version()}.",
        f"Medians of interleaved rounds; other processes used {others:.1f} CPU-seconds while they ran.",
        "",
        f"## {size}, one step, only the parameters require grad (the tutorial's benchmark)",
        "",
        *small_size_table(tutorial),
        "",
        f"## {size}, one step, every input requires grad (a step inside an unrolled sequence)",
        "",
        *small_size_table(small[True]),
        "",
        f"## B{LARGE['batch']} I{LARGE['input_features']} S{LARGE['state_size']}, forward + backward",
        "",
        "| candidate | forward (ms) | backward (ms) | step (ms) |",
        "|---|---:|---:|---:|",
    ]
    for name, (fwd, bwd, total) in large.items():
        lines.append(f"| {name} | {fwd / 1e3:.2f} | {bwd / 1e3:.2f} | {total / 1e3:.2f} |")
    lines += ["", "## Targets (the tutorial's benchmark)", "", "| ratio | measured | target | met |", "|---|---:|---:|---|"]
    for what, ratio, target in checks:
        lines.append(f"| {what} | {ratio:.2f} | <= {target:.2f} | {'yes' if ratio <= target else 'NO'} |")
    faster = cpu_fwd < compiled_fwd and cpu_bwd < compiled_bwd
    lines.append(
        f"| lltm cpu / torch.compile (forward, backward) | {cpu_fwd / compiled_fwd:.2f}, "
        f"{cpu_bwd / compiled_bwd:.2f} | < 1 | {'yes' if faster else 'NO'} |"
    )
    lines += ["", "## Where the time goes (the tutorial's benchmark)", ""]
    ops_fwd, ops_bwd, _ = tutorial["lltm_cpu ops alone"]
    gemm_fwd, gemm_bwd, _ = tutorial["GEMMs alone"]
    for what, total, ops, gemm, eager_time, target in (
        ("forward", cpu_fwd, ops_fwd, gemm_fwd, base_fwd, TARGETS["forward"]),
        ("backward", cpu_bwd, ops_bwd, gemm_bwd, base_bwd, TARGETS["backward"]),
    ):
        lines.append(
            f"- {what}: lltm cpu {total:.0f} us = GEMMs {gemm:.0f} us + rest of the lltm_cpu kernel "
            f"{round(ops - gemm):+d} us + lltm_core and autograd around it {total - ops:.0f} us. "
            f"The GEMMs alone take {gemm / (target * eager_time):.0%} of the target's budget "
            f"({target} x eager = {target * eager_time:.0f} us)."
        )
    lines += ["", NOTES]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        with open(args.output, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
