#!/usr/bin/env python3
"""A training loop over sequences of many lengths: what lltm-cpu's first-call tuning costs it.

lltm-cpu times its GEMM routes at the first call of a shape.  The GEMMs over all steps (the input
projection, the input and weight gradients) have a size of T*B, so a loop whose batches differ in
length meets new shapes for as long as it meets new lengths.  This runs two passes over the same
lengths, shuffled, each length a forward and backward of output.sum() of one layer:

* LLTMLayer(I, S, backend="cpu") and torch.nn.LSTM(I, S) (oneDNN: no tuning of its own),
  alternating length by length in one process;
* per pass: the mean time of a call, and its ratio LLTMLayer / nn.LSTM (the pass totals).

The first pass meets every length for the first time; the second has all of them tuned.  Also
printed: how many choices lltm-cpu has made (lltm_cpu.gemm_routes()).  Sets no tuning variable.

    python benchmarks/varying_lengths.py                       # T20..59 at B16 I32 S128
    python benchmarks/varying_lengths.py --size 64,256,512     # B64 I256 S512
"""

from __future__ import annotations

import argparse
import datetime
import platform
import random
import time

import torch

import lltm_core
import lltm_cpu


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="16,32,128", help="B,I,S (default 16,32,128)")
    parser.add_argument("--lengths", default="20-59", help="first-last sequence length T (default 20-59)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    batch, features, state = (int(v) for v in args.size.split(","))
    first, last = (int(v) for v in args.lengths.split("-"))
    torch.set_num_threads(args.threads)
    if "cpu" not in lltm_core.available_backends():
        parser.error("lltm-cpu is not available here: lltm info says why")

    torch.manual_seed(0)
    candidates = {"LLTMLayer (cpu)": lltm_core.LLTMLayer(features, state, backend="cpu"),
                  "nn.LSTM": torch.nn.LSTM(features, state)}
    warm = torch.randn(3, batch, features)
    for module in candidates.values():  # the fixed costs of a first call: loading, the recurrent GEMMs' tuning
        module(warm)[0].sum().backward()
    lengths = list(range(first, last + 1))
    random.Random(0).shuffle(lengths)
    inputs = {T: torch.randn(T, batch, features, requires_grad=True) for T in lengths}

    print(f"{datetime.date.today().isoformat()}; CPU: {lltm_cpu.cpu_info()}; {args.threads} threads; "
          f"torch {torch.__version__}, Python {platform.python_version()}")
    print(f"Command: `python benchmarks/varying_lengths.py --size {args.size} --lengths {args.lengths} "
          f"--threads {args.threads}`")
    print()
    print("| pass | LLTMLayer (cpu) ms / call | nn.LSTM ms / call | LLTMLayer / nn.LSTM | lltm-cpu choices so far |")
    print("| --- | --- | --- | --- | --- |")
    for name in ("first (every length new)", "second"):
        total = dict.fromkeys(candidates, 0.0)
        for T in lengths:
            for label, module in candidates.items():
                x = inputs[T]
                start = time.perf_counter()
                module(x)[0].sum().backward()
                total[label] += time.perf_counter() - start
        per_call = {label: 1e3 * seconds / len(lengths) for label, seconds in total.items()}
        print(f"| {name} | {per_call['LLTMLayer (cpu)']:.2f} | {per_call['nn.LSTM']:.2f} | "
              f"{total['LLTMLayer (cpu)'] / total['nn.LSTM']:.2f} | {len(lltm_cpu.gemm_routes())} |")


if __name__ == "__main__":
    main()
