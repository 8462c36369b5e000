"""The selection rule: which backend runs a call, decided by :func:`rank` and :func:`decide` alone.

The order, as networkx's backend dispatch has it: a backend the user named
(``backend=``, ``use_backend()``, ``LLTM_BACKEND``) or nothing; else every
available backend that takes the tensors' device and dtype, by priority
(:func:`rank`).  Each is asked about the call (:attr:`Ranking.questions`: a
named one only whether it *can* run it), and the first that says yes runs it
(:func:`decide`).  :func:`select` (every call), :func:`lltm_core.explain` and
the errors all take :func:`decide`'s answer: the rule is written once.
Discovery and loading are ``_discovery``'s, the warnings ``_notices``'s.

Module state (``refresh()`` resets it, with ``_discovery``'s and ``_notices``'s):

``_choice_cache``
    ``(name, source, device type, dtype, LLTM_DISABLE_BACKENDS) -> Backend |
    Ranking``: the device-level choice.  A Backend when no candidate that could
    win declines calls (then that is the whole choice); else the Ranking, to be
    asked per call.
``_call_choices``
    ``(_choice_cache key, Call) -> Backend``: per-call choices; bounded
    (``MEMO_SIZE``, oldest out first), since shapes vary in real training.
``_answers``
    ``(backend name, "can_run"/"should_run", Call) -> (yes, reason)``;
    bounded the same way.
``_measured``
    ``(shape class, the names timed) -> {backend name: seconds, or why it could not be timed}``:
    the measured choice's timings, kept for the process; bounded the same way.
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
import warnings
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from . import _discovery, _notices
from ._callers import user_stacklevel
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
# thread that entered a block last) and a count of refresh() calls and
# select_by_measurement() changes.  Dynamo
# guards on their values, so entering or leaving a use_backend() block, or
# refreshing, retraces.  Where they cannot tell (another thread's block,
# LLTM_BACKEND or LLTM_DISABLE_BACKENDS changed after tracing), the compiled
# operator checks the choice again when it runs and raises rather than run a
# backend nobody chose (lltm_core._ops.check_traced_choice).
compile_hint: str | None = None
compile_generation = 0

# The per-call memos: bounded, oldest out first.
MEMO_SIZE = 4096
_call_choices: dict[tuple, Backend] = {}
_answers: dict[tuple, tuple[bool, str]] = {}

_env_backend = _discovery.env_backend
_env_disabled = _discovery.env_disabled

# The measured choice: select_by_measurement(), or LLTM_SELECT=measure, read once, here (not per
# call like LLTM_BACKEND: the choice's cache key holds the setting, and a read costs on every call).
ENV_SELECT = "LLTM_SELECT"
_select_variable = _discovery.env_reader(ENV_SELECT)()
_measure_setting: bool = _select_variable == "measure"
if _select_variable not in (None, "", "measure"):
    warnings.warn(f"{ENV_SELECT}={_select_variable!r} means nothing to lltm: its one value is 'measure' (choose "
                  f"among the backends that accept a call by timing them); the choice stays by priority",
                  stacklevel=user_stacklevel())
_measured: dict[tuple, dict[str, float | str]] = {}
#: ``time_backends(backends, call) -> {name: seconds per call, or "raised ..."}``: how the measured
#: choice times the backends that accept a call.  lltm_core._measure sets it when lltm_core is
#: imported: it runs the kernels through the public functions, which import this module.
time_backends: Callable[[list, Call], dict[str, float | str]] | None = None


def measuring() -> bool:
    """Whether the choice among the backends that accept a call is made by timing them."""
    return _measure_setting


class TraceEntry(NamedTuple):
    """One backend's part in a choice, as :func:`lltm_core.explain` reports it."""

    name: str
    #: "chosen", "declined", "lower priority", "slower" (measured), "not for this device/dtype", "unavailable"
    #: or "not asked".
    verdict: str
    reason: str


@dataclass(frozen=True)
class Ranking:
    """:func:`rank`'s answer for a device and dtype: who is asked about a call, in order."""

    backends: tuple[Backend, ...]  # best first; for a named request, that one backend
    source: str  # who named the backend, or "" when lltm-core chooses
    passed_over: tuple[TraceEntry, ...]  # not asked: unavailable, disabled, not for these tensors, or not named
    unavailable: tuple[BackendRecord, ...]  # installed but cannot run: named in a warning if one would have won
    error: str = ""  # why nothing can take these tensors (then backends is empty)
    #: Whether the backends that accept a call are timed and the fastest runs it (never for a named backend).
    measure: bool = False

    @property
    def questions(self) -> tuple[str, ...]:
        """What each backend is asked about a call.

        A backend the user named is asked only whether it *can* run the call:
        ``should_run`` is its preference, and the user's choice overrides it.
        """
        return ("can_run",) if self.source else ("can_run", "should_run")

    @property
    def asks_per_call(self) -> bool:
        """Whether the choice depends on the call: the first backend has a question to answer.

        When it has none it says yes to every call, and the ones after it are never reached, unless
        the choice is measured: then every backend that accepts the call is timed.
        """
        if self.measure and len(self.backends) > 1:
            return True
        first = self.backends[0]
        return any(getattr(first, question) is not None for question in self.questions)


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
        _measured.clear()


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

    passed_over: list[TraceEntry] = []
    candidates: list[Backend] = []
    unavailable: list[BackendRecord] = []
    for n in _discovery.installed_names():
        rec = _discovery.resolve(n)
        if not rec.available:
            passed_over.append(TraceEntry(n, "unavailable", f"{rec.status}: {rec.reason}"))
            if rec.status == "unavailable":
                unavailable.append(rec)
            continue
        why_not = rec.backend.supports(device_type, dtype)
        if why_not is not None:
            passed_over.append(TraceEntry(n, "not for this device/dtype", f"it {why_not}"))
            continue
        candidates.append(rec.backend)
    candidates.sort(key=lambda b: (-b.priority, b.name))
    error = ""
    if not candidates:
        lines = "\n  ".join(f"{t.name}: {t.reason}" for t in passed_over) or "no backends are installed"
        installed = set(_discovery.installed_names())
        hidden = sorted(_discovery.disabled_names() & installed)
        if "ref" not in installed:
            advice = f"Install lltm-ref, which runs anywhere: {_discovery.INSTALL_HINTS['ref']}."
        elif hidden:
            advice = f"{ENV_DISABLE}={_env_disabled()} hides {', '.join(hidden)}."
        else:
            advice = "None of the installed backends takes these tensors (see why above); `lltm info` lists them."
        error = f"no lltm backend can take {what}.\n  {lines}\n{advice}"
    return Ranking(tuple(candidates), "", tuple(passed_over), tuple(unavailable), error, measure=measuring())


def _named_object(backend: Backend) -> Ranking:
    """The ranking of a :class:`Backend` object passed as ``backend=``: it alone, named."""
    return Ranking((backend,), "a Backend passed as backend=", (), ())


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


def _verdict(backend: Backend, questions: tuple[str, ...], call: Call) -> tuple[bool, str]:
    """(yes, reason if no): ``backend``'s answers to ``questions`` about ``call``, the first no ending them."""
    for question in questions:
        ok, reason = _answer(backend, question, call)
        if not ok:
            return ok, reason
    return True, ""


def decide(ranking: Ranking, call: Call) -> tuple[Backend | None, list[TraceEntry]]:
    """(the backend that runs ``call``, or None; the trace): the first in ``ranking`` that says yes.

    Every backend in the order is asked (the answers are memoized), so that the
    trace says of each one after the chosen whether it would have run the call;
    the backends ``rank`` passed over follow, with why.  With ``ranking.measure``,
    the backends that say yes are timed on the call's shape class (once per
    process) and the fastest is the first.
    """
    verdicts = [(b, *_verdict(b, ranking.questions, call)) for b in ranking.backends]
    accepting = [b for b, ok, _ in verdicts if ok]
    times = _timings(accepting, call) if ranking.measure and len(accepting) > 1 else {}
    timed = sorted((b for b in accepting if isinstance(times.get(b.name), float)), key=lambda b: times[b.name])
    chosen = timed[0] if timed else accepting[0] if accepting else None
    judged: list[TraceEntry] = []
    for b, ok, reason in verdicts:
        if not ok:
            judged.append(TraceEntry(b.name, "declined", f"priority {b.priority}; {reason}"))
        elif b is chosen:
            why = (f"asked for by {ranking.source}" if ranking.source else
                   f"the fastest measured: {_time_text(times, b)}" if timed else
                   f"priority {b.priority}, the highest that accepts the call")
            judged.append(TraceEntry(b.name, "chosen", why))
        elif timed:
            judged.append(TraceEntry(b.name, "slower", f"measured {_time_text(times, b)} against "
                                                       f"{chosen.name}'s {_time_text(times, chosen)}"))
        else:
            judged.append(TraceEntry(b.name, "lower priority",
                                     f"priority {b.priority} < {chosen.name}'s {chosen.priority}; it would run it"))
    return chosen, judged + list(ranking.passed_over)


def shape_class(call: Call) -> Call:
    """The calls that share one measurement: the same but for the steps, rounded up to a power of two."""
    if call.steps is None or call.steps < 1:
        return call
    return call._replace(steps=1 << (call.steps - 1).bit_length())


def _timings(backends: list[Backend], call: Call) -> dict[str, float | str]:
    """The measured choice's times of ``backends`` on ``call``'s shape class: timed on first need, then kept."""
    key = (shape_class(call), tuple(b.name for b in backends))
    times = _measured.get(key)
    if times is None:
        times = time_backends(backends, key[0])
        log.debug("%s: measured %s", key[0].describe(), times)
        _remember(_measured, key, times)
    return times


def _time_text(times: dict[str, float | str], backend: Backend) -> str:
    value = times.get(backend.name)
    return f"{value * 1e6:.0f} us a call" if isinstance(value, float) else f"not timed ({value})"


def _decided(ranking: Ranking, call: Call) -> Backend:
    """:func:`decide`'s choice, or BackendError with its trace when nothing can run ``call``."""
    chosen, judged = decide(ranking, call)
    if chosen is not None:
        log.debug("%s -> %s", call.describe(), chosen.name)
        _notices.warn_if_passed_over(list(ranking.unavailable), chosen, call.device_type, call.dtype,
                                     f"{call.device_type} {_dtype_name(call.dtype)} tensors")
        return chosen
    lines = "\n  ".join(f"{t.name}: {t.verdict}: {t.reason}" for t in judged)
    if ranking.source:
        refusal = _verdict(ranking.backends[0], ranking.questions, call)[1]
        raise BackendError(f"lltm backend {ranking.backends[0].name!r} (asked for by {ranking.source}) cannot run "
                           f"{call.describe()}: {refusal}.\n  {lines}")
    raise BackendError(f"no lltm backend can run {call.describe()}.\n  {lines}\n"
                       f"`lltm info --explain` shows this trace for any shape.")


def select(device_type: str, dtype: torch.dtype, name: str | None = None, *, source: str = "backend=",
           call: Call | None = None) -> Backend:
    """The backend that runs a call on ``device_type`` tensors of ``dtype``: :func:`decide` on :func:`rank`'s order.

    ``name`` None means the user's request (``use_backend()``, else ``LLTM_BACKEND``), if any.
    ``call`` is the :class:`~lltm_core.Call`, or None when there is no particular call
    (``get_backend()``, ``lltm info``): then no backend is asked, and the first in order is it.
    Raises BackendError with the reason when nothing can run it.  ``source`` says, in errors,
    where ``name`` came from.
    """
    if name is None:
        name, source = requested()
    # source is in the key for the errors' sake: they say who named the backend.
    key = (name, source, device_type, dtype, _env_disabled(), _measure_setting)
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
        chosen = _decided(entry, call)
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
                  [b.name for b in ranking.backends], [f"{t.name}: {t.reason}" for t in ranking.passed_over])
        entry = ranking if ranking.asks_per_call else first
        if entry is first:
            _notices.warn_if_passed_over(list(ranking.unavailable), first, device_type, dtype,
                                         f"{device_type} {_dtype_name(dtype)} tensors")
        _choice_cache[key] = entry
    return entry


def choose(device_type: str, dtype: torch.dtype, backend, call: Call | None = None) -> Backend:
    """What a call's ``backend=`` argument (a name, a :class:`Backend`, or None) runs on these tensors.

    Without ``call``, the backend for the device and dtype alone; when it ``declines_calls``, the
    choice for a particular call may differ, and the caller asks again with the call.  That keeps
    the common case (no backend declines anything) from describing every call.
    """
    if isinstance(backend, Backend):
        why_not = backend.supports(device_type, dtype)
        if why_not is not None:
            raise BackendError(f"lltm backend {backend.name!r} (passed as backend=) cannot take these tensors: it {why_not}")
        if call is not None:
            ranking = _named_object(backend)
            if ranking.asks_per_call:
                _decided(ranking, call)
        return backend
    return select(device_type, dtype, backend, call=call)


def depends_on_call(device_type: str, dtype: torch.dtype, backend) -> bool:
    """Whether the choice for these tensors asks backends per call (some candidate has can_run/should_run)."""
    if isinstance(backend, Backend):
        return _named_object(backend).asks_per_call
    return device_entry(device_type, dtype, backend).__class__ is Ranking


def device_entry(device_type: str, dtype: torch.dtype, name: str | None) -> Backend | Ranking:
    """select()'s cached device-level entry for these tensors (filled first), as a call without shape sees it."""
    source = "backend="
    if name is None:
        name, source = requested()
    select(device_type, dtype, name, source=source)  # fills the cache, or raises with the reason
    return _choice_cache[(name, source, device_type, dtype, _env_disabled(), _measure_setting)]


def why_chosen(chosen: Backend) -> str:
    """Why ``select()``, asked for no name, returns ``chosen`` now."""
    name, source = requested()
    if name is not None:
        return f"asked for by {source}"
    if measuring():
        return "the fastest measured of the backends that take the call"
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


class select_by_measurement:
    """Choose among the backends that accept a call by timing them, as cuDNN's benchmark mode does.

    ``lltm_core.select_by_measurement()`` turns it on for the process, and
    ``select_by_measurement(False)`` off; as a context manager
    (``with lltm_core.select_by_measurement(): ...``) it holds for the block and
    restores the setting after.  ``LLTM_SELECT=measure`` turns it on at import.
    For each call shape class (the Call, its steps rounded up to a power of two)
    every backend that accepts the call is timed a few times, interleaved,
    forward and, when the call needs it, backward; the fastest runs every call
    of that class for the rest of the process (``refresh()`` forgets the times).
    ``explain()`` shows them.  A backend the user named is never timed: it runs.
    Under ``torch.compile`` the measurement is made while tracing.
    """

    def __init__(self, enabled: bool = True):
        if not isinstance(enabled, bool):
            raise TypeError(f"select_by_measurement() takes a bool, got {enabled!r}")
        global _measure_setting, compile_generation
        self._outer = _measure_setting
        _measure_setting = enabled
        compile_generation += 1  # a compiled graph traced under the other setting traces again

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        global _measure_setting, compile_generation
        _measure_setting = self._outer
        compile_generation += 1


