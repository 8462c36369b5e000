"""Where a sequence call's device time goes: lltm-cuda's kernels and cuDNN nn.LSTM's, from the profiler.

bench_gpu.py says how long a call takes; this says which kernels take it.  For each size and dtype
it profiles a few forward (and forward+backward) calls of ``lltm_core.lltm_sequence`` on lltm-cuda
and of ``torch.nn.LSTM``, and prints per kernel: launches per call, mean and total device time per
call; then the host time per call beside the device time, which tells a host-bound loop (the GPU
waiting for launches) from a slow kernel, and the SM clock just after (a GPU that waits between
short kernels may not boost).  Run from the repository root on a CUDA machine::

    python benchmarks/profile_gpu.py [--sizes small large] [--dtypes float32 bfloat16] [--top 6] [--traces DIR]

--traces DIR also writes each profile as a Chrome trace (open it in Perfetto), one file per size,
dtype and candidate.  At the large size, where W_h does not fit a cluster and the default is per
step, lltm-cuda's grid path (LLTM_CUDA_SEQUENCE=grid) is profiled too: one kernel a call for its time
loop, however long the sequence.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

import lltm_core
from gpu_measure import on_path
from lltm_core.testing import make_sequence_inputs

SIZES = {"small": (64, 16, 32, 128), "large": (64, 256, 1024, 1024)}  # (T, B, I, S), bench_gpu.py's


def kernel_table(fn, calls: int, top: int, trace: Path | None = None) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    # CPU activity too: with CUDA alone some torch versions drop kernel events.
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    kernels = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            count, total = kernels.get(event.name, (0, 0.0))
            kernels[event.name] = (count + 1, total + event.device_time)
    if not kernels:  # a torch whose events name no kernels: the averages' own device time instead
        kernels = {e.key: (e.count, e.self_device_time_total) for e in prof.key_averages() if e.self_device_time_total}
    device_us = sum(total for _, total in kernels.values()) / calls
    rows = sorted(kernels.items(), key=lambda item: -item[1][1])[:top]
    lines = [f"  device time per call, all kernels: {device_us:.1f} us"]
    for name, (count, total) in rows:
        lines.append(f"  {count / calls:6.1f} x {total / count:8.2f} us = {total / calls:9.1f} us  {name[:110]}")
    return lines


def sm_clock() -> str:
    """The SM clock now, against its maximum (nvidia-smi): a GPU kept waiting by the host may not boost."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "SM clock: nvidia-smi not available"
    return "SM clock now, max: " + done.stdout.strip() if done.returncode == 0 else "SM clock: not read"


def host_and_device_ms(fn, calls: int = 10) -> tuple[float, float]:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    host = (time.perf_counter() - host) * 1e3 / calls  # launch time: the host returns before the GPU ends
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--top", type=int, default=6)
    parser.add_argument("--traces", type=Path, help="write each profile's Chrome trace into this folder")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("profile_gpu.py: no CUDA device: nothing to profile")
        return 0
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"TF32: cuBLAS {torch.backends.cuda.matmul.allow_tf32}, cuDNN {torch.backends.cudnn.allow_tf32}")
    for size_name in args.sizes:
        T, B, I, S = SIZES[size_name]
        for dtype in (getattr(torch, d) for d in args.dtypes):
            x, w, b, h0, c0 = make_sequence_inputs(T, B, I, S, dtype=dtype, device="cuda", requires_grad=False)
            x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
            lstm = torch.nn.LSTM(I, S, device="cuda", dtype=dtype)
            grad_out = torch.randn(T, B, S, device="cuda", dtype=dtype)
            candidates = {
                "lltm-cuda forward": lambda: lltm_core.lltm_sequence(x, w, b, h0, c0, backend="cuda"),
                "lltm-cuda fwd+bwd": lambda: torch.autograd.backward(
                    lltm_core.lltm_sequence(x, w, b, h0, c0, backend="cuda")[0], grad_out),
                **({"lltm-cuda grid forward": on_path("grid", lambda: lltm_core.lltm_sequence(
                        x, w, b, h0, c0, backend="cuda")),
                    "lltm-cuda grid fwd+bwd": on_path("grid", lambda: torch.autograd.backward(
                        lltm_core.lltm_sequence(x, w, b, h0, c0, backend="cuda")[0], grad_out)),
                    } if size_name == "large" else {}),
                "nn.LSTM forward": lambda: lstm(x, (h0[None], c0[None])),
                "nn.LSTM fwd+bwd": lambda: torch.autograd.backward(lstm(x, (h0[None], c0[None]))[0], grad_out),
            }
            for name, fn in candidates.items():
                host, device = host_and_device_ms(fn)
                print(f"\nT{T} B{B} I{I} S{S} {str(dtype)[6:]} {name}: host {host:.3f} ms to launch a call, "
                      f"{device:.3f} ms device time per call (events)")
                trace = None
                if args.traces is not None:
                    args.traces.mkdir(parents=True, exist_ok=True)
                    trace = args.traces / (re.sub(r"[^A-Za-z0-9]+", "_", f"T{T}_B{B}_I{I}_S{S}_{dtype}_{name}") + ".json")
                print("\n".join(kernel_table(fn, args.calls, args.top, trace)), flush=True)
                print(f"  {sm_clock()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
