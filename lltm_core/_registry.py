"""The selection rule: which backend runs a call, decided by :func:`rank` and :func:`verdict` alone.

``rank`` orders the backends that may take a device and dtype (or checks the
one a user named); ``verdict`` asks one of them about one call (``can_run``,
then ``should_run`` unless the user named it).  :func:`select` (every call)
and :func:`lltm_core.explain` (the trace, ``_explain``) both walk ``rank``'s
order with ``verdict``: the rule is written once.  Discovery and loading are
``_discovery``'s, the warnings ``_notices``'s.

Module state (``refresh()`` resets it, with ``_discovery``'s and ``_notices``'s):

``_choice_cache``
    ``(name, source, device type, dtype, LLTM_DISABLE_BACKENDS) -> Backend |
    Ranking``: the device-level choice.  A Backend when no candidate that could
    win declines calls (then that is the whole choice); else the Ranking, to be
    asked per call.
``_call_choices``
    ``(_choice_cache key, call tuple) -> Backend``: per-call choices; bounded
    (``MEMO_SIZE``, oldest out first), since shapes vary in real training.
``_answers``
    ``(backend name, "can_run"/"should_run", Call) -> (yes, reason)``;
    bounded the same way.
``_context_choice``
    The innermost ``use_backend()`` name, per thread and asyncio task.
``compile_hint``, ``compile_generation``
    What ``torch.compile`` guards on (see below).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import _discovery, _notices
from ._discovery import ENV_BACKEND, ENV_DISABLE, BackendError, BackendRecord, is_loaded_from_entry_point  # noqa: F401
from .backend import Backend, Call

log = logging.getLogger("lltm_core")

_lock = threading.RLock()
_choice_cache: dict[tuple, Backend | Ranking] = {}
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

# The per-call memos: bounded, oldest out first.
MEMO_SIZE = 4096
_call_choices: dict[tuple, Backend] = {}
_answers: dict[tuple, tuple[bool, str]] = {}

_env_backend = _discovery.env_backend
_env_disabled = _discovery.env_disabled


class TraceEntry(NamedTuple):
    """One backend's part in a choice, as :func:`lltm_core.explain` reports it."""

    name: str
    #: "chosen", "declined", "lower priority", "not for this device/dtype", "unavailable" or "not asked".
    verdict: str
    reason: str


@dataclass(frozen=True)
class Ranking:
    """:func:`rank`'s answer for a device and dtype: who is asked about a call, in order."""

    backends: tuple[Backend, ...]  # best first; for a named request, that one backend
    source: str  # who named the backend, or "" when lltm-core chooses
    passed: tuple[TraceEntry, ...]  # not asked: unavailable, disabled, not for these tensors, or not named
    unavailable: tuple[BackendRecord, ...]  # installed but cannot run: named in a warning if one would have won
    error: str = ""  # why nothing can take these tensors (then backends is empty)


def refresh() -> None:
    """Forget everything discovered, loaded and chosen (e.g. after installing a backend)."""
    global compile_generation
    with _lock:
        _discovery.forget()
        forget_choices()
        _notices.forget()
        compile_generation += 1


def forget_choices() -> None:
    """Drop the memoized choices and answers, keeping what was discovered and loaded."""
    with _lock:
        _choice_cache.clear()
        _call_choices.clear()
        _answers.clear()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def requested() -> tuple[str | None, str]:
    """(the backend name the user asked for, or None; who asked): use_backend() beats LLTM_BACKEND."""
    ctx = _context_choice.get()
    if ctx is not None:
        return ctx, "use_backend()"
    env = (_env_backend() or "").strip()
    if env:
        return env, f"{ENV_BACKEND}={env}"
    return None, ""


def rank(device_type: str, dtype: torch.dtype, name: str | None, source: str) -> Ranking:
    """The order in which backends are asked about calls on ``device_type`` tensors of ``dtype``.

    1. A named backend (``name``, from ``source``: ``backend=``, ``use_backend()``
       or ``LLTM_BACKEND``) is the only one, and only it is loaded.  If it is not
       installed, is unavailable or disabled, or does not take this device/dtype,
       ``error`` says so: the call fails, never runs elsewhere.
    2. Otherwise every backend not hidden by ``LLTM_DISABLE_BACKENDS`` is loaded
       (a hidden one never is), and those available that take this device type and
       dtype are ordered by ``priority``, highest first; ties go to the name that
       sorts first, so the order does not depend on install order.
    """
    what = f"{device_type} {_dtype_name(dtype)} tensors"
    if name is not None:
        others = tuple(TraceEntry(n, "not asked", f"{source} names {name!r}")
                       for n in _discovery.installed_names() if n != name)
        rec = _discovery.resolve(name)
        if rec is None:
            return Ranking((), source, others, (), _discovery.not_found_message(name, source))
        if not rec.available:
            return Ranking((), source, others, (), (
                f"lltm backend {name!r} (asked for by {source}) is {rec.status}: {rec.reason}. "
                f"Also installed: {', '.join(t.name for t in others) or 'none'} (`lltm info` says which are available)."))
        why_not = rec.backend.supports(device_type, dtype)
        if why_not is not None:
            return Ranking((), source, others, (), (
                f"lltm backend {name!r} (asked for by {source}) cannot take {what}: it {why_not}. "
                f"`lltm info` shows which backend takes which tensors."))
        return Ranking((rec.backend,), source, others, ())

    passed: list[TraceEntry] = []
    candidates: list[Backend] = []
    unavailable: list[BackendRecord] = []
    for n in _discovery.installed_names():
        rec = _discovery.resolve(n)
        if not rec.available:
            passed.append(TraceEntry(n, "unavailable", f"{rec.status}: {rec.reason}"))
            if rec.status == "unavailable":
                unavailable.append(rec)
            continue
        why_not = rec.backend.supports(device_type, dtype)
        if why_not is not None:
            passed.append(TraceEntry(n, "not for this device/dtype", f"it {why_not}"))
            continue
        candidates.append(rec.backend)
    candidates.sort(key=lambda b: (-b.priority, b.name))
    error = ""
    if not candidates:
        lines = "\n  ".join(f"{t.name}: {t.reason}" for t in passed) or "no backends are installed"
        installed = set(_discovery.installed_names())
        hidden = sorted(_discovery.disabled_names() & installed)
        if "ref" not in installed:
            advice = f"Install lltm-ref, which runs anywhere: {_discovery.INSTALL_HINTS['ref']}."
        elif hidden:
            advice = f"{ENV_DISABLE}={_env_disabled()} hides {', '.join(hidden)}."
        else:
            advice = "None of the installed backends takes these tensors (see why above); `lltm info` lists them."
        error = f"no lltm backend can take {what}.\n  {lines}\n{advice}"
    return Ranking(tuple(candidates), "", tuple(passed), tuple(unavailable), error)


def verdict(backend: Backend, call: Call, named: str) -> tuple[bool, str]:
    """Whether ``backend`` runs ``call``: its ``can_run``, then (unless the user ``named`` it) its ``should_run``."""
    ok, reason = _answer(backend, "can_run", call)
    if ok and not named:
        ok, reason = _answer(backend, "should_run", call)
    return ok, reason


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
    answer_and_reason = _answers.get(key)
    if answer_and_reason is not None:
        return answer_and_reason
    try:
        answer = ask(call)
    # Someone else's code: an answer that raises is a decline, never the call's error.
    except (Exception, SystemExit) as exc:
        answer_and_reason = False, f"{question} raised {type(exc).__name__}: {exc}"
        _notices.raising_answer(backend.name, question, answer_and_reason[1])
    else:
        if answer is True:
            answer_and_reason = True, ""
        elif answer is False:
            answer_and_reason = False, f"{question} said no"
        elif isinstance(answer, str):
            answer_and_reason = False, f"{question}: {answer or 'no (no reason given)'}"
        else:
            answer_and_reason = False, f"{question} returned {answer!r}; it must return True, False or a reason string"
    _remember(_answers, key, answer_and_reason)
    return answer_and_reason


def trace(ranking: Ranking, call: Call) -> list[TraceEntry]:
    """Every backend, in the order the rule considers them, with its verdict on ``call``."""
    judged: list[TraceEntry] = []
    chosen = None
    for b in ranking.backends:
        ok, reason = verdict(b, call, ranking.source)
        if not ok:
            judged.append(TraceEntry(b.name, "declined", f"priority {b.priority}; {reason}"))
        elif chosen is None:
            chosen = b
            why = (f"asked for by {ranking.source}" if ranking.source
                   else f"priority {b.priority}, the highest that accepts the call")
            judged.append(TraceEntry(b.name, "chosen", why))
        else:
            judged.append(TraceEntry(b.name, "lower priority",
                                     f"priority {b.priority} < {chosen.name}'s {chosen.priority}; it would run it"))
    return judged + list(ranking.passed)


def select(device_type: str, dtype: torch.dtype, name: str | None = None, *, source: str = "backend=",
           call: tuple | None = None) -> Backend:
    """The backend that runs a call on ``device_type`` tensors of ``dtype``: the first in :func:`rank`'s order
    whose :func:`verdict` on the call is yes.

    ``name`` None means the user's request (``use_backend()``, else ``LLTM_BACKEND``), if any.
    ``call`` is the rest of the call, ``(op, batch, input_features, state_size, steps,
    needs_backward)`` as in :class:`~lltm_core.Call`, or None when there is no particular call
    (``get_backend()``, ``lltm info``): then no backend is asked, and the first in order is it.
    Raises BackendError with the reason when nothing can run it.  ``source`` says, in errors,
    where ``name`` came from.
    """
    if name is None:
        name, source = requested()
    # source is in the key for the errors' sake: they say who named the backend.
    key = (name, source, device_type, dtype, _env_disabled())
    entry = _choice_cache.get(key)
    if entry is None:
        entry = _device_choice(key, device_type, dtype, name, source)
    if entry.__class__ is not Ranking:
        return entry
    if call is None:
        return entry.backends[0]
    memo_key = (key, call)
    chosen = _call_choices.get(memo_key)
    if chosen is None:
        chosen = _select_for_call(entry, Call(call[0], device_type, dtype, *call[1:]))
        _remember(_call_choices, memo_key, chosen)
    return chosen


def _device_choice(key: tuple, device_type: str, dtype: torch.dtype, name, source: str) -> Backend | Ranking:
    if name is not None and not isinstance(name, str):
        raise TypeError(f"{source} takes a backend name or an lltm_core.Backend, got {type(name).__name__} {name!r}")
    with _lock:
        ranking = rank(device_type, dtype, name, source)
        if ranking.error:
            raise BackendError(ranking.error)
        first = ranking.backends[0]
        log.debug("%s %s tensors -> %s (%s; candidates %s; passed over %s)", device_type, _dtype_name(dtype),
                  first.name, f"asked for by {source}" if ranking.source else f"priority {first.priority}",
                  [b.name for b in ranking.backends], [f"{t.name}: {t.reason}" for t in ranking.passed])
        # Only a backend that declines calls, before the first that takes every call, makes the choice per call.
        entry = ranking if (first.can_run is not None if ranking.source else first.declines_calls) else first
        if entry is first:
            _notices.warn_if_passed_over(list(ranking.unavailable), first, device_type, dtype,
                                         f"{device_type} {_dtype_name(dtype)} tensors")
        _choice_cache[key] = entry
    return entry


def _select_for_call(ranking: Ranking, call: Call) -> Backend:
    for backend in ranking.backends:
        if verdict(backend, call, ranking.source)[0]:
            log.debug("%s -> %s", call.describe(), backend.name)
            _notices.warn_if_passed_over(list(ranking.unavailable), backend, call.device_type, call.dtype,
                                         f"{call.device_type} {_dtype_name(call.dtype)} tensors")
            return backend
    lines = "\n  ".join(f"{t.name}: {t.verdict}: {t.reason}" for t in trace(ranking, call))
    if ranking.source:
        name = ranking.backends[0].name
        raise BackendError(f"lltm backend {name!r} (asked for by {ranking.source}) cannot run {call.describe()}: "
                           f"{_answer(ranking.backends[0], 'can_run', call)[1]}.\n  {lines}")
    raise BackendError(f"no lltm backend can run {call.describe()}.\n  {lines}\n"
                       f"`lltm info --explain` shows this trace for any shape.")


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
    """Whether the choice for these tensors asks backends per call (some candidate has can_run/should_run)."""
    if isinstance(backend, Backend):
        return backend.can_run is not None
    return device_entry(device_type, dtype, backend).__class__ is Ranking


def device_entry(device_type: str, dtype: torch.dtype, name: str | None) -> Backend | Ranking:
    """select()'s cached device-level entry for these tensors (filled first), as a call without shape sees it."""
    source = "backend="
    if name is None:
        name, source = requested()
    select(device_type, dtype, name, source=source)  # fills the cache, or raises with the reason
    return _choice_cache[(name, source, device_type, dtype, _env_disabled())]


def why_chosen(chosen: Backend) -> str:
    """Why ``select()``, asked for no name, returns ``chosen`` now."""
    name, source = requested()
    if name is not None:
        return f"asked for by {source}"
    return f"highest priority ({chosen.priority}) of the backends that take it"


# --- the public face of the rule (lltm_core re-exports these) -----------------


@contextlib.contextmanager
def use_backend(name: str):
    """Use backend ``name`` for every call in this block that does not name one itself."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"use_backend() takes a backend name, got {name!r}")
    if name not in _discovery.records_by_name():  # a typo fails here, not at the first call inside the block
        raise BackendError(_discovery.not_found_message(name, "use_backend()"))
    global compile_hint
    token = _context_choice.set(name)
    outer_hint, compile_hint = compile_hint, name
    try:
        yield
    finally:
        _context_choice.reset(token)
        compile_hint = outer_hint


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
    rec = _discovery.resolve(name) if name is not None else None
    if rec is not None and rec.available and "cpu" not in rec.backend.devices:
        return min(rec.backend.devices)
    return "cpu"  # an unavailable or unknown backend: select() says why
