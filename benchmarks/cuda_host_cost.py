"""What lltm-cuda's host code costs a call: its four operators at a size where the kernels cost nothing.

The operators' C++ (checks, the tensors it makes and views, the GEMM calls through the C shim, the
launches) is the same in the real build and the emulated one (LLTM_CUDA_EMULATE=1: the kernels
compiled for the CPU), so the emulated build measures it on any machine.  Run in a venv with
lltm-cuda-emulated (or lltm-cuda, on a GPU) installed::

    python benchmarks/cuda_host_cost.py [--steps 3 33]

Each figure is the median over 9 rounds of a few thousand back-to-back calls, in microseconds;
on a GPU each round ends with a synchronise, so it is the longer of host and device time.  Two
step counts give the sequence operators' cost per step (the slope) apart from their fixed cost.
To compare two builds, run them in alternate processes: both cannot be loaded in one.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lltm_core import available_backends, get_backend
from lltm_core.benchmarking import cpu_model

B, I, S = 2, 3, 4


def per_call_us(f, sync, calls: int = 3000, rounds: int = 9) -> float:
    for _ in range(calls // 10):
        f()
    sync()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            f()
        sync()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[3, 33], help="sequence lengths T")
    args = parser.parse_args()
    name = "cuda" if "cuda" in available_backends() else "cuda_emulated"
    backend = get_backend(name)  # raises, saying why, when neither is installed and usable
    device = "cuda" if name == "cuda" else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(device)

    ops = torch.ops.lltm_cuda
    w, b, h, c = rand(3 * S, S + I), rand(3 * S), rand(B, S), rand(B, S)
    x = rand(B, I)
    saved = ops.forward.default(x, w, b, h, c)
    grad_h, grad_c = rand(B, S), rand(B, S).sum(0).expand(B, S)  # as autograd hands a sum's gradient
    rows = [("cell forward", per_call_us(lambda: ops.forward.default(x, w, b, h, c), sync)),
            ("cell backward", per_call_us(lambda: ops.backward.default(grad_h, grad_c, w, *saved[2:], True), sync))]
    sequence = {}
    for T in args.steps:
        xs = rand(T, B, I)
        out = ops.sequence_forward.default(xs, w, b, h, c, None, False, True)
        grad_out = rand(T, B, S)
        sequence[T] = (
            per_call_us(lambda: ops.sequence_forward.default(xs, w, b, h, c, None, False, True), sync),
            per_call_us(lambda: ops.sequence_backward.default(grad_out, grad_h, grad_h, w, xs, h, out[0], None,
                                                              out[3], out[4], False, True), sync))
        rows += [(f"sequence forward T{T}", sequence[T][0]), (f"sequence backward T{T}", sequence[T][1])]
    if len(args.steps) >= 2:
        lo, hi = min(args.steps), max(args.steps)
        for i, part in enumerate(("forward", "backward")):
            rows.append((f"sequence {part}, per step (T{lo} to T{hi})", (sequence[hi][i] - sequence[lo][i]) / (hi - lo)))
    where = torch.cuda.get_device_name() if device == "cuda" else cpu_model()
    print(f"backend {backend.name} ({where}); torch {torch.__version__}, 1 thread; B{B} I{I} S{S}, float32")
    print("| operator | us a call |\n| --- | --- |")
    for label, us in rows:
        print(f"| {label} | {us:.2f} |")


if __name__ == "__main__":
    main()
