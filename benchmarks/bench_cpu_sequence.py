#!/usr/bin/env python3
"""lltm-cpu's fused sequence kernels against torch.nn.LSTM (oneDNN), the per-step loop and their own GEMMs.

    python benchmarks/bench_cpu_sequence.py [--runs 5] [--output benchmarks/results/cpu_sequence.md]

Issue 12's peer is ``torch.nn.LSTM`` on CPU, oneDNN's fused LSTM in training
and inference.  Every candidate runs in one process, interleaved: each round
runs each candidate a few times in turn and a candidate's figure is the median
of all its calls, so drift in the machine's speed hits every candidate alike.
The whole measurement repeats ``--runs`` times and the report gives each run's
ratios and their range: a verdict holds only if every run agrees.  The machine
is shared, so each run first waits (up to ``--max-wait`` seconds) for other
processes to go quiet, and a run during which they used more than
``--max-others`` CPU-seconds is discarded and taken again; the report says how
many were.

Candidates, on float32 with 2 threads (torch.set_num_threads), one layer and
direction, zero initial state, the input requiring grad (so the backward
computes d_input, as for any layer but the first; nn.LSTM's oneDNN backward
takes as long without it, measured at T32 B64):

* ``nn.LSTM``: ``torch.nn.LSTM(I, S)``;
* ``lltm cpu (LLTMLayer)``: ``lltm_core.LLTMLayer(I, S, backend="cpu")``, the
  fused sequence kernels behind lltm_core's autograd;
* ``lltm cpu per-step loop``: ``lltm_core.LLTM(I, S, backend="cpu")`` called once
  per step in Python, the outputs stacked (what a user without LLTMLayer writes);
* ``lltm_cpu sequence ops``: ``torch.ops.lltm_cpu.sequence_forward`` and
  ``.sequence_backward`` called directly: no lltm_core, no autograd;
* ``its GEMMs alone``: the GEMMs lltm_cpu's sequence kernels run and nothing
  else, from C++ (compiled here with ninja): the per-step GEMMs on torch's
  brgemm, one block of batch rows per thread, the others on ATen (MKL): one
  input projection and T recurrent GEMMs forward; T recurrent GEMMs, the three
  weight-gradient GEMMs and the d_input GEMM backward;
* ``its GEMMs alone, at::addmm per step``: the same GEMMs, all through ATen
  into preallocated buffers (``at::addmm_out`` / ``at::mm_out``), each
  MKL-threaded: what the per-step GEMMs cost without lltm_cpu's choices.

Training is forward + backward of ``output.sum()`` (timed as one, gradients
reset to None before each call); inference is the forward under
``torch.no_grad()``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils import cpp_extension

import lltm_core
from lltm_core.testing import max_rel_error

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu import busy_cpu_seconds, cpu_model, own_cpu_seconds  # noqa: E402

OWN_GEMMS = "its GEMMs alone"
ATEN_GEMMS = "its GEMMs alone, at::addmm per step"

SMALL = dict(steps=64, batch=16, input_features=32, state_size=128)
LARGE = dict(steps=32, batch=64, input_features=256, state_size=512)

# What the notes' "written down before optimising" predicted for some of these ratios.
PREDICTED = {
    ("small", "train", "nn.LSTM"): 0.64,
    ("small", "infer", "nn.LSTM"): 0.69,
    ("small", "train", "lltm cpu per-step loop"): 0.25,
    ("large", "train", "nn.LSTM"): 0.77,
    ("large", "infer", "nn.LSTM"): 0.87,
}

# (size, mode, candidate, baseline, target): candidate time / baseline time must be at most target.
TARGETS = [
    ("small", "train", "lltm cpu (LLTMLayer)", "nn.LSTM", 0.80),
    ("small", "infer", "lltm cpu (LLTMLayer)", "nn.LSTM", 1.00),
    ("small", "train", "lltm cpu (LLTMLayer)", "lltm cpu per-step loop", 0.35),
    ("large", "train", "lltm cpu (LLTMLayer)", "nn.LSTM", 0.85),
    ("large", "infer", "lltm cpu (LLTMLayer)", "nn.LSTM", 1.05),
    ("large", "train", "lltm cpu (LLTMLayer)", OWN_GEMMS, 1.15),
]

# The GEMMs of lltm_cpu's sequence kernels and nothing else, from C++: with
# ATen's GEMMs throughout (at::addmm_out per step, MKL-threaded), and with the
# GEMMs the kernels themselves run (brgemm per step on a block of rows per
# thread, on its own transposed copy of W_h; MKL for the GEMMs over all steps).
_CPP = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <vector>

// Forward: x W_x^T + b for all T*B rows, then per step gates_t += h W_h^T.
void aten_forward(const at::Tensor& input, const at::Tensor& w_x, const at::Tensor& bias, const at::Tensor& w_h,
                  const at::Tensor& h, at::Tensor& gates) {
  const int64_t T = input.size(0), B = input.size(1);
  at::Tensor flat_gates = gates.view({T * B, -1});
  at::addmm_out(flat_gates, bias, input.view({T * B, -1}), w_x.t());
  const at::Tensor w_h_t = w_h.t();
  for (int64_t t = 0; t < T; ++t) {
    at::Tensor step = gates.select(0, t);
    at::addmm_out(step, step, h, w_h_t);
  }
}

// After the loop: d_W = d_gates^T [h_prev | x] in three GEMMs (the h columns
// in two: output-shifted rows and h0), and d_input.
void after_loop(const at::Tensor& grad_gates, const at::Tensor& w_x, const at::Tensor& input,
                const at::Tensor& output, const at::Tensor& h0, at::Tensor& grad_w_h, at::Tensor& grad_w_x,
                at::Tensor& grad_input) {
  const int64_t T = input.size(0), B = input.size(1);
  const at::Tensor flat = grad_gates.view({T * B, -1});
  at::mm_out(grad_w_h, flat.narrow(0, B, (T - 1) * B).t(), output.view({T * B, -1}).narrow(0, 0, (T - 1) * B));
  grad_w_h.addmm_(flat.narrow(0, 0, B).t(), h0);
  at::mm_out(grad_w_x, flat.t(), input.view({T * B, -1}));
  at::Tensor flat_grad_input = grad_input.view({T * B, -1});
  at::mm_out(flat_grad_input, flat, w_x);
}

// Backward: per step d_h = d_gates_t W_h, then after_loop.
void aten_backward(const at::Tensor& grad_gates, const at::Tensor& w_x, const at::Tensor& w_h,
                   const at::Tensor& input, const at::Tensor& output, const at::Tensor& h0, at::Tensor& grad_h,
                   at::Tensor& grad_w_h, at::Tensor& grad_w_x, at::Tensor& grad_input) {
  for (int64_t t = input.size(0) - 1; t >= 0; --t) {
    at::mm_out(grad_h, grad_gates.select(0, t), w_h);
  }
  after_loop(grad_gates, w_x, input, output, h0, grad_w_h, grad_w_x, grad_input);
}

// The per-step GEMMs as lltm_cpu runs them (float32): rows split into one block per thread.
template <typename Block>
void for_blocks(int64_t B, const Block& block) {
  const int64_t blocks = std::min<int64_t>(at::get_num_threads(), B);
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t k = first; k < last; ++k) {
      block(k * B / blocks, (k + 1) * B / blocks);
    }
  });
}

void own_forward(const at::Tensor& input, const at::Tensor& w_x, const at::Tensor& bias, const at::Tensor& w_h,
                 const at::Tensor& h, at::Tensor& gates) {
  const int64_t T = input.size(0), B = input.size(1), S = w_h.size(1);
  at::Tensor flat_gates = gates.view({T * B, -1});
  at::addmm_out(flat_gates, bias, input.view({T * B, -1}), w_x.t());
  for_blocks(B, [&](int64_t row_begin, int64_t row_end) {
    std::vector<float> w_h_t(S * 3 * S);  // (S, 3S)
    const float* w = w_h.data_ptr<float>();
    for (int64_t r = 0; r < 3 * S; ++r) {
      for (int64_t c = 0; c < S; ++c) {
        w_h_t[c * 3 * S + r] = w[r * S + c];
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      at::native::cpublas::brgemm(row_end - row_begin, 3 * S, S, S, 3 * S, 3 * S, true,
                                  h.data_ptr<float>() + row_begin * S, w_h_t.data(),
                                  gates.data_ptr<float>() + (t * B + row_begin) * 3 * S);
    }
  });
}

void own_backward(const at::Tensor& grad_gates, const at::Tensor& w_x, const at::Tensor& w_h,
                  const at::Tensor& input, const at::Tensor& output, const at::Tensor& h0, at::Tensor& grad_h,
                  at::Tensor& grad_w_h, at::Tensor& grad_w_x, at::Tensor& grad_input) {
  const int64_t T = input.size(0), B = input.size(1), S = w_h.size(1);
  for_blocks(B, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t t = T - 1; t >= 0; --t) {
      at::native::cpublas::brgemm(row_end - row_begin, S, 3 * S, 3 * S, S, S, false,
                                  grad_gates.data_ptr<float>() + (t * B + row_begin) * 3 * S, w_h.data_ptr<float>(),
                                  grad_h.data_ptr<float>() + row_begin * S);
    }
  });
  after_loop(grad_gates, w_x, input, output, h0, grad_w_h, grad_w_x, grad_input);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("aten_forward", &aten_forward);
  m.def("aten_backward", &aten_backward);
  m.def("own_forward", &own_forward);
  m.def("own_backward", &own_backward);
}
"""


def make_candidates(size: dict, gemms, with_loop: bool) -> dict:
    """{name: {"train": step, "infer": step}}; a step runs one call and returns its ns."""
    T, B, I, S = size["steps"], size["batch"], size["input_features"], size["state_size"]
    x = torch.randn(T, B, I, requires_grad=True)
    lstm = torch.nn.LSTM(I, S)
    layer = lltm_core.LLTMLayer(I, S, backend="cpu")
    cell = lltm_core.LLTM(I, S, backend="cpu")
    with torch.no_grad():  # the cell is the layer's first (and only) layer: same results
        cell.weights.copy_(layer.weights_l0)
        cell.bias.copy_(layer.bias_l0)

    def timed_train(run, leaves):
        def step():
            for t in leaves:
                t.grad = None
            start = time.perf_counter_ns()
            run().sum().backward()
            return time.perf_counter_ns() - start
        return step

    def timed_infer(run):
        def step():
            start = time.perf_counter_ns()
            with torch.no_grad():
                run()
            return time.perf_counter_ns() - start
        return step

    def run_loop():
        h = c = torch.zeros(B, S)
        outputs = []
        for t in range(T):
            h, c = cell(x[t], (h, c))
            outputs.append(h)
        return torch.stack(outputs)

    candidates = {
        "nn.LSTM": (lambda: lstm(x)[0], [x, *lstm.parameters()]),
        "lltm cpu (LLTMLayer)": (lambda: layer(x)[0], [x, *layer.parameters()]),
    }
    if with_loop:
        candidates["lltm cpu per-step loop"] = (run_loop, [x, *cell.parameters()])
    out = {name: {"train": timed_train(run, leaves), "infer": timed_infer(run)}
           for name, (run, leaves) in candidates.items()}

    # The operators alone, and the GEMMs alone, on the layer's weights.
    ops = torch.ops.lltm_cpu
    weights, bias = layer.weights_l0.detach(), layer.bias_l0.detach()
    xd, h0 = x.detach(), torch.zeros(B, S)
    grad_output = torch.ones(()).expand(T, B, S)  # as autograd hands over the gradient of output.sum()

    def ops_forward():
        return ops.sequence_forward(xd, weights, bias, h0, h0, None, False)

    def ops_train():
        start = time.perf_counter_ns()
        output, _, _, gates, tanh_cell = ops_forward()
        ops.sequence_backward(grad_output, h0, h0, weights, xd, h0, output, None, gates, tanh_cell, False, True)
        return time.perf_counter_ns() - start

    def ops_infer():
        start = time.perf_counter_ns()
        ops_forward()
        return time.perf_counter_ns() - start

    out["lltm_cpu sequence ops"] = {"train": ops_train, "infer": ops_infer}

    w_h, w_x = weights[:, :S].contiguous(), weights[:, S:].contiguous()
    gates_buffer = torch.empty(T, B, 3 * S)
    grad_gates = torch.randn(T, B, 3 * S)
    saved_output = torch.randn(T, B, S)
    grad_h, grad_w_h, grad_w_x = torch.empty(B, S), torch.empty(3 * S, S), torch.empty(3 * S, I)
    grad_input = torch.empty(T, B, I)

    def gemm_steps(forward, backward):
        def train():
            start = time.perf_counter_ns()
            forward(xd, w_x, bias, w_h, h0, gates_buffer)
            backward(grad_gates, w_x, w_h, xd, saved_output, h0, grad_h, grad_w_h, grad_w_x, grad_input)
            return time.perf_counter_ns() - start

        def infer():
            start = time.perf_counter_ns()
            forward(xd, w_x, bias, w_h, h0, gates_buffer)
            return time.perf_counter_ns() - start

        return {"train": train, "infer": infer}

    out[OWN_GEMMS] = gemm_steps(gemms.own_forward, gemms.own_backward)
    out[ATEN_GEMMS] = gemm_steps(gemms.aten_forward, gemms.aten_backward)

    # The fused layer must compute what the cell looped computes, gradients included.
    results = []
    for run, params in ((lambda: layer(x)[0], list(layer.parameters())), (run_loop, list(cell.parameters()))):
        x.grad = None
        for p in params:
            p.grad = None
        result = run()
        result.sum().backward()
        results.append([result.detach(), x.grad, *(p.grad for p in params)])
    for name, got, want in zip(("output", "grad input", "grad weights", "grad bias"), *results):
        error = max_rel_error(got, want)  # relative to the largest magnitude, as the conformance kit measures
        if error > 1e-4:
            raise AssertionError(f"{size_name(size)}: LLTMLayer's {name} differs from the looped cell's by {error:.1e}")
    return out


def measure(candidates: dict, mode: str, rounds: int, calls_per_round: int, warmup: int) -> tuple[dict, float]:
    """{name: median us} of `mode`'s calls, interleaved; and the CPU-seconds others used meanwhile."""
    times = {name: [] for name in candidates}
    for steps in candidates.values():
        for _ in range(warmup):
            steps[mode]()
    busy_before, own_before = busy_cpu_seconds(), own_cpu_seconds()
    for _ in range(rounds):
        for name, steps in candidates.items():
            times[name].extend(steps[mode]() for _ in range(calls_per_round))
    others = 0.0
    if busy_before is not None:
        others = max((busy_cpu_seconds() - busy_before) - (own_cpu_seconds() - own_before), 0.0)
    return {name: statistics.median(ns) / 1e3 for name, ns in times.items()}, others


def wait_until_quiet(max_wait: float, window: float = 2.0, threshold: float = 0.05) -> float:
    """Waits, up to `max_wait` seconds, until other processes use under `threshold` of a core for
    `window` seconds (this machine is shared); returns how long it waited."""
    start = time.monotonic()
    while time.monotonic() - start < max_wait:
        busy, own = busy_cpu_seconds(), own_cpu_seconds()
        if busy is None:
            break
        time.sleep(window)
        if (busy_cpu_seconds() - busy) - (own_cpu_seconds() - own) < threshold * window:
            break
    return time.monotonic() - start


def size_name(size: dict) -> str:
    return "T{steps} B{batch} I{input_features} S{state_size}".format(**size)


def verdict(ratios: list[float], target: float) -> str:
    if max(ratios) <= target:
        return "yes"
    if min(ratios) > target:
        return f"NO (by {min(ratios) / target - 1:.0%} at best)"
    return "in some runs only"


NOTES = """\
## Notes

### Written down before optimising

From single-thread CPU time (`time.thread_time`: on this shared machine the CPU
time of one thread is what other processes disturb least), of the first fused
version, which ran every GEMM on MKL with the recurrent weights packed once per
sequence (`cblas_sgemm_pack`), at T64 B16 I32 S128:

- fused forward 2.14 ms, backward 3.54 ms; nn.LSTM forward 2.32 ms, forward +
  backward 7.19 ms: 0.92x forward, 0.79x training, so the training target
  (0.80x) held by nothing.
- Of that, the GEMMs alone took 1.80 / 3.33 ms and the pointwise passes about
  0.34 / 0.21 ms.  The recurrent GEMM of one thread's block of 8 rows (M8 N384
  K128) took 11.2 us with MKL packed and 11.4 us unpacked (35 GMAC/s: MKL runs
  its AVX2 kernels on AMD CPUs), 12.9 us through at::addmm, and 6.9 us with
  torch's `at::native::cpublas::brgemm` (oneDNN's AVX-512 micro-kernel,
  57 GMAC/s).  nn.LSTM, which is oneDNN throughout, does about 49 GMAC/s over
  its whole forward at T32 B64.
- Expected from moving the recurrent GEMMs to brgemm: -0.55 ms forward and
  -0.55 ms backward at T64 B16 (to about 1.6 and 3.0 ms: 0.69x nn.LSTM's
  forward, 0.64x its training); at T32 B64 about -7 ms of 64 forward (0.87x) and
  -6 ms of 114 backward (0.77x training).  The GEMMs over all steps (input
  projection, d_W, d_input) stay on MKL: brgemm in blocks of rows measured
  0-15% faster at T64 B16 and up to 1.6x slower for d_W at T32 B64, and d_W
  would need a transposed copy of an operand.
- With 2 threads: the time loop runs one block of batch rows per thread, with
  no synchronisation between steps, so it should scale about 2x; MKL's GEMMs
  over all steps measured 2.0-2.1x (d_W at T64 B16: 1.33 ms on one thread,
  0.63 ms on two).  So the ratios on 2 threads should be those above.
- The per-step loop of `lltm_core.LLTM` pays lltm_core, autograd and two
  operator calls per step (about 170 us of a step's forward and backward at
  B16), against about 45 us per step fused: about 0.25x.
- Folding the bias into the input projection (a fill, then the GEMM adds to
  it) costs about 10 us: no reason to leave the issue's design.

### Checked afterwards

- Single-thread CPU time after the change (measured apart, as before):
  forward 1.59 ms, backward 2.87 ms at T64 B16 (predicted 1.6 and 3.0); T32 B64
  forward 56.7 ms (predicted 57).
- On 2 threads, predicted against measured (the range over the runs):

{predictions}

  At T32 B64 training comes out lower than predicted because nn.LSTM gains
  less from the second thread than lltm-cpu does: measured apart, 214 ms of
  one thread's CPU time against about 118 ms on two (1.8x), and lltm-cpu
  163 ms against about 81 ms (2.0x).

- Where the time went (each candidate's median over the runs):

{breakdown}

### Not done, and why

- Multi-layer: lltm_core composes the layers (one sequence call per layer and
  direction) and that is left so.  Stacking inside the backend would save one
  call's plumbing per layer (the difference between the LLTMLayer and
  operator rows above); overlapping layers in a wavefront would need one
  layer's input projection per step, which is what the one GEMM over all
  steps avoids.  Not measured faster, so not done.
- The pointwise passes are about a fifth of the forward at T64 B16 (four exp
  and three divisions per element, accurate to a few ulp); cheaper
  approximations would give up the accuracy lltm-cpu's step tests hold it to.
- bfloat16 runs the recurrent GEMMs through at::mm (a dispatcher call per
  step); no target covers it.
"""


def predictions(runs: list, sizes: dict) -> str:
    lines = []
    for (size, mode, baseline), predicted in PREDICTED.items():
        ratios = [medians[size, mode]["lltm cpu (LLTMLayer)"] / medians[size, mode][baseline] for medians, _ in runs]
        what = "forward + backward" if mode == "train" else "forward"
        lines.append(f"  - {size_name(sizes[size])}, {what} / {baseline}: predicted {predicted:.2f}x, "
                     f"measured {min(ratios):.2f}-{max(ratios):.2f}x")
    return "\n".join(lines)


def breakdown(runs: list, sizes: dict) -> str:
    """Where the time went, per size and mode: each candidate's median over the runs of its medians."""
    lines = []
    for size, dims in sizes.items():
        for mode, what in (("train", "forward + backward"), ("infer", "forward")):
            t = {name: statistics.median(medians[size, mode][name] for medians, _ in runs)
                 for name in runs[0][0][size, mode]}
            layer, ops, gemms = t["lltm cpu (LLTMLayer)"], t["lltm_cpu sequence ops"], t[OWN_GEMMS]
            lines.append(
                f"  - {size_name(dims)}, {what}: LLTMLayer {layer:.0f} us = its GEMMs {gemms:.0f} us "
                f"+ the rest of the operators (pointwise passes, copies, allocations) {ops - gemms:+.0f} us "
                f"+ lltm_core, autograd and output.sum() {layer - ops:+.0f} us; nn.LSTM {t['nn.LSTM']:.0f} us.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="repeat the whole measurement; the report gives the range")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds per size and mode (small size)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-wait", type=float, default=120,
                        help="before each run, wait up to this many seconds for other processes to go quiet")
    parser.add_argument("--max-others", type=float, default=1.0,
                        help="a run during which other processes used more CPU-seconds than this is discarded and "
                             "taken again (at most --retries times in all); the report counts them")
    parser.add_argument("--retries", type=int, default=10)
    parser.add_argument("--output", help="write the Markdown report here as well as to stdout")
    args = parser.parse_args()
    if args.runs < 1 or args.rounds < 1:
        parser.error("--runs and --rounds must be at least 1")
    if not cpp_extension.is_ninja_available():
        sys.exit("bench_cpu_sequence.py compiles a small C++ extension and needs ninja: pip install ninja")
    torch.set_num_threads(args.threads)
    gemms = cpp_extension.load_inline("lltm_sequence_gemms", cpp_sources=[_CPP], extra_cflags=["-O2", "-fopenmp"],
                                      extra_ldflags=["-fopenmp"])
    lltm_core.get_backend("cpu")  # loads the torch.ops.lltm_cpu operators
    route = torch.ops.lltm_cpu.sequence_gemm(torch.float32)
    torch.manual_seed(0)

    sizes = {"small": SMALL, "large": LARGE}
    candidates = {"small": make_candidates(SMALL, gemms, with_loop=True),
                  "large": make_candidates(LARGE, gemms, with_loop=False)}
    # (rounds, calls per round, warm-up calls): the large size's calls take ~0.1 s each.
    schedule = {"small": (args.rounds, 3, 5), "large": (max(args.rounds // 4, 2), 1, 2)}
    runs = []  # per run: {(size, mode): {name: us}}, others' CPU-seconds
    discarded = []  # others' CPU-seconds of the runs taken again
    while len(runs) < args.runs:
        wait_until_quiet(args.max_wait)
        medians, others = {}, 0.0
        for size in sizes:
            for mode in ("train", "infer"):
                rounds, calls, warmup = schedule[size]
                medians[size, mode], busy = measure(candidates[size], mode, rounds, calls, warmup)
                others += busy
        if others > args.max_others and len(discarded) < args.retries:
            discarded.append(others)
            continue
        runs.append((medians, others))

    lines = [
        "# lltm-cpu sequence kernels against torch.nn.LSTM",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"torch {torch.__version__}, {cpu_model()}, {torch.get_num_threads()} threads, "
        f"ATen CPU capability {torch.backends.cpu.get_cpu_capability()}, Python {platform.python_version()}; "
        f"lltm_cpu's float32 sequence GEMMs: {route} (LLTM_CPU_GEMM={os.environ.get('LLTM_CPU_GEMM', '(unset)')}).",
        f"float32, one layer and direction, zero initial state, the input requiring grad. Medians of interleaved "
        f"rounds; {args.runs} runs, the tables show the last and the targets every run.",
        "",
    ]
    last, _ = runs[-1]
    for size, dims in sizes.items():
        lines += [f"## {size_name(dims)}", "",
                  "| candidate | train: forward + backward (us) | / nn.LSTM | inference: forward (us) | / nn.LSTM |",
                  "|---|---:|---:|---:|---:|"]
        train, infer = last[size, "train"], last[size, "infer"]
        for name in train:
            lines.append(f"| {name} | {train[name]:.0f} | {train[name] / train['nn.LSTM']:.2f} | "
                         f"{infer[name]:.0f} | {infer[name] / infer['nn.LSTM']:.2f} |")
        lines.append("")
    run_columns = " | ".join(f"run {n}" for n in range(1, args.runs + 1))
    lines += ["## Targets", "",
              f"| size | ratio | {run_columns} | range | target | met |",
              "|---|---|" + "---:|" * (args.runs + 2) + "---|"]
    for size, mode, candidate, baseline, target in TARGETS:
        ratios = [medians[size, mode][candidate] / medians[size, mode][baseline] for medians, _ in runs]
        what = f"{candidate}, {'forward + backward' if mode == 'train' else 'forward (no_grad)'} / {baseline}"
        lines.append(f"| {size_name(sizes[size])} | {what} | " + " | ".join(f"{r:.2f}" for r in ratios)
                     + f" | {min(ratios):.2f}-{max(ratios):.2f} | <= {target:.2f} | {verdict(ratios, target)} |")
    lines += ["", "Other processes' CPU-seconds during each run: "
              + ", ".join(f"{others:.1f}" for _, others in runs) + ". "
              + (f"{len(discarded)} more runs were discarded and taken again because other processes used more than "
                 f"{args.max_others} CPU-seconds during them ({', '.join(f'{o:.1f}' for o in discarded)})."
                 if discarded else "No run was discarded."),
              "", NOTES.format(predictions=predictions(runs, sizes), breakdown=breakdown(runs, sizes))]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        Path(args.output).write_text(report)


if __name__ == "__main__":
    main()
