#!/usr/bin/env python3
"""lltm-cpu's fused sequence kernels against torch.nn.LSTM on this CPU, with the GEMM routes they chose.

Measures, in one process and interleaved round by round, one layer in one direction over a whole
sequence, at two sizes (T64 B16 I32 S128 and T32 B64 I256 S512) in float32 and bfloat16, on torch's
thread count (--threads, default 2):

* nn.LSTM: torch.nn.LSTM(I, S) in the same dtype (oneDNN's fused LSTM), the baseline;
* lltm cpu (LLTMLayer): lltm_core.LLTMLayer(I, S, backend="cpu"), lltm-cpu's sequence operators
  behind lltm-core's autograd;
* sequence ops: torch.ops.lltm_cpu.sequence_forward / sequence_backward called directly
  (no lltm-core, no autograd);
* per-step loop: lltm_core.LLTM(I, S, backend="cpu") called once per step in Python;
* LLTMLayer, deterministic: the same LLTMLayer under torch.use_deterministic_algorithms(True), where
  lltm-cpu times nothing and takes a fixed choice of routes and split (docs/backends/cpu.md): what
  reproducibility costs, against the measured choice in the same rounds.

Training is forward + backward of output.sum() (the input requiring grad, gradients reset before each
call), inference the forward under torch.no_grad(); zero initial state.  Each round times every
candidate --calls times in turn (the order rotating), and a ratio is candidate / nn.LSTM within the
round; the report gives each ratio's median over the rounds, checked against the targets, the median
times, and lltm_cpu.gemm_routes(): each GEMM's and time loop's chosen route with what every candidate
measured.  Prints Markdown (also written to --output); sets no tuning variable and reports any set.

The roofline columns: each row's multiply-adds a second (the GEMMs' work: an LLTM step is a
B x 3S x (S+I) product forward, nn.LSTM's B x 4S x (S+I), and training three such products), and
their fraction of the machine's peak, measured in the same process on the same threads by
machine_peak.cpp (compiled here): the float32 FMA peak for float32 rows, for bfloat16 rows AMX's
tile peak where the CPU has it, else the AVX512_BF16 dot-product peak.

    python benchmarks/bench_cpu_sequence.py                  # everything: about 3 minutes on 2 AVX-512 cores,
                                                             # 17 on AVX2 only (nn.LSTM's bfloat16 is 8 s a call)
    python benchmarks/bench_cpu_sequence.py --rounds 5      # a quick check of direction
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

import lltm_core
import lltm_cpu
from pointwise_pass import cpu_flags

SIZES = {"T64 B16 I32 S128": (64, 16, 32, 128), "T32 B64 I256 S512": (32, 64, 256, 512)}
# (dtype, size) -> (training bar, inference bar): LLTMLayer / nn.LSTM, medians of per-round ratios.
TARGETS = {
    ("float32", "T64 B16 I32 S128"): (0.55, 0.75),
    ("float32", "T32 B64 I256 S512"): (0.65, 0.80),
    ("bfloat16", "T64 B16 I32 S128"): (0.80, 1.00),
    ("bfloat16", "T32 B64 I256 S512"): (0.80, 1.00),
}
BASELINE, LAYER, OPS, LOOP = "nn.LSTM", "lltm cpu (LLTMLayer)", "sequence ops", "per-step loop"
FIXED = "LLTMLayer, deterministic"  # under torch.use_deterministic_algorithms(True): lltm-cpu's fixed choice
HERE = Path(__file__).resolve().parent
# machine_peak.cpp's kernels: (its number, the name reported, the /proc/cpuinfo flags it needs).
PEAK_KERNELS = [
    (1, "float32 FMA (AVX-512)", {"avx512f"}),
    (0, "float32 FMA (AVX2)", {"avx2", "fma"}),
    (2, "bfloat16 dot product (AVX512_BF16)", {"avx512f", "avx512_bf16"}),
    (3, "bfloat16 tiles (AMX-BF16)", {"amx_tile", "amx_bf16"}),
]


def multiply_adds(name: str, mode: str, steps: int, batch: int, features: int, state: int) -> int:
    """The GEMMs' multiply-adds of one call: the gates' product per step forward (3 gates for the
    LLTM, 4 for nn.LSTM), and for training the input and weight gradients' two more."""
    gates = 4 if name == BASELINE else 3
    return steps * batch * gates * state * (state + features) * (3 if mode == "fwd+bwd" else 1)


def machine_peaks(threads: int) -> dict[str, float]:
    """{kernel: multiply-adds a second on `threads` threads at once}, for each of machine_peak.cpp's
    kernels this CPU has, each the best of 5 runs of about 0.1 s."""
    flags = cpu_flags()
    with tempfile.TemporaryDirectory(prefix="lltm-peak-") as scratch:
        library = Path(scratch) / "machine_peak.so"
        compile_command = ["c++", "-std=c++17", "-O3", "-shared", "-fPIC", "-pthread", str(HERE / "machine_peak.cpp"),
                           "-o", str(library)]
        # A compiler without AMX builds the others.
        if subprocess.run([*compile_command, "-DMACHINE_PEAK_AMX"], capture_output=True).returncode != 0:
            subprocess.run(compile_command, check=True)
        peak = ctypes.CDLL(str(library)).machine_peak
        peak.restype = ctypes.c_double
        peak.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int]
        peaks = {}
        for which, name, needs in PEAK_KERNELS:
            if needs <= flags:
                rate = peak(which, threads, 1_000_000 if "AMX" in name else 10_000_000, 5)
                if rate > 0:
                    peaks[name] = rate
    return peaks


def roofline_peak(peaks: dict[str, float], dtype_name: str) -> tuple[str, float] | None:
    """The peak a row of this dtype is held against: the widest float32 FMA, or bfloat16's widest
    (AMX's tiles where Linux grants them, which lltm-cpu's amx-bf16 route uses, else AVX512_BF16's dot
    product)."""
    wanted = ["float32 FMA (AVX-512)", "float32 FMA (AVX2)"] if dtype_name == "float32" else [
        "bfloat16 tiles (AMX-BF16)", "bfloat16 dot product (AVX512_BF16)"]
    return next(((name, peaks[name]) for name in wanted if name in peaks), None)


def candidates(dtype: torch.dtype, steps: int, batch: int, features: int, state: int) -> dict:
    """name -> (training call, inference call), each on the same random input."""
    torch.manual_seed(0)
    x = torch.randn(steps, batch, features, dtype=dtype, requires_grad=True)
    lstm = torch.nn.LSTM(features, state).to(dtype)
    layer = lltm_core.LLTMLayer(features, state, backend="cpu").to(dtype)
    cell = lltm_core.LLTM(features, state, backend="cpu").to(dtype)
    weights, bias = layer.weights_l0, layer.bias_l0
    zeros = torch.zeros(batch, state, dtype=dtype)

    def train(forward):
        def run():
            for p in (x, *lstm.parameters(), *layer.parameters(), *cell.parameters()):
                p.grad = None
            forward().sum().backward()
        return run

    def infer(forward):
        def run():
            with torch.no_grad():
                forward()
        return run

    def deterministic(run):
        def fixed():
            torch.use_deterministic_algorithms(True)
            try:
                run()
            finally:
                torch.use_deterministic_algorithms(False)
        return fixed

    def loop():
        h, c = zeros, zeros
        outputs = []
        for t in range(steps):
            h, c = cell(x[t], (h, c))
            outputs.append(h)
        return torch.stack(outputs)

    ops = torch.ops.lltm_cpu
    w, b = weights.detach(), bias.detach()

    def ops_train():
        xd = x.detach()
        out = ops.sequence_forward(xd, w, b, zeros, zeros, None, False, True)
        grad = torch.ones_like(out[0])
        ops.sequence_backward(grad, zeros, zeros, w, xd, zeros, out[0], None, out[3], out[4], False, True)

    return {
        BASELINE: (train(lambda: lstm(x)[0]), infer(lambda: lstm(x)[0])),
        LAYER: (train(lambda: layer(x)[0]), infer(lambda: layer(x)[0])),
        OPS: (ops_train, infer(lambda: ops.sequence_forward(x, w, b, zeros, zeros, None, False, False)[0])),
        LOOP: (train(loop), infer(loop)),
        FIXED: (deterministic(train(lambda: layer(x)[0])), deterministic(infer(lambda: layer(x)[0]))),
    }


def measure(calls_by_name: dict, rounds: int, calls: int) -> tuple[dict, dict]:
    """(name -> list of per-round median seconds, name -> median seconds of each call's place in its
    round), the candidates interleaved, their order rotating.  The second shows what the first call
    after another candidate costs against the later ones."""
    names = list(calls_by_name)
    for call in calls_by_name.values():  # first calls: route tuning, allocations
        call()
    times = {name: [] for name in names}
    samples_by_place = {name: [[] for _ in range(calls)] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            samples = []
            for place in range(calls):
                start = time.perf_counter()
                calls_by_name[name]()
                samples.append(time.perf_counter() - start)
                samples_by_place[name][place].append(samples[-1])
            times[name].append(statistics.median(samples))
    by_place = {name: [statistics.median(place) for place in places] for name, places in samples_by_place.items()}
    return times, by_place


def per_round(times: dict, name: str) -> list[float]:
    """name's time / nn.LSTM's time, round by round."""
    return [t / b for t, b in zip(times[name], times[BASELINE])]


def ratios(times: dict) -> dict:
    """name -> median over rounds of (name's time / nn.LSTM's time in the same round)."""
    return {name: statistics.median(per_round(times, name)) for name in times}


def quartiles(times: dict, name: str) -> str:
    """The first and third quartiles of name's per-round ratios to nn.LSTM, "0.55-0.61": how far a
    median's distance from its bar stands out of the machine's noise."""
    if len(times[name]) < 2:
        return "-"
    first, _, third = statistics.quantiles(per_round(times, name), n=4)
    return f"{first:.2f}-{third:.2f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per case (default 15)")
    parser.add_argument("--calls", type=int, default=3, help="calls of each candidate per round (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated (default float32,bfloat16)")
    parser.add_argument("--output", help="also write the report to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if lltm_core.get_backend("cpu") is None or "cpu" not in lltm_core.available_backends():
        parser.error("lltm-cpu is not available here: lltm info says why")

    settings = {v: os.environ.get(v, "(unset)") for v in ("LLTM_CPU_GEMM", "LLTM_CPU_SPLIT", "ATEN_CPU_CAPABILITY")}
    lines = [
        "# lltm-cpu sequence kernels against torch.nn.LSTM",
        "",
        f"{datetime.date.today().isoformat()}; CPU: {lltm_cpu.cpu_info()}; {args.threads} threads; "
        f"torch {torch.__version__}, Python {platform.python_version()}; "
        + ", ".join(f"{k}={v}" for k, v in settings.items()) + f"; load average at start {os.getloadavg()[0]:.2f}.",
        "",
        f"Command: `python benchmarks/bench_cpu_sequence.py --rounds {args.rounds} --calls {args.calls} "
        f"--threads {args.threads} --dtypes {args.dtypes}`",
        "",
    ]
    peaks = machine_peaks(args.threads)
    results = {}
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for size, shape in SIZES.items():
            cases = candidates(dtype, *shape)
            for mode, index in (("fwd+bwd", 0), ("fwd", 1)):
                times, by_place = measure({name: calls[index] for name, calls in cases.items()}, args.rounds,
                                          args.calls)
                results[dtype_name, size, mode] = (times, ratios(times), by_place)
    # Measured before and after: a neighbour's burst on a shared machine lowers one of them.
    peaks = {name: max(rate, peaks[name]) for name, rate in machine_peaks(args.threads).items() if name in peaks}
    lines += ["## The machine's peak (machine_peak.cpp, all threads at once, in this process, the higher of "
              "before and after the timings)", "",
              "| kernel | G multiply-adds / s |", "| --- | --- |"]
    lines += [f"| {name} | {rate / 1e9:.1f} |" for name, rate in peaks.items()] or ["| (none measured) | |"]
    lines.append("")
    lines += ["## Targets (LLTMLayer / nn.LSTM, median of per-round ratios, and their quartiles)", "",
              "| dtype | size | fwd+bwd | quartiles | bar | fwd | quartiles | bar | met | fwd+bwd of peak: lltm-cpu / nn.LSTM |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (dtype_name, size), (train_bar, infer_bar) in TARGETS.items():
        if (dtype_name, size, "fwd") not in results:
            continue
        train = results[dtype_name, size, "fwd+bwd"][1][LAYER]
        infer = results[dtype_name, size, "fwd"][1][LAYER]
        met = ", ".join(f"{mode} {'yes' if ratio <= bar else 'no'}"
                        for mode, ratio, bar in (("fwd+bwd", train, train_bar), ("fwd", infer, infer_bar)))
        held_against = roofline_peak(peaks, dtype_name)
        times = results[dtype_name, size, "fwd+bwd"][0]
        fractions = "/".join(
            f"{multiply_adds(name, 'fwd+bwd', *SIZES[size]) / statistics.median(times[name]) / held_against[1]:.0%}"
            for name in (LAYER, BASELINE)) if held_against else "-"
        # Three decimals: a ratio printed 0.65 may be above a 0.65 bar.
        spread = {mode: quartiles(results[dtype_name, size, mode][0], LAYER) for mode in ("fwd+bwd", "fwd")}
        lines.append(f"| {dtype_name} | {size} | {train:.3f} | {spread['fwd+bwd']} | ≤ {train_bar:.2f} | {infer:.3f} | "
                     f"{spread['fwd']} | ≤ {infer_bar:.2f} | {met} | {fractions} |")
    lines.append("")
    for (dtype_name, size, mode), (times, ratio, by_place) in results.items():
        held_against = roofline_peak(peaks, dtype_name)
        lines += [f"## {dtype_name} {size} {mode}", "",
                  f"Fraction of peak: of the {held_against[0] if held_against else '(no peak measured)'} peak.", "",
                  "| candidate | median ms | / nn.LSTM | G multiply-adds / s | of peak | ms by call in its round (1st, 2nd, ...) |",
                  "| --- | --- | --- | --- | --- | --- |"]
        fixed_cost = statistics.median(f / m for f, m in zip(times[FIXED], times[LAYER]))
        for name in times:
            places = ", ".join(f"{t * 1e3:.3f}" for t in by_place[name])
            median = statistics.median(times[name])
            rate = multiply_adds(name, mode, *SIZES[size]) / median
            fraction = f"{rate / held_against[1]:.0%}" if held_against else "-"
            lines.append(f"| {name} | {median * 1e3:.3f} | {ratio[name]:.2f} | {rate / 1e9:.1f} | {fraction} | {places} |")
        lines += ["", f"The deterministic choice / the measured one (median of per-round ratios): {fixed_cost:.3f}", ""]
    lines += ["## Routes lltm-cpu chose in this process (lltm_cpu.gemm_routes())", "",
              "| choice | chosen | how | measured (µs) |", "| --- | --- | --- | --- |"]
    for record in lltm_cpu.gemm_routes():
        measured = ", ".join(f"{k} {v:.3g}" for k, v in record["measured_us"].items())
        lines.append(f"| {record['key']} | {record['chosen']} | {record['source']} | {measured} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        with open(args.output, "w") as f:
            f.write(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
