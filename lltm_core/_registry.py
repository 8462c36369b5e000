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

import torch

from .backend import SUPPORTED_INTERFACE_VERSIONS, Backend

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
_choice_cache: dict[tuple, Backend] = {}
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


def select(device_type: str, dtype: torch.dtype, name: str | None = None, *, source: str = "backend=") -> Backend:
    """The backend that runs a call on ``device_type`` tensors of ``dtype``.

    The decision order:

    1. An explicit request wins, and is never second-guessed: the ``backend=``
       argument, else the innermost ``use_backend()`` block, else the
       ``LLTM_BACKEND`` environment variable.  If the backend it names is not
       installed, is unavailable here, is disabled, or does not take this
       device/dtype, the call fails with that reason.  Silently running
       something else would make benchmarks and bug reports lie.
    2. Otherwise, among backends that loaded, declare themselves available,
       are not hidden by ``LLTM_DISABLE_BACKENDS`` and support this device
       type and dtype, the highest ``priority`` wins; ties go to the name that
       sorts first, so the choice does not depend on install order.  An
       installed backend that would have won but cannot run is named once in
       a BackendUnavailableWarning (see _warn_if_passed_over).
    3. If none qualifies, the error lists every backend and why it was
       rejected.

    Choices are cached per (request, device type, dtype); ``refresh()`` clears
    the cache.  ``source`` says, in errors, where ``name`` came from.
    """
    if name is None:
        name, source = _requested()
    key = (name, device_type, dtype, _env_disabled())
    chosen = _choice_cache.get(key)
    if chosen is not None:
        return chosen
    with _lock:
        chosen = _select_uncached(device_type, dtype, name, source)
        _choice_cache[key] = chosen
    return chosen


def choose(device_type: str, dtype: torch.dtype, backend) -> Backend:
    """What a call's ``backend=`` argument (a name, a :class:`Backend`, or None) runs on these tensors."""
    if isinstance(backend, Backend):
        why_not = backend.supports(device_type, dtype)
        if why_not is not None:
            raise BackendError(f"lltm backend {backend.name!r} (passed as backend=) cannot take these tensors: it {why_not}")
        return backend
    return select(device_type, dtype, backend)


def _select_uncached(device_type: str, dtype: torch.dtype, name: str | None, source: str) -> Backend:
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
    chosen = min(candidates, key=lambda b: (-b.priority, b.name))
    _warn_if_passed_over(unavailable, chosen, device_type, dtype, what)
    log.debug(
        "%s -> %s (priority %d; candidates %s; rejected %s)",
        what, chosen.name, chosen.priority, [b.name for b in candidates], rejected,
    )
    return chosen


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


def explain(device_type: str, dtype: torch.dtype) -> tuple[str | None, str]:
    """(chosen backend name or None, why) for ``lltm info``."""
    try:
        with warnings.catch_warnings():  # lltm info lists the unavailable backends with their reasons
            warnings.simplefilter("ignore", BackendUnavailableWarning)
            b = select(device_type, dtype)
    except BackendError as exc:
        return None, str(exc)
    return b.name, why_chosen(b)


def why_chosen(chosen: Backend) -> str:
    """Why ``select()``, asked for no name, returns ``chosen`` now."""
    name, source = _requested()
    if name is not None:
        return f"asked for by {source}"
    return f"highest priority ({chosen.priority}) of the backends that take it"
