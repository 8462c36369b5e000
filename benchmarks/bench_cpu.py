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
where old_h and old_cell come from the previous step: only then does backward
run the grad_X = grad_gates @ weights GEMM (eager autograd and lltm_cpu alike).
Then bfloat16 at both sizes.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time

import torch

import lltm_core
from lltm_core.benchmarking import busy_cpu_seconds, cpu_model, own_cpu_seconds
from lltm_core.testing import SeedLLTM  # the tutorial's pure-PyTorch module

SMALL = dict(batch=16, input_features=32, state_size=128)  # the seed's benchmark size
LARGE = dict(batch=256, input_features=256, state_size=1024)

TARGETS = {  # candidate time / baseline time must be at most this
    "forward": 0.35,  # the tutorial's targets, against eager
    "backward": 0.50,
    "large": 1.15,
    "forward kept": 0.80,  # the per-step cell keeps its speed beside the sequence kernels
    "backward kept": 0.80,
}





def make_step(module, batch, input_features, state_size, inputs_require_grad, dtype=torch.float32):
    """A function running one timed step of ``module``: (forward ns, backward ns)."""
    input = torch.randn(batch, input_features, dtype=dtype, requires_grad=inputs_require_grad)
    state = tuple(torch.randn(batch, state_size, dtype=dtype, requires_grad=inputs_require_grad) for _ in range(2))
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


def make_kernel_step(batch, input_features, state_size, needs_grad_X, dtype=torch.float32):
    """torch.ops.lltm_cpu.forward and .backward called directly: no lltm_core, no autograd."""
    weights = torch.randn(3 * state_size, state_size + input_features, dtype=dtype) / math.sqrt(state_size)
    args = (torch.randn(batch, input_features, dtype=dtype), weights, torch.randn(3 * state_size, dtype=dtype),
            torch.randn(batch, state_size, dtype=dtype), torch.randn(batch, state_size, dtype=dtype))
    ones = torch.ones(batch, state_size, dtype=dtype)
    forward, backward = torch.ops.lltm_cpu.forward.default, torch.ops.lltm_cpu.backward.default

    def step():
        start = time.perf_counter_ns()
        _, _, *saved = forward(*args)
        mid = time.perf_counter_ns()
        backward(ones, ones, weights, *saved, needs_grad_X)
        return mid - start, time.perf_counter_ns() - mid

    return step


def make_gemm_step(batch, input_features, state_size, needs_grad_X, dtype=torch.float32):
    """The GEMMs of one LLTM step and nothing else: addmm forward; grad_weights' mm backward, and
    grad_X's mm if ``needs_grad_X`` (as autograd, and lltm_cpu, skip it when no input needs a gradient)."""
    X = torch.randn(batch, state_size + input_features, dtype=dtype)
    weights = torch.randn(3 * state_size, state_size + input_features, dtype=dtype)
    bias = torch.randn(3 * state_size, dtype=dtype)
    grad_gates = torch.randn(batch, 3 * state_size, dtype=dtype)

    def step():
        start = time.perf_counter_ns()
        torch.addmm(bias, X, weights.t())
        mid = time.perf_counter_ns()
        grad_gates.t().mm(X)
        if needs_grad_X:
            grad_gates.mm(weights)
        return mid - start, time.perf_counter_ns() - mid

    return step




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


def measure_large(dtype: torch.dtype, rounds: int) -> tuple[dict, float]:
    """lltm cpu at the large size against its GEMMs alone, every input requiring grad (all three GEMMs)."""
    model = lltm_core.LLTM(LARGE["input_features"], LARGE["state_size"], backend="cpu", dtype=dtype)
    return measure(
        {
            "lltm cpu": make_step(model, **LARGE, inputs_require_grad=True, dtype=dtype),
            "GEMMs alone": make_gemm_step(**LARGE, needs_grad_X=True, dtype=dtype),
        },
        # Ten warm-up steps: until then fresh multi-MB allocations page-fault
        # (glibc adapts its mmap threshold), which a training loop pays only once.
        max(rounds // 10, 1), 3, warmup=10,
    )


def large_size_table(large: dict) -> list[str]:
    lines = ["| candidate | forward (ms) | backward (ms) | step (ms) |", "|---|---:|---:|---:|"]
    for name, (fwd, bwd, total) in large.items():
        lines.append(f"| {name} | {fwd / 1e3:.2f} | {bwd / 1e3:.2f} | {total / 1e3:.2f} |")
    return lines



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
    small, others = {}, 0.0
    for inputs_require_grad in (False, True):
        steps = {name: make_step(m, **SMALL, inputs_require_grad=inputs_require_grad) for name, m in modules.items()}
        floors = {
            "lltm_cpu ops alone": make_kernel_step(**SMALL, needs_grad_X=inputs_require_grad),
            "GEMMs alone": make_gemm_step(**SMALL, needs_grad_X=inputs_require_grad),
        }
        small[inputs_require_grad], busy = measure({**steps, **floors}, args.rounds, args.steps, warmup=100)
        others += busy

    large, busy = measure_large(torch.float32, args.rounds)
    others += busy

    # bfloat16: the same module and sizes, stored in bfloat16 (lltm_cpu computes its pointwise passes in float).
    bf16 = {"dtype": torch.bfloat16}
    eager_bf16 = SeedLLTM(SMALL["input_features"], SMALL["state_size"], **bf16)
    small_bf16, busy = measure(
        {
            "eager PyTorch": make_step(eager_bf16, **SMALL, inputs_require_grad=False, **bf16),
            **{
                f"lltm {name}": make_step(
                    lltm_core.LLTM(SMALL["input_features"], SMALL["state_size"], backend=name, **bf16),
                    **SMALL, inputs_require_grad=False, **bf16,
                )
                for name in ("cpu", "ref")
            },
            "lltm_cpu ops alone": make_kernel_step(**SMALL, needs_grad_X=False, **bf16),
            "GEMMs alone": make_gemm_step(**SMALL, needs_grad_X=False, **bf16),
        },
        max(args.rounds // 2, 1), args.steps, warmup=100,
    )
    others += busy
    large_bf16, busy = measure_large(torch.bfloat16, args.rounds)
    others += busy

    tutorial = small[False]
    base_fwd, base_bwd, _ = tutorial["eager PyTorch"]
    cpu_fwd, cpu_bwd, _ = tutorial["lltm cpu"]
    compiled_fwd, compiled_bwd, _ = tutorial["torch.compile(eager)"]
    checks = [
        ("forward vs eager (the tutorial's target)", cpu_fwd / base_fwd, TARGETS["forward"]),
        ("backward vs eager (the tutorial's target)", cpu_bwd / base_bwd, TARGETS["backward"]),
        ("B256 step vs its GEMMs alone", large["lltm cpu"][2] / large["GEMMs alone"][2], TARGETS["large"]),
        ("forward vs eager, the per-step cell kept", cpu_fwd / base_fwd, TARGETS["forward kept"]),
        ("backward vs eager, the per-step cell kept", cpu_bwd / base_bwd, TARGETS["backward kept"]),
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
        *large_size_table(large),
        "",
        f"## bfloat16: {size}, only the parameters require grad",
        "",
        *small_size_table(small_bf16),
        "",
        f"## bfloat16: B{LARGE['batch']} I{LARGE['input_features']} S{LARGE['state_size']}, forward + backward",
        "",
        *large_size_table(large_bf16),
        "",
        f"lltm cpu step / GEMMs alone: {large_bf16['lltm cpu'][2] / large_bf16['GEMMs alone'][2]:.2f} "
        f"(float32: {large['lltm cpu'][2] / large['GEMMs alone'][2]:.2f}).",
    ]
    lines += ["", "## Targets (at the tutorial's benchmark)", "", "| ratio | measured | target | met |", "|---|---:|---:|---|"]
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
            f"- {what}: lltm cpu {total:.0f} us = the lltm_cpu kernel {ops:.0f} us + the module call, lltm_core "
            f"and autograd around it {total - ops:.0f} us. torch's own GEMMs of the step (addmm, mm) take "
            f"{gemm:.0f} us alone, {gemm / (target * eager_time):.0%} of the target's budget "
            f"({target} x eager = {target * eager_time:.0f} us)."
        )
    lines += ["", "What would close the gaps, measured: benchmarks/results/cpu.md."]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        with open(args.output, "w") as f:
            f.write(report)


if __name__ == "__main__":
    main()
