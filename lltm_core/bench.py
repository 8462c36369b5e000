"""Time every available backend against its peers: the cell, then the sequence.

The cell table is the tutorial's benchmark: one forward call, synchronise, one
backward call of ``(new_h.sum() + new_cell.sum())``, synchronise, each timed
on its own, against the tutorial's eager module and torch.compile of it.  The
sequence table times a whole sequence: the forward under ``torch.no_grad()``,
and the forward plus the backward of ``output.sum()``, against
``torch.nn.LSTM`` (oneDNN on CPU, cuDNN on GPU) and the per-step loop of
``lltm_core.LLTM`` on the best backend.

Candidates are measured in alternating rounds inside one process, so a noisy
machine slows them all alike and the ratios stay meaningful.  A backend whose
outputs or gradients disagree with the reference is reported as failing and
not timed; one that raises, and a torch.compile peer that cannot build, fail
alone while the rest are timed; a backend that cannot take a group's tensors
(or is unavailable, or disabled) gets a skipped row saying why.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict

import torch

from ._bench_groups import _DTYPES, DEFAULT_SEQ_LEN, PRESETS, TABLES, benchmark
from ._bench_report import check_plot_target, format_sequence_table, format_table, plot
from ._device import cuda_unavailable_reason, device_unavailable_reason

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", action="append", default=[], metavar="B,I,S",
                   help="batch,input_features,state_size (repeatable; default: the tutorial's 16,32,128)")
    p.add_argument("--preset", action="append", default=[], choices=sorted(PRESETS),
                   help="named sizes: " + "; ".join(f"{k}={v[0][0]},{v[0][1]},{v[0][2]}" for k, v in PRESETS.items()))
    p.add_argument("--backend", action="append", default=[], metavar="NAME",
                   help="backend to time (repeatable; default: every available one)")
    p.add_argument("--device", action="append", default=[], metavar="DEVICE",
                   help="cpu or cuda (repeatable; default: every available device)")
    p.add_argument("--dtype", action="append", default=[], choices=sorted(_DTYPES), help="default: float32")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=float, default=None,
                        help="time spent measuring each candidate per size (default: 2)")
    budget.add_argument("--iterations", type=int, default=None, help="forward+backward calls per candidate per size")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer (saves its compile time)")
    p.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, metavar="T",
                   help=f"time steps of the sequence table (default: {DEFAULT_SEQ_LEN}); its B, I, S are --size's")
    p.add_argument("--table", action="append", default=[], choices=TABLES,
                   help="which tables to measure (repeatable; default: both)")
    p.add_argument("--json", action="store_true", help="print results as JSON instead of a table")
    p.add_argument("--plot", metavar="FILE.png", help="also write a bar chart (needs matplotlib)")


def _parse_size(text: str) -> tuple[int, int, int]:
    try:
        b, i, s = (int(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"lltm bench: --size takes B,I,S (three integers), got {text!r}") from None
    if min(b, i, s) < 1:
        raise SystemExit(f"lltm bench: --size values must be >= 1, got {text!r}")
    return b, i, s


def _usable_devices() -> list[str]:
    return ["cpu"] + (["cuda"] if cuda_unavailable_reason() is None else [])


def _check_device(text: str) -> str:
    """``text`` if it names a device this machine has (cpu, cuda, cuda:N), else exit saying why not."""
    try:
        device = torch.device(text)
    except RuntimeError:
        raise SystemExit(f"lltm bench: --device takes cpu, cuda or cuda:N, got {text!r}") from None
    if device.type == "cpu":
        return text
    if device.type != "cuda":
        raise SystemExit(f"lltm bench: --device takes cpu, cuda or cuda:N, got {text!r}")
    reason = device_unavailable_reason(device)
    if reason is not None:
        raise SystemExit(f"lltm bench: --device {text}: {reason}")
    return text


class _Progress:
    """A one-line progress bar on stderr, only when stderr is a terminal."""

    def __init__(self, total: int):
        self.total, self.done, self.enabled = total, 0, sys.stderr.isatty()

    def step(self, label: str) -> None:
        """Group ``label`` starts: the bar shows the groups finished before it."""
        if self.enabled:
            width = 30
            filled = int(width * self.done / max(self.total, 1))
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                             f"measuring {label[:40]:<40}")
            sys.stderr.flush()
        self.done += 1

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()


def run(args) -> int:
    # A size given twice (or by --size and a preset) is measured once, like a repeated --backend.
    sizes = list(dict.fromkeys([_parse_size(s) for s in args.size] + [s for p in args.preset for s in PRESETS[p]]))
    sizes = sizes or PRESETS["seed"]
    devices = [_check_device(d) for d in args.device] or _usable_devices()
    if args.seconds is not None and not (math.isfinite(args.seconds) and args.seconds > 0):
        raise SystemExit(f"lltm bench: --seconds takes a number of seconds > 0, got {args.seconds}")
    if args.iterations is not None and args.iterations < 1:
        raise SystemExit(f"lltm bench: --iterations takes a count >= 1, got {args.iterations}")
    if args.plot:
        check_plot_target(args.plot)
    if args.seq_len < 1:
        raise SystemExit(f"lltm bench: --seq-len takes a number of time steps >= 1, got {args.seq_len}")
    tables = [t for t in TABLES if t in args.table] or list(TABLES)
    dtypes = [_DTYPES[d] for d in args.dtype] or [torch.float32]
    seconds = args.seconds if args.seconds is not None or args.iterations is not None else 2.0
    groups = len(tables) * len(devices) * len(dtypes) * len(sizes)
    progress = _Progress(groups)
    try:
        results, interrupted = benchmark(sizes, devices, dtypes, args.backend, seconds=seconds,
                                         iterations=args.iterations, compile_peer=not args.no_compile,
                                         on_group=progress.step, tables=tables, seq_len=args.seq_len)
    finally:
        progress.close()
    if args.json:
        json.dump({"torch": torch.__version__, "interrupted": interrupted, "results": [asdict(r) for r in results]},
                  sys.stdout, indent=2)
        print()
    else:
        print(f"LLTM benchmark, torch {torch.__version__}, {torch.get_num_threads()} CPU threads.")
        if "cell" in tables:
            print("The cell, per call: forward, then backward of (new_h.sum() + new_cell.sum()), each synchronised.")
            cell = [r for r in results if r.table == "cell"]
            print(format_table(cell) if cell else "  nothing measured")
        if "sequence" in tables:
            print(f"\nThe sequence ({args.seq_len} steps), per call: forward under torch.no_grad(), then forward "
                  f"and backward of output.sum(), each synchronised.")
            sequence = [r for r in results if r.table == "sequence"]
            print(format_sequence_table(sequence) if sequence else "  nothing measured")
        if interrupted:
            print("(interrupted: the table shows what was measured before Ctrl-C)")
    if args.plot and any(r.status == "ok" for r in results):
        plot(results, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    failed = [r for r in results if r.status == "failed"]
    return 130 if interrupted else (1 if failed else 0)
