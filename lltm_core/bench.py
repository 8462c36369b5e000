"""Time every available backend against the tutorial's eager module and torch.compile of it.

The method is the tutorial's: one forward call, synchronise, one backward call
of ``(new_h.sum() + new_cell.sum())``, synchronise, each timed on its own.
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
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from . import LLTM, _registry
from ._device import cuda_unavailable_reason
from ._format import table
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
    reason = cuda_unavailable_reason()
    if reason is not None:
        raise SystemExit(f"lltm bench: --device {text}: {reason}")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise SystemExit(f"lltm bench: --device {text}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return text


def _check_plot_target(path: str) -> None:
    """Fail before measuring, not after: no such folder, matplotlib missing, a format it cannot write."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise SystemExit(f"lltm bench: --plot {path}: no such folder {folder}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        raise SystemExit("lltm bench --plot needs matplotlib: pip install matplotlib (or pip install 'lltm-core[plot]')") from None
    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    formats = Figure().canvas.get_supported_filetypes()
    if suffix and suffix not in formats:
        raise SystemExit(f"lltm bench: --plot {path}: matplotlib cannot write .{suffix} (it writes {', '.join(sorted(formats))})")


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


def _first_line(exc: BaseException) -> str:
    """``Type: first line of the message``: enough for a table cell."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _measure_group(candidates: dict, x, state, device: str, seconds: float | None, iterations: int | None):
    """Alternate the candidates in rounds until each has its budget.

    Returns (name -> (fwd, bwd) samples, name -> why it failed, interrupted).
    A candidate that raises (a backend's kernel, torch.compile of the peer) is
    dropped from the group with its error, and the others go on.  On Ctrl-C,
    what was measured so far.
    """
    sync = _sync(device)
    candidates = dict(candidates)
    samples = {name: ([], []) for name in candidates}
    failures: dict[str, str] = {}
    # Rounds of 10 calls; with a small --iterations, smaller rounds, so that
    # the candidates still alternate several times.
    per_round = 10 if iterations is None else max(1, min(10, iterations // 10))

    def calls(name: str, n: int, fwd: list, bwd: list) -> None:
        try:
            for _ in range(n):
                _time_one_call(candidates[name], x, state, sync, fwd, bwd)
        except Exception as exc:  # noqa: BLE001 - whatever a backend raises is its own failure
            failures[name] = f"raised {_first_line(exc)}"
            del candidates[name], samples[name]

    try:
        for name in list(candidates):  # warm-up: first-call allocations, compilation
            calls(name, 3, [], [])
        while candidates:
            for name in list(candidates):
                fwd, bwd = samples[name]
                n = per_round if iterations is None else min(per_round, iterations - len(fwd))
                calls(name, n, fwd, bwd)
            if iterations is not None:
                if all(len(f) >= iterations for f, _ in samples.values()):
                    break
            elif all(sum(f) + sum(b) >= seconds for f, b in samples.values()):
                break
        return samples, failures, False
    except KeyboardInterrupt:
        # a forward may have finished without its backward: keep whole calls only
        for fwd, bwd in samples.values():
            del fwd[len(bwd):]
        return {k: v for k, v in samples.items() if v[1]}, failures, True


def _verify(name: str, device: str, dtype: torch.dtype, size) -> str | None:
    """None if backend ``name`` matches the reference on fresh inputs of this size, else what differs."""
    from .testing import make_inputs

    try:
        errors = compare_with_reference(name, make_inputs(*size, dtype=dtype, device=device))
    except Exception as exc:  # noqa: BLE001 - a backend that raises fails here, not the whole run
        return f"raised {_first_line(exc)}, while checked against the reference"
    tol = tolerance(dtype)
    bad = {k: v for k, v in errors.items() if not v <= tol}
    if bad:
        return "disagrees with the reference: " + ", ".join(f"{k} rel. error {v:.2g} > {tol:g}" for k, v in bad.items())
    return None


def _skip_reason(name: str, device: str, dtype: torch.dtype) -> str:
    """Why backend ``name``, not asked for, is left out of a group: the row says it, so none vanishes."""
    rec = _registry._resolve(name)
    if not rec.available:
        return f"{rec.status}: {rec.reason}"
    return rec.backend.supports(torch.device(device).type, dtype) or "cannot take these tensors"


def benchmark(sizes, devices, dtypes, backends, *, seconds=None, iterations=None, compile_peer=True,
              on_group=lambda label: None):
    """Yield a :class:`Result` per candidate, group by group; see the module docstring.

    ``backends`` names the backends to time (each one that cannot run is a
    failure); empty means every discovered backend (each one that cannot take
    the group's tensors is skipped, with its reason).  ``on_group(label)`` is
    called as each (device, dtype, size) group starts.
    """
    names = backends or sorted({r["name"] for r in _registry.report()})  # report() loads each backend once
    for device in devices:
        for dtype in dtypes:
            for size in sizes:
                B, I, S = size
                label = f"B{B} I{I} S{S}"
                dname = str(dtype)[6:]
                on_group(f"{device} {dname} {label}")
                try:
                    torch.manual_seed(0)
                    seed_module = SeedLLTM(I, S, device=device, dtype=dtype)
                    x = torch.randn(B, I, device=device, dtype=dtype)
                    state = (torch.randn(B, S, device=device, dtype=dtype),
                             torch.randn(B, S, device=device, dtype=dtype))
                except Exception as exc:  # noqa: BLE001 - e.g. a size that does not fit: the other groups still run
                    yield Result("every candidate", device, dname, label, "failed",
                                 f"could not set up this size: {_first_line(exc)}")
                    continue
                candidates = {EAGER: seed_module}
                if compile_peer:
                    candidates[COMPILED] = torch.compile(seed_module)
                not_timed = {}
                for name in names:
                    try:
                        _registry.select(torch.device(device).type, dtype, name, source="--backend")
                    except BackendError as exc:
                        not_timed[name] = (
                            Result(name, device, dname, label, "failed", str(exc)) if backends
                            else Result(name, device, dname, label, "skipped", _skip_reason(name, device, dtype))
                        )
                        continue
                    problem = _verify(name, device, dtype, size)
                    if problem:
                        not_timed[name] = Result(name, device, dname, label, "failed", problem)
                        continue
                    module = LLTM(I, S, backend=name, device=device, dtype=dtype)
                    module.load_state_dict(seed_module.state_dict())
                    candidates[name] = module
                if backends and not any(name in candidates for name in backends):
                    yield from not_timed.values()  # nothing asked for can run: timing the peers alone is no use
                    continue
                samples, failures, interrupted = _measure_group(candidates, x, state, device, seconds, iterations)
                if COMPILED in failures:
                    failures[COMPILED] += " (--no-compile leaves torch.compile out)"
                base = {k: (_summary(f), _summary(b)) for k, (f, b) in samples.items()}
                for name in candidates:
                    if name in failures:
                        yield Result(name, device, dname, label, "failed", failures[name])
                        continue
                    if name not in base:  # interrupted before its first whole call
                        continue
                    fwd, bwd = base[name]
                    r = Result(name, device, dname, label, forward_us=fwd, backward_us=bwd, calls=len(samples[name][0]))
                    for peer, attr in ((EAGER, "speedup_vs_eager"), (COMPILED, "speedup_vs_compile")):
                        if peer in base and name != peer:
                            pf, pb = base[peer]
                            setattr(r, attr, {"forward": pf["median"] / fwd["median"], "backward": pb["median"] / bwd["median"]})
                    yield r
                yield from not_timed.values()
                if interrupted:
                    raise KeyboardInterrupt


def _fmt_us(d: dict) -> str:
    return f"{d['median']:.1f} ({d['mean']:.1f})" if d else "-"


def _fmt_x(d: dict) -> str:
    return f"{d['forward']:.2f}x / {d['backward']:.2f}x" if d else "-"


def format_table(results: list[Result]) -> str:
    # A FAILED or SKIPPED row says why in a column of its own, added only when there is one.
    notes = any(r.status != "ok" for r in results)
    rows = []
    for r in results:
        if r.status != "ok":
            rows.append([r.candidate, r.device, r.dtype, r.size, r.status.upper(), "-", "-", "-", r.detail])
            continue
        rows.append([r.candidate, r.device, r.dtype, r.size, _fmt_us(r.forward_us), _fmt_us(r.backward_us),
                     _fmt_x(r.speedup_vs_eager), _fmt_x(r.speedup_vs_compile)] + ([""] if notes else []))
    header = ["candidate", "device", "dtype", "size", "forward us: median (mean)", "backward us: median (mean)",
              "speed-up vs eager fwd / bwd", "vs torch.compile fwd / bwd"] + (["why not timed"] if notes else [])
    return table(rows, header)


def plot(results: list[Result], path: str) -> None:
    _check_plot_target(path)
    import matplotlib.pyplot as plt

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
    # A size given twice (or by --size and a preset) is measured once, like a repeated --backend.
    sizes = list(dict.fromkeys([_parse_size(s) for s in args.size] + [s for p in args.preset for s in PRESETS[p]]))
    sizes = sizes or PRESETS["seed"]
    devices = [_check_device(d) for d in args.device] or _usable_devices()
    if args.seconds is not None and not (math.isfinite(args.seconds) and args.seconds > 0):
        raise SystemExit(f"lltm bench: --seconds takes a number of seconds > 0, got {args.seconds}")
    if args.iterations is not None and args.iterations < 1:
        raise SystemExit(f"lltm bench: --iterations takes a count >= 1, got {args.iterations}")
    if args.plot:
        _check_plot_target(args.plot)
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
    if args.plot and any(r.status == "ok" for r in results):
        plot(results, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    failed = [r for r in results if r.status == "failed"]
    return 130 if interrupted else (1 if failed else 0)
