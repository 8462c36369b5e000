#!/usr/bin/env python3
"""What lltm-core's plumbing costs, measured against the same arithmetic without it.

    python benchmarks/core_overhead.py [--rounds 31] [--output benchmarks/results/core_overhead.md]

Three tables of candidates timed in one process, interleaved round by round
(the order rotating; ``lltm_core.benchmarking.interleaved``), and reported as
the median and the range of the per-round ratios: the machine is shared and its speed drifts, and
a ratio taken within one round sees both candidates at the same speed.

* **cell**: ``lltm_core.LLTM(backend="ref")`` against the tutorial's eager
  module at the seed's size (B16 I32 S128, float32).  lltm-ref runs the same
  kind of PyTorch operators as the eager module, so the ratio is the cost of
  the checks, the choice of backend and the autograd.Function around the
  kernels.  Forward (parameters requiring grad), and backward of
  ``new_h.sum() + new_cell.sum()`` timed on its own within a training step, and that whole step.
  Target: <= 1.10x each.
* **sequence**: ``lltm_core.LLTMLayer(32, 128, backend="cpu")`` at T64 B16,
  forward under ``torch.no_grad()`` and forward + backward of ``output.sum()``,
  against the same lltm-cpu sequence kernels in the thinnest Python
  ``torch.autograd.Function`` that runs them (no checks, no choice of backend, no
  LLTMLayer): that ratio is lltm-core's own share, target <= 1.03x each, timed in
  rounds that hold only those two.  Rows without a target, timed together in rounds
  of their own, give the share again as read beside the floors, the whole cost against the bare
  kernels (no autograd; the bare side computes the sum too, and passes the
  expanded gradient autograd would) and the floors under it: the bare kernels
  followed by a Python autograd.Function that computes nothing (six saved tensors,
  as lltm_core's); the minimal Function itself; the same kernels in a C++
  torch::autograd::Function (floor_nodes.cpp, shared with autograd_floor.py; the row says so when
  it cannot be built); and LLTMLayer as it is but with that C++ node in place of
  lltm_core's Python autograd.Function.  Skipped, saying so, where lltm-cpu is not
  installed.
* **inference**: each v3 backend's ``sequence_forward`` with
  ``needs_backward=False`` (the input projected a chunk of steps at a time,
  nothing saved) against the same call with ``needs_backward=True`` (what every
  inference call ran before contract v3), at both sequence sizes of the
  benchmarks.  Target: no slower (<= 1.02x: two runs of one candidate differ by that here).

And one line on the cost of the per-call choice itself: ``select()`` for a
call, memoized, with and without a backend that declines calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import time
from pathlib import Path

import torch

import lltm_core
from lltm_core import _discovery, _registry, _sequence
from lltm_core._sequence import run_forward
from lltm_core.benchmarking import PhaseTimes, calls_for, interleaved
from lltm_core.testing import SeedLLTM

from lltm_core.benchmarking import busy_cpu_seconds, cpu_model, own_cpu_seconds  # noqa: E402

SEQUENCE_SIZES = {"T64 B16 I32 S128": (64, 16, 32, 128), "T32 B64 I256 S512": (32, 64, 256, 512)}


def per_round_ratios(baseline, candidate, rounds: int, calls: int) -> list[float]:
    """candidate's time / baseline's, one ratio a round (lltm_core.benchmarking: the order rotating)."""
    return interleaved({"b": baseline, "c": candidate}, rounds=rounds, calls=calls,
                       warmup=max(calls // 4, 3)).ratios("c", "b")


def row(label: str, ratios: list[float], target: float) -> tuple[str, bool]:
    median = statistics.median(ratios)
    met = median <= target
    return (f"| {label} | {median:.3f}x | {min(ratios):.3f}–{max(ratios):.3f} | <= {target:.2f}x "
            f"{'met' if met else 'MISSED'} |"), met


def per_round_times(candidates: dict, rounds: int, calls: int) -> list[dict]:
    """{name: seconds per call} per round, every candidate in each round, the order rotating."""
    timings = interleaved(candidates, rounds=rounds, calls=calls, warmup=max(calls // 4, 3))
    return [{name: t[0] for name, t in r.items()} for r in timings.rounds]


def cell_table(rounds: int) -> tuple[list[str], bool]:
    """The forward alone, the backward timed within a training step, and the whole step."""
    B, I, S = 16, 32, 128
    torch.manual_seed(0)
    seed, core = SeedLLTM(I, S), lltm_core.LLTM(I, S, backend="ref")
    core.load_state_dict(seed.state_dict())
    x, h, c = torch.randn(B, I), torch.randn(B, S), torch.randn(B, S)

    def forward(module):
        def run():
            module(x, (h, c))  # the graph built and freed, as a forward whose result is dropped
        return run

    def step(module):
        # The backward (about 0.1 ms) is timed directly: as (step less forward), two timings of separate
        # calls, it took the noise of both (its per-round ratio ranged from -0.7x to 2.6x).
        def run() -> PhaseTimes:
            start = time.perf_counter()
            new_h, new_c = module(x, (h, c))
            loss = new_h.sum() + new_c.sum()
            backward_start = time.perf_counter()
            loss.backward()
            backward_end = time.perf_counter()
            del new_h, new_c, loss  # the graph's last references: its teardown is the step's
            return PhaseTimes((backward_end - backward_start, time.perf_counter() - start))
        return run

    timings = interleaved({"seed f": forward(seed), "core f": forward(core), "seed step": step(seed),
                           "core step": step(core)}, rounds=rounds, calls=calls_for(forward(seed), 0.02), warmup=20)
    lines, ok = [], True
    for label, ratios in (("forward", timings.ratios("core f", "seed f")),
                          ("backward", timings.ratios("core step", "seed step", 0)),
                          ("forward + backward, the whole training step", timings.ratios("core step", "seed step", 1))):
        text, met = row(f"cell B{B} I{I} S{S}, {label}: LLTM(ref) / eager module", ratios, 1.10)
        lines.append(text)
        ok &= met
    return lines, ok


def sequence_table(rounds: int) -> tuple[list[str], bool]:
    if "cpu" not in lltm_core.available_backends():
        return ["| sequence: lltm-cpu is not installed here; nothing measured | | | |"], True
    T, B, I, S = SEQUENCE_SIZES["T64 B16 I32 S128"]
    torch.manual_seed(0)
    layer = lltm_core.LLTMLayer(I, S, backend="cpu")
    backend = lltm_core.get_backend("cpu")
    weights, bias = layer.weights_l0, layer.bias_l0
    x = torch.randn(T, B, I, requires_grad=True)
    zeros = torch.zeros(B, S)

    def layer_forward():
        with torch.no_grad():
            layer(x)

    def bare_forward():
        run_forward(backend, x.detach(), weights.detach(), bias.detach(), zeros, zeros, None, False, False)

    def layer_train():
        x.grad = weights.grad = bias.grad = None
        layer(x)[0].sum().backward()

    def bare_train():
        out = run_forward(backend, x.detach(), weights.detach(), bias.detach(), zeros, zeros, None, False, True)
        out[0].sum()  # the loss, which the LLTMLayer side computes too: not lltm-core's cost
        backend.sequence_backward(torch.ones(()).expand(T, B, S), torch.zeros(B, S), torch.zeros(B, S),
                                  weights.detach(), x.detach(), zeros, out[0], None, *out[3:], False, True)

    # The floor of any Python autograd.Function: one that runs no kernels, called right after
    # the bare kernels (as lltm_core's is), against the bare kernels alone.
    def noop_after_bare():
        bare_train()
        x.grad = weights.grad = bias.grad = None
        _no_op_apply(x, weights, bias).sum().backward()

    # The same kernels in the thinnest Python autograd.Function that runs them: what is left of the
    # second row's gap with none of lltm_core (no checks, no choice of backend, no LLTMLayer).
    def minimal_function_train():
        x.grad = weights.grad = bias.grad = None
        _minimal_sequence_apply(backend, x, weights, bias, zeros)[0].sum().backward()

    # Under no_grad the kernels are called as LLTMLayer calls them, needs_backward=False (nothing kept), so
    # that the share is lltm-core's code alone; what the kernels' inference path costs against keeping
    # everything is the inference rows' measure, and the row after the share gives the two together.
    def minimal_function_forward():
        with torch.no_grad():
            _minimal_sequence_apply(backend, x, weights, bias, zeros, False)

    def minimal_function_forward_keeping():
        with torch.no_grad():
            _minimal_sequence_apply(backend, x, weights, bias, zeros, True)

    # lltm-core's share is timed in rounds that hold only its two candidates, as the share is
    # defined; in rounds that also hold the floors, what runs just before a candidate can move it
    # by as much as the bar's margin (core_overhead.md).  That reading is kept as a row too.
    size = f"T{T} B{B} I{I} S{S}"
    share = per_round_times({"layer": layer_forward, "minimal": minimal_function_forward},
                            rounds, calls_for(layer_forward, 0.03))
    text, ok = row(f"sequence {size}, forward (no_grad): LLTMLayer(cpu) / the minimal Python autograd.Function, "
                   f"the same kernel call (lltm-core's share)", [t["layer"] / t["minimal"] for t in share], 1.03)
    lines = [text]
    inference = per_round_times({"bare": bare_forward, "layer": layer_forward, "minimal": minimal_function_forward,
                                 "minimal, keeping": minimal_function_forward_keeping},
                                rounds, calls_for(layer_forward, 0.03))
    lines.append(crowded_share_row(f"sequence {size}, forward (no_grad)", inference))
    ratios = [t["layer"] / t["minimal, keeping"] for t in inference]
    lines.append(f"| sequence {size}, forward (no_grad): LLTMLayer(cpu) / the minimal Function keeping what a "
                 f"backward needs (needs_backward=True) | {statistics.median(ratios):.3f}x | "
                 f"{min(ratios):.3f}–{max(ratios):.3f} | (none: lltm-core and the kernels' inference path) |")
    ratios = [t["layer"] / t["bare"] for t in inference]
    lines.append(f"| sequence {size}, forward (no_grad): LLTMLayer(cpu) / bare sequence kernels | "
                 f"{statistics.median(ratios):.3f}x | {min(ratios):.3f}–{max(ratios):.3f} | (none: the whole cost) |")

    # Forward + backward: LLTMLayer and the floors under it, all timed in the same rounds (the order
    # rotating), so that the rows compare with each other and not only with the bare kernels.
    training = {"bare": bare_train, "layer": layer_train, "no-op": noop_after_bare, "minimal": minimal_function_train}
    floors = [("no-op", "the bare kernels plus a no-op autograd.Function's forward + backward",
               "what any autograd.Function costs here"),
              ("minimal", "the same kernels in a minimal Python autograd.Function (no lltm_core)",
               "what a Python autograd.Function around these kernels costs")]
    # And in a C++ torch::autograd::Function: what taking the node out of Python would leave.
    node = _cpp_sequence_node()
    if not isinstance(node, str):
        def cpp_node_train():
            x.grad = weights.grad = bias.grad = None
            node.sequence(x, weights, bias, zeros)[0].sum().backward()

        # LLTMLayer as it is (every check, the choice of backend, its own Python), with that C++ node in
        # place of lltm_core's Python autograd.Function: what a backend-supplied C++ node would bring,
        # measured before anyone builds one.
        def cpp_node_in_layer(backend, input, weights, bias, h0, c0, lengths, reverse):
            assert h0 is c0 and lengths is None and not reverse  # the layer's zero-state call: the node's only one
            return node.sequence(input, weights, bias, h0)

        python_node = _sequence._apply_without_functorch

        def layer_with_cpp_node_train():
            _sequence._apply_without_functorch = cpp_node_in_layer
            try:
                layer_train()
            finally:
                _sequence._apply_without_functorch = python_node

        # Timed only if it computes what LLTMLayer computes: the same gradients through the C++ node
        # (within rounding: lltm-cpu may settle its GEMM routes during the first calls).
        grads = []
        for train in (layer_train, layer_with_cpp_node_train):
            train()
            train()
            grads.append([t.grad.clone() for t in (x, weights, bias)])
        for got, want in zip(*grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        training.update({"C++": cpp_node_train, "layer, C++": layer_with_cpp_node_train})
        floors += [("C++", "the same kernels in a C++ torch::autograd::Function (no Python around them)",
                    "what moving the autograd node to C++ would leave"),
                   ("layer, C++", "LLTMLayer with the C++ node in place of its Python autograd.Function",
                    "what lltm_core's Python costs around a C++ node")]
    share = per_round_times({"layer": layer_train, "minimal": minimal_function_train},
                            rounds, calls_for(bare_train, 0.03))
    text, met = row(f"sequence {size}, forward + backward: LLTMLayer(cpu) / the minimal Python autograd.Function "
                    f"(lltm-core's share)", [t["layer"] / t["minimal"] for t in share], 1.03)
    lines.append(text)
    times = per_round_times(training, rounds, calls_for(bare_train, 0.03))
    lines.append(crowded_share_row(f"sequence {size}, forward + backward", times))

    def against_bare(name: str) -> list[float]:
        return [t[name] / t["bare"] for t in times]

    ratios = against_bare("layer")
    lines.append(f"| sequence {size}, forward + backward: LLTMLayer(cpu) / bare sequence kernels | "
                 f"{statistics.median(ratios):.3f}x | {min(ratios):.3f}–{max(ratios):.3f} | (none: the whole cost) |")
    for name, label, meaning in floors:
        ratios = against_bare(name)
        lines.append(f"| floor: {label} / bare kernels | {statistics.median(ratios):.3f}x | "
                     f"{min(ratios):.3f}–{max(ratios):.3f} | (none: {meaning}) |")
    if isinstance(node, str):
        lines.append(f"| floor: the same kernels in a C++ torch::autograd::Function, alone and in LLTMLayer / bare "
                     f"kernels | not measured: {node} | | |")
    return lines, ok and met


def crowded_share_row(what: str, times: list[dict]) -> str:
    """lltm-core's share as read in rounds that also hold the floors (no target: the row above is the measure)."""
    ratios = [t["layer"] / t["minimal"] for t in times]
    return (f"| {what}: the same share, in rounds that also hold the floors | {statistics.median(ratios):.3f}x | "
            f"{min(ratios):.3f}–{max(ratios):.3f} | (none: what runs beside a candidate moves it) |")


def _cpp_sequence_node():
    """The compiled C++ nodes' module (floor_nodes.cpp, shared with autograd_floor.py), or why it could not be built."""
    from floor_nodes import build_floor_nodes

    return build_floor_nodes()


class _MinimalSequence(torch.autograd.Function):
    """lltm-cpu's sequence kernels with nothing around them but autograd: saves what _SequenceFunction saves."""

    @staticmethod
    def forward(ctx, backend, input, weights, bias, zeros, needs_backward=True):
        output, h_n, c_n, *saved = backend.sequence_forward(input, weights, bias, zeros, zeros, None, False,
                                                            needs_backward)
        ctx.backend = backend
        ctx.save_for_backward(input, weights, zeros, output, *saved)
        return output, h_n, c_n

    @staticmethod
    def backward(ctx, grad_output, grad_h_n, grad_c_n):
        input, weights, zeros, output, *saved = ctx.saved_tensors
        grad_input, grad_weights, grad_bias, _, _ = ctx.backend.sequence_backward(
            grad_output, grad_h_n, grad_c_n, weights, input, zeros, output, None, *saved, False, True)
        return None, grad_input, grad_weights, grad_bias, None, None


class _NoOp(torch.autograd.Function):
    """Saves six tensors and returns one, as _SequenceFunction does, and computes nothing."""

    @staticmethod
    def forward(ctx, input, weights, bias):
        ctx.save_for_backward(input, weights, bias, input, weights, bias)
        return input.new_empty(1)

    @staticmethod
    def backward(ctx, grad):
        ctx.saved_tensors
        return None, None, None


# Both floors call Function.apply as lltm_core calls its own (without the Python wrapper that only
# serves torch.func transforms, see lltm_core._sequence), so that they differ from it in nothing else.
_minimal_sequence_apply = super(torch.autograd.Function, _MinimalSequence).apply
_no_op_apply = super(torch.autograd.Function, _NoOp).apply


def inference_table(rounds: int) -> tuple[list[str], bool]:
    lines, ok = [], True
    for name in [n for n in ("ref", "cpu") if n in lltm_core.available_backends()]:
        backend = lltm_core.get_backend(name)
        if not backend.takes_needs_backward:
            lines.append(f"| inference on {name}: interface {list(backend.interface_versions)}, no needs_backward | | | |")
            continue
        for size, (T, B, I, S) in SEQUENCE_SIZES.items():
            torch.manual_seed(0)
            args = (torch.randn(T, B, I), torch.randn(3 * S, S + I) / (S + I) ** 0.5, torch.randn(3 * S),
                    torch.randn(B, S), torch.randn(B, S), None, False)
            with torch.no_grad():
                def keeping():
                    run_forward(backend, *args, True)

                def chunked():
                    run_forward(backend, *args, False)

                # "No slower": equal within the 2% that two runs of one candidate differ by here.
                text, met = row(f"inference {size} on {name}: needs_backward=False / True",
                                per_round_ratios(keeping, chunked, rounds, calls_for(keeping, 0.03)), 1.02)
            lines.append(text)
            ok &= met
    return lines, ok


def selection_line() -> str:
    """ns per memoized select() of one call: the steady state of every lltm() and lltm_sequence() call."""
    call = lltm_core.Call("sequence", "cpu", torch.float32, 16, 32, 128, 64, True)
    n = 200_000

    def per_call() -> float:
        select = _registry.select
        start = time.perf_counter_ns()
        for _ in range(n):
            select("cpu", torch.float32, call=call)
        return (time.perf_counter_ns() - start) / n

    plain = min(per_call() for _ in range(5))
    # The same with a backend that declines calls in front: select() asks it once, then looks the answer up.
    ref = lltm_core.get_backend("ref")
    declining = dataclasses.replace(ref, name="declining", priority=1000, interface_versions=(1, 2, 3),
                                    should_run=lambda c: c.state_size <= 64 or f"state_size {c.state_size} > 64")
    record = _discovery.BackendRecord("declining", "(this benchmark)", "0", "-", backend=declining, status="available")
    _discovery.records_by_name()["declining"] = [record]
    _registry.forget_choices()
    try:
        assert _registry.select("cpu", torch.float32, call=call).name != "declining"
        per_call_choice = min(per_call() for _ in range(5))
    finally:
        lltm_core.refresh()
    return (f"select() of one call, memoized: {plain:.0f} ns when no candidate declines calls, "
            f"{per_call_choice:.0f} ns with one that does (a dict lookup per call after the first)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=31)
    p.add_argument("--output", type=Path, help="also write the report (markdown) here")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2, this machine's cores)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    busy_before, own_before = busy_cpu_seconds(), own_cpu_seconds()
    started = time.perf_counter()
    lines = [f"CPU: {cpu_model()}; torch {torch.__version__} (CPU capability "
             f"{torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads, "
             f"Python {platform.python_version()}, {args.rounds} rounds", "",
             "| what | median ratio | range over rounds | target |", "|---|---|---|---|"]
    ok = True
    for table in (cell_table, sequence_table, inference_table):
        rows, met = table(args.rounds)
        lines += rows
        ok &= met
    lines += ["", selection_line()]
    if busy_before is not None:
        others = max((busy_cpu_seconds() - busy_before) - (own_cpu_seconds() - own_before), 0.0)
        lines.append(f"Other processes used {others:.1f} CPU-seconds during the {time.perf_counter() - started:.0f} s "
                     f"of this run.")
    report = "\n".join(lines)
    print(report)
    if args.output:
        args.output.write_text(report + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
