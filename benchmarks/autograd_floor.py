#!/usr/bin/env python3
"""How fast lltm-cpu could be at the tutorial's size if lltm_core cost nothing.

    python benchmarks/autograd_floor.py [--runs 5] [--output benchmarks/results/autograd_floor.md]

lltm-cpu's targets are forward <= 0.35x and backward <= 0.50x the eager
module at B16 I32 S128 (the tutorial's benchmark: only the parameters require
grad).  lltm_core puts the kernels behind argument checks, a backend choice and
a Python ``torch.autograd.Function``.  This compiles (once, with ninja) the
cheapest possible wrapper for the same two lltm_cpu operators: a C++
``torch::autograd::Function`` called through pybind11, with no checks and no
choice at all.  Timed in one process, interleaved with the eager module and
with ``lltm_core.LLTM(backend="cpu")``, it gives the floor that any change to
lltm_core's plumbing is up against.

Two more rows bound what any kernel could reach: the same C++ node running no
kernels at all (it returns uninitialised tensors of the right shapes: only the
module call, the autograd graph and engine, and the tutorial's sums are left)
and the step's GEMMs alone.  Their sum is what a per-step autograd call with
free pointwise work would take.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

import torch

import lltm_core
from lltm_core.benchmarking import PhaseTimes, interleaved
from lltm_core.testing import SeedLLTM

from lltm_core.benchmarking import busy_cpu_seconds, own_cpu_seconds

# The step builders and sizes are bench_cpu.py's, so the floor rows time exactly its steps.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu import SMALL, TARGETS, make_gemm_step, make_step, small_size_table  # noqa: E402
from floor_nodes import build_floor_nodes  # noqa: E402

def measure(steps: dict, rounds: int, steps_per_round: int, warmup: int) -> tuple[dict, float]:
    """{name: (median forward us, median backward us, median step us)}, timed interleaved, and the
    CPU-seconds other processes used meanwhile (0 where unknown)."""
    busy_before, own_before = busy_cpu_seconds(), own_cpu_seconds()
    # Each step times its forward and backward itself, in ns.
    timed = {name: (lambda step=step: PhaseTimes(step())) for name, step in steps.items()}
    timings = interleaved(timed, rounds=rounds, calls=steps_per_round, warmup=warmup)
    others = 0.0
    if busy_before is not None:
        others = max((busy_cpu_seconds() - busy_before) - (own_cpu_seconds() - own_before), 0.0)
    medians = {name: (timings.median(name, 0) / 1e3, timings.median(name, 1) / 1e3,
                      statistics.median(f + b for f, b in samples) / 1e3)
               for name, samples in timings.samples.items()}
    return medians, others


NO_KERNELS = "the C++ autograd node running no kernels (outputs left uninitialised)"
GEMMS = "GEMMs alone"


def floor_lines(times: dict) -> list[str]:
    """The floor (no kernels + GEMMs) against eager and the targets, per pass."""
    eager, empty, gemms = times["eager PyTorch"], times[NO_KERNELS], times[GEMMS]
    lines = []
    for i, direction in enumerate(("forward", "backward")):
        floor = (empty[i] + gemms[i]) / eager[i]
        verdict = "above the target: with these GEMMs no pointwise kernel or wrapper can meet it" if (
            floor > TARGETS[direction]) else (
            f"leaves {(TARGETS[direction] - floor) * eager[i]:.0f} us for the fused pointwise pass, "
            "the operator call and the rest of the kernel")
        lines.append(f"- {direction}: {empty[i] / eager[i]:.2f}x + {gemms[i] / eager[i]:.2f}x = **{floor:.2f}x** "
                     f"of eager (target {TARGETS[direction]}x): {verdict}")
    return lines


def runs_table(runs: list) -> list[str]:
    """One row of ratios to eager per repeated measurement, and their range: how much the machine moved them."""
    rows = {"lltm cpu (lltm_core.LLTM)": [], "lltm_cpu kernels in a C++ autograd node": [], "floor": []}
    lines = ["| run | " + " | ".join(f"{name}: fwd / bwd" for name in rows) + " | other CPU-seconds |",
             "|---|" + "---:|" * (len(rows) + 1)]
    for n, (times, others) in enumerate(runs, 1):
        eager = times["eager PyTorch"]
        cells = []
        for name, seen in rows.items():
            if name == "floor":
                ratio = [(times[NO_KERNELS][i] + times[GEMMS][i]) / eager[i] for i in range(2)]
            else:
                ratio = [times[name][i] / eager[i] for i in range(2)]
            seen.append(ratio)
            cells.append(f"{ratio[0]:.2f}x / {ratio[1]:.2f}x")
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {others:.1f} |")
    spans = [f"{min(r[0] for r in seen):.2f}-{max(r[0] for r in seen):.2f}x / "
             f"{min(r[1] for r in seen):.2f}-{max(r[1] for r in seen):.2f}x" for seen in rows.values()]
    lines.append("| range | " + " | ".join(spans) + " | |")
    return lines


class CppAutogradLLTM(torch.nn.Module):
    """The tutorial's module, running lltm_cpu's kernels (or none) through a C++ autograd node."""

    def __init__(self, like: torch.nn.Module, lltm):
        super().__init__()
        self.weights, self.bias, self._lltm = like.weights, like.bias, lltm

    def forward(self, input, state):
        new_h, new_cell = self._lltm(input, self.weights, self.bias, state[0], state[1])
        return new_h, new_cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--runs", type=int, default=1, help="repeat the measurement; the report shows each run's ratios")
    parser.add_argument("--output", help="write the Markdown report here as well as to stdout")
    args = parser.parse_args()

    lltm_core.get_backend("cpu")  # registers the torch.ops.lltm_cpu operators the extension calls
    extension = build_floor_nodes()  # floor_nodes.cpp, shared with core_overhead.py
    if isinstance(extension, str):
        sys.exit(f"autograd_floor.py: {extension}")
    torch.manual_seed(0)
    eager = SeedLLTM(SMALL["input_features"], SMALL["state_size"])
    through_core = lltm_core.LLTM(SMALL["input_features"], SMALL["state_size"], backend="cpu")
    through_core.load_state_dict(eager.state_dict())
    cpp = CppAutogradLLTM(eager, extension.lltm)

    # The C++ node must compute what lltm_core computes, gradients included.
    input = torch.randn(SMALL["batch"], SMALL["input_features"])
    state = (torch.randn(SMALL["batch"], SMALL["state_size"]), torch.randn(SMALL["batch"], SMALL["state_size"]))
    results = []
    for module in (through_core, cpp):
        module.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        new_h, new_cell = module(input, state)
        (new_h.sum() + new_cell.sum()).backward()
        results.append([new_h, new_cell, *(p.grad for p in module.parameters())])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want)

    if args.runs < 1:
        parser.error("--runs must be at least 1")
    steps = {
        "eager PyTorch": make_step(eager, **SMALL, inputs_require_grad=False),
        "lltm cpu (lltm_core.LLTM)": make_step(through_core, **SMALL, inputs_require_grad=False),
        "lltm_cpu kernels in a C++ autograd node": make_step(cpp, **SMALL, inputs_require_grad=False),
        NO_KERNELS: make_step(CppAutogradLLTM(eager, extension.no_kernels), **SMALL, inputs_require_grad=False),
        GEMMS: make_gemm_step(**SMALL, needs_grad_X=False),
    }
    runs = [measure(steps, args.rounds, args.steps, warmup=100) for _ in range(args.runs)]
    times, others = runs[-1]
    size = f"B{SMALL['batch']} I{SMALL['input_features']} S{SMALL['state_size']}"
    lines = [
        "# lltm-cpu without lltm_core: the floor of the tutorial's benchmark",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, Python {platform.python_version()}. "
        f"{size}, only the parameters require grad; medians of interleaved rounds; "
        f"other processes used {others:.1f} CPU-seconds meanwhile.",
        "",
        *([f"The last of {args.runs} runs:", ""] if args.runs > 1 else []),
        *small_size_table(times),
        "",
        f"lltm-cpu's targets: forward <= {TARGETS['forward']}x, backward <= {TARGETS['backward']}x. "
        "The C++ node has none of lltm_core's checks, backend choice or Python frames; "
        "what it still pays is the module call, autograd's graph and engine, and the kernels.",
        "",
        f"A per-step autograd call whose pointwise work cost nothing would take at least "
        f"{NO_KERNELS.split(' (')[0]} + {GEMMS}:",
        "",
        *floor_lines(times),
    ]
    if args.runs > 1:
        lines += ["", f"Ratios to eager in each of the {args.runs} runs (floor: no kernels + GEMMs alone):", "",
                  *runs_table(runs)]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        Path(args.output).write_text(report)


if __name__ == "__main__":
    main()
