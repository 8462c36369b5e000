"""What one kernel boundary costs on this GPU: the first measurement of benchmarks/gpu_check.sh.

A sequence on the per-step path is a chain of dependent kernels, so the cost of a boundary bounds
it.  This measures, with torch alone (nothing built):
  - a chain of N dependent tiny kernels (an in-place add on one element), launched eagerly and
    replayed from one CUDA graph: device microseconds per kernel (CUDA events) and, from the
    profiler's kernel timestamps, each kernel's own duration and the gap before the next;
  - an empty-sized kernel plus a synchronise, timed on the host (the round trip a host loop pays);
  - the SM clock sampled every 20 ms by nvidia-smi in the background during the runs (not after
    them), with the performance state and the active clock-event reasons, per phase.
Run from anywhere on a CUDA machine::

    python benchmarks/kernel_boundary.py [--chain 2000] [--markdown FILE]

Without a GPU it says so and exits 0 (gpu_check.sh's dry run).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


class ClockSampler:
    """nvidia-smi -lms 20 in the background; phase(name) marks which samples belong to what."""

    FIELDS = "timestamp,clocks.sm,clocks.max.sm,pstate,clocks_event_reasons.active"

    def __init__(self):
        self.file = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
        self.marks: list[tuple[float, str]] = []
        try:
            self.process = subprocess.Popen(["nvidia-smi", f"--query-gpu={self.FIELDS}", "--format=csv,noheader,nounits",
                                             "-lms", "20"], stdout=self.file, stderr=subprocess.DEVNULL)
        except OSError:
            self.process = None
        self.start = time.time()

    def phase(self, name: str) -> None:
        self.marks.append((time.time(), name))

    def summary(self) -> list[str]:
        if self.process is None:
            return ["SM clock: nvidia-smi not available"]
        self.process.terminate()
        self.process.wait(timeout=10)
        samples = []  # (seconds since start of the file's first sample, MHz, max MHz, pstate, reasons)
        for line in Path(self.file.name).read_text().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 5 or not parts[1].isdigit():
                continue
            stamp = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
            stamp += float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
            samples.append((stamp, int(parts[1]), parts[2], parts[3], parts[4]))
        lines = []
        bounds = self.marks + [(time.time(), "")]
        for (begin, name), (end, _) in zip(bounds, bounds[1:]):
            inside = [s for s in samples if begin <= s[0] < end]
            if inside:
                clocks = [s[1] for s in inside]
                lines.append(f"SM clock during {name}: median {statistics.median(clocks)} MHz (min {min(clocks)}, "
                             f"max {max(clocks)}, of max {inside[0][2]} MHz), pstate {inside[-1][3]}, "
                             f"event reasons {inside[-1][4]}, {len(inside)} samples")
            else:
                lines.append(f"SM clock during {name}: no sample (the phase was shorter than 20 ms)")
        return lines


def chain_events_us(run, kernels: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / kernels


def kernel_gaps_us(run) -> tuple[float, float, int]:
    """Median kernel duration and median gap between consecutive kernels, from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    if len(spans) < 2:
        return float("nan"), float("nan"), len(spans)
    durations = [end - start for start, end in spans]
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:])]
    return statistics.median(durations), statistics.median(gaps), len(spans)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chain", type=int, default=2000, help="dependent kernels in the chain")
    parser.add_argument("--markdown", help="also write the results to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("kernel_boundary.py: no CUDA device: nothing to measure")
        return 0
    lines = [f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
             f"chain of {args.chain} dependent kernels"]
    x = torch.zeros(1, device="cuda")

    def eager():
        for _ in range(args.chain):
            x.add_(1)

    eager()  # warm: the kernel loaded, the allocator settled
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        eager()  # a warm-up on the side stream, as graph capture asks
        with torch.cuda.graph(graph, stream=stream):
            eager()
    torch.cuda.synchronize()

    clock = ClockSampler()
    time.sleep(0.1)  # an idle sample first
    clock.phase("eager chain")
    eager_us = statistics.median(chain_events_us(eager, args.chain) for _ in range(5))
    clock.phase("graph replay")
    graph_us = statistics.median(chain_events_us(graph.replay, args.chain) for _ in range(5))
    clock.phase("kernel + synchronise")
    round_trips = []
    for _ in range(200):
        begin = time.perf_counter()
        x.add_(1)
        torch.cuda.synchronize()
        round_trips.append((time.perf_counter() - begin) * 1e6)
    clock.phase("profiled chains")
    eager_kernel, eager_gap, eager_n = kernel_gaps_us(eager)
    graph_kernel, graph_gap, graph_n = kernel_gaps_us(graph.replay)
    clock.phase("idle after")
    time.sleep(0.1)
    lines += [
        f"eager chain: {eager_us:.2f} us of device time per kernel (CUDA events, median of 5 chains)",
        f"graph replay: {graph_us:.2f} us per kernel",
        f"profiler, eager: kernel {eager_kernel:.2f} us, gap before the next {eager_gap:.2f} us (medians of {eager_n})",
        f"profiler, graph: kernel {graph_kernel:.2f} us, gap before the next {graph_gap:.2f} us (medians of {graph_n})",
        f"one tiny kernel + synchronise, host time: median {statistics.median(round_trips):.1f} us, "
        f"min {min(round_trips):.1f} us (200 runs)",
        *clock.summary(),
    ]
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(f"- {line}" for line in lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
