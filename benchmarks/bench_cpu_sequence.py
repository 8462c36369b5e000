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

Candidates, in float32 and in bfloat16 (``--dtypes``), with 2 threads
(torch.set_num_threads), one layer and direction, zero initial state, the
input requiring grad (so the backward computes d_input, as for any layer but
the first; nn.LSTM's oneDNN backward takes as long without it, measured at
T32 B64):

* ``nn.LSTM``: ``torch.nn.LSTM(I, S)`` in the same dtype;
* ``lltm cpu (LLTMLayer)``: ``lltm_core.LLTMLayer(I, S, backend="cpu")``, the
  fused sequence kernels behind lltm_core's autograd;
* ``lltm cpu per-step loop``: ``lltm_core.LLTM(I, S, backend="cpu")`` called once
  per step in Python, the outputs stacked (what a user without LLTMLayer writes);
* ``lltm_cpu sequence ops``: ``torch.ops.lltm_cpu.sequence_forward`` and
  ``.sequence_backward`` called directly: no lltm_core, no autograd; its
  inference is contract v3's forward (``needs_backward=False``: the input
  projected in chunks, nothing saved);
* ``sequence ops, forward saving for backward``: inference through the
  forward that saves the gates and tanh(c_t) (``needs_backward=True``, what
  every forward did before contract v3), to show the chunked one is no slower;
* float32 only, ``its GEMMs alone``: the GEMMs lltm_cpu's sequence kernels run
  on this CPU and nothing else, from C++ (compiled here with ninja): the
  per-step GEMMs on torch's brgemm, split between the threads as lltm_cpu
  chose for the shape (by batch rows, each thread on all of W_h, or by state
  columns, each on its slices of W_h with one spin barrier a step; W_h laid
  out in panels of 64 columns either way), the others on oneDNN's matmul
  (the routes and splits lltm_cpu measured fastest here; the header lists
  them): one input projection and
  T recurrent GEMMs forward; T recurrent GEMMs, the three weight-gradient
  GEMMs and the d_input GEMM backward;
* float32 only, ``its GEMMs alone, at::addmm per step``: the same GEMMs, all
  through ATen into preallocated buffers (``at::addmm_out`` / ``at::mm_out``),
  each MKL-threaded: what the per-step GEMMs cost without lltm_cpu's choices.

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
from lltm_core.testing import max_rel_error, reference_sequence, tolerance

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu import busy_cpu_seconds, own_cpu_seconds  # noqa: E402

OWN_GEMMS = "its GEMMs alone"
ATEN_GEMMS = "its GEMMs alone, at::addmm per step"
SAVING_FORWARD = "sequence ops, forward saving for backward"
LAYER = "lltm cpu (LLTMLayer)"

SMALL = dict(steps=64, batch=16, input_features=32, state_size=128)
LARGE = dict(steps=32, batch=64, input_features=256, state_size=512)

# What the notes' "written down before optimising" predicted for LLTMLayer / nn.LSTM,
# per (dtype, size, mode): this round's (a zero h0's products skipped), written before measuring the layer.
PREDICTED = {
    ("float32", "small", "train"): 0.62,
    ("float32", "small", "infer"): 0.63,
    ("float32", "large", "train"): 0.59,
    ("float32", "large", "infer"): 0.78,
    ("bfloat16", "small", "train"): 0.50,
}

# (dtype, size, mode, candidate, baseline, target): candidate time / baseline time must be at most target.
TARGETS = [
    ("float32", "small", "train", LAYER, "nn.LSTM", 0.65),
    ("float32", "small", "infer", LAYER, "nn.LSTM", 0.85),
    ("float32", "large", "train", LAYER, "nn.LSTM", 0.70),
    ("float32", "large", "infer", LAYER, "nn.LSTM", 0.85),
    ("bfloat16", "small", "train", LAYER, "nn.LSTM", 0.80),
    ("bfloat16", "small", "infer", LAYER, "nn.LSTM", 1.00),
    ("bfloat16", "large", "train", LAYER, "nn.LSTM", 0.80),
    ("bfloat16", "large", "infer", LAYER, "nn.LSTM", 1.00),
    # Contract v3's chunked inference forward against the forward that saves for backward.
    ("float32", "small", "infer", "lltm_cpu sequence ops", SAVING_FORWARD, 1.00),
    ("float32", "large", "infer", "lltm_cpu sequence ops", SAVING_FORWARD, 1.00),
]

# The GEMMs of lltm_cpu's sequence kernels and nothing else, from C++: with
# ATen's GEMMs throughout (at::addmm_out per step, MKL-threaded), and with the
# GEMMs the kernels themselves run on this CPU (brgemm per step, split by
# batch rows or by state columns as lltm_cpu chose, W_h laid out in panels
# of 64 columns; oneDNN's matmul for the GEMMs over all steps).
_CPP = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <atomic>
#include <vector>

namespace at::native {  // exported by libtorch_cpu, its header not installed (see lltm_cpu's blas.cpp)
TORCH_API void mkldnn_matmul(const Tensor& mat1, const Tensor& mat2, const Tensor& result, float beta, float alpha);
}

// The GEMMs over all steps as lltm_cpu runs them here: d_W = d_gates^T [h_prev | x], d_input.
// From a zero h0, as here, lltm_cpu skips h0's part of d_W, and so does this.
void own_after_loop(const at::Tensor& grad_gates, const at::Tensor& w_x, const at::Tensor& input,
                    const at::Tensor& output, const at::Tensor& h0, at::Tensor& grad_w_h, at::Tensor& grad_w_x,
                    at::Tensor& grad_input) {
  const int64_t T = input.size(0), B = input.size(1);
  const at::Tensor flat = grad_gates.view({T * B, -1});
  at::native::mkldnn_matmul(flat.narrow(0, B, (T - 1) * B).t(), output.view({T * B, -1}).narrow(0, 0, (T - 1) * B),
                            grad_w_h, 0.0f, 1.0f);
  at::native::mkldnn_matmul(flat.t(), input.view({T * B, -1}), grad_w_x, 0.0f, 1.0f);
  at::native::mkldnn_matmul(flat, w_x, grad_input.view({T * B, -1}), 0.0f, 1.0f);
}

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

// The per-step GEMMs as lltm_cpu runs them here (float32): the state columns
// split into one block per thread (blocks of 32), all rows, one barrier a step.
struct Barrier {
  explicit Barrier(int64_t n) : n(n) {}
  void wait() {
    const int64_t g = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
      arrived.store(0, std::memory_order_relaxed);
      generation.store(g + 1, std::memory_order_release);
      return;
    }
    while (generation.load(std::memory_order_acquire) == g) {
      __builtin_ia32_pause();
    }
  }
  const int64_t n;
  alignas(64) std::atomic<int64_t> arrived{0};
  alignas(64) std::atomic<int64_t> generation{0};
};

// Or the batch rows split into one block per thread, no barrier.
template <typename Block>
void for_row_blocks(int64_t B, const Block& block) {
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), B));
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t k = first; k < last; ++k) {
      block(k * B / blocks, (k + 1) * B / blocks);
    }
  });
}

template <typename Block>
void for_column_blocks(int64_t S, const Block& block) {
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), S / 32));
  Barrier barrier(blocks);
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    block(first * S / blocks / 32 * 32, last == blocks ? S : last * S / blocks / 32 * 32, barrier);
  });
}

// op(B)'s columns [c0, c1) (op(B)[r][c] = b[c * ldb + r] if trans_b, else b[r * ldb + c]) as k x 64 panels.
std::vector<float> panels(const float* b, int64_t ldb, bool trans_b, int64_t k, int64_t c0, int64_t c1) {
  std::vector<float> out(k * (c1 - c0));
  for (int64_t first = c0; first < c1; first += 64) {
    const int64_t width = std::min<int64_t>(64, c1 - first);
    float* panel = out.data() + (first - c0) * k;
    for (int64_t r = 0; r < k; ++r) {
      for (int64_t c = 0; c < width; ++c) {
        panel[r * width + c] = trans_b ? b[(first + c) * ldb + r] : b[r * ldb + first + c];
      }
    }
  }
  return out;
}

// C's columns [c0, c1) (rows of ldc) = A (m x k) times the panels.
void panel_brgemm(int64_t m, int64_t k, const float* a, int64_t lda, const std::vector<float>& p, int64_t c0,
                  int64_t c1, float* c, int64_t ldc) {
  for (int64_t first = c0; first < c1; first += 64) {
    const int64_t width = std::min<int64_t>(64, c1 - first);
    at::native::cpublas::brgemm(m, width, k, lda, width, ldc, false, a, p.data() + (first - c0) * k, c + first);
  }
}

// From a zero h0, as here, lltm_cpu skips the first step's product (zero), and so does this: t from 1.
void own_forward(const at::Tensor& input, const at::Tensor& w_x, const at::Tensor& bias, const at::Tensor& w_h,
                 const at::Tensor& h, at::Tensor& gates, bool by_columns) {
  const int64_t T = input.size(0), B = input.size(1), S = w_h.size(1);
  at::native::mkldnn_matmul(input.view({T * B, -1}), w_x.t(), gates.view({T * B, -1}), 0.0f, 1.0f);
  std::vector<float> product(B * 3 * S);  // lltm_cpu's pointwise pass adds it to the gates
  if (!by_columns) {
    for_row_blocks(B, [&](int64_t r0, int64_t r1) {
      const std::vector<float> p = panels(w_h.data_ptr<float>(), S, true, S, 0, 3 * S);  // all of W_h^T
      for (int64_t t = 1; t < T; ++t) {
        panel_brgemm(r1 - r0, S, h.data_ptr<float>() + r0 * S, S, p, 0, 3 * S, product.data() + r0 * 3 * S, 3 * S);
      }
    });
    return;
  }
  for_column_blocks(S, [&](int64_t j0, int64_t j1, Barrier& barrier) {
    std::vector<std::vector<float>> gate_panels;
    for (int64_t g = 0; g < 3; ++g) {  // W_h's rows g*S + j0 .. g*S + j1, transposed
      gate_panels.push_back(panels(w_h.data_ptr<float>(), S, true, S, g * S + j0, g * S + j1));
    }
    for (int64_t t = 1; t < T; ++t) {
      for (int64_t g = 0; g < 3; ++g) {
        panel_brgemm(B, S, h.data_ptr<float>(), S, gate_panels[g], g * S + j0, g * S + j1, product.data(), 3 * S);
      }
      barrier.wait();
    }
  });
}

void own_backward(const at::Tensor& grad_gates, const at::Tensor& w_x, const at::Tensor& w_h,
                  const at::Tensor& input, const at::Tensor& output, const at::Tensor& h0, at::Tensor& grad_h,
                  at::Tensor& grad_w_h, at::Tensor& grad_w_x, at::Tensor& grad_input, bool by_columns) {
  const int64_t T = input.size(0), S = w_h.size(1), B = input.size(1);
  if (!by_columns) {
    for_row_blocks(B, [&](int64_t r0, int64_t r1) {
      const std::vector<float> p = panels(w_h.data_ptr<float>(), S, false, 3 * S, 0, S);  // all of W_h
      for (int64_t t = T - 1; t >= 0; --t) {
        panel_brgemm(r1 - r0, 3 * S, grad_gates.data_ptr<float>() + (t * B + r0) * 3 * S, 3 * S, p, 0, S,
                     grad_h.data_ptr<float>() + r0 * S, S);
      }
    });
    own_after_loop(grad_gates, w_x, input, output, h0, grad_w_h, grad_w_x, grad_input);
    return;
  }
  for_column_blocks(S, [&](int64_t j0, int64_t j1, Barrier& barrier) {
    const std::vector<float> p = panels(w_h.data_ptr<float>(), S, false, 3 * S, j0, j1);  // W_h's columns j0 .. j1
    for (int64_t t = T - 1; t >= 0; --t) {
      barrier.wait();  // lltm_cpu's: after the pass that writes d_gates_t
      panel_brgemm(B, 3 * S, grad_gates.data_ptr<float>() + t * B * 3 * S, 3 * S, p, j0, j1,
                   grad_h.data_ptr<float>(), S);
    }
  });
  own_after_loop(grad_gates, w_x, input, output, h0, grad_w_h, grad_w_x, grad_input);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("aten_forward", &aten_forward);
  m.def("aten_backward", &aten_backward);
  m.def("own_forward", &own_forward);
  m.def("own_backward", &own_backward);
}
"""


def make_candidates(size: dict, dtype: torch.dtype, gemms, with_loop: bool) -> dict:
    """{name: {"train": step, "infer": step}}; a step runs one call and returns its ns."""
    T, B, I, S = size["steps"], size["batch"], size["input_features"], size["state_size"]
    x = torch.randn(T, B, I, dtype=dtype, requires_grad=True)
    lstm = torch.nn.LSTM(I, S).to(dtype)
    layer = lltm_core.LLTMLayer(I, S, backend="cpu").to(dtype)
    cell = lltm_core.LLTM(I, S, backend="cpu").to(dtype)
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
        h = c = torch.zeros(B, S, dtype=dtype)
        outputs = []
        for t in range(T):
            h, c = cell(x[t], (h, c))
            outputs.append(h)
        return torch.stack(outputs)

    candidates = {
        "nn.LSTM": (lambda: lstm(x)[0], [x, *lstm.parameters()]),
        LAYER: (lambda: layer(x)[0], [x, *layer.parameters()]),
    }
    if with_loop:
        candidates["lltm cpu per-step loop"] = (run_loop, [x, *cell.parameters()])
    out = {name: {"train": timed_train(run, leaves), "infer": timed_infer(run)}
           for name, (run, leaves) in candidates.items()}

    # The operators alone, and the GEMMs alone, on the layer's weights.
    ops = torch.ops.lltm_cpu
    weights, bias = layer.weights_l0.detach(), layer.bias_l0.detach()
    xd, h0 = x.detach(), torch.zeros(B, S, dtype=dtype)
    grad_output = torch.ones((), dtype=dtype).expand(T, B, S)  # as autograd hands over the gradient of output.sum()

    def ops_forward(needs_backward):
        return ops.sequence_forward(xd, weights, bias, h0, h0, None, False, needs_backward)

    def ops_train():
        start = time.perf_counter_ns()
        output, _, _, gates, tanh_cell = ops_forward(True)
        ops.sequence_backward(grad_output, h0, h0, weights, xd, h0, output, None, gates, tanh_cell, False, True)
        return time.perf_counter_ns() - start

    def ops_infer(needs_backward):
        def step():
            start = time.perf_counter_ns()
            ops_forward(needs_backward)
            return time.perf_counter_ns() - start
        return step

    out["lltm_cpu sequence ops"] = {"train": ops_train, "infer": ops_infer(False)}
    out[SAVING_FORWARD] = {"train": ops_train, "infer": ops_infer(True)}
    if dtype != torch.float32:  # the C++ GEMM candidates below are float32's
        return check_layer(out, size, dtype, x, layer, run_loop, cell)

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

    # The split lltm_cpu measured faster for this shape (check_layer's calls below chose it before any is timed).
    def own_forward(*args):
        gemms.own_forward(*args, lltm_split(B, S, "forward") == "columns")

    def own_backward(*args):
        gemms.own_backward(*args, lltm_split(B, S, "backward") == "columns")

    out[OWN_GEMMS] = gemm_steps(own_forward, own_backward)
    out[ATEN_GEMMS] = gemm_steps(gemms.aten_forward, gemms.aten_backward)
    return check_layer(out, size, dtype, x, layer, run_loop, cell)


def lltm_split(batch: int, state_size: int, direction: str) -> str:
    """The time-loop split ("rows" or "columns") lltm_cpu chose for float32 at this B and S, from its
    gemm_routes() ("time loop float32 B64 S512 threads 2 forward: columns (measured: ...)")."""
    for line in torch.ops.lltm_cpu.gemm_routes():
        key, _, rest = line.partition(": ")
        words = key.split()
        if key.startswith(f"time loop float32 B{batch} S{state_size} ") and direction in words:
            return rest.split()[0]
    return "rows"  # not split (one thread, or too small)


def check_layer(out: dict, size: dict, dtype: torch.dtype, x, layer, run_loop, cell) -> dict:
    """The fused layer must compute what the cell looped computes, gradients included."""
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
        if error > (1e-4 if dtype == torch.float32 else 0.1):
            raise AssertionError(f"{size_name(size)} {dtype}: LLTMLayer's {name} differs from the looped cell's by "
                                 f"{error:.1e}")
    if dtype != torch.float32:
        # Over T steps each bfloat16 computation drifts from the exact one on its own (lltm-cpu keeps the
        # cell state in float, the looped cell rounds it every step): the layer must be no further from the
        # float64 result than the looped cell, or within the kit's tolerance.
        T, B, S = x.shape[0], x.shape[1], size["state_size"]
        zeros = torch.zeros(B, S, dtype=torch.float64)
        exact = reference_sequence(x.detach().double(), layer.weights_l0.detach().double(),
                                   layer.bias_l0.detach().double(), zeros, zeros)[0]
        layer_error, loop_error = (max_rel_error(r[0], exact) for r in results)
        if layer_error > max(loop_error, tolerance(dtype)):
            raise AssertionError(f"{size_name(size)} {dtype}: LLTMLayer's output is {layer_error:.1e} from float64's, "
                                 f"the looped cell's {loop_error:.1e}")
    return out


class Medians(dict):
    """{name: median us over all of a run's calls}, and in .rounds per round {name: that round's median us}."""

    rounds: list


def round_ratio(medians: Medians, candidate: str, baseline: str) -> float:
    """The median over a run's rounds of candidate / baseline within each round (the two ran side by side)."""
    return statistics.median(r[candidate] / r[baseline] for r in medians.rounds)


def measure(candidates: dict, mode: str, rounds: int, calls_per_round: int, warmup: int) -> tuple[Medians, float]:
    """The medians of `mode`'s calls, interleaved; and the CPU-seconds others used meanwhile."""
    times = {name: [] for name in candidates}
    for steps in candidates.values():
        for _ in range(warmup):
            steps[mode]()
    busy_before, own_before = busy_cpu_seconds(), own_cpu_seconds()
    per_round = []
    names = list(candidates)
    for round_index in range(rounds):
        this_round = {}
        # Every other round in reverse order: a candidate's place in the round (after which other, with
        # what left in the caches) moved ratios of equal-cost candidates by up to 5% in a fixed order.
        for name in names if round_index % 2 == 0 else reversed(names):
            steps = candidates[name]
            ns = [steps[mode]() for _ in range(calls_per_round)]
            times[name].extend(ns)
            this_round[name] = statistics.median(ns) / 1e3
        per_round.append(this_round)
    others = 0.0
    if busy_before is not None:
        others = max((busy_cpu_seconds() - busy_before) - (own_cpu_seconds() - own_before), 0.0)
    medians = Medians({name: statistics.median(ns) / 1e3 for name, ns in times.items()})
    medians.rounds = per_round
    return medians, others


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

### This round, written down before optimising: a zero h0's products

Last round left one target short: float32 T64 B16 forward + backward,
0.60-0.66x against 0.65.  Its sequence operators are mostly GEMMs (about 970
of 1080 us), and those run near this CPU's peak (the per-step brgemm, M8 N384
K128 a thread, 3.15 us: about 250 GFLOP/s a core).  So the lever left in the
kernels is doing fewer of them.

- LLTMLayer's default state is zero (nn.LSTM's hx=None), and the kernels
  multiplied it all the same: the first step's recurrent GEMM (one of the
  forward's 64 at T64), and h0's part of d_W, a GEMM of its own (M384 N128
  K16, 15 us on MKL at its first call, header above).  Now lltm_cpu tests h0
  (an OR over its bits, zeros of either sign) and skips both, as cuDNN does
  for an omitted hx.
- Predicted: about 1-1.7% off the float32 T64 B16 forward + backward (a
  step's GEMM and the K16 GEMM of ~1050 us), 0.8% off its forward; about 1%
  at T32 B64.  Measured with a runtime switch, the two variants interleaved
  in one process (30 rounds): float32 T64 B16 forward + backward 1.6%,
  forward 0.6%; T32 B64 1.0% and 1.3%; bfloat16 1.5-4.4%.  LLTMLayer /
  nn.LSTM should move by as much: float32 T64 B16 forward + backward about
  0.63x -> 0.62x, still close to its bar.
- Tried and dropped, before that: the forward pass's cell_forward was out of
  line (a call and a vzeroupper per vector); inlined, 0.99-1.01x.  With the
  activations replaced by a linear stand-in (a bound on what any faster
  activation could give): the float32 T64 B16 inference forward 7% faster,
  forward + backward unchanged.  The pointwise pass is not where the training
  call's time goes.

### This round, checked afterwards

- Predicted against measured, LLTMLayer / nn.LSTM (the range over {which}):

{predictions}

- Where the time went (each candidate's median over {which}; float32 has the
  GEMMs-alone rows, which run the split lltm_cpu chose, with panels, and
  skip the zero h0's products as the kernels do):

{breakdown}

- What the forward + backward rows add above the operators is autograd's and
  the layer's, not the kernels'.  Timed alone here, with nothing else in the
  caches (timeit's best of 7): `x.sum().backward()` on a leaf takes 12 us, the
  engine's fixed cost, and a no-op autograd.Function's forward + backward
  with it 24 us.  Right after the kernels, with the caches holding their
  data, the same code runs slower.  core_overhead.md measures that floor
  against the bare kernels.

### Last round: the pointwise passes' exp, and the benchmark itself

- at::vec's exp() calls SLEEF's expf in libtorch, out of line, for every
  vector; the cell's four exponentials were 85% of the forward's pointwise
  pass (one thread's 64 rows x 256 columns of S512: 50 us a step, 7.5 us
  without).  An inlined Cody-Waite exp (degree-7 polynomial, AVX-512's
  scalef or two exponent-field powers on AVX2) took it to 18.6 us in
  float32, bfloat16 51 -> 21.7 us; activations within 1.3 ulp of float64.
  Predicted 0.80x and 0.94x for the T32 B64 forwards; measured 0.78-0.80x
  and 0.89-0.91x, which met their targets.
- Every other round runs the candidates in reverse order (in a fixed order
  ratios of equal-cost candidates moved by up to 5% with their place), and
  60 rounds by default (at 20, one invocation's float32 T64 B16 forward +
  backward ratios moved 0.60-0.69x; at 60 within 0.01-0.02).

### Two rounds ago: the time loop's column split and brgemm's panels

The time loop is split between the threads by batch rows or by state
columns, whichever measured faster on whole steps at the key's first call
(rows at T64 B16, columns at T32 B64, header above), and each thread's share
of W_h is laid out in panels of 64 columns that stay in L2.  Timed on their
GEMMs alone the splits measured equal at T64 B16, but by columns a thread
waits at every step's barrier for whatever the other loses in its pass, so
the splits are timed with the pass included.

### Not done, and why

- The layout of W_h's slices is redone at every call (0.3-0.4 ms at T32
  B64, a few us at T64 B16); caching it across calls was not tried: in-place
  writes through `.data` do not bump the version counter, so a cache could
  go stale.
- The backward still computes h0's gradient (its step-0 GEMM) when h0 does
  not require grad, as LLTMLayer's zero state does not: the operator's
  contract returns it, and skipping it would need a flag the contract lacks.
- The backward pass adds each row's gate gradients into the bias sums in
  memory; summing in registers, columns outer, measured 10-100% slower.
- AMX and an AVX2-only CPU: this CPU has AVX-512 and AVX512_BF16 and no AMX,
  so no AMX figure is claimed.  The routes and the split are measured per
  process, so an Intel Xeon (where the issue saw MKL win the per-step GEMMs)
  chooses its own; not measured here.
- Bit-for-bit equal runs need the split fixed as well as the GEMM routes
  (`LLTM_CPU_SPLIT=rows`): the two sum the bias gradient in other orders.
- Multi-layer: lltm_core composes the layers (one sequence call per layer and
  direction) and that is left so.
"""


def quiet(runs: list, max_others: float) -> tuple[list, str]:
    """The runs other processes left alone (at most max_others CPU-seconds), if any, and what they are."""
    calm = [run for run in runs if run[1] <= max_others]
    if not calm:
        return runs, "all the runs (none was quiet)"
    return calm, f"the quiet runs ({len(calm)} of {len(runs)}, others under {max_others} CPU-seconds)"


def predictions(runs: list, dtypes: list, sizes: dict) -> str:
    lines = []
    for (dtype, size, mode), predicted in PREDICTED.items():
        if dtype not in dtypes:
            continue
        ratios = [round_ratio(medians[dtype, size, mode], LAYER, "nn.LSTM") for medians, _ in runs]
        what = "forward + backward" if mode == "train" else "forward"
        lines.append(f"  - {dtype} {size_name(sizes[size])}, {what}: predicted {predicted:.2f}x, "
                     f"measured {min(ratios):.2f}-{max(ratios):.2f}x")
    return "\n".join(lines)


def breakdown(runs: list, dtypes: list, sizes: dict) -> str:
    """Where the time went, per dtype, size and mode: each candidate's median over the runs of its medians."""
    lines = []
    for dtype in dtypes:
        for size, dims in sizes.items():
            for mode, what in (("train", "forward + backward"), ("infer", "forward")):
                t = {name: statistics.median(medians[dtype, size, mode][name] for medians, _ in runs)
                     for name in runs[0][0][dtype, size, mode]}
                layer, ops = t[LAYER], t["lltm_cpu sequence ops"]
                if OWN_GEMMS in t:
                    gemms = t[OWN_GEMMS]
                    parts = (f"its GEMMs {gemms:.0f} us + the rest of the operators (pointwise passes, copies, "
                             f"allocations) {ops - gemms:+.0f} us")
                else:
                    parts = f"the operators {ops:.0f} us"
                lines.append(f"  - {dtype} {size_name(dims)}, {what}: LLTMLayer {layer:.0f} us = {parts} "
                             f"+ lltm_core, autograd and output.sum() {layer - ops:+.0f} us; "
                             f"nn.LSTM {t['nn.LSTM']:.0f} us.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="repeat the whole measurement; the report gives the range")
    parser.add_argument("--rounds", type=int, default=60, help="interleaved rounds per size and mode (small size)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    parser.add_argument("--max-wait", type=float, default=120,
                        help="before each run, wait up to this many seconds for other processes to go quiet")
    parser.add_argument("--max-others", type=float, default=1.0,
                        help="a run during which other processes used more CPU-seconds than this is discarded and "
                             "taken again (at most --retries times in all); the report counts them")
    parser.add_argument("--retries", type=int, default=10)
    parser.add_argument("--output", help="write the Markdown report here as well as to stdout")
    args = parser.parse_args()
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if args.runs < 1 or args.rounds < 1:
        parser.error("--runs and --rounds must be at least 1")
    if not set(dtypes) <= {"float32", "bfloat16"} or not dtypes:
        parser.error("--dtypes takes float32 and/or bfloat16")
    if not cpp_extension.is_ninja_available():
        sys.exit("bench_cpu_sequence.py compiles a small C++ extension and needs ninja: pip install ninja")
    torch.set_num_threads(args.threads)
    gemms = cpp_extension.load_inline("lltm_sequence_gemms", cpp_sources=[_CPP], extra_cflags=["-O2", "-fopenmp"],
                                      extra_ldflags=["-fopenmp"])
    lltm_core.get_backend("cpu")  # loads the torch.ops.lltm_cpu operators
    import lltm_cpu

    torch.manual_seed(0)
    sizes = {"small": SMALL, "large": LARGE}
    candidates = {(dtype, size): make_candidates(dims, getattr(torch, dtype), gemms, with_loop=size == "small")
                  for dtype in dtypes for size, dims in sizes.items()}
    # (rounds, calls per round, warm-up calls): the large size's calls take ~0.1 s each.
    schedule = {"small": (args.rounds, 3, 5), "large": (max(args.rounds // 4, 2), 1, 2)}
    runs = []  # per run: {(dtype, size, mode): {name: us}}, others' CPU-seconds
    discarded = []  # others' CPU-seconds of the runs taken again
    while len(runs) < args.runs:
        wait_until_quiet(args.max_wait)
        medians, others = {}, 0.0
        for dtype in dtypes:
            for size in sizes:
                for mode in ("train", "infer"):
                    rounds, calls, warmup = schedule[size]
                    medians[dtype, size, mode], busy = measure(candidates[dtype, size], mode, rounds, calls, warmup)
                    others += busy
        if others > args.max_others and len(discarded) < args.retries:
            discarded.append(others)
            continue
        runs.append((medians, others))

    gemm = os.environ.get("LLTM_CPU_GEMM", "(unset)")
    split = os.environ.get("LLTM_CPU_SPLIT", "(unset)")
    lines = [
        "# lltm-cpu sequence kernels against torch.nn.LSTM",
        "",
        f"CPU: {lltm_cpu.cpu_info()}; {torch.get_num_threads()} threads.",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
        "",
        f"torch {torch.__version__}, Python {platform.python_version()}, LLTM_CPU_GEMM={gemm}, LLTM_CPU_SPLIT={split}. "
        f"{', '.join(dtypes)}, nn.LSTM in the same dtype; one layer and direction, zero initial state, the input "
        f"requiring grad. Interleaved rounds; the tables show the last run's medians over all its calls, the "
        f"targets each run's median of per-round ratios (candidate / baseline in the same round); {args.runs} runs.",
        "",
        "GEMM routes and time-loop splits lltm_cpu chose in this process (`lltm_cpu.gemm_routes()`: the first call "
        "of each GEMM shape timed every route, of each time loop both splits):",
        "",
        *(f"- {line}" for line in lltm_cpu.gemm_routes()),
        "",
    ]
    last, _ = runs[-1]
    for dtype in dtypes:
        for size, dims in sizes.items():
            lines += [f"## {dtype} {size_name(dims)}", "",
                      "| candidate | train: forward + backward (us) | / nn.LSTM | inference: forward (us) | / nn.LSTM |",
                      "|---|---:|---:|---:|---:|"]
            train, infer = last[dtype, size, "train"], last[dtype, size, "infer"]
            for name in train:
                lines.append(f"| {name} | {train[name]:.0f} | {train[name] / train['nn.LSTM']:.2f} | "
                             f"{infer[name]:.0f} | {infer[name] / infer['nn.LSTM']:.2f} |")
            lines.append("")
    run_columns = " | ".join(f"run {n}" for n in range(1, args.runs + 1))
    lines += ["## Targets", "",
              f"| dtype | size | ratio | {run_columns} | range | target | met |",
              "|---|---|---|" + "---:|" * (args.runs + 2) + "---|"]
    for dtype, size, mode, candidate, baseline, target in TARGETS:
        if dtype not in dtypes:
            continue
        ratios = [round_ratio(medians[dtype, size, mode], candidate, baseline) for medians, _ in runs]
        what = f"{candidate}, {'forward + backward' if mode == 'train' else 'forward (no_grad)'} / {baseline}"
        lines.append(f"| {dtype} | {size_name(sizes[size])} | {what} | " + " | ".join(f"{r:.2f}" for r in ratios)
                     + f" | {min(ratios):.2f}-{max(ratios):.2f} | <= {target:.2f} | {verdict(ratios, target)} |")
    lines += ["", "Other processes' CPU-seconds during each run: "
              + ", ".join(f"{others:.1f}" for _, others in runs) + ". "
              + (f"{len(discarded)} more runs were discarded and taken again because other processes used more than "
                 f"{args.max_others} CPU-seconds during them ({', '.join(f'{o:.1f}' for o in discarded)})."
                 if discarded else "No run was discarded."),
              ""]
    calm, which = quiet(runs, args.max_others)
    lines += [NOTES.format(predictions=predictions(calm, dtypes, sizes), breakdown=breakdown(calm, dtypes, sizes),
                           which=which)]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        Path(args.output).write_text(report)


if __name__ == "__main__":
    main()
