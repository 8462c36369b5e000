"""lltm-cuda's two sequence paths against cuDNN's nn.LSTM, in one process, as ratios.

For each case it times, with CUDA events, a forward and a forward+backward of
  - lltm-cuda's persistent path (LLTM_CUDA_SEQUENCE=persistent; "n/a" with the reason where it
    cannot run, e.g. W_h does not fit on chip),
  - lltm-cuda's per-step path (LLTM_CUDA_SEQUENCE=per-step),
  - torch.nn.LSTM on cuDNN (four gates to LLTM's three),
with every .grad set to None between iterations on both sides, and prints each time and its
ratio to nn.LSTM's (below 1: lltm-cuda is faster).  The cases are the targets of issue 49:
T64 B16 I32 S128 in float32 with cuDNN's TF32 off (IEEE against IEEE: lltm-cuda's float32 is
IEEE) and on, and in bfloat16; T64 B256 I1024 S1024 in bfloat16.  Run from the repository root on a
CUDA machine with lltm-cuda installed::

    python benchmarks/persistent_vs_cudnn.py [--repeats 20] [--markdown FILE]

Without a GPU it says so and exits 0 (gpu_check.sh's dry run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

CASES = [  # (T, B, I, S, dtype, cuDNN TF32)
    (64, 16, 32, 128, torch.float32, False),
    (64, 16, 32, 128, torch.float32, True),
    (64, 16, 32, 128, torch.bfloat16, False),
    (64, 256, 1024, 1024, torch.bfloat16, False),
]


def time_ms(fn, repeats: int) -> float:
    """Median over `repeats` calls, each timed with CUDA events, after three warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("persistent_vs_cudnn.py: no CUDA device: nothing to time")
        return 0
    import lltm_core
    import lltm_cuda
    from lltm_core.testing import make_sequence_inputs

    rows = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
            f"cuBLAS TF32 {torch.backends.cuda.matmul.allow_tf32}; median of {args.repeats} calls, CUDA events",
            "",
            "| case | pass | lltm persistent ms | lltm per-step ms | nn.LSTM ms | persistent / LSTM | per-step / LSTM |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    print("\n".join(rows), flush=True)
    for T, B, I, S, dtype, tf32 in CASES:
        torch.backends.cudnn.allow_tf32 = tf32
        x, w, b, h0, c0 = make_sequence_inputs(T, B, I, S, dtype=dtype, device="cuda")
        lstm = torch.nn.LSTM(I, S, device="cuda", dtype=dtype)
        grad = torch.randn(T, B, S, device="cuda", dtype=dtype)
        params = [x, w, b, h0, c0, *lstm.parameters()]

        def zero_grads():
            for p in params:
                p.grad = None

        def lltm_fwd():
            return lltm_core.lltm_sequence(x, w, b, h0, c0, backend="cuda")[0]

        def lstm_fwd():
            return lstm(x, (h0[None], c0[None]))[0]

        def both(forward):
            def run():
                zero_grads()
                forward().backward(grad)
            return run

        def inference(forward):
            def run():
                with torch.no_grad():
                    forward()
            return run

        name = f"T{T} B{B} I{I} S{S} {str(dtype)[6:]}" + (f" (cuDNN TF32 {'on' if tf32 else 'off'})"
                                                          if dtype == torch.float32 else "")
        for label, wrap in (("forward", inference), ("fwd+bwd", both)):
            times = {}
            for path in ("persistent", "per-step"):
                os.environ["LLTM_CUDA_SEQUENCE"] = path
                try:
                    times[path] = time_ms(wrap(lltm_fwd), args.repeats)
                except RuntimeError as error:
                    times[path] = str(error).splitlines()[0][-90:]
            os.environ.pop("LLTM_CUDA_SEQUENCE")
            times["lstm"] = time_ms(wrap(lstm_fwd), args.repeats)

            def cell(value):
                return f"{value:.3f}" if isinstance(value, float) else f"n/a: {value}"

            def ratio(value):
                return f"{value / times['lstm']:.2f}" if isinstance(value, float) else "n/a"

            row = (f"| {name} | {label} | {cell(times['persistent'])} | {cell(times['per-step'])} | "
                   f"{times['lstm']:.3f} | {ratio(times['persistent'])} | {ratio(times['per-step'])} |")
            rows.append(row)
            print(row, flush=True)
        rows.append(f"| {name} | default path | {lltm_cuda.sequence_path(dtype, B, S)[2]} | | | | |")
        print(rows[-1], flush=True)
    if args.markdown:
        Path(args.markdown).write_text("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
