"""Time every available backend against the tutorial's eager module and torch.compile of it.

The method is the tutorial's: one forward call, synchronise, one backward call
of ``(new_h.sum() + new_cell.sum())``, synchronise, each timed on its own.
Candidates are measured in alternating rounds inside one process, so a noisy
machine slows them all alike and the ratios stay meaningful.  A backend whose
outputs or gradients disagree with the reference is reported as failing and
not timed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from . import LLTM, available_backends, get_backend
from ._device import cuda_unavailable_reason
from ._registry import BackendError
from .testing import SeedLLTM, compare_with_reference, tolerance

PRESETS = {
    "seed": [(16, 32, 128)],
    "medium": [(64, 256, 512)],
    "large": [(256, 256, 1024)],
}
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
EAGER, COMPILED = "eager (seed module)", "torch.compile (seed module)"


@dataclass
class Result:
    candidate: str
    device: str
    dtype: str
    size: str
    status: str = "ok"  # ok | failed | skipped
    detail: str = ""
    forward_us: dict = field(default_factory=dict)  # mean / median per call
    backward_us: dict = field(default_factory=dict)
    calls: int = 0
    speedup_vs_eager: dict = field(default_factory=dict)
    speedup_vs_compile: dict = field(default_factory=dict)


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


def _sync(device: str):
    if device == "cuda":
        return torch.cuda.synchronize
    return lambda: None


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


def _time_one_call(model, x, state, sync, fwd: list, bwd: list) -> None:
    start = time.perf_counter()
    new_h, new_cell = model(x, state)
    sync()
    mid = time.perf_counter()
    (new_h.sum() + new_cell.sum()).backward()
    sync()
    end = time.perf_counter()
    fwd.append(mid - start)
    bwd.append(end - mid)


def _summary(samples: list[float]) -> dict:
    return {"mean": statistics.fmean(samples) * 1e6, "median": statistics.median(samples) * 1e6}


def _measure_group(candidates: dict, x, state, device: str, seconds: float | None, iterations: int | None):
    """Alternate the candidates in rounds until each has its budget.

    Returns (name -> (fwd, bwd) samples, interrupted): on Ctrl-C, what was
    measured so far.
    """
    sync = _sync(device)
    samples = {name: ([], []) for name in candidates}
    per_round = 10
    spent = {name: 0.0 for name in candidates}
    try:
        for model in candidates.values():  # warm-up: first-call allocations, compilation
            for _ in range(3):
                _time_one_call(model, x, state, sync, [], [])
        while True:
            for name, model in candidates.items():
                fwd, bwd = samples[name]
                for _ in range(per_round):
                    _time_one_call(model, x, state, sync, fwd, bwd)
                spent[name] = sum(fwd) + sum(bwd)
            if iterations is not None:
                if all(len(s[0]) >= iterations for s in samples.values()):
                    return samples, False
            elif all(v >= seconds for v in spent.values()):
                return samples, False
    except KeyboardInterrupt:
        # a forward may have finished without its backward: keep whole calls only
        for fwd, bwd in samples.values():
            del fwd[len(bwd):]
        return {k: v for k, v in samples.items() if v[1]}, True


def _verify(name: str, device: str, dtype: torch.dtype, size) -> str | None:
    """None if backend ``name`` matches the reference on fresh inputs of this size, else what differs."""
    from .testing import make_inputs

    errors = compare_with_reference(name, make_inputs(*size, dtype=dtype, device=device))
    tol = tolerance(dtype)
    bad = {k: v for k, v in errors.items() if not v <= tol}
    if bad:
        return "disagrees with the reference: " + ", ".join(f"{k} rel. error {v:.2g} > {tol:g}" for k, v in bad.items())
    return None


def benchmark(sizes, devices, dtypes, backends, *, seconds=None, iterations=None, compile_peer=True,
              on_group=lambda label: None):
    """Yield a :class:`Result` per candidate, group by group; see the module docstring.

    ``on_group(label)`` is called as each (device, dtype, size) group starts.
    """
    for device in devices:
        for dtype in dtypes:
            for size in sizes:
                B, I, S = size
                label = f"B{B} I{I} S{S}"
                dname = str(dtype)[6:]
                on_group(f"{device} {dname} {label}")
                torch.manual_seed(0)
                seed_module = SeedLLTM(I, S, device=device, dtype=dtype)
                x = torch.randn(B, I, device=device, dtype=dtype)
                state = (torch.randn(B, S, device=device, dtype=dtype), torch.randn(B, S, device=device, dtype=dtype))
                candidates = {EAGER: seed_module}
                if compile_peer:
                    candidates[COMPILED] = torch.compile(seed_module)
                results = {}
                for name in backends or available_backends():
                    try:
                        get_backend(name, device=device, dtype=dtype)
                    except BackendError as exc:
                        if backends:  # asked for explicitly: say why it was not timed
                            results[name] = Result(name, device, dname, label, "failed", str(exc))
                        continue
                    problem = _verify(name, device, dtype, size)
                    if problem:
                        results[name] = Result(name, device, dname, label, "failed", problem)
                        continue
                    module = LLTM(I, S, backend=name, device=device, dtype=dtype)
                    module.load_state_dict(seed_module.state_dict())
                    candidates[name] = module
                samples, interrupted = _measure_group(candidates, x, state, device, seconds, iterations)
                base = {k: (_summary(f), _summary(b)) for k, (f, b) in samples.items()}
                for name, (fwd, bwd) in base.items():
                    r = Result(name, device, dname, label, forward_us=fwd, backward_us=bwd, calls=len(samples[name][0]))
                    for peer, attr in ((EAGER, "speedup_vs_eager"), (COMPILED, "speedup_vs_compile")):
                        if peer in base and name != peer:
                            pf, pb = base[peer]
                            setattr(r, attr, {"forward": pf["median"] / fwd["median"], "backward": pb["median"] / bwd["median"]})
                    results[name] = r
                for r in results.values():
                    yield r
                if interrupted:
                    raise KeyboardInterrupt


def _fmt_us(d: dict) -> str:
    return f"{d['median']:.1f} ({d['mean']:.1f})" if d else "-"


def _fmt_x(d: dict) -> str:
    return f"{d['forward']:.2f}x / {d['backward']:.2f}x" if d else "-"


def format_table(results: list[Result]) -> str:
    from .cli import _table

    rows = []
    for r in results:
        if r.status != "ok":
            rows.append([r.candidate, r.device, r.dtype, r.size, r.status.upper(), "", "", r.detail])
            continue
        rows.append([r.candidate, r.device, r.dtype, r.size, _fmt_us(r.forward_us), _fmt_us(r.backward_us),
                     _fmt_x(r.speedup_vs_eager), _fmt_x(r.speedup_vs_compile)])
    header = ["candidate", "device", "dtype", "size", "forward us: median (mean)", "backward us: median (mean)",
              "speed-up vs eager fwd / bwd", "vs torch.compile fwd / bwd"]
    return _table(rows, header)


def plot(results: list[Result], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("lltm bench --plot needs matplotlib: pip install matplotlib (or pip install 'lltm-core[plot]')") from None
    ok = [r for r in results if r.status == "ok"]
    groups = sorted({(r.device, r.dtype, r.size) for r in ok})
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for ax, group in zip(axes[0], groups):
        rows = [r for r in ok if (r.device, r.dtype, r.size) == group]
        names = [r.candidate.replace(" (seed module)", "\n(seed module)") for r in rows]
        xs = range(len(rows))
        ax.bar([i - 0.2 for i in xs], [r.forward_us["median"] for r in rows], width=0.4, label="forward")
        ax.bar([i + 0.2 for i in xs], [r.backward_us["median"] for r in rows], width=0.4, label="backward")
        ax.set_xticks(list(xs), names, fontsize=8)
        ax.set_ylabel("median time per call (us)")
        ax.set_title(f"LLTM {group[2]}, {group[0]} {group[1]}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args) -> int:
    sizes = [_parse_size(s) for s in args.size] + [s for p in args.preset for s in PRESETS[p]]
    sizes = sizes or PRESETS["seed"]
    devices = args.device or _usable_devices()
    for d in devices:
        if d not in _usable_devices():
            raise SystemExit(f"lltm bench: device {d!r} is not available here (available: {', '.join(_usable_devices())})")
    dtypes = [_DTYPES[d] for d in args.dtype] or [torch.float32]
    seconds = args.seconds if args.seconds is not None or args.iterations is not None else 2.0
    groups = len(devices) * len(dtypes) * len(sizes)
    progress = _Progress(groups)
    results: list[Result] = []
    interrupted = False
    try:
        for r in benchmark(sizes, devices, dtypes, args.backend, seconds=seconds, iterations=args.iterations,
                           compile_peer=not args.no_compile, on_group=progress.step):
            results.append(r)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        progress.close()
    if args.json:
        json.dump({"torch": torch.__version__, "interrupted": interrupted, "results": [asdict(r) for r in results]},
                  sys.stdout, indent=2)
        print()
    else:
        print(f"LLTM benchmark, torch {torch.__version__}, {torch.get_num_threads()} CPU threads. "
              f"Per call: forward, then backward of (new_h.sum() + new_cell.sum()), each synchronised.")
        print(format_table(results) if results else "  nothing measured")
        if interrupted:
            print("(interrupted: the table shows what was measured before Ctrl-C)")
    if args.plot and results:
        plot(results, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    failed = [r for r in results if r.status == "failed"]
    return 130 if interrupted else (1 if failed else 0)
