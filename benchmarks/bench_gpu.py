"""lltm-cuda against eager PyTorch and torch.compile, and its kernels against the GPU's ceilings.

Run from the repository root on a machine with a CUDA GPU and lltm-cuda installed::

    python benchmarks/bench_gpu.py --markdown benchmarks/results/h200.md

Two kinds of measurement, all float32 with torch's default matmul precision
(TF32 off; the report says which was in force):

* The seed's method, at B16 I32 S128 and B4096 I1024 S2048: one forward,
  synchronise, one backward of (new_h.sum() + new_cell.sum()), synchronise,
  each timed on the host.  Every input requires grad (an unrolled sequence).
  The candidates run interleaved, one step each per round, in one process, and
  a candidate's figure is the median over rounds, so drift hits all alike.
* Device time at the big size: the forward against the gate GEMM alone
  (CUDA events), and each fused pointwise kernel's bandwidth (counted bytes
  over its kernel time from the profiler) against a device-to-device copy.

Without a GPU it says so and exits 0: there is nothing to measure.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch

import lltm_core
from lltm_core._device import cuda_unavailable_reason
from lltm_core.testing import SeedLLTM  # the tutorial's pure-PyTorch module

SMALL = (16, 32, 128)  # (batch, input_features, state_size): the seed's size
BIG = (4096, 1024, 2048)
# candidate / baseline, "at most" or "at least" (bandwidths)
TARGETS = {
    "small forward": 0.25,
    "small backward": 0.30,
    "big forward vs GEMM": 1.05,
    "pointwise bandwidth": 0.80,
}
# Bytes each kernel must move per (batch, state) element, in units of the element size.
FORWARD_KERNEL_ELEMENTS = 7  # reads gates (3), old_cell; writes new_h, new_cell, tanh_cell
BACKWARD_KERNEL_ELEMENTS = 10  # reads gates (3), tanh_cell, grad_h, grad_cell; writes d_gates (3), grad_old_cell


def make_state(size, requires_grad=True):
    """Random (input, old_h, old_cell) on the GPU."""
    B, I, S = size
    return [torch.randn(B, n, device="cuda", requires_grad=requires_grad) for n in (I, S, S)]


def make_weights(size):
    """Random (weights, bias) on the GPU, scaled so the gates are not saturated."""
    B, I, S = size
    return torch.randn(3 * S, S + I, device="cuda") / math.sqrt(S + I), torch.randn(3 * S, device="cuda")


def max_rel_error(got, want) -> float:
    # NaN counts as infinitely wrong (max() and comparisons would otherwise pass it over).
    return ((got - want).abs().nan_to_num(nan=math.inf).max() / want.abs().max().clamp_min(1)).item()


def check_agreement(model, seed, size) -> float:
    """Largest relative difference from the seed module in outputs and weight gradients."""
    x, h, c = make_state(size)
    errors = []
    outputs = [m(x, (h, c)) for m in (model, seed)]
    upstream = [torch.randn_like(t) for t in outputs[0]]
    grads = [torch.autograd.grad(out, (m.weights,) + (x, h, c), upstream) for out, m in zip(outputs, (model, seed))]
    for got, want in zip([*outputs[0], *grads[0]], [*outputs[1], *grads[1]]):
        errors.append(max_rel_error(got, want))
    return max(errors)


def seed_method(candidates: dict, size, rounds: int, warmup: int) -> dict:
    """{name: (forward us, backward us)}: medians of the seed's per-call timing, candidates interleaved."""
    x, h, c = make_state(size)
    samples = {name: ([], []) for name in candidates}
    for round_index in range(warmup + rounds):
        for name, model in candidates.items():
            model.zero_grad(set_to_none=True)
            x.grad = h.grad = c.grad = None
            start = time.perf_counter()
            new_h, new_cell = model(x, (h, c))
            torch.cuda.synchronize()
            middle = time.perf_counter()
            (new_h.sum() + new_cell.sum()).backward()
            torch.cuda.synchronize()
            end = time.perf_counter()
            if round_index >= warmup:
                samples[name][0].append(middle - start)
                samples[name][1].append(end - middle)
    return {name: (statistics.median(f) * 1e6, statistics.median(b) * 1e6) for name, (f, b) in samples.items()}


def device_ms(fn, calls: int) -> float:
    """Milliseconds of device time per call of fn, over `calls` back-to-back calls (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def interleaved_device_ms(fns: dict, rounds: int = 10, calls: int = 10) -> dict:
    for fn in fns.values():  # warm-up: cuBLAS heuristics, allocator
        device_ms(fn, 2)
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(device_ms(fn, calls))
    return {name: statistics.median(s) for name, s in samples.items()}


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy, counting bytes read and written."""
    src = torch.randn(2**28, device="cuda")
    dst = torch.empty_like(src)
    ms = interleaved_device_ms({"copy": lambda: dst.copy_(src)})["copy"]
    return 2 * src.nbytes / (ms / 1e3)


def pointwise_kernel_us(size, calls: int = 20) -> dict:
    """{"forward"|"backward": mean kernel time in us} of lltm-cuda's fused kernels, from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    x, h, c = make_state(size, requires_grad=False)
    weights, bias = make_weights(size)
    grad_h, grad_cell = torch.randn_like(h), torch.randn_like(c)
    forward, backward = torch.ops.lltm_cuda.forward, torch.ops.lltm_cuda.backward
    for _ in range(3):
        backward(grad_h, grad_cell, weights, *forward(x, weights, bias, h, c)[2:], True)
    torch.cuda.synchronize()
    # CPU activity too: with CUDA alone some torch versions drop kernel events.
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            backward(grad_h, grad_cell, weights, *forward(x, weights, bias, h, c)[2:], True)
        torch.cuda.synchronize()
    times = {}
    for event in prof.key_averages():
        for direction in ("forward", "backward"):
            if f"lltm_{direction}_kernel" in event.key:
                times[direction] = event.device_time_total / event.count
    return times


def verdict(ratio: float, target: float, at_most: bool = True) -> str:
    """A performance target: "met" or "MISSED".  FAIL is kept for checks that found something wrong."""
    met = ratio <= target if at_most else ratio >= target
    return "met" if met else "MISSED"


def run(args) -> list[str]:
    backend = lltm_core.get_backend("cuda", device="cuda", dtype=torch.float32)  # raises with the reason
    props = torch.cuda.get_device_properties(0)
    lines = [
        f"GPU: {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"lltm backend {backend.name!r}: {backend.description}",
        f"float32; TF32 matmul allowed: {torch.backends.cuda.matmul.allow_tf32}. Times are medians; "
        f"seed method = host time per call with torch.cuda.synchronize() after forward and after backward.",
        "",
        "| size | step | eager | torch.compile | lltm-cuda | lltm-cuda / eager | target | result |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for size, rounds, warmup in ((SMALL, args.rounds, 20), (BIG, max(args.rounds // 10, 5), 3)):
        B, I, S = size
        seed = SeedLLTM(I, S, device="cuda")
        cuda = lltm_core.LLTM(I, S, backend="cuda", device="cuda")
        cuda.load_state_dict(seed.state_dict())
        candidates = {"eager": seed, "lltm-cuda": cuda}
        try:
            # Shares the seed's parameters; static shapes, one graph per size.
            compiled = torch.compile(seed, dynamic=False)
            # Compiles forward and backward here, outside the timing.
            print(f"B{B} I{I} S{S}: torch.compile vs eager, largest relative difference "
                  f"{check_agreement(compiled, seed, size):.2e}", flush=True)
            candidates["torch.compile"] = compiled
        except Exception as exc:  # a compiler problem must not hide the other figures
            print(f"torch.compile unavailable at {size}: {type(exc).__name__}: {exc}", file=sys.stderr)
        error = check_agreement(cuda, seed, size)
        print(f"B{B} I{I} S{S}: lltm-cuda vs eager, largest relative difference {error:.2e}", flush=True)
        if not error <= 1e-4:
            lines.append(f"| B{B} I{I} S{S} | agreement | | | {error:.2e} | | <= 1e-4 | FAIL |")
        timings = seed_method(candidates, size, rounds, warmup)
        for step, index in (("forward", 0), ("backward", 1)):
            eager_us, cuda_us = timings["eager"][index], timings["lltm-cuda"][index]
            compiled_us = f"{timings['torch.compile'][index]:.1f} us" if "torch.compile" in timings else "n/a"
            ratio = cuda_us / eager_us
            target = TARGETS.get(f"small {step}") if size == SMALL else None
            lines.append(
                f"| B{B} I{I} S{S} | {step} | {eager_us:.1f} us | {compiled_us} | {cuda_us:.1f} us | {ratio:.3f} "
                f"| {f'<= {target}' if target else '-'} | {verdict(ratio, target) if target else '-'} |"
            )

    x, h, c = make_state(BIG, requires_grad=False)
    weights, bias = make_weights(BIG)
    B, I, S = BIG
    X = torch.cat([h, x], dim=1)
    with torch.no_grad():
        ms = interleaved_device_ms({
            "gemm": lambda: torch.addmm(bias, X, weights.t()),
            "forward": lambda: lltm_core.lltm(x, weights, bias, h, c, backend="cuda"),
        })
    copy = copy_bandwidth()
    kernels = pointwise_kernel_us(BIG)
    lines += [
        "",
        f"Device time at B{B} I{I} S{S}:",
        "",
        "| measure | lltm-cuda | reference | ratio | target | result |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    ratio = ms["forward"] / ms["gemm"]
    target = TARGETS["big forward vs GEMM"]
    lines.append(
        f"| forward (cat + addmm + fused kernel) vs gate GEMM alone (addmm) | {ms['forward']:.3f} ms "
        f"| {ms['gemm']:.3f} ms | {ratio:.3f} | <= {target} | {verdict(ratio, target)} |"
    )
    target = TARGETS["pointwise bandwidth"]
    for direction, elements in (("forward", FORWARD_KERNEL_ELEMENTS), ("backward", BACKWARD_KERNEL_ELEMENTS)):
        if direction not in kernels:
            lines.append(f"| {direction} pointwise kernel | not found in the profile | | | | FAIL |")
            continue
        bandwidth = elements * B * S * x.element_size() / (kernels[direction] / 1e6)
        ratio = bandwidth / copy
        lines.append(
            f"| {direction} pointwise kernel: counted bytes / kernel time ({kernels[direction]:.1f} us) "
            f"vs 1 GiB device copy | {bandwidth / 1e12:.2f} TB/s | {copy / 1e12:.2f} TB/s | {ratio:.3f} "
            f"| >= {target} | {verdict(ratio, target, at_most=False)} |"
        )
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", metavar="PATH", help="also write the report to this Markdown file")
    parser.add_argument("--rounds", type=int, default=300, help="timed rounds at the small size (a tenth at the big)")
    args = parser.parse_args(argv)
    why = cuda_unavailable_reason()
    failed = 0
    if why is not None:
        lines = [f"bench_gpu.py: nothing measured: {why}. Run it on a CUDA GPU."]
    else:
        lines = run(args)
        # The last line is what gpu_check.sh shows for this step.  A missed target
        # is a result to report (with its floor); a FAIL row is a check that went wrong.
        failed = sum(line.rstrip().endswith("| FAIL |") for line in lines)
        missed = sum(line.rstrip().endswith("| MISSED |") for line in lines)
        lines += ["", f"bench_gpu.py: {failed} check(s) FAIL, {missed} target(s) MISSED (see the tables)."]
    report = "\n".join(lines) + "\n"
    print(report, end="")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
