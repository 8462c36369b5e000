"""Discovering, loading and choosing backends.

Discovery reads entry-point metadata only; a backend's code is imported the
first time a call needs it (or a report asks about it), once per process.

The selection rule lives in one function, :func:`select`; read its docstring
for the order in which choices are made.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import logging
import os
import threading
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import NamedTuple

import torch

from .backend import SUPPORTED_INTERFACE_VERSIONS, Backend, Call

log = logging.getLogger("lltm_core")

ENTRY_POINT_GROUP = "lltm.backends"
ENV_BACKEND = "LLTM_BACKEND"
ENV_DISABLE = "LLTM_DISABLE_BACKENDS"

# What to tell a user who lacks a backend we know of.  None is on PyPI yet, so the hint is the
# command that works: from an lltm source tree (or by name, from a folder of wheels, --find-links).
_INSTALL_HINTS = {
    "ref": "pip install --no-build-isolation ./backends/lltm_ref  (from an lltm source tree)",
    "cpu": "pip install --no-build-isolation ./backends/lltm_cpu  (from an lltm source tree; compiles against your torch)",
    "cuda": "pip install --no-build-isolation ./backends/lltm_cuda  (from an lltm source tree; needs nvcc and a CUDA build of torch)",
}


class BackendError(RuntimeError):
    """No backend can take this call, or the one asked for cannot."""


class BackendUnavailableWarning(UserWarning):
    """An installed backend that would have been chosen cannot run, so a lesser one runs instead."""


@dataclass
class BackendRecord:
    """What lltm-core knows about one discovered entry point."""

    name: str
    distribution: str
    version: str
    value: str  # "module:factory"
    entry_point: metadata.EntryPoint | None = None
    backend: Backend | None = None
    status: str = "not loaded"  # not loaded | available | unavailable | disabled | shadowed
    reason: str = ""

    @property
    def available(self) -> bool:
        return self.status == "available"

    def as_dict(self) -> dict:
        b = self.backend
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "entry_point": self.value,
            "status": self.status,
            "reason": self.reason,
            "priority": b.priority if b else None,
            "devices": sorted(b.devices) if b else None,
            "dtypes": sorted(str(d).removeprefix("torch.") for d in b.dtypes) if b else None,
            "description": b.description if b else "",
            # Whether LLTMLayer runs this backend's own sequence kernels, or loops its step kernels.
            "sequence_kernels": b.has_sequence_kernels if b else None,
        }


_lock = threading.RLock()
_records: dict[str, list[BackendRecord]] | None = None  # name -> candidates, discovery order
_choice_cache: dict[tuple, Backend | _PerCall] = {}  # see select()
# use_backend() choice; a ContextVar so threads and asyncio tasks don't see each other's.
_context_choice: contextvars.ContextVar[str | None] = contextvars.ContextVar("lltm_backend", default=None)

# What torch.compile guards on.  Dynamo cannot trace a ContextVar and reads
# os.environ without guarding on it, so a compiled graph would otherwise keep
# whatever backend was chosen when it was traced.  These two plain globals
# change whenever the choice may: the innermost use_backend() name (of the
# thread that entered a block last) and a count of refresh() calls.  Dynamo
# guards on their values, so entering or leaving a use_backend() block, or
# refreshing, retraces.  Where they cannot tell (another thread's block,
# LLTM_BACKEND or LLTM_DISABLE_BACKENDS changed after tracing), the compiled
# operator checks the choice again when it runs and raises rather than run a
# backend nobody chose (lltm_core._autograd).
compile_hint: str | None = None
compile_generation = 0


def _disabled_names() -> set[str]:
    return {n.strip() for n in (_env_disabled() or "").split(",") if n.strip()}


def _env_reader(name: str):
    """A fast ``os.environ.get(name)`` for the per-call path.

    Both variables are read on every call, so that setting them at run time
    takes effect (never silently ignored).  ``os.environ.get`` encodes the key
    and decodes the value each time, about 1 us apiece in a call that budgets
    a few; reading the mapping's raw storage skips that when it is there.
    """
    data = getattr(os.environ, "_data", None)
    encodekey = getattr(os.environ, "encodekey", None)
    decodevalue = getattr(os.environ, "decodevalue", None)
    if not (isinstance(data, dict) and encodekey and decodevalue):
        return lambda: os.environ.get(name)
    key = encodekey(name)

    def read():
        raw = data.get(key)
        return None if raw is None else decodevalue(raw)

    return read


_env_backend = _env_reader(ENV_BACKEND)
_env_disabled = _env_reader(ENV_DISABLE)


def _discover() -> dict[str, list[BackendRecord]]:
    found: dict[str, list[BackendRecord]] = {}
    seen: set[tuple[str, str]] = set()
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else "?"
        # The same distribution can be visible twice on sys.path (an editable
        # install plus a build dir); that is one backend, not a conflict.
        if (ep.name, dist_name) in seen:
            continue
        seen.add((ep.name, dist_name))
        found.setdefault(ep.name, []).append(
            BackendRecord(
                name=ep.name,
                distribution=dist_name,
                version=dist.version if dist is not None else "?",
                value=ep.value,
                entry_point=ep,
            )
        )
    for name, recs in found.items():
        if len(recs) > 1:
            owners = ", ".join(f"{r.distribution} {r.version} ({r.value})" for r in recs)
            warnings.warn(
                f"lltm backend name {name!r} is claimed by several distributions: {owners}. "
                f"The first that loads and is available is used; uninstall the others.",
                RuntimeWarning,
                stacklevel=3,
            )
    log.debug("discovered backends: %s", {n: [r.distribution for r in rs] for n, rs in found.items()})
    return found


def _records_by_name() -> dict[str, list[BackendRecord]]:
    global _records
    records = _records  # one read: refresh() may reset the global meanwhile
    if records is None:
        with _lock:
            if _records is None:
                _records = _discover()
            records = _records
    return records


def refresh() -> None:
    """Forget everything discovered and loaded (e.g. after installing a backend)."""
    global _records, compile_generation
    with _lock:
        _records = None
        _choice_cache.clear()
        _call_choices.clear()
        _answers.clear()
        _warned_unavailable.clear()
        compile_generation += 1


def _load(rec: BackendRecord) -> None:
    """Import one backend, once, recording why it cannot be used if it cannot."""
    if rec.status != "not loaded":
        return
    try:
        factory = rec.entry_point.load()
        backend = factory()
    # A broken backend must never break lltm-core, not even by calling sys.exit().
    except (Exception, SystemExit) as exc:
        rec.status, rec.reason = "unavailable", f"failed to load: {type(exc).__name__}: {exc}"
        log.debug("backend %s (%s): %s", rec.name, rec.distribution, rec.reason)
        return
    if not isinstance(backend, Backend):
        rec.status = "unavailable"
        rec.reason = f"entry point {rec.value} returned {type(backend).__name__}, not lltm_core.Backend"
    elif backend.name != rec.name:
        rec.status = "unavailable"
        rec.reason = f"entry point is named {rec.name!r} but the backend calls itself {backend.name!r}"
    elif not set(backend.interface_versions) & set(SUPPORTED_INTERFACE_VERSIONS):
        rec.status = "unavailable"
        rec.reason = (
            f"implements lltm interface {list(backend.interface_versions)}, but this lltm-core "
            f"speaks {list(SUPPORTED_INTERFACE_VERSIONS)}: install matching versions of lltm-core and {rec.distribution}"
        )
    else:
        try:
            why_not = backend.availability()
        except (Exception, SystemExit) as exc:
            why_not = f"availability check failed: {type(exc).__name__}: {exc}"
        rec.backend = backend
        rec.status, rec.reason = ("available", "") if why_not is None else ("unavailable", why_not)
    log.debug("backend %s (%s %s): %s %s", rec.name, rec.distribution, rec.version, rec.status, rec.reason)


def _resolve(name: str) -> BackendRecord | None:
    """The record that serves ``name``: the first available candidate, else the first one."""
    recs = _records_by_name().get(name)
    if not recs:
        return None
    with _lock:
        for rec in recs:
            _load(rec)
        winner = next((r for r in recs if r.available), recs[0])
        for rec in recs:
            if rec is not winner and rec.available:
                rec.status = "shadowed"
                rec.reason = f"{winner.distribution} also provides {name!r} and was found first"
    if name in _disabled_names():
        return BackendRecord(
            name, winner.distribution, winner.version, winner.value, backend=winner.backend,
            status="disabled", reason=f"hidden by {ENV_DISABLE}",
        )
    return winner


def report() -> list[dict]:
    """Every discovered entry point (loading each), with status and reason."""
    out = []
    with _lock:  # one consistent view: refresh() waits
        records = _records_by_name()
        for name in sorted(records):
            shown = _resolve(name)
            for rec in records[name]:
                d = rec.as_dict()
                if shown.status == "disabled" and rec.available:
                    d["status"], d["reason"] = shown.status, shown.reason
                out.append(d)
    return out


def available_names() -> list[str]:
    with _lock:  # one consistent view: refresh() waits
        return [n for n in sorted(_records_by_name()) if (r := _resolve(n)) is not None and r.available]


def is_loaded_from_entry_point(backend: Backend) -> bool:
    """Whether ``backend`` is the object an entry point's factory returned since the last refresh()."""
    return any(rec.backend is backend for rec in _records_by_name().get(backend.name, ()))


def _requested() -> tuple[str | None, str]:
    ctx = _context_choice.get()
    if ctx is not None:
        return ctx, "use_backend()"
    env = (_env_backend() or "").strip()
    if env:
        return env, f"{ENV_BACKEND}={env}"
    return None, ""


@contextlib.contextmanager
def use_backend(name: str):
    """Use backend ``name`` for every call in this block that does not name one itself."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"use_backend() takes a backend name, got {name!r}")
    if _resolve(name) is None:  # a typo fails here, not at the first call inside the block
        raise BackendError(_not_found_message(name, "use_backend()"))
    global compile_hint
    token = _context_choice.set(name)
    outer_hint, compile_hint = compile_hint, name
    try:
        yield
    finally:
        _context_choice.reset(token)
        compile_hint = outer_hint


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _not_found_message(name: str, source: str) -> str:
    have = available_names()
    close = difflib.get_close_matches(name.lower(), list(_records_by_name()) + list(_INSTALL_HINTS), n=1)
    if close and close[0] != name:
        advice = f"did you mean {close[0]!r}? Available: {', '.join(have) or 'none'}."
    else:
        hint = _INSTALL_HINTS.get(name, f"install the distribution that provides the {name!r} lltm backend")
        advice = f"available: {', '.join(have) or 'none'}. To get it: {hint}."
    return (
        f"lltm backend {name!r} (asked for by {source}) is not installed; {advice} "
        f"`lltm info` lists every backend lltm-core can see."
    )


def select(device_type: str, dtype: torch.dtype, name: str | None = None, *, source: str = "backend=",
           call: tuple | None = None) -> Backend:
    """The backend that runs a call on ``device_type`` tensors of ``dtype``.

    ``call`` is the rest of the call, ``(op, batch, input_features,
    state_size, steps, needs_backward)`` as in :class:`~lltm_core.Call`, or
    None when there is no particular call (``get_backend()``, ``lltm info``):
    then the per-call answers are not asked.  The decision order:

    1. An explicit request wins, and is never second-guessed: the ``backend=``
       argument, else the innermost ``use_backend()`` block, else the
       ``LLTM_BACKEND`` environment variable.  If the backend it names is not
       installed, is unavailable here, is disabled, does not take this
       device/dtype, or its ``can_run`` says it cannot compute this call, the
       call fails with that reason.  Its ``should_run`` is not asked: the user
       chose.  Silently running something else would make benchmarks and bug
       reports lie.
    2. Otherwise, among backends that loaded, declare themselves available,
       are not hidden by ``LLTM_DISABLE_BACKENDS`` and support this device
       type and dtype, ordered by ``priority`` (highest first; ties go to the
       name that sorts first, so the choice does not depend on install
       order), the first whose ``can_run`` and ``should_run`` both answer
       True for this call runs it.  An answer that raises is a decline.  An
       installed backend that would have won but cannot run is named once in
       a BackendUnavailableWarning (see _warn_if_passed_over).
    3. If none qualifies, the error lists every backend and why it was
       rejected or declined (``explain()`` gives the same trace).

    The device-level part of a choice is cached per (request, device type,
    dtype, LLTM_DISABLE_BACKENDS); when no candidate that could win declines
    calls, that is the whole choice.  Otherwise the choice per call, and each
    backend's answers, are memoized in bounded caches (shapes vary in real
    training).  ``refresh()`` clears them.  ``source`` says, in errors, where
    ``name`` came from.
    """
    if name is None:
        name, source = _requested()
    # source is in the key for the errors' sake: they say who named the backend.
    key = (name, source, device_type, dtype, _env_disabled())
    entry = _choice_cache.get(key)
    if entry is None:
        with _lock:
            entry = _choice_cache[key] = _select_uncached(device_type, dtype, name, source)
    if entry.__class__ is not _PerCall:
        return entry
    if call is None:
        return entry.backends[0]
    memo_key = (key, call)
    chosen = _call_choices.get(memo_key)
    if chosen is None:
        chosen = _select_for_call(entry, Call(call[0], device_type, dtype, *call[1:]))
        _remember(_call_choices, memo_key, chosen)
    return chosen


def choose(device_type: str, dtype: torch.dtype, backend, call: tuple | None = None) -> Backend:
    """What a call's ``backend=`` argument (a name, a :class:`Backend`, or None) runs on these tensors.

    Without ``call``, the backend for the device and dtype alone; when it ``declines_calls``, the
    choice for a particular call may differ, and the caller asks again with the call.  That keeps
    the common case (no backend declines anything) from describing every call.
    """
    if isinstance(backend, Backend):
        why_not = backend.supports(device_type, dtype)
        if why_not is not None:
            raise BackendError(f"lltm backend {backend.name!r} (passed as backend=) cannot take these tensors: it {why_not}")
        if backend.can_run is not None and call is not None:
            described = Call(call[0], device_type, dtype, *call[1:])
            ok, reason = _answer(backend, "can_run", described)
            if not ok:
                raise BackendError(f"lltm backend {backend.name!r} (passed as backend=) cannot run "
                                   f"{described.describe()}: {reason}")
        return backend
    return select(device_type, dtype, backend, call=call)


def depends_on_call(device_type: str, dtype: torch.dtype, backend) -> bool:
    """Whether select() for these tensors asks backends per call (some candidate has can_run/should_run)."""
    if isinstance(backend, Backend):
        return backend.can_run is not None
    return _device_entry(device_type, dtype, backend).__class__ is _PerCall


def _device_entry(device_type: str, dtype: torch.dtype, name: str | None) -> Backend | _PerCall:
    """select()'s cached device-level entry for these tensors (filled first), as a call without shape sees it."""
    source = "backend="
    if name is None:
        name, source = _requested()
    select(device_type, dtype, name, source=source)  # fills the cache, or raises with the reason
    return _choice_cache[(name, source, device_type, dtype, _env_disabled())]


@dataclass(frozen=True)
class _PerCall:
    """A device-level choice that depends on the call: the candidates to ask, best first."""

    backends: tuple[Backend, ...]
    source: str  # who named the backend, or "" when lltm-core chooses
    rejected: tuple[str, ...]  # "name: why", of the backends that cannot take the device and dtype at all


# The per-call caches: bounded, oldest out first.  A training run with varying
# batch sizes and sequence lengths makes a new Call for each shape it meets.
MEMO_SIZE = 4096
_call_choices: dict[tuple, Backend] = {}  # (select()'s key, call tuple) -> backend
_answers: dict[tuple, tuple[bool, str]] = {}  # (backend name, "can_run"/"should_run", Call) -> (yes, reason)


def _remember(memo: dict, key, value) -> None:
    with _lock:
        if len(memo) >= MEMO_SIZE:
            del memo[next(iter(memo))]
        memo[key] = value


def _answer(backend: Backend, question: str, call: Call) -> tuple[bool, str]:
    """``backend``'s answer to ``question`` ("can_run" or "should_run") for ``call``: (yes, reason if no)."""
    ask = getattr(backend, question)
    if ask is None:
        return True, ""
    key = (backend.name, question, call)
    verdict = _answers.get(key)
    if verdict is not None:
        return verdict
    try:
        answer = ask(call)
    # Someone else's code: an answer that raises is a decline, never the call's error.
    except (Exception, SystemExit) as exc:
        verdict = False, f"{question} raised {type(exc).__name__}: {exc}"
        log.warning("lltm backend %s: %s (counted as a decline)", backend.name, verdict[1])
    else:
        if answer is True:
            verdict = True, ""
        elif answer is False:
            verdict = False, f"{question} said no"
        elif isinstance(answer, str):
            verdict = False, f"{question}: {answer or 'no (no reason given)'}"
        else:
            verdict = False, f"{question} returned {answer!r}; it must return True, False or a reason string"
    _remember(_answers, key, verdict)
    return verdict


def _select_for_call(entry: _PerCall, call: Call) -> Backend:
    for backend in entry.backends:
        ok, _ = _answer(backend, "can_run", call)
        if ok and not entry.source:
            ok, _ = _answer(backend, "should_run", call)
        if ok:
            log.debug("%s -> %s", call.describe(), backend.name)
            return backend
    lines = "\n  ".join(f"{t.name}: {t.verdict}: {t.reason}" for t in _trace(entry.backends, entry.source, call))
    if entry.source:
        name = entry.backends[0].name
        raise BackendError(f"lltm backend {name!r} (asked for by {entry.source}) cannot run {call.describe()}: "
                           f"{_answer(entry.backends[0], 'can_run', call)[1]}.\n  {lines}")
    raise BackendError(f"no lltm backend can run {call.describe()}.\n  {lines}\n"
                       f"`lltm info --explain` shows this trace for any shape.")


def _select_uncached(device_type: str, dtype: torch.dtype, name: str | None, source: str) -> Backend | _PerCall:
    what = f"{device_type} {_dtype_name(dtype)} tensors"
    if name is not None and not isinstance(name, str):
        raise TypeError(f"{source} takes a backend name or an lltm_core.Backend, got {type(name).__name__} {name!r}")
    if name is not None:
        rec = _resolve(name)
        if rec is None:
            raise BackendError(_not_found_message(name, source))
        if not rec.available:
            raise BackendError(
                f"lltm backend {name!r} (asked for by {source}) is {rec.status}: {rec.reason}. "
                f"Available: {', '.join(available_names()) or 'none'}."
            )
        why_not = rec.backend.supports(device_type, dtype)
        if why_not is not None:
            takers = [n for n in available_names() if _resolve(n).backend.supports(device_type, dtype) is None]
            raise BackendError(
                f"lltm backend {name!r} (asked for by {source}) cannot take {what}: it {why_not}. "
                f"Backends that can: {', '.join(takers) or 'none'}."
            )
        log.debug("%s -> %s (asked for by %s)", what, name, source)
        if rec.backend.can_run is not None:
            return _PerCall((rec.backend,), source, ())
        return rec.backend

    rejected: list[str] = []
    candidates: list[Backend] = []
    unavailable: list[BackendRecord] = []  # installed but cannot run: a loss if one would have won
    for n in sorted(_records_by_name()):
        rec = _resolve(n)
        if not rec.available:
            rejected.append(f"{n}: {rec.status} ({rec.reason})")
            if rec.status == "unavailable":
                unavailable.append(rec)
            continue
        why_not = rec.backend.supports(device_type, dtype)
        if why_not is not None:
            rejected.append(f"{n}: {why_not}")
            continue
        candidates.append(rec.backend)
    if not candidates:
        lines = "\n  ".join(rejected) or "no backends are installed"
        hidden = sorted(_disabled_names() & set(_records_by_name()))
        if "ref" not in _records_by_name():
            advice = f"Install lltm-ref, which runs anywhere: {_INSTALL_HINTS['ref']}."
        elif hidden:
            advice = f"{ENV_DISABLE}={_env_disabled()} hides {', '.join(hidden)}."
        else:
            advice = "None of the installed backends takes these tensors (see why above); `lltm info` lists them."
        raise BackendError(f"no lltm backend can take {what}.\n  {lines}\n{advice}")
    candidates.sort(key=lambda b: (-b.priority, b.name))
    _warn_if_passed_over(unavailable, candidates[0], device_type, dtype, what)
    log.debug(
        "%s -> %s (priority %d; candidates %s; rejected %s)",
        what, candidates[0].name, candidates[0].priority, [b.name for b in candidates], rejected,
    )
    # Only backends up to the first that takes every call can ever be chosen.
    last = next((i for i, b in enumerate(candidates) if not b.declines_calls), len(candidates) - 1)
    if last == 0:
        return candidates[0]
    return _PerCall(tuple(candidates[: last + 1]), "", tuple(rejected))


class TraceEntry(NamedTuple):
    """One backend's part in a choice, as :func:`explain` reports it."""

    name: str
    #: "chosen", "declined", "lower priority", "not for this device/dtype", "unavailable" or "not asked".
    verdict: str
    reason: str


def _trace(asked: tuple[Backend, ...], named: str, call: Call) -> list[TraceEntry]:
    """Every backend, in the order select() considers them, with its verdict on ``call``.

    ``asked``: select()'s candidates, best first; ``named``: who named the one backend asked, or "".
    """
    out: list[TraceEntry] = []
    chosen = None
    others = []
    with _lock:
        for n in sorted(_records_by_name()):
            rec = _resolve(n)
            if rec.available and rec.backend.supports(call.device_type, call.dtype) is None:
                others.append(rec.backend)
            elif rec.available:
                out.append(TraceEntry(n, "not for this device/dtype", f"it {rec.backend.supports(call.device_type, call.dtype)}"))
            else:
                out.append(TraceEntry(n, "unavailable", f"{rec.status}: {rec.reason}"))
    others.sort(key=lambda b: (-b.priority, b.name))
    ordered = list(asked) + [b for b in others if b.name not in {a.name for a in asked}]
    judged: list[TraceEntry] = []
    for b in ordered:
        if named and b.name != asked[0].name:
            judged.append(TraceEntry(b.name, "not asked", f"{named} names {asked[0].name!r}"))
            continue
        ok, reason = _answer(b, "can_run", call)
        if ok and not named:
            ok, reason = _answer(b, "should_run", call)
        if not ok:
            judged.append(TraceEntry(b.name, "declined", f"priority {b.priority}; {reason}"))
        elif chosen is None:
            chosen = b
            why = f"asked for by {named}" if named else f"priority {b.priority}, the highest that accepts the call"
            judged.append(TraceEntry(b.name, "chosen", why))
        else:
            judged.append(TraceEntry(b.name, "lower priority",
                                     f"priority {b.priority} < {chosen.name}'s {chosen.priority}; it would run it"))
    return judged + out


def explain(call: Call) -> list[TraceEntry]:
    """The trace of the choice for ``call``: every backend in order, with its verdict and the reason.

    As Hugging Face kernels reports its variants: which one was chosen, and
    why each other one was declined or not considered.  Honors
    ``LLTM_BACKEND`` and ``use_backend()``; never raises for a call nothing
    can run (then no entry is "chosen").
    """
    if not isinstance(call, Call):
        raise TypeError(f"explain() takes an lltm_core.Call, got {type(call).__name__}")
    name, source = _requested()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", BackendUnavailableWarning)
            entry = _select_uncached(call.device_type, call.dtype, name, source)
    except BackendError as exc:
        if name is not None:
            return [TraceEntry(name, "unavailable", str(exc))]
        return _trace((), "", call)
    if entry.__class__ is _PerCall:
        return _trace(entry.backends, entry.source, call)
    return _trace((entry,), source if name is not None else "", call)


_warned_unavailable: set[str] = set()


def _warn_if_passed_over(unavailable: list[BackendRecord], chosen: Backend, device_type: str, dtype: torch.dtype,
                         what: str) -> None:
    """Warn, once per backend, when an installed backend (of ``unavailable``) that would have won cannot run.

    Nobody asked for it, so falling back is right; but a broken install (a library built for
    another torch, say) would otherwise only lose its speed-up, unseen.  Not for a backend that
    could not take these tensors anyway (lltm-cuda for CPU tensors), nor for one disabled or
    shadowed on purpose.  A backend that failed to load might have won: it is reported too.
    """
    for rec in unavailable:
        n = rec.name
        if n in _warned_unavailable:
            continue
        if rec.backend is not None and (
                rec.backend.supports(device_type, dtype) is not None or rec.backend.priority <= chosen.priority):
            continue
        _warned_unavailable.add(n)
        warnings.warn(
            f"lltm backend {n!r} ({rec.distribution} {rec.version}) is installed but unavailable: {rec.reason}. "
            f"{what} use {chosen.name!r} instead. Fix it, or hide it with {ENV_DISABLE}={n}; `lltm info` lists every backend.",
            BackendUnavailableWarning, stacklevel=5,
        )


def choice_for_device(device_type: str, dtype: torch.dtype) -> tuple[str | None, str]:
    """(chosen backend name or None, why) for ``lltm info``'s selection table: no particular call."""
    try:
        with warnings.catch_warnings():  # lltm info lists the unavailable backends with their reasons
            warnings.simplefilter("ignore", BackendUnavailableWarning)
            b = select(device_type, dtype)
    except BackendError as exc:
        return None, str(exc)
    why = why_chosen(b)
    entry = _device_entry(device_type, dtype, None)
    if entry.__class__ is _PerCall:
        declining = [c.name for c in entry.backends if c.declines_calls]
        why += (f"; {', '.join(declining)} may decline a call by its shape, and the next one runs it "
                f"(lltm info --explain sequence --shape T,B,I,S)")
    return b.name, why


def why_chosen(chosen: Backend) -> str:
    """Why ``select()``, asked for no name, returns ``chosen`` now."""
    name, source = _requested()
    if name is not None:
        return f"asked for by {source}"
    return f"highest priority ({chosen.priority}) of the backends that take it"


# --- the public face of the registry (lltm_core re-exports these) -------------


def get_backend(name: str | None = None, *, device=None, dtype=None) -> Backend:
    """The backend called ``name``, or the one lltm-core would choose.

    ``device`` and ``dtype`` (default: ``torch.get_default_dtype()``) say which
    tensors the backend must take.  The default device is the CPU, except for a
    named backend that does not run there: ``get_backend("cuda")`` means
    lltm-cuda for CUDA tensors, and is checked on the first device it declares.
    With a name, the named backend is checked against them and an error says
    why it cannot take them; it is never swapped for another.
    """
    device_type = torch.device(device).type if device is not None else _default_device_type(name)
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    return select(device_type, dtype, name, source="get_backend()")


def _default_device_type(name: str | None) -> str:
    rec = _resolve(name) if name is not None else None
    if rec is not None and rec.available and "cpu" not in rec.backend.devices:
        return min(rec.backend.devices)
    return "cpu"  # an unavailable or unknown backend: select() says why


def available_backends() -> list[str]:
    """Names of the installed backends that load and can run here."""
    return available_names()


def backend_report() -> list[dict]:
    """Every discovered entry point: distribution, version, status and, if unusable, why."""
    return report()
