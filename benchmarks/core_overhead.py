#!/usr/bin/env python3
"""What lltm-core's plumbing costs: lltm_core.LLTM(backend="ref") against the tutorial's eager module.

    python benchmarks/core_overhead.py [--seconds 10] [--size 16,32,128]

lltm-ref runs the same kind of PyTorch operators as the eager module, so the
ratio is the cost of the argument checks, backend selection and the
autograd.Function around the kernels.  Target (issue 2): <= 1.25x for forward
and for backward at B16 I32 S128.  Both are measured alternately in one process
(lltm_core.bench), so machine noise hits them alike.
"""

from __future__ import annotations

import argparse
import platform

import torch

from lltm_core.bench import EAGER, benchmark

TARGET = 1.25


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--size", default="16,32,128")
    args = p.parse_args()
    size = tuple(int(v) for v in args.size.split(","))
    rows = {r.candidate: r for r in benchmark([size], ["cpu"], [torch.float32], ["ref"], seconds=args.seconds, compile_peer=False)}
    eager, ref = rows[EAGER], rows["ref"]
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"B,I,S={size}, {ref.calls} calls each, alternating")
    print("| pass | eager module (us, median) | lltm_core.LLTM, ref (us, median) | ratio | target |")
    print("|---|---|---|---|---|")
    ok = True
    for label, attr in (("forward", "forward_us"), ("backward", "backward_us")):
        e, r = getattr(eager, attr)["median"], getattr(ref, attr)["median"]
        ratio = r / e
        ok &= ratio <= TARGET
        print(f"| {label} | {e:.1f} | {r:.1f} | {ratio:.2f}x | <= {TARGET}x {'met' if ratio <= TARGET else 'MISSED'} |")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
