"""lltm-triton's persistent sequence kernels against lltm-cuda's per-step path and cuDNN's nn.LSTM.

Run from the repository root on a CUDA GPU with lltm-triton and lltm-cuda installed (gpu_check.sh
does)::

    python benchmarks/bench_triton.py --markdown triton.md

At T64 B16 I32 S128 (the tutorial's size), T256 B32 I128 S256 and T64 B256 I1024 S1024, in
bfloat16, and in float32 twice: with TF32 allowed on both sides (torch.backends.cuda.matmul and
torch.backends.cudnn both True) and with IEEE float32 on both sides (both False).  cuDNN's RNNs use
TF32 whenever torch.backends.cudnn.allow_tf32 is True, its default, so only these two pairings are
fair.  For each: which backend lltm-core chooses and what triton's should_run said (so the limits in
lltm_triton/_policy.py can be revised from the figures), triton's agreement with lltm-ref in
float64, then the forward (inputs requiring grad, so the saved tensors are written) and the
forward+backward, as device time per call (gpu_measure.py's, as bench_gpu.py times: CUDA events
over back-to-back calls, candidates interleaved by lltm_core.benchmarking).  triton is named explicitly, so it runs even where should_run
declines: those rows measure what the decline avoids.  Last, the cell (one step) at B16 I32 S128
against lltm-cuda's, forward+backward.

Without a GPU it prints should_run's verdicts on these shapes (pure arithmetic) and exits 0.
"""

from __future__ import annotations

import argparse
import sys

import torch
from gpu_measure import (AGREEMENT_MULTIPLIER, cudnn_used, device_ms, report, sequence_agreement, sequence_inputs,
                         summarize, verdict)

import lltm_core
from lltm_core import Call
from lltm_core._device import cuda_unavailable_reason
from lltm_core.testing import make_inputs

SIZES = {"tutorial": (64, 16, 32, 128), "mid": (256, 32, 128, 256), "big": (64, 256, 1024, 1024)}
MODES = [("bfloat16", torch.bfloat16, True), ("float32 TF32", torch.float32, True),
         ("float32 IEEE", torch.float32, False)]
# (size, mode, measure, baseline) -> the ratio lltm-triton must stay at or under on an H200.
TARGETS = {
    **{("tutorial", mode, measure, "cuDNN nn.LSTM"): 0.75
       for mode in ("bfloat16", "float32 TF32") for measure in ("forward", "forward+backward")},
    **{("tutorial", mode, measure, "lltm-cuda"): 0.30
       for mode in ("bfloat16", "float32 TF32") for measure in ("forward", "forward+backward")},
}
# Agreement with lltm-ref in float64: the kit's tolerances, and TF32's own for float32 with TF32.
TF32_TOLERANCE = 1e-2


def set_tf32(allowed: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = allowed
    torch.backends.cudnn.allow_tf32 = allowed


def should_run_table() -> list[str]:
    from lltm_triton import _policy

    lines = ["| size | dtype | W_h on chip | triton's should_run |", "| --- | --- | --- | --- |"]
    for T, B, I, S in SIZES.values():
        for dtype in (torch.bfloat16, torch.float32):
            verdict = _policy.should_run(Call("sequence", "cuda", dtype, B, I, S, T, True))
            lines.append(f"| T{T} B{B} I{I} S{S} | {str(dtype)[6:]} | {_policy.w_h_bytes(S, dtype) // 1024} KB | "
                         f"{'yes' if verdict is True else verdict} |")
    return lines


def choice(size, dtype) -> str:
    T, B, I, S = size
    trace = lltm_core.explain(Call("sequence", "cuda", dtype, B, I, S, T, True))
    chosen = next((e.name for e in trace if e.verdict == "chosen"), "none")
    triton = next((f"{e.verdict}: {e.reason}" if e.reason else e.verdict for e in trace if e.name == "triton"),
                  "not installed")
    return f"lltm-core chooses {chosen}; triton {triton}"


def run(args) -> list[str]:
    from lltm_core.testing import tolerance

    lltm_core.get_backend("triton", device="cuda", dtype=torch.float32)  # raises with the reason
    have_cuda = "cuda" in lltm_core.available_backends()
    lines = [f"cuDNN {torch.backends.cudnn.version()}; lltm-cuda {'installed' if have_cuda else 'NOT available'}. "
             f"Device time per call (CUDA events over {args.calls} back-to-back calls, median of {args.rounds} "
             f"rounds, candidates interleaved). nn.LSTM has 4 gates of S to the LLTM's 3.", ""]
    table = ["| size | mode | measure | lltm-triton | baseline | ratio | target | result |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    notes = []
    for mode, dtype, tf32 in MODES:
        set_tf32(tf32)
        for size_name, size in SIZES.items():
            T, B, I, S = size
            where = f"T{T} B{B} I{I} S{S}"
            notes.append(f"- {where} {mode}: {choice(size, dtype)}")
            error, ref_error = sequence_agreement(size, dtype, "triton")
            # As bench_gpu.py judges lltm-cuda: at most twice lltm-ref's own error in the dtype, where larger.
            bound = max(TF32_TOLERANCE if mode == "float32 TF32" else tolerance(dtype), AGREEMENT_MULTIPLIER * ref_error)
            print(f"{where} {mode}: largest relative error against lltm-ref in float64: lltm-triton {error:.2e}, "
                  f"lltm-ref in {str(dtype)[6:]} {ref_error:.2e}", flush=True)
            if not error <= bound:
                table.append(f"| {where} | {mode} | agreement with lltm-ref | {error:.2e} | {ref_error:.2e} "
                             f"(lltm-ref in {str(dtype)[6:]}) | | <= {bound:.2g} | FAIL |")
            x, weights, bias, h0, c0 = sequence_inputs(size, dtype)
            lstm = torch.nn.LSTM(I, S, device="cuda", dtype=dtype)
            grad_out = torch.randn(T, B, S, device="cuda", dtype=dtype)
            cudnn = "cuDNN nn.LSTM" if cudnn_used(lstm, x, (h0[None], c0[None])) else "nn.LSTM, NOT cuDNN"

            def lltm(name):
                return lambda: lltm_core.lltm_sequence(x, weights, bias, h0, c0, backend=name)[0]

            def lstm_forward():
                return lstm(x, (h0[None], c0[None]))[0]

            def step(forward):
                return lambda: torch.autograd.backward(forward(), grad_out)

            candidates = {"lltm-triton": lltm("triton"), cudnn: lstm_forward}
            if have_cuda:
                candidates["lltm-cuda"] = lltm("cuda")
            for measure, wrap in (("forward", lambda f: f), ("forward+backward", step)):
                times = device_ms({n: wrap(f) for n, f in candidates.items()}, args.rounds, args.calls)
                ours = times.pop("lltm-triton")
                for base_name, base in times.items():
                    target = TARGETS.get((size_name, mode, measure, base_name.replace(", NOT cuDNN", "")))
                    ratio = ours / base
                    table.append(f"| {where} | {mode} | {measure} | {ours:.3f} ms | {base:.3f} ms ({base_name}) | "
                                 f"{ratio:.3f} | {f'<= {target}' if target else '-'} | "
                                 f"{verdict(ratio, target) if target else '-'} |")
            print(table[-1], flush=True)
    choices = ["", "Choices (lltm_core.explain, with a backward):", ""] + notes
    return lines + table + choices + cell_rows(args, have_cuda)


def cell_rows(args, have_cuda) -> list[str]:
    """One step at B16 I32 S128, forward+backward: lltm-triton's one launch each way, from Triton's Python
    launcher, against lltm-cuda's C++ operators (GEMM on cuBLAS): whether _policy's CELL_MACS default holds."""
    if not have_cuda:
        return ["", "The cell: not compared (lltm-cuda not available)."]
    lines = ["", "The cell at B16 I32 S128, forward+backward (device time per call, launch gaps included):", "",
             "| dtype | lltm-triton | lltm-cuda | ratio |", "| --- | --- | --- | --- |"]
    set_tf32(True)
    for dtype in (torch.bfloat16, torch.float32):
        x, weights, bias, h, c = make_inputs(16, 32, 128, dtype=dtype, device="cuda")  # all requiring grad

        def step(name):
            def run():
                new_h, new_c = lltm_core.lltm(x, weights, bias, h, c, backend=name)
                (new_h.sum() + new_c.sum()).backward()
            return run

        times = device_ms({"triton": step("triton"), "cuda": step("cuda")}, args.rounds, args.calls * 4)
        lines.append(f"| {str(dtype)[6:]} | {times['triton']:.3f} ms | {times['cuda']:.3f} ms | "
                     f"{times['triton'] / times['cuda']:.3f} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", metavar="PATH", help="also write the report to this Markdown file")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per candidate")
    parser.add_argument("--calls", type=int, default=5, help="back-to-back calls per round")
    args = parser.parse_args(argv)
    lines = ["should_run's verdicts (lltm_triton/_policy.py; arithmetic only, the same on any machine):", ""]
    lines += should_run_table() + [""]
    why = cuda_unavailable_reason()
    failed = 0
    if why is not None:
        lines.append(f"bench_triton.py: nothing measured: {why}. Run it on a CUDA GPU.")
    else:
        tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        try:
            lines += run(args)
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
        failed = summarize(lines, "bench_triton.py", "the table")
    return report(lines, args.markdown, failed)


if __name__ == "__main__":
    sys.exit(main())
