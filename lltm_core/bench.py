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
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace

import torch

from . import _discovery, _registry
from ._cell import LLTM
from .layer import LLTMLayer
from ._device import cuda_unavailable_reason
from ._format import table
from ._discovery import BackendError
from .testing import SeedLLTM, compare_with_reference, max_rel_error, reference_layer, tolerance

PRESETS = {
    "seed": [(16, 32, 128)],
    "medium": [(64, 256, 512)],
    "large": [(256, 256, 1024)],
}
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
EAGER, COMPILED = "eager (seed module)", "torch.compile (seed module)"
LSTM = "nn.LSTM"  # the sequence table's peer
TABLES = ("cell", "sequence")
DEFAULT_SEQ_LEN = 64
# The sequence is checked against the reference over this many steps at most: the oracle runs
# the cell in Python per sequence and step, and a wrong backend shows within a few steps.
_VERIFY_STEPS = 8


@dataclass
class Result:
    candidate: str
    device: str
    dtype: str
    size: str
    status: str = "ok"  # ok | failed | skipped
    detail: str = ""
    table: str = "cell"  # cell | sequence
    # mean / median per call.  cell: forward, and backward.  sequence: forward under
    # no_grad (forward_us), and forward + backward of output.sum() (forward_backward_us).
    forward_us: dict = field(default_factory=dict)
    backward_us: dict = field(default_factory=dict)
    forward_backward_us: dict = field(default_factory=dict)
    calls: int = 0
    speedup_vs_eager: dict = field(default_factory=dict)
    speedup_vs_compile: dict = field(default_factory=dict)
    speedup_vs_lstm: dict = field(default_factory=dict)  # sequence: {"forward", "forward_backward"}


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


def _cell_call(model, x, state, sync):
    """One timed call of the cell table: (forward seconds, backward seconds)."""

    def call() -> tuple[float, float]:
        start = time.perf_counter()
        new_h, new_cell = model(x, state)
        sync()
        mid = time.perf_counter()
        (new_h.sum() + new_cell.sum()).backward()
        sync()
        return mid - start, time.perf_counter() - mid

    return call


def _sequence_call(model, x, sync):
    """One timed call of the sequence table: (forward under no_grad, forward + backward of output.sum())."""

    def call() -> tuple[float, float]:
        start = time.perf_counter()
        with torch.no_grad():
            model(x)
        sync()
        mid = time.perf_counter()
        model(x)[0].sum().backward()
        sync()
        return mid - start, time.perf_counter() - mid

    return call


class _CellLoop(torch.nn.Module):
    """The per-step loop of ``lltm_core.LLTM`` over a sequence: what LLTMLayer is for replacing."""

    def __init__(self, cell: LLTM):
        super().__init__()
        self.cell = cell

    def forward(self, x):
        h = c = x.new_zeros(x.shape[1], self.cell.state_size)
        outputs = []
        for step in x:
            h, c = self.cell(step, (h, c))
            outputs.append(h)
        return torch.stack(outputs), (h, c)


def _summary(samples: list[float]) -> dict:
    return {"mean": statistics.fmean(samples) * 1e6, "median": statistics.median(samples) * 1e6}


def _first_line(exc: BaseException) -> str:
    """``Type: first line of the message``: enough for a table cell."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _measure_group(candidates: dict, seconds: float | None, iterations: int | None):
    """Alternate the candidates (name -> timed call, see _cell_call) in rounds until each has its budget.

    Returns (name -> (first, second) samples, name -> why it failed, interrupted).
    A candidate that raises (a backend's kernel, torch.compile of the peer) is
    dropped from the group with its error, and the others go on.  On Ctrl-C,
    what was measured so far.
    """
    candidates = dict(candidates)
    samples = {name: ([], []) for name in candidates}
    failures: dict[str, str] = {}
    # Rounds of 10 calls; with a small --iterations, smaller rounds, so that
    # the candidates still alternate several times.
    per_round = 10 if iterations is None else max(1, min(10, iterations // 10))

    def calls(name: str, n: int, fwd: list, bwd: list) -> None:
        try:
            for _ in range(n):
                first, second = candidates[name]()
                fwd.append(first)
                bwd.append(second)
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
    return _disagreement(errors, dtype)


def _disagreement(errors: dict, dtype: torch.dtype) -> str | None:
    """None if every relative error is within the dtype's tolerance, else a table cell naming those that are not."""
    tol = tolerance(dtype)
    bad = {k: v for k, v in errors.items() if not v <= tol}
    if bad:
        return "disagrees with the reference: " + ", ".join(f"{k} rel. error {v:.2g} > {tol:g}" for k, v in bad.items())
    return None


def _skip_reason(name: str, device: str, dtype: torch.dtype) -> str:
    """Why backend ``name``, not asked for, is left out of a group: the row says it, so none vanishes."""
    rec = _discovery.resolve(name)
    if not rec.available:
        return f"{rec.status}: {rec.reason}"
    return rec.backend.supports(torch.device(device).type, dtype) or "cannot take these tensors"


def _verify_layer(name: str, device: str, dtype: torch.dtype, size, steps: int) -> str | None:
    """None if LLTMLayer on backend ``name`` matches the reference over a few steps of this size, else what differs."""
    B, I, S = size
    try:
        layer = LLTMLayer(I, S, backend=name, device=device, dtype=dtype)
        x = torch.randn(min(steps, _VERIFY_STEPS), B, I, device=device, dtype=dtype, requires_grad=True)
        output, (h_n, c_n) = layer(x)
        upstream = [torch.randn_like(t) for t in (output, h_n, c_n)]
        grads = torch.autograd.grad((output, h_n, c_n), [x, *layer.parameters()], upstream)
        ref_x = x.detach().double().requires_grad_()
        ref_params = {k: v.detach().double().requires_grad_() for k, v in layer.named_parameters()}
        zeros = torch.zeros(1, B, S, device=device, dtype=torch.float64)
        want = reference_layer(ref_params, 1, False, ref_x, zeros, zeros)
        want_grads = torch.autograd.grad(want, [ref_x, *ref_params.values()], [u.double() for u in upstream])
    except Exception as exc:  # noqa: BLE001 - a backend that raises fails here, not the whole run
        return f"raised {_first_line(exc)}, while checked against the reference"
    names = ["output", "h_n", "c_n", "grad_input", *(f"grad_{k}" for k in ref_params)]
    errors = {k: max_rel_error(g, w) for k, g, w in zip(names, (output, h_n, c_n, *grads), (*want, *want_grads))}
    return _disagreement(errors, dtype)


def _time_group(peers: dict, backend_rows: dict, asked: bool, seconds, iterations, result):
    """Measure one group and yield its results; returns whether Ctrl-C cut it short.

    ``peers`` maps a name to its timed call; ``backend_rows`` maps each backend's row name to
    either its timed call or, if it is not timed, the Result that says why.  ``asked``: the
    backends were named with --backend, and a group where none of them runs is not timed.
    ``result(name, (first, second) summaries or None, calls, base, failure or None)`` builds a row.
    """
    not_timed = [v for v in backend_rows.values() if isinstance(v, Result)]
    if asked and len(not_timed) == len(backend_rows):
        yield from not_timed  # nothing asked for can run: timing the peers alone is no use
        return False
    candidates = {**peers, **{k: v for k, v in backend_rows.items() if not isinstance(v, Result)}}
    samples, failures, interrupted = _measure_group(candidates, seconds, iterations)
    if COMPILED in failures:
        failures[COMPILED] += " (--no-compile leaves torch.compile out)"
    base = {k: (_summary(f), _summary(b)) for k, (f, b) in samples.items()}
    for name in candidates:
        if name in failures:
            yield result(name, None, 0, base, failures[name])
        elif name in base:  # else interrupted before its first whole call
            yield result(name, base[name], len(samples[name][0]), base, None)
    yield from not_timed
    return interrupted


def _backend_rows(names, backends, device, dtype, group: Result, row_name, build, verify):
    """Row name -> timed call for each backend that takes the group and agrees with the reference, else its Result.

    ``group`` is a Result carrying the group's device, dtype, size and table, copied into each row made here.
    """
    def row(name, status, detail):
        return Result(row_name(name), group.device, group.dtype, group.size, status, detail, group.table)

    rows = {}
    for name in names:
        try:
            _registry.select(torch.device(device).type, dtype, name, source="--backend")
        except BackendError as exc:
            rows[row_name(name)] = row(name, "failed", str(exc)) if backends else \
                row(name, "skipped", _skip_reason(name, device, dtype))
            continue
        problem = verify(name)
        rows[row_name(name)] = row(name, "failed", problem) if problem else build(name)
    return rows


def benchmark(sizes, devices, dtypes, backends, *, seconds=None, iterations=None, compile_peer=True,
              on_group=lambda label: None, tables=TABLES, seq_len=DEFAULT_SEQ_LEN):
    """Yield a :class:`Result` per candidate, table by table and group by group; see the module docstring.

    ``backends`` names the backends to time (each one that cannot run is a
    failure); empty means every discovered backend (each one that cannot take
    the group's tensors is skipped, with its reason).  ``on_group(label)`` is
    called as each (table, device, dtype, size) group starts.
    """
    names = backends or sorted({r["name"] for r in _discovery.backend_report()})  # loads each backend once
    for table_name in tables:
        group = _cell_group if table_name == "cell" else _sequence_group
        for device in devices:
            for dtype in dtypes:
                for size in sizes:
                    options = dict(seconds=seconds, iterations=iterations, compile_peer=compile_peer,
                                   seq_len=seq_len, on_group=on_group)
                    if (yield from group(names, backends, device, dtype, size, **options)):
                        raise KeyboardInterrupt


def _cell_group(names, backends, device, dtype, size, *, seconds, iterations, compile_peer, seq_len, on_group):
    B, I, S = size
    here = Result("", device, str(dtype)[6:], f"B{B} I{I} S{S}", table="cell")
    on_group(f"{device} {here.dtype} {here.size}")
    try:
        torch.manual_seed(0)
        seed_module = SeedLLTM(I, S, device=device, dtype=dtype)
        x = torch.randn(B, I, device=device, dtype=dtype)
        state = (torch.randn(B, S, device=device, dtype=dtype), torch.randn(B, S, device=device, dtype=dtype))
    except Exception as exc:  # noqa: BLE001 - e.g. a size that does not fit: the other groups still run
        yield replace(here, candidate="every candidate", status="failed",
                      detail=f"could not set up this size: {_first_line(exc)}")
        return False
    sync = _sync(device)
    peers = {EAGER: _cell_call(seed_module, x, state, sync)}
    if compile_peer:
        peers[COMPILED] = _cell_call(torch.compile(seed_module), x, state, sync)

    def build(name):
        module = LLTM(I, S, backend=name, device=device, dtype=dtype)
        module.load_state_dict(seed_module.state_dict())
        return _cell_call(module, x, state, sync)

    rows = _backend_rows(names, backends, device, dtype, here, lambda n: n, build,
                         lambda n: _verify(n, device, dtype, size))

    def result(name, summaries, calls, base, failure):
        if failure is not None:
            return replace(here, candidate=name, status="failed", detail=failure)
        fwd, bwd = summaries
        r = replace(here, candidate=name, forward_us=fwd, backward_us=bwd, calls=calls)
        for peer, attr in ((EAGER, "speedup_vs_eager"), (COMPILED, "speedup_vs_compile")):
            if peer in base and name != peer:
                pf, pb = base[peer]
                setattr(r, attr, {"forward": pf["median"] / fwd["median"], "backward": pb["median"] / bwd["median"]})
        return r

    return (yield from _time_group(peers, rows, bool(backends), seconds, iterations, result))


def _sequence_group(names, backends, device, dtype, size, *, seconds, iterations, compile_peer, seq_len, on_group):
    B, I, S = size
    T = seq_len
    here = Result("", device, str(dtype)[6:], f"T{T} B{B} I{I} S{S}", table="sequence")
    on_group(f"sequence {device} {here.dtype} {here.size}")
    sync = _sync(device)
    try:
        torch.manual_seed(0)
        x = torch.randn(T, B, I, device=device, dtype=dtype)
        peers = {LSTM: _sequence_call(torch.nn.LSTM(I, S, device=device, dtype=dtype), x, sync)}
    except Exception as exc:  # noqa: BLE001 - e.g. a size that does not fit: the other groups still run
        yield replace(here, candidate="every candidate", status="failed",
                      detail=f"could not set up this size: {_first_line(exc)}")
        return False
    try:
        best = _registry.select(torch.device(device).type, dtype).name
    except BackendError as exc:  # no backend takes these tensors: the rows below say why, per backend
        best, why_no_loop = None, str(exc).splitlines()[0]
    if best is None:
        yield replace(here, candidate="LLTM per-step loop", status="skipped", detail=why_no_loop)
    else:  # the cell table checks the cell; here it may run alone (--table sequence)
        loop = f"LLTM per-step loop ({best})"
        problem = _verify(best, device, dtype, size)
        if problem:
            yield replace(here, candidate=loop, status="failed", detail=problem)
        else:
            peers[loop] = _sequence_call(_CellLoop(LLTM(I, S, backend=best, device=device, dtype=dtype)), x, sync)

    def build(name):
        return _sequence_call(LLTMLayer(I, S, backend=name, device=device, dtype=dtype), x, sync)

    rows = _backend_rows(names, backends, device, dtype, here, lambda n: f"LLTMLayer ({n})", build,
                         lambda n: _verify_layer(n, device, dtype, size, T))

    def result(name, summaries, calls, base, failure):
        if failure is not None:
            return replace(here, candidate=name, status="failed", detail=failure)
        fwd, train = summaries
        r = replace(here, candidate=name, forward_us=fwd, forward_backward_us=train, calls=calls)
        if LSTM in base and name != LSTM:
            pf, pt = base[LSTM]
            r.speedup_vs_lstm = {"forward": pf["median"] / fwd["median"],
                                 "forward_backward": pt["median"] / train["median"]}
        return r

    return (yield from _time_group(peers, rows, bool(backends), seconds, iterations, result))


def _fmt_us(d: dict) -> str:
    return f"{d['median']:.1f} ({d['mean']:.1f})" if d else "-"


def _fmt_x(d: dict, second: str = "backward") -> str:
    return f"{d['forward']:.2f}x / {d[second]:.2f}x" if d else "-"


def format_table(results: list[Result]) -> str:
    """The cell table's rows of ``results`` (see format_sequence_table for the other)."""
    return _format_rows(
        [r for r in results if r.table == "cell"],
        ["forward us: median (mean)", "backward us: median (mean)", "speed-up vs eager fwd / bwd",
         "vs torch.compile fwd / bwd"],
        lambda r: [_fmt_us(r.forward_us), _fmt_us(r.backward_us), _fmt_x(r.speedup_vs_eager),
                   _fmt_x(r.speedup_vs_compile)])


def format_sequence_table(results: list[Result]) -> str:
    return _format_rows(
        [r for r in results if r.table == "sequence"],
        ["forward (no_grad) us: median (mean)", "forward+backward us: median (mean)",
         "speed-up vs nn.LSTM fwd / fwd+bwd"],
        lambda r: [_fmt_us(r.forward_us), _fmt_us(r.forward_backward_us),
                   _fmt_x(r.speedup_vs_lstm, "forward_backward")])


def _format_rows(results: list[Result], measured: list[str], cells) -> str:
    # A FAILED or SKIPPED row says why in a column of its own, added only when there is one.
    notes = any(r.status != "ok" for r in results)
    rows = []
    for r in results:
        if r.status != "ok":
            rows.append([r.candidate, r.device, r.dtype, r.size, r.status.upper(), *["-"] * (len(measured) - 1), r.detail])
        else:
            rows.append([r.candidate, r.device, r.dtype, r.size, *cells(r)] + ([""] if notes else []))
    return table(rows, ["candidate", "device", "dtype", "size", *measured] + (["why not timed"] if notes else []))


def plot(results: list[Result], path: str) -> None:
    _check_plot_target(path)
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.status == "ok"]
    groups = sorted({(r.table, r.device, r.dtype, r.size) for r in ok})
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4.5), squeeze=False)
    for ax, group in zip(axes[0], groups):
        rows = [r for r in ok if (r.table, r.device, r.dtype, r.size) == group]
        names = [r.candidate.replace(" (", "\n(") for r in rows]
        sequence = group[0] == "sequence"
        bars = (("forward (no_grad)", "forward_us"), ("forward+backward", "forward_backward_us")) if sequence else \
            (("forward", "forward_us"), ("backward", "backward_us"))
        xs = range(len(rows))
        for offset, (label, attr) in zip((-0.2, 0.2), bars):
            ax.bar([i + offset for i in xs], [getattr(r, attr)["median"] for r in rows], width=0.4, label=label)
        ax.set_xticks(list(xs), names, fontsize=8)
        ax.set_ylabel("median time per call (us)")
        ax.set_title(f"LLTM {'sequence ' if sequence else ''}{group[3]}, {group[1]} {group[2]}")
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
    if args.seq_len < 1:
        raise SystemExit(f"lltm bench: --seq-len takes a number of time steps >= 1, got {args.seq_len}")
    tables = [t for t in TABLES if t in args.table] or list(TABLES)
    dtypes = [_DTYPES[d] for d in args.dtype] or [torch.float32]
    seconds = args.seconds if args.seconds is not None or args.iterations is not None else 2.0
    groups = len(tables) * len(devices) * len(dtypes) * len(sizes)
    progress = _Progress(groups)
    results: list[Result] = []
    interrupted = False
    try:
        for r in benchmark(sizes, devices, dtypes, args.backend, seconds=seconds, iterations=args.iterations,
                           compile_peer=not args.no_compile, on_group=progress.step, tables=tables,
                           seq_len=args.seq_len):
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
