"""``python -m lltm_cuda --library``: print the operator library's path, for a C++ program to load.

Prints nothing else, so a build script can take it as it is:
``LLTM_CUDA_LIBRARY=$(python -m lltm_cuda --library)``.

``python -m lltm_cuda --explain T,B,I,S [--dtype float32] [--device 0]``: which sequence path such
a call takes (persistent over a cluster of how many blocks, the cooperative grid when
LLTM_CUDA_SEQUENCE=grid forces it, or per step) and why.
"""

from __future__ import annotations

import argparse

import torch

from . import library_path, sequence_path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lltm_cuda", description=__doc__.splitlines()[0])
    parser.add_argument("--library", action="store_true", help="print the path of the operator library")
    parser.add_argument("--explain", metavar="T,B,I,S", help="the sequence path a call of these sizes takes, and why")
    parser.add_argument("--dtype", default="float32", choices=("float16", "bfloat16", "float32", "float64"))
    parser.add_argument("--device", type=int, default=0, help="the CUDA device index (default 0)")
    args = parser.parse_args(argv)
    if args.explain:
        sizes = args.explain.split(",")
        if len(sizes) != 4 or not all(v.strip().isdigit() for v in sizes):
            parser.error(f"--explain takes T,B,I,S (non-negative integers), got {args.explain!r}")
        steps, batch, features, state = (int(v) for v in sizes)
        path, cluster, why = sequence_path(getattr(torch, args.dtype), batch, state, args.device)
        print(f"sequence T{steps} B{batch} I{features} S{state} {args.dtype}: {why}")
        return 0
    if not args.library:
        parser.error("nothing to do: pass --library or --explain")
    print(library_path())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
