"""The AOTInductor package of an LLTM model run from C++, against the same model in Python eager.

    python benchmarks/deploy.py [--rounds 7] [--runs 200] [--backend cpu] [--output FILE] [--cmake-arg -DX=Y ...]

The model is LLTMLayer(I, S) on one backend, at T64 B16 I32 S128, under no_grad.  It is exported
with dynamic batch and time and compiled by AOTInductor (examples/deploy/export_model.py), and the
C++ runner (examples/deploy/runner.cpp, built here with cmake) times the package.  Each round times
``--runs`` calls in the runner's process, then ``--runs`` calls of the eager module in this one,
the two in alternating order; it prints each round's medians (us per call) and the median of the
per-round ratios C++ / eager (below 1.00: the package is faster).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import lltm_core
from lltm_core.benchmarking import cpu_model

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "deploy"
T, B, I, S = 64, 16, 32, 128


def _build_runner(build: Path, cmake_args: list[str]) -> Path:
    for command in (["cmake", "-S", str(EXAMPLE), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                     f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", *cmake_args],
                    ["cmake", "--build", str(build)]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            # The first error and what follows it: CMake's messages span lines (a CUDA build of
            # torch, say, has its CMake package look for the CUDA toolkit too).
            lines = (done.stderr + done.stdout).splitlines()
            first = next((i for i, line in enumerate(lines) if "CMake Error" in line or "error:" in line),
                         max(len(lines) - 15, 0))
            raise SystemExit(f"deploy.py: building the C++ runner failed ({' '.join(command)}):\n  "
                             + "\n  ".join(lines[first:first + 15]))
    return build / "lltm_deploy_runner"


def _eager_us(model, x, runs: int) -> float:
    times = []
    with torch.no_grad():
        for _ in range(runs):
            start = time.perf_counter()
            model(x)
            times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def _cpp_us(runner: Path, library: str, package: Path, inputs: Path, runs: int) -> float:
    done = subprocess.run([str(runner), library, str(package), str(inputs), str(inputs.with_name("out.pt")),
                           "--repeat", str(runs)], capture_output=True, text=True, check=True)
    return float(re.search(r"median us per run: ([0-9.]+)", done.stdout).group(1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=200, help="calls timed per side and round")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--output", type=Path, help="also append the table to this file")
    parser.add_argument("--cmake-arg", action="append", default=[], metavar="-DNAME=VALUE",
                        help="passed to cmake's configure step (a CUDA build of torch may need the toolkit's "
                             "location: examples/deploy/README.md)")
    args = parser.parse_args(argv)

    spec = importlib.util.spec_from_file_location("export_model", EXAMPLE / "export_model.py")
    export_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export_model)
    library = lltm_core.get_backend(args.backend).operator_library
    if library is None:
        print(f"backend {args.backend!r} has no operator library: its packages cannot run from C++", file=sys.stderr)
        return 2

    torch.manual_seed(0)
    model = lltm_core.LLTMLayer(I, S, batch_first=True, backend=args.backend).eval()
    x = torch.randn(B, T, I)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        runner = _build_runner(tmp / "build", args.cmake_arg)
        package = export_model.export(_First(model), x, dynamic_time=True, package=tmp / "model.pt2")
        torch.save([x], tmp / "inputs.pt")
        _eager_us(model, x, 20)  # warm-up: the GEMM routes are measured once, at the first call of a shape
        rows = []
        for round_ in range(args.rounds):
            if round_ % 2:
                eager = _eager_us(model, x, args.runs)
                cpp = _cpp_us(runner, library, package, tmp / "inputs.pt", args.runs)
            else:
                cpp = _cpp_us(runner, library, package, tmp / "inputs.pt", args.runs)
                eager = _eager_us(model, x, args.runs)
            rows.append((cpp, eager, cpp / eager))

    lines = [
        f"## {datetime.date.today()}: {cpu_model()} (ATen's kernels: {torch.backends.cpu.get_cpu_capability()}), "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, backend {args.backend}",
        "",
        f"LLTMLayer({I}, {S}) at T{T} B{B}, no_grad: the AOTInductor package in C++ against Python eager.",
        "",
        "| round | C++ package us | Python eager us | ratio |",
        "| --- | --- | --- | --- |",
        *(f"| {i + 1} | {c:.1f} | {e:.1f} | {r:.3f} |" for i, (c, e, r) in enumerate(rows)),
        "",
        f"median ratio C++ / eager: **{statistics.median(r for _, _, r in rows):.3f}** (target at most 1.00)",
    ]
    print("\n".join(lines))
    if args.output:
        with args.output.open("a") as f:
            f.write("\n" + "\n".join(lines) + "\n")
    return 0


class _First(torch.nn.Module):
    """The layer's output alone: the package returns one tensor."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)[0]


if __name__ == "__main__":
    sys.exit(main())
