"""lltm-cuda's sequence paths against cuDNN's nn.LSTM, in one process, as ratios.

For each case it times a forward (no grad) and a forward+backward, as device time per call
(gpu_measure.device_ms: CUDA events around back-to-back calls, every candidate in each of
interleaved rounds), of
  - lltm-cuda's cluster-persistent path (LLTM_CUDA_SEQUENCE=persistent: W_h on chip across a
    thread-block cluster; "n/a" with the reason where it cannot run, e.g. W_h does not fit),
  - its grid-persistent path (LLTM_CUDA_SEQUENCE=grid: one cooperative launch, one block a
    multiprocessor, one grid barrier a step),
  - its per-step path (LLTM_CUDA_SEQUENCE=per-step: a GEMM and a pointwise kernel a step),
  - torch.nn.LSTM on cuDNN (four gates to LLTM's three),
with every .grad set to None before each forward+backward on both sides, and prints each time and
its ratio to nn.LSTM's (below 1: lltm-cuda is faster).  It also gives the grid path's largest error
against lltm-ref in float64, beside lltm-ref's own in the same dtype (gpu_measure.sequence_agreement).

The cases, most telling first: T64 B16 I32 S128 in float32 with cuDNN's TF32 off (IEEE against
IEEE: lltm-cuda's float32 is IEEE), T64 B256 I1024 S1024 in bfloat16 and in float32 (where W_h does
not fit a cluster: per step, grid or cuDNN; the grid path is the default nowhere until these rows
show it faster than per step), then T64 B16 I32 S128 in bfloat16 and in float32 with TF32 on.  Run
from the repository root on a CUDA machine with lltm-cuda installed::

    python benchmarks/persistent_vs_cudnn.py [--rounds 10] [--markdown FILE]

Without a GPU it says so and exits 0 (gpu_check.sh's dry run).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

PATHS = ("persistent", "grid", "per-step")
DEVICE, BACKEND = "cuda", "cuda"  # lltm-cuda on the GPU (a dry run of the script's logic may change them)
CASES = [  # (T, B, I, S, dtype, cuDNN TF32)
    (64, 16, 32, 128, torch.float32, False),
    (64, 256, 1024, 1024, torch.bfloat16, False),
    (64, 256, 1024, 1024, torch.float32, False),
    (64, 16, 32, 128, torch.bfloat16, False),
    (64, 16, 32, 128, torch.float32, True),
]


def path_refusal(path: str, dtype, batch: int, state: int) -> str | None:
    """Why lltm-cuda cannot run this path at these sizes (its own words), or None."""
    import lltm_cuda

    from gpu_measure import on_path

    try:
        on_path(path, lambda: lltm_cuda.sequence_path(dtype, batch, state))()
    except RuntimeError as error:
        return str(error).splitlines()[0].partition(", but ")[2][:160]  # the reason, not the preamble
    return None


def case_rows(case, rounds: int) -> list[str]:
    """The table's rows for one case: each pass's times and ratios, the grid path's error, the default."""
    import lltm_core
    import lltm_cuda
    from gpu_measure import device_ms, on_path, sequence_agreement, sequence_inputs

    T, B, I, S, dtype, tf32 = case
    torch.backends.cudnn.allow_tf32 = tf32
    name = f"T{T} B{B} I{I} S{S} {str(dtype)[6:]}" + (f" (cuDNN TF32 {'on' if tf32 else 'off'})"
                                                      if dtype == torch.float32 else "")
    x, w, b, h0, c0 = sequence_inputs((T, B, I, S), dtype)
    lstm = torch.nn.LSTM(I, S, device=DEVICE, dtype=dtype)
    grad = torch.randn(T, B, S, device=DEVICE, dtype=dtype)
    params = [x, w, b, *lstm.parameters()]
    forwards = {"lstm": lambda: lstm(x, (h0[None], c0[None]))[0]}
    refused = {path: path_refusal(path, dtype, B, S) for path in PATHS}
    for path in PATHS:
        if refused[path] is None:
            forwards[path] = on_path(path, lambda: lltm_core.lltm_sequence(x, w, b, h0, c0, backend=BACKEND)[0])

    def training(forward):
        def run():
            for p in params:
                p.grad = None
            forward().backward(grad)
        return run

    rows = []
    for label, make in (("forward", torch.no_grad()), ("fwd+bwd", training)):
        times = device_ms({path: make(fn) for path, fn in forwards.items()}, rounds=rounds, calls=5 if B >= 256 else 10)
        cells = [f"{times[p]:.3f}" if p in times else f"n/a: {refused[p]}" for p in PATHS]
        ratios = [f"{times[p] / times['lstm']:.2f}" if p in times else "n/a" for p in PATHS]
        rows.append(f"| {name} | {label} | {' | '.join(cells)} | {times['lstm']:.3f} | {' | '.join(ratios)} |")
    if refused["grid"] is None:
        error, ref_error = on_path("grid", lambda: sequence_agreement((T, B, I, S), dtype, BACKEND))()
        rows.append(f"| {name} | grid's error | {error:.1e} against lltm-ref in float64 (lltm-ref's own in "
                    f"{str(dtype)[6:]}: {ref_error:.1e}) | | | | | | |")
    rows.append(f"| {name} | default path | {lltm_cuda.sequence_path(dtype, B, S)[2]} | | | | | | |")
    return rows


def main(argv=None) -> int:
    options = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    options.add_argument("--rounds", type=int, default=10, help="interleaved rounds a pass (gpu_measure.device_ms)")
    options.add_argument("--markdown", help="also write the table to this file")
    args = options.parse_args(argv)
    if not torch.cuda.is_available():
        print("persistent_vs_cudnn.py: no CUDA device: nothing to time")
        return 0
    rows = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
            f"cuBLAS TF32 {torch.backends.cuda.matmul.allow_tf32}; device ms a call, median of {args.rounds} "
            f"interleaved rounds",
            "",
            "| case | pass | lltm persistent ms | lltm grid ms | lltm per-step ms | nn.LSTM ms | persistent / LSTM "
            "| grid / LSTM | per-step / LSTM |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    print("\n".join(rows), flush=True)
    try:
        for case in CASES:
            found = case_rows(case, args.rounds)
            print("\n".join(found), flush=True)
            rows += found
            if args.markdown:  # after each case: a run cut short still leaves its rows
                Path(args.markdown).write_text("\n".join(rows) + "\n")
    finally:
        torch.backends.cudnn.allow_tf32 = True
    return 0


if __name__ == "__main__":
    sys.exit(main())
