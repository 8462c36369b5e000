#!/usr/bin/env python3
"""lltm-cpu's float32 GEMM kernel (csrc/cpu/gemm_f32_avx2.cpp, the route "avx2-fma", or with --kernel
avx512-fma gemm_f32_avx512.cpp) alone: GFLOP/s on one thread, per shape, with A as stored and transposed.

The sequence benchmark shows the kernel only where its first-call measurement picks it over MKL,
which on most CPUs it does for the small recurrent GEMMs and not for the GEMMs over all steps.  This
times the kernel itself: each shape is one thread's share of a T32 B64 I256 S512 sequence's GEMM on
two threads (the weight gradients read A transposed), plus recurrent steps.  Each binary checks its
product against a plain loop before it reports.

With --against, another source tree's kernel (a checkout of an earlier commit, say
`git worktree add /tmp/before HEAD~1`) is compiled too and run alternately with this tree's,
process by process.

    python benchmarks/gemm_kernel.py
    python benchmarks/gemm_kernel.py --against /tmp/before --rounds 5
"""

from __future__ import annotations

import argparse
import datetime
import runpy
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch

from pointwise_pass import HERE, cpu_flags, cpu_name

# route -> (its source, its namespace, the /proc/cpuinfo flags it needs)
KERNELS = {
    "avx2-fma": ("csrc/cpu/gemm_f32_avx2.cpp", "lltm_cpu::gemm_f32", {"avx2", "fma"}),
    "avx512-fma": ("csrc/cpu/gemm_f32_avx512.cpp", "lltm_cpu::gemm_f32::avx512", {"avx512f"}),
}
# (what it is, m, n, k, A transposed): one thread's share, T32 B64 I256 S512 on two threads
SHAPES = [
    ("weight gradient dW_h", 768, 512, 1984, True),
    ("the same, A as stored", 768, 512, 1984, False),
    ("weight gradient dW_x", 768, 256, 2048, True),
    ("input projection", 1024, 1536, 256, False),
    ("input gradient", 1024, 256, 1536, False),
    ("recurrent step forward", 32, 1536, 512, False),
    ("recurrent step backward", 32, 512, 1536, False),
    ("recurrent step, T64 B16 S128", 8, 384, 128, False),
    ("recurrent step backward, T64 B16 S128", 8, 128, 384, False),
]


def build(tree: Path, out: Path, route: str) -> Path:
    """The harness linked with `tree`'s float32 kernel of `route`."""
    source, namespace, _ = KERNELS[route]
    distribution = tree / "backends" / "lltm_cpu" if (tree / "backends").is_dir() else tree
    config = runpy.run_path(str(distribution / "lltm_cpu" / "_build_config.py"))
    if source not in config["ISA_SOURCES"]:
        raise SystemExit(f"gemm_kernel.py: {distribution}'s build leaves the kernel out: "
                         f"{config['KERNELS_LEFT_OUT'].get(route, 'not listed')}")
    common = ["c++", "-std=c++17", "-O3", f"-I{distribution / 'csrc' / 'cpu'}"]
    kernel, binary = out / "kernel.o", out / "gemm_kernel"
    subprocess.run([*common, *config["ISA_SOURCES"][source], "-c", str(distribution / source), "-o", str(kernel)],
                   check=True)
    subprocess.run([*common, f"-DLLTM_GEMM_F32_KERNEL={namespace}", str(HERE / "gemm_kernel.cpp"), str(kernel),
                    "-o", str(binary)], check=True)
    return binary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=20, help="calls of each shape; the fastest is taken")
    parser.add_argument("--rounds", type=int, default=3, help="processes of each build and shape, alternating")
    parser.add_argument("--against", type=Path, help="another source tree (its root or backends/lltm_cpu)")
    parser.add_argument("--kernel", choices=sorted(KERNELS), default="avx2-fma", help="which build (default avx2-fma)")
    args = parser.parse_args()

    if not KERNELS[args.kernel][2] <= cpu_flags():
        raise SystemExit(f"gemm_kernel.py: this CPU lacks {', '.join(sorted(KERNELS[args.kernel][2]))}, "
                         f"which the {args.kernel} kernel needs")
    trees = {"this tree": HERE.parent, **({"against": args.against.resolve()} if args.against else {})}
    gflops: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="lltm-gemm-") as scratch:
        binaries = {}
        for label, tree in trees.items():
            out = Path(scratch) / label.replace(" ", "_")
            out.mkdir()
            binaries[label] = build(tree, out, args.kernel)
        for _ in range(args.rounds):
            for index, (_, m, n, k, trans_a) in enumerate(SHAPES):
                for label, binary in binaries.items():
                    printed = subprocess.run([str(binary), str(m), str(n), str(k), str(int(trans_a)),
                                              str(args.reps)], check=True, capture_output=True, text=True).stdout
                    gflops.setdefault((label, index), []).append(float(printed))

    print(f"# lltm-cpu's float32 GEMM kernel {args.kernel}, GFLOP/s on one thread\n\n{datetime.date.today()}; CPU: {cpu_name()}; "
          f"the fastest of {args.reps} calls, median over {args.rounds} processes per build; torch "
          f"{torch.__version__} (build flags only)\n")
    columns = ["GEMM", "M", "N", "K", "A", "this tree"] + (["against", "this / against"] if args.against else [])
    print("| " + " | ".join(columns) + " |\n| " + " | ".join("---" for _ in columns) + " |")
    for index, (what, m, n, k, trans_a) in enumerate(SHAPES):
        here = statistics.median(gflops["this tree", index])
        row = [what, str(m), str(n), str(k), "transposed" if trans_a else "as stored", f"{here:.1f}"]
        if args.against:
            against = statistics.median(gflops["against", index])
            row += [f"{against:.1f}", f"{here / against:.2f}"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
