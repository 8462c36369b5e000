"""What bench_gpu.py (lltm-cuda) and bench_triton.py (lltm-triton) share: device time per call on
lltm_core.benchmarking's interleaved rounds, the sequence's inputs and its agreement with lltm-ref
in float64, whether nn.LSTM ran cuDNN, and the report's verdicts and summary line; and, for
persistent_vs_cudnn.py and profile_gpu.py, a call on a forced lltm-cuda sequence path."""

from __future__ import annotations

import os

import torch

import lltm_core
from lltm_core.benchmarking import PhaseTimes, interleaved
from lltm_core.testing import make_sequence_inputs, max_rel_error

#: A backend's sequence may err at most this many times what lltm-ref errs in the same dtype (and at
#: most the kit's tolerance wherever that is larger); torch's inductor tests use 2 the same way.
AGREEMENT_MULTIPLIER = 2.0


def device_time(fn, calls: int):
    """A candidate for lltm_core.benchmarking.interleaved that times itself: ``calls`` back-to-back calls of
    ``fn`` between two CUDA events, so the figure is device time per call, launch gaps included."""

    def timed() -> PhaseTimes:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return PhaseTimes((start.elapsed_time(end) / 1e3 / calls,))

    return timed


def device_ms(fns: dict, rounds: int = 10, calls: int = 10) -> dict:
    """{name: median milliseconds of device time per call}: ``rounds`` interleaved rounds (the order
    rotating), each timing ``calls`` back-to-back calls of every candidate; one warm-up round
    (cuBLAS heuristics, the allocator) first."""
    timings = interleaved({name: device_time(fn, calls) for name, fn in fns.items()}, calls=1, rounds=rounds,
                          warmup=1)
    return {name: timings.median(name) * 1e3 for name in fns}


def on_path(path: str, fn):
    """``fn`` run with lltm-cuda's sequence path forced to ``path`` (LLTM_CUDA_SEQUENCE: persistent,
    grid or per-step; the library reads it at each call), the variable unset again after."""

    def forced():
        os.environ["LLTM_CUDA_SEQUENCE"] = path
        try:
            return fn()
        finally:
            del os.environ["LLTM_CUDA_SEQUENCE"]

    return forced


def sequence_inputs(size, dtype):
    """(x, weights, bias, h0, c0) for lltm_sequence, scaled as the kit scales them; x and the parameters need grad."""
    x, weights, bias, h0, c0 = make_sequence_inputs(*size, dtype=dtype, device="cuda", requires_grad=False)
    return x.requires_grad_(), weights.requires_grad_(), bias.requires_grad_(), h0, c0


def sequence_agreement(size, dtype, backend: str) -> tuple[float, float]:
    """Largest relative error of ``backend``'s sequence, outputs and all gradients, against lltm-ref's
    in float64; and the same error of lltm-ref itself run in ``dtype``, on the same inputs.  Over T64 an
    LLTM's state grows (no forget gate) and bfloat16's rounding compounds through h's recurrence, so the
    kit's short-sequence tolerance is no bar there: the reference algorithm's own error in the dtype is
    (as torch's inductor tests hold compiled code to eager's error)."""
    inputs = [t.detach().requires_grad_() for t in sequence_inputs(size, dtype)]
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    want = lltm_core.lltm_sequence(*ref_inputs, backend="ref")
    upstream = [torch.randn(t.shape, dtype=torch.float64, device=t.device) for t in want]
    want_grads = torch.autograd.grad(want, ref_inputs, upstream)
    errors = []
    for name in (backend, "ref"):
        got = lltm_core.lltm_sequence(*inputs, backend=name)
        grads = torch.autograd.grad(got, inputs, [u.to(dtype) for u in upstream])
        errors.append(max(max_rel_error(g, w) for g, w in zip((*got, *grads), (*want, *want_grads))))
    return errors[0], errors[1]


def cudnn_used(lstm, x, state) -> bool:
    """Whether this nn.LSTM call ran cuDNN's RNN (aten::_cudnn_rnn) rather than torch's own cell loop."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        lstm(x, state)
    return any("cudnn_rnn" in event.key for event in prof.key_averages())


def verdict(ratio: float, target: float, at_most: bool = True) -> str:
    """A performance target: "met" or "MISSED".  FAIL is kept for checks that found something wrong."""
    met = ratio <= target if at_most else ratio >= target
    return "met" if met else "MISSED"


def summarize(lines: list[str], name: str, where: str) -> int:
    """Append the line gpu_check.sh shows for this step; return how many checks FAILed.

    A missed target is a result to report (with its floor); a FAIL row is a check that went wrong.
    """
    failed = sum("| FAIL" in line for line in lines)
    missed = sum(line.rstrip().endswith("| MISSED |") for line in lines)
    lines += ["", f"{name}: {failed} check(s) FAIL, {missed} target(s) MISSED (see {where})."]
    return failed


def report(lines: list[str], markdown: str | None, failed: int) -> int:
    """Print the report (and write it to ``markdown``); the exit code: 1 if a check FAILed."""
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if markdown:
        with open(markdown, "w") as f:
            f.write(text)
    return 1 if failed else 0
