"""``lltm bench``'s groups: per table, device, dtype and size, the candidates, their checks and their timing.

The timing is :func:`lltm_core.benchmarking.interleaved`'s, shared with the
scripts in ``benchmarks/``.  Each group returns its rows and whether Ctrl-C cut
it short.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

import torch

from . import _discovery, _registry
from ._cell import LLTM
from ._discovery import BackendError
from .benchmarking import interleaved, phased
from .layer import LLTMLayer
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


def _sync(device: str):
    if device == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def _cell_call(model, x, state, sync):
    """The cell table's candidate: forward, then backward of (new_h.sum() + new_cell.sum()), each timed."""
    return phased(lambda: model(x, state), lambda out: (out[0].sum() + out[1].sum()).backward(), sync=sync)


def _sequence_call(model, x, sync):
    """The sequence table's candidate: forward under no_grad, then forward + backward of output.sum(), each timed."""

    def inference():
        with torch.no_grad():
            model(x)

    return phased(inference, lambda _: model(x)[0].sum().backward(), sync=sync)


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


def _time_group(peers: dict, backend_rows: dict, asked: bool, seconds, iterations, result) -> tuple[list, bool]:
    """Time one group: (its rows, whether Ctrl-C cut it short).

    ``peers`` maps a name to its timed call; ``backend_rows`` maps each backend's row name to
    either its timed call or, if it is not timed, the Result that says why.  ``asked``: the
    backends were named with --backend, and a group where none of them runs is not timed.
    ``result(name, (first, second) summaries or None, calls, base, failure or None)`` builds a row.
    """
    not_timed = [v for v in backend_rows.values() if isinstance(v, Result)]
    if asked and len(not_timed) == len(backend_rows):
        return not_timed, False  # nothing asked for can run: timing the peers alone is no use
    candidates = {**peers, **{k: v for k, v in backend_rows.items() if not isinstance(v, Result)}}
    # Rounds of 10 calls; with a small --iterations, smaller rounds, so that the candidates still
    # alternate several times.
    per_round = 10 if iterations is None else max(1, min(10, iterations // 10))
    timings = interleaved(candidates, calls=per_round, total_calls=iterations,
                          seconds=seconds if iterations is None else None, keep_going=True)
    failures = timings.failures
    if COMPILED in failures:
        failures[COMPILED] += " (--no-compile leaves torch.compile out)"
    base = {k: (_summary([s[0] for s in v]), _summary([s[1] for s in v])) for k, v in timings.samples.items() if v}
    rows = []
    for name in candidates:
        if name in failures:
            rows.append(result(name, None, 0, base, failures[name]))
        elif name in base:  # else interrupted before its first whole round
            rows.append(result(name, base[name], len(timings.samples[name]), base, None))
    return rows + not_timed, timings.interrupted


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
              on_group=lambda label: None, tables=TABLES, seq_len=DEFAULT_SEQ_LEN) -> tuple[list, bool]:
    """(a :class:`Result` per candidate, table by table and group by group; whether Ctrl-C cut it short).

    ``backends`` names the backends to time (each one that cannot run is a
    failure); empty means every discovered backend (each one that cannot take
    the group's tensors is skipped, with its reason).  ``on_group(label)`` is
    called as each (table, device, dtype, size) group starts.
    """
    names = backends or sorted({r["name"] for r in _discovery.backend_report()})  # loads each backend once
    results: list[Result] = []
    options = dict(seconds=seconds, iterations=iterations, compile_peer=compile_peer, seq_len=seq_len,
                   on_group=on_group)
    try:
        for table_name in tables:
            group = _cell_group if table_name == "cell" else _sequence_group
            for device in devices:
                for dtype in dtypes:
                    for size in sizes:
                        rows, interrupted = group(names, backends, device, dtype, size, **options)
                        results.extend(rows)
                        if interrupted:
                            return results, True
    except KeyboardInterrupt:  # while setting up or checking a group: what was timed before stands
        return results, True
    return results, False


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
        return [replace(here, candidate="every candidate", status="failed",
                        detail=f"could not set up this size: {_first_line(exc)}")], False
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

    return _time_group(peers, rows, bool(backends), seconds, iterations, result)


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
        return [replace(here, candidate="every candidate", status="failed",
                        detail=f"could not set up this size: {_first_line(exc)}")], False
    out = []  # the per-step loop's row, when it is not timed
    try:
        best = _registry.select(torch.device(device).type, dtype).name
    except BackendError as exc:  # no backend takes these tensors: the rows below say why, per backend
        best, why_no_loop = None, str(exc).splitlines()[0]
    if best is None:
        out.append(replace(here, candidate="LLTM per-step loop", status="skipped", detail=why_no_loop))
    else:  # the cell table checks the cell; here it may run alone (--table sequence)
        loop = f"LLTM per-step loop ({best})"
        problem = _verify(best, device, dtype, size)
        if problem:
            out.append(replace(here, candidate=loop, status="failed", detail=problem))
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

    rows, interrupted = _time_group(peers, rows, bool(backends), seconds, iterations, result)
    return out + rows, interrupted
