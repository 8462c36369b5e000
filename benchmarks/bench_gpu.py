"""lltm-cuda against eager PyTorch, torch.compile and cuDNN's nn.LSTM, and its kernels against the GPU's ceilings.

Run from the repository root on a machine with a CUDA GPU and lltm-cuda installed::

    python benchmarks/bench_gpu.py --markdown benchmarks/results/h200.md [--part cell|sequence]

The cell (``--part cell``), float32 with torch's default matmul precision
(TF32 off; the report says which was in force):

* The seed's method, at B16 I32 S128 and B4096 I1024 S2048: one forward,
  synchronise, one backward of (new_h.sum() + new_cell.sum()), synchronise,
  each timed on the host.  Every input requires grad (an unrolled sequence).
  The candidates run interleaved, one step each per round, in one process, and
  a candidate's figure is the median over rounds, so drift hits all alike.
  At B16 a call is a few µs of kernels, so these figures mostly time the host
  and the synchronise; hence also:
* Device time at B16 I32 S128 (CUDA events over back-to-back calls, gpu_measure's):
  the forward with autograd recording, and the backward as torch.autograd.grad
  of both outputs over one retained graph (fresh gradients each call, nothing
  accumulated into .grad, so nothing to zero on either side).
* Device time at the big size: the forward against the gate GEMM alone
  (CUDA events), and each fused pointwise kernel's bandwidth (counted bytes
  over its kernel time from the profiler) against a device-to-device copy.

The sequence (``--part sequence``), in float32 and bfloat16, at T64 B16 I32 S128
and T64 B256 I1024 S1024: ``lltm_core.lltm_sequence`` on lltm-cuda's sequence
kernels against ``torch.nn.LSTM`` (cuDNN where torch uses it; the report says
whether it did), forward and forward+backward (the upstream gradient a fixed
random tensor, input and parameters requiring grad), as device time per call over
back-to-back calls (CUDA events), so a host-bound loop counts its launch gaps.
At the large size the forward is also held against its own GEMMs alone (the input
projection and the T recurrent GEMMs, replayed from a CUDA graph: no launch gaps),
and at the small size the raw sequence ops are timed eagerly and replayed from a
CUDA graph, to measure what launch cost the per-step loop pays and so whether
capturing it in a graph would pay off.

Inference (contract v3, in the sequence part): at both sizes in float32, one forward under
``torch.no_grad()`` (lltm-core then calls the kernels with needs_backward=False: nothing kept,
the input projected a chunk of steps at a time) against nn.LSTM's under no_grad, as device time,
and the peak GPU memory that forward adds (``torch.cuda.max_memory_allocated``) against the
contract's bound, 1.25x its input and output (or, at a size where one 2048-row chunk of gates is
larger than that, the output plus that chunk and the state): a FAIL row when it is over.

Float32 runs IEEE on both sides: cuDNN's RNNs would use TF32 by default (torch.backends.cudnn.allow_tf32)
where cuBLAS does not, so the cuDNN flag is set to the matmul flag.  Each (size, dtype) first checks
lltm-cuda's outputs and gradients against lltm-ref in float64, beside lltm-ref's own error in that
dtype: at most twice that (or the kit's tolerance, where larger) passes.

Without a GPU it says so and exits 0: there is nothing to measure.
"""

from __future__ import annotations

import argparse
import math
import sys

import torch
from gpu_measure import (AGREEMENT_MULTIPLIER, cudnn_used, device_ms, report, sequence_agreement, sequence_inputs,
                         summarize, verdict)

import lltm_core
from lltm_core._device import cuda_unavailable_reason
from lltm_core.benchmarking import interleaved, phased
from lltm_core.testing import SeedLLTM  # the tutorial's pure-PyTorch module
from lltm_core.testing import max_rel_error

SMALL = (16, 32, 128)  # (batch, input_features, state_size): the seed's size
BIG = (4096, 1024, 2048)
# candidate / baseline, "at most" or "at least" (bandwidths)
TARGETS = {
    "small forward": 0.25,  # the seed's method: the tutorial's figures
    "small backward": 0.30,
    "small forward, device time": 0.50,
    "small backward, device time": 0.50,
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
    """{name: (forward us, backward us)}: medians of the seed's per-call host timing (synchronised after
    each phase), candidates interleaved by lltm_core.benchmarking."""
    x, h, c = make_state(size)

    def seed_call(model):
        def forward():
            model.zero_grad(set_to_none=True)
            x.grad = h.grad = c.grad = None
            return model(x, (h, c))

        return phased(forward, lambda out: (out[0].sum() + out[1].sum()).backward(), sync=torch.cuda.synchronize)

    timings = interleaved({name: seed_call(model) for name, model in candidates.items()}, calls=1, rounds=rounds,
                          warmup=warmup)
    return {name: (timings.median(name, 0) * 1e6, timings.median(name, 1) * 1e6) for name in candidates}


def device_method(candidates: dict, size) -> dict:
    """{name: (forward us, backward us)}: device time per call (CUDA events over back-to-back calls,
    gpu_measure.device_ms, the candidates interleaved).  The forward records autograd's graph as
    training does; the backward is torch.autograd.grad of (new_h, new_cell) with respect to every
    input and parameter over one graph kept for it, so each call makes fresh gradients and none is
    accumulated into .grad."""
    x, h, c = make_state(size)
    upstream = [torch.randn_like(h), torch.randn_like(c)]
    fns, candidates = {}, dict(candidates)
    for name, model in list(candidates.items()):
        inputs = (x, h, c, *model.parameters())
        outputs = model(x, (h, c))
        fns[f"{name} forward"] = lambda model=model: model(x, (h, c))
        fns[f"{name} backward"] = lambda outputs=outputs, inputs=inputs: torch.autograd.grad(
            outputs, inputs, upstream, retain_graph=True)
        if name == "torch.compile":  # a compiler problem must not hide the other figures
            try:
                fns[f"{name} backward"]()
            except Exception as exc:  # AOTAutograd's donated buffers refuse retain_graph: no device-time row
                print(f"torch.compile's backward over a kept graph: {type(exc).__name__}: {exc}", file=sys.stderr)
                del fns[f"{name} forward"], fns[f"{name} backward"], candidates[name]
    ms = device_ms(fns)
    return {name: (ms[f"{name} forward"] * 1e3, ms[f"{name} backward"] * 1e3) for name in candidates}


def cell_rows(label: str, timings: dict, size, target_suffix: str = "") -> list[str]:
    """The table's rows of one timing method: each step's times and lltm-cuda / eager, checked
    against TARGETS at the small size."""
    B, I, S = size
    rows = []
    for step, index in (("forward", 0), ("backward", 1)):
        eager_us, cuda_us = timings["eager"][index], timings["lltm-cuda"][index]
        compiled_us = f"{timings['torch.compile'][index]:.1f} us" if "torch.compile" in timings else "n/a"
        ratio = cuda_us / eager_us
        target = TARGETS.get(f"small {step}{target_suffix}") if size == SMALL else None
        rows.append(
            f"| B{B} I{I} S{S} | {step}{label} | {eager_us:.1f} us | {compiled_us} | {cuda_us:.1f} us | {ratio:.3f} "
            f"| {f'<= {target}' if target else '-'} | {verdict(ratio, target) if target else '-'} |"
        )
    return rows


def copy_bandwidth() -> float:
    """Bytes per second of a 1 GiB device-to-device copy, counting bytes read and written."""
    src = torch.randn(2**28, device="cuda")
    dst = torch.empty_like(src)
    ms = device_ms({"copy": lambda: dst.copy_(src)})["copy"]
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


def cell_table_head() -> list[str]:
    backend = lltm_core.get_backend("cuda", device="cuda", dtype=torch.float32)  # raises with the reason
    props = torch.cuda.get_device_properties(0)
    return [
        f"GPU: {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"lltm backend {backend.name!r}: {backend.description}",
        f"float32; TF32 matmul allowed: {torch.backends.cuda.matmul.allow_tf32}. Times are medians; "
        f"seed method = host time per call with torch.cuda.synchronize() after forward and after backward; "
        f"device time = CUDA events over back-to-back calls (the backward: autograd.grad over a kept graph).",
        "",
        "| size | step | eager | torch.compile | lltm-cuda | lltm-cuda / eager | target | result |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]


def seed_and_cuda(size) -> tuple[torch.nn.Module, torch.nn.Module, list[str]]:
    """The tutorial's module and lltm-cuda's LLTM with the same parameters at ``size``, and the
    table's FAIL row if they disagree (none if they agree)."""
    B, I, S = size
    seed = SeedLLTM(I, S, device="cuda")
    cuda = lltm_core.LLTM(I, S, backend="cuda", device="cuda")
    cuda.load_state_dict(seed.state_dict())
    error = check_agreement(cuda, seed, size)
    print(f"B{B} I{I} S{S}: lltm-cuda vs eager, largest relative difference {error:.2e}", flush=True)
    return seed, cuda, [] if error <= 1e-4 else [f"| B{B} I{I} S{S} | agreement | | | {error:.2e} | | <= 1e-4 | FAIL |"]


def run_cell_device() -> list[str]:
    """The cell at the small size in device time alone, eager against lltm-cuda (no torch.compile,
    no host timing): seconds, so gpu_check.sh runs it among its first steps."""
    seed, cuda, disagreement = seed_and_cuda(SMALL)
    timings = device_method({"eager": seed, "lltm-cuda": cuda}, SMALL)
    return cell_table_head() + disagreement + cell_rows(", device time", timings, SMALL, ", device time")


def run(args) -> list[str]:
    lines = cell_table_head()
    for size, rounds, warmup in ((SMALL, args.rounds, 20), (BIG, max(args.rounds // 10, 5), 3)):
        B, I, S = size
        seed, cuda, disagreement = seed_and_cuda(size)
        lines += disagreement
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
        lines += cell_rows("", seed_method(candidates, size, rounds, warmup), size)
        if size == SMALL:
            lines += cell_rows(", device time", device_method(candidates, size), size, ", device time")

    x, h, c = make_state(BIG, requires_grad=False)
    weights, bias = make_weights(BIG)
    B, I, S = BIG
    X = torch.cat([h, x], dim=1)
    with torch.no_grad():
        ms = device_ms({
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


# --- the sequence ----------------------------------------------------------------------------

SEQUENCE_SIZES = {"small": (64, 16, 32, 128), "large": (64, 256, 1024, 1024)}  # (T, B, I, S)
SEQUENCE_DTYPES = (torch.float32, torch.bfloat16)
SEQUENCE_TARGETS = {  # lltm-cuda / baseline, at most
    ("small", "fwd+bwd vs nn.LSTM"): 1.0,
    ("large", "fwd+bwd vs nn.LSTM"): 0.85,
    ("large", "forward vs its GEMMs"): 1.10,
}


def graphed(fn):
    """fn captured in a CUDA graph (after a warm-up on a side stream, as torch's docs say): returns replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def run_sequence(args) -> list[str]:
    from lltm_core.testing import tolerance

    lltm_core.get_backend("cuda", device="cuda", dtype=torch.float32)  # raises with the reason
    # cuDNN's RNNs use TF32 by default (torch.backends.cudnn.allow_tf32), cuBLAS's GEMMs do not: both
    # sides follow the matmul flag, so float32 is IEEE against IEEE (or TF32 against TF32).
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    lines = [
        f"TF32 allowed: {torch.backends.cuda.matmul.allow_tf32} (cuBLAS and cuDNN alike); "
        f"cuDNN {torch.backends.cudnn.version()}. "
        f"Device time per call (CUDA events over {args.sequence_calls} back-to-back calls, median of "
        f"{args.sequence_rounds} rounds, candidates interleaved). nn.LSTM has 4 gates of S to the LLTM's 3.",
        "",
        "| size | dtype | measure | lltm-cuda | baseline | ratio | target | result |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def row(size_name, dtype, measure, ours, base, base_name):
        target = SEQUENCE_TARGETS.get((size_name, measure))
        ratio = ours / base
        T, B, I, S = SEQUENCE_SIZES[size_name]
        lines.append(
            f"| T{T} B{B} I{I} S{S} | {str(dtype)[6:]} | {measure} | {ours:.3f} ms | {base:.3f} ms ({base_name}) "
            f"| {ratio:.3f} | {f'<= {target}' if target else '-'} | {verdict(ratio, target) if target else '-'} |")

    for size_name, size in SEQUENCE_SIZES.items():
        T, B, I, S = size
        for dtype in SEQUENCE_DTYPES:
            where = f"T{T} B{B} I{I} S{S} {str(dtype)[6:]}"
            error, ref_error = sequence_agreement(size, dtype, "cuda")
            bound = max(tolerance(dtype), AGREEMENT_MULTIPLIER * ref_error)
            basis = f"{AGREEMENT_MULTIPLIER:g}x lltm-ref's" if bound > tolerance(dtype) else "the kit's tolerance"
            print(f"{where}: largest relative error against lltm-ref in float64: lltm-cuda {error:.2e}, "
                  f"lltm-ref in {str(dtype)[6:]} {ref_error:.2e}", flush=True)
            # Reported, and still timed: the kit and the GPU tests judge correctness.
            ratio = error / max(ref_error, 1e-300)
            lines.append(f"| T{T} B{B} I{I} S{S} | {str(dtype)[6:]} | error vs float64 | {error:.2e} | {ref_error:.2e} "
                         f"(lltm-ref in {str(dtype)[6:]}) | {ratio:.3f} | <= {bound:.2g} ({basis}) | "
                         f"{'pass' if error <= bound else 'FAIL'} |")
            x, weights, bias, h0, c0 = sequence_inputs(size, dtype)
            lstm = torch.nn.LSTM(I, S, device="cuda", dtype=dtype)
            grad_out = torch.randn(T, B, S, device="cuda", dtype=dtype)
            baseline = "cuDNN nn.LSTM" if cudnn_used(lstm, x, (h0[None], c0[None])) else "nn.LSTM, NOT cuDNN"

            def lltm_forward():
                return lltm_core.lltm_sequence(x, weights, bias, h0, c0, backend="cuda")[0]

            def lstm_forward():
                return lstm(x, (h0[None], c0[None]))[0]

            def lltm_step():
                torch.autograd.backward(lltm_forward(), grad_out)

            def lstm_step():
                torch.autograd.backward(lstm_forward(), grad_out)

            ms = device_ms({"lltm fwd": lltm_forward, "lstm fwd": lstm_forward, "lltm step": lltm_step,
                                        "lstm step": lstm_step}, rounds=args.sequence_rounds,
                                       calls=args.sequence_calls)
            row(size_name, dtype, "forward vs nn.LSTM", ms["lltm fwd"], ms["lstm fwd"], baseline)
            row(size_name, dtype, "fwd+bwd vs nn.LSTM", ms["lltm step"], ms["lstm step"], baseline)

            if size_name == "large":
                # The forward's own GEMMs, as it issues them, replayed from a graph: their device time alone.
                w = weights.detach()
                x2d, w_x_t, w_h_t, b = x.detach().view(T * B, I), w[:, S:].t(), w[:, :S].t(), bias.detach()
                gates = torch.empty(T, B, 3 * S, device="cuda", dtype=dtype)
                h = torch.randn(B, S, device="cuda", dtype=dtype)

                def gemms():
                    torch.addmm(b, x2d, w_x_t, out=gates.view(T * B, 3 * S))
                    for t in range(T):
                        gates[t].addmm_(h, w_h_t)

                with torch.no_grad():
                    try:
                        floor, how = graphed(gemms), "its GEMMs, graph-replayed"
                    except Exception as exc:  # an eager floor is still a floor, only a looser one
                        print(f"{where}: capturing the GEMMs failed ({type(exc).__name__}: {exc}); timing them eagerly",
                              file=sys.stderr)
                        floor, how = gemms, "its GEMMs, eager"
                    ms = device_ms({"forward": lltm_forward, "gemms": floor}, rounds=args.sequence_rounds,
                                               calls=args.sequence_calls)
                row(size_name, dtype, "forward vs its GEMMs", ms["forward"], ms["gemms"], how)

    T, B, I, S = SEQUENCE_SIZES["small"]
    lines += ["", f"Launch cost at T{T} B{B} I{I} S{S} float32: the raw sequence ops (no autograd), eager against "
              "the same calls replayed from one CUDA graph. A ratio well under 1 says the per-step loop is "
              "launch-bound and a graph, reused for repeated shapes, would pay.", "",
              "| measure | eager | graph replay | graph / eager | result |", "| --- | --- | --- | --- | --- |"]
    lines += graph_rows(args)
    lines += inference_rows(args)
    return lines


INFERENCE_MEMORY_BOUND = 1.25  # contract v3: a no_grad forward adds at most this x (input + output)
INFERENCE_CHUNK_ROWS = 2048  # rows (steps x batch) of the input projection one chunk holds (writing-a-backend.md)


def inference_rows(args) -> list[str]:
    lines = ["", "Inference (contract v3), float32 under torch.no_grad(): device time per call against nn.LSTM's, "
             f"and the peak GPU memory one forward adds against {INFERENCE_MEMORY_BOUND}x (input + output), or the "
             f"output plus one {INFERENCE_CHUNK_ROWS}-row chunk of gates and the state where that is more.", "",
             "| size | no_grad forward | nn.LSTM no_grad | ratio | peak memory added | bound | result |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for size in SEQUENCE_SIZES.values():
        T, B, I, S = size
        x, weights, bias, h0, c0 = (t.detach() for t in sequence_inputs(size, torch.float32))
        lstm = torch.nn.LSTM(I, S, device="cuda")
        with torch.no_grad():
            def lltm_forward():
                return lltm_core.lltm_sequence(x, weights, bias, h0, c0, backend="cuda")[0]

            ms = device_ms({"lltm": lltm_forward, "lstm": lambda: lstm(x, (h0[None], c0[None]))[0]},
                                       rounds=args.sequence_rounds, calls=args.sequence_calls)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            output = lltm_forward()
            torch.cuda.synchronize()
            added = torch.cuda.max_memory_allocated() - before
        # The contract's promise is the output plus a workspace that does not grow with T: one chunk of
        # at most INFERENCE_CHUNK_ROWS rows' gates and the running state.  1.25x (input + output) is
        # that at the contract's size; at a small one the chunk can be larger than the output.
        workspace = min(T * B, INFERENCE_CHUNK_ROWS) * 3 * S * x.element_size() + 2 * B * S * 4
        bound = max(INFERENCE_MEMORY_BOUND * (x.nbytes + output.nbytes), output.nbytes + workspace)
        lines.append(f"| T{T} B{B} I{I} S{S} | {ms['lltm']:.3f} ms | {ms['lstm']:.3f} ms | "
                     f"{ms['lltm'] / ms['lstm']:.3f} | {added / 2**20:.1f} MiB | {bound / 2**20:.1f} MiB | "
                     f"{'pass' if added <= bound else 'FAIL'} |")
    return lines


def graph_rows(args) -> list[str]:
    T, B, I, S = SEQUENCE_SIZES["small"]
    x, weights, bias, h0, c0 = (t.detach() for t in sequence_inputs(SEQUENCE_SIZES["small"], torch.float32))
    grads = [torch.randn(shape, device="cuda") for shape in ((T, B, S), (B, S), (B, S))]
    forward, backward = torch.ops.lltm_cuda.sequence_forward, torch.ops.lltm_cuda.sequence_backward
    results = {}

    def fwd():
        results["fwd"] = forward(x, weights, bias, h0, c0, None, False)

    def fwd_bwd():
        out = forward(x, weights, bias, h0, c0, None, False)
        results["fwd+bwd"] = (out[0], *backward(*grads, weights, x, h0, out[0], None, *out[3:], False, True))

    rows = []
    for name, fn in (("forward", fwd), ("forward+backward", fwd_bwd)):
        key = "fwd" if fn is fwd else "fwd+bwd"
        try:
            fn()
            want = [t.clone() for t in results[key]]
            replay = graphed(fn)
            replay()
            torch.cuda.synchronize()
            if not all(max_rel_error(g, w) <= 1e-5 for g, w in zip(results[key], want)):
                rows.append(f"| {name} | | | | FAIL: the graph's replay computed other numbers than the eager call |")
                continue
            ms = device_ms({"eager": fn, "graph": replay}, rounds=args.sequence_rounds,
                                       calls=args.sequence_calls)
        except Exception as exc:  # not capturable is an answer too (then no graph can pay), not a wrong result
            rows.append(f"| {name} | | | | not measured: {type(exc).__name__}: {str(exc).splitlines()[0][:120]} |")
            continue
        rows.append(f"| {name} | {ms['eager']:.3f} ms | {ms['graph']:.3f} ms | {ms['graph'] / ms['eager']:.3f} | "
                    f"measured |")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", metavar="PATH", help="also write the report to this Markdown file")
    parser.add_argument("--rounds", type=int, default=300, help="cell: timed rounds at the small size (a tenth at the big)")
    parser.add_argument("--part", choices=("all", "cell", "sequence", "cell-device"), default="all",
                        help="what to measure: the cell, the sequence, or both (default); cell-device: the "
                             "small cell's device-time rows alone (seconds)")
    parser.add_argument("--sequence-rounds", type=int, default=10, help="sequence: timed rounds per candidate")
    parser.add_argument("--sequence-calls", type=int, default=10, help="sequence: back-to-back calls per round")
    args = parser.parse_args(argv)
    why = cuda_unavailable_reason()
    failed = 0
    if why is not None:
        lines = [f"bench_gpu.py: nothing measured ({args.part}): {why}. Run it on a CUDA GPU."]
    else:
        lines = []
        if args.part in ("all", "cell"):
            lines += ["### The cell", ""] + run(args)
        if args.part == "cell-device":
            lines += ["### The cell at the small size, device time", ""] + run_cell_device()
        if args.part in ("all", "sequence"):
            lines += ([""] if lines else []) + ["### The sequence: lltm_sequence against nn.LSTM", ""]
            lines += run_sequence(args)
        failed = summarize(lines, f"bench_gpu.py ({args.part})", "the tables")
    return report(lines, args.markdown, failed)


if __name__ == "__main__":
    sys.exit(main())
