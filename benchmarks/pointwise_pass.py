#!/usr/bin/env python3
"""lltm-cpu's fused pointwise passes alone: nanoseconds per element, per instruction set.

Compiles pointwise_pass.cpp with each of lltm-cpu's pointwise builds that this CPU runs
(pointwise_avx2.cpp, pointwise_avx512.cpp), with the flags lltm_cpu/_build_config.py gives them,
and times every pass on one thread over ROWS x STATE_SIZE elements (default 32 x 512: one thread's
block of a T32 B64 S512 sequence step): the sequence step forward (inference, and saving for
backward), the sequence step backward, and the cell's forward and backward (float32).

With --against, the same passes of another source tree (a checkout of an earlier commit, say
`git worktree add /tmp/before HEAD~1`) are compiled too and run alternately with this tree's,
process by process, and the report gives each pass's time in both and their ratio.

    python benchmarks/pointwise_pass.py
    python benchmarks/pointwise_pass.py --against /tmp/before --rounds 5
"""

from __future__ import annotations

import argparse
import datetime
import platform
import runpy
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch
import torch.utils.cpp_extension

HERE = Path(__file__).resolve().parent
# ISA namespace -> (its pointwise source, the /proc/cpuinfo flags it needs)
BUILDS = {
    "AVX2": ("csrc/cpu/pointwise_avx2.cpp", {"avx2", "fma", "f16c"}),
    "AVX512": ("csrc/cpu/pointwise_avx512.cpp", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
}


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def build(tree: Path, isa: str, out: Path) -> Path:
    """The harness linked with `tree`'s pointwise build for `isa`."""
    distribution = tree / "backends" / "lltm_cpu" if (tree / "backends").is_dir() else tree
    config = runpy.run_path(str(distribution / "lltm_cpu" / "_build_config.py"))
    source, _ = BUILDS[isa]
    includes = [f"-I{path}" for path in [*torch.utils.cpp_extension.include_paths(), distribution / "csrc" / "cpu"]]
    common = ["c++", "-std=c++17", *config["COMPILE_FLAGS"], *includes]
    passes, harness, binary = out / f"{isa}_passes.o", out / f"{isa}_harness.o", out / f"pointwise_{isa}"
    subprocess.run([*common, *config["ISA_SOURCES"][source], "-c", str(distribution / source), "-o", str(passes)],
                   check=True)
    subprocess.run([*common, f"-DISA={isa}", "-c", str(HERE / "pointwise_pass.cpp"), "-o", str(harness)], check=True)
    subprocess.run(["c++", str(harness), str(passes), "-o", str(binary)], check=True)
    return binary


def run(binary: Path, rows: int, state_size: int, reps: int) -> dict[tuple[str, str], float]:
    printed = subprocess.run([str(binary), str(rows), str(state_size), str(reps)], check=True, capture_output=True,
                             text=True).stdout
    return {(name, dtype): float(ns) for name, dtype, ns in (line.split() for line in printed.splitlines())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--state-size", type=int, default=512)
    parser.add_argument("--reps", type=int, default=200, help="calls of each pass; the fastest is taken")
    parser.add_argument("--rounds", type=int, default=3, help="processes of each build, alternating")
    parser.add_argument("--against", type=Path, help="another source tree (its root or backends/lltm_cpu)")
    args = parser.parse_args()

    flags = cpu_flags()
    isas = [isa for isa, (_, needs) in BUILDS.items() if needs <= flags]
    if not isas:
        raise SystemExit("pointwise_pass.py: this CPU runs none of lltm-cpu's vectorised pointwise builds "
                         f"({', '.join(BUILDS)}); its portable build is not timed here")
    trees = {"this tree": HERE.parent, **({"against": args.against.resolve()} if args.against else {})}
    times: dict[tuple[str, str], dict] = {}
    with tempfile.TemporaryDirectory(prefix="lltm-pointwise-") as scratch:
        binaries = {}
        for label, tree in trees.items():
            for isa in isas:
                out = Path(scratch) / label.replace(" ", "_")
                out.mkdir(exist_ok=True)
                binaries[label, isa] = build(tree, isa, out)
        for _ in range(args.rounds):
            for (label, isa), binary in binaries.items():
                for key, ns in run(binary, args.rows, args.state_size, args.reps).items():
                    times.setdefault((label, isa), {}).setdefault(key, []).append(ns)

    print(f"# lltm-cpu pointwise passes, ns per element\n\n{datetime.date.today()}; CPU: {cpu_name()}; one thread; "
          f"torch {torch.__version__} (headers only); rows {args.rows}, state size {args.state_size}; the fastest of "
          f"{args.reps} calls, median over {args.rounds} processes per build\n")
    columns = ["pass", "dtype", "ISA", "this tree"] + (["against", "this / against"] if args.against else [])
    print("| " + " | ".join(columns) + " |\n| " + " | ".join("---" for _ in columns) + " |")
    for isa in isas:
        for key, values in times["this tree", isa].items():
            row = [*key, isa, f"{statistics.median(values):.3f}"]
            if args.against:
                against = statistics.median(times["against", isa][key])
                row += [f"{against:.3f}", f"{statistics.median(values) / against:.2f}"]
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
