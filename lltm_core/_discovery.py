"""Discovering and loading backends: entry-point metadata first, a backend's code only when asked.

Module state (all under ``_lock``; ``forget()`` resets it):

``_records``
    None until first needed; then ``{name: [BackendRecord, ...]}`` for every
    entry point in the group ``lltm.backends``, in discovery order.  Built from
    metadata alone: no backend module is imported to build it.
``BackendRecord.status``
    "not loaded" until :func:`resolve` (or :func:`backend_report`) imports
    that backend's module and runs its factory, once; then "available",
    "unavailable" (with the reason) or "shadowed" (another distribution
    provides the same name).

A name in ``LLTM_DISABLE_BACKENDS`` is never loaded: :func:`resolve` reads
the disabled list before it imports anything, so a plugin that hangs,
crashes or takes seconds to import is never run while disabled.  Loading
one backend never loads another; only :func:`backend_report` and
:func:`available_backends` (and choosing among all, in ``_registry``) load
every name that is not disabled.
"""

from __future__ import annotations

import difflib
import logging
import os
import threading
import warnings
from dataclasses import dataclass
from importlib import metadata

from ._callers import user_stacklevel
from .backend import SUPPORTED_INTERFACE_VERSIONS, Backend

log = logging.getLogger("lltm_core")

ENTRY_POINT_GROUP = "lltm.backends"
ENV_BACKEND = "LLTM_BACKEND"
ENV_DISABLE = "LLTM_DISABLE_BACKENDS"

# What to tell a user who lacks a backend we know of.  None is on PyPI yet, so the hint is the
# command that works: from an lltm source tree (or by name, from a folder of wheels, --find-links).
INSTALL_HINTS = {
    "ref": "pip install --no-build-isolation ./backends/lltm_ref  (from an lltm source tree)",
    "cpu": "pip install --no-build-isolation ./backends/lltm_cpu  (from an lltm source tree; compiles against your torch)",
    "cuda": "pip install --no-build-isolation ./backends/lltm_cuda  (from an lltm source tree; needs nvcc and a CUDA build of torch)",
    "triton": "pip install --no-build-isolation ./backends/lltm_triton  (from an lltm source tree; pulls triton)",
}


class BackendError(RuntimeError):
    """No backend can take this call, or the one asked for cannot."""


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
_records: dict[str, list[BackendRecord]] | None = None


def env_reader(name: str):
    """A fast ``os.environ.get(name)`` for the per-call path.

    The variables are read on every call, so that setting them at run time
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


env_backend = env_reader(ENV_BACKEND)
env_disabled = env_reader(ENV_DISABLE)


def disabled_names() -> set[str]:
    return {n.strip() for n in (env_disabled() or "").split(",") if n.strip()}


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
                stacklevel=user_stacklevel(),
            )
    log.debug("discovered backends: %s", {n: [r.distribution for r in rs] for n, rs in found.items()})
    return found


def records_by_name() -> dict[str, list[BackendRecord]]:
    """Every discovered entry point by name, from metadata alone (nothing is imported)."""
    global _records
    records = _records  # one read: forget() may reset the global meanwhile
    if records is None:
        with _lock:
            if _records is None:
                _records = _discover()
            records = _records
    return records


def installed_names() -> list[str]:
    """The names of the installed backends, loaded or not, sorted."""
    return sorted(records_by_name())


def forget() -> None:
    """Drop what was discovered and loaded; the next question discovers again."""
    global _records
    with _lock:
        _records = None


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


def resolve(name: str) -> BackendRecord | None:
    """The record that serves ``name`` (None if nothing is called that), loading that backend only.

    A disabled name comes back as a "disabled" record without being loaded.  Otherwise each
    candidate distribution is loaded; the first available one serves, else the first one.
    """
    recs = records_by_name().get(name)
    if not recs:
        return None
    first = recs[0]
    if name in disabled_names():  # before any import: a disabled plugin's code never runs
        return BackendRecord(name, first.distribution, first.version, first.value,
                             status="disabled", reason=f"hidden by {ENV_DISABLE}")
    with _lock:
        for rec in recs:
            _load(rec)
        winner = next((r for r in recs if r.available), first)
        for rec in recs:
            if rec is not winner and rec.available:
                rec.status = "shadowed"
                rec.reason = f"{winner.distribution} also provides {name!r} and was found first"
    return winner


def backend_report() -> list[dict]:
    """Every discovered entry point: distribution, version, status and, if unusable, why.

    Loads every backend that is not disabled (a disabled one is listed, not imported).
    """
    out = []
    with _lock:  # one consistent view: refresh() waits
        records = records_by_name()
        hidden = disabled_names()
        for name in sorted(records):
            if name in hidden:
                out.extend({**r.as_dict(), "status": "disabled", "reason": f"hidden by {ENV_DISABLE}"}
                           for r in records[name])
                continue
            resolve(name)
            out.extend(r.as_dict() for r in records[name])
    return out


def available_backends() -> list[str]:
    """Names of the installed backends that load and can run here (loading each that is not disabled)."""
    with _lock:  # one consistent view: refresh() waits
        return [n for n in installed_names() if (r := resolve(n)) is not None and r.available]


def is_loaded_from_entry_point(backend: Backend) -> bool:
    """Whether ``backend`` is the object an entry point's factory returned since the last refresh()."""
    return any(rec.backend is backend for rec in records_by_name().get(backend.name, ()))


def not_found_message(name: str, source: str) -> str:
    """Why ``name`` (asked for by ``source``) cannot be had: a close match, or how to install it.

    Lists installed names without loading them, so that a named call stays isolated from the rest.
    """
    installed = installed_names()
    # A distribution's name (lltm-cpu, lltm_cpu) for its backend's (cpu): too far apart for difflib.
    normalized = name.lower().replace("_", "-")
    backends_by_distribution = {rec.distribution.lower().replace("_", "-"): rec.name
                                for recs in records_by_name().values() for rec in recs}
    if normalized in backends_by_distribution:
        return (f"lltm backend {name!r} (asked for by {source}): no backend has that name; it names the "
                f"distribution, whose backend is called {backends_by_distribution[normalized]!r}: pass that. "
                f"Installed backends: {', '.join(installed)}. `lltm info` lists every backend lltm-core can see.")
    known = installed + list(INSTALL_HINTS)
    in_tree = normalized.removeprefix("lltm-")  # lltm-cuda, say, not installed: named by its backend's name below
    close = ([in_tree] if normalized.startswith("lltm-") and in_tree in known
             else difflib.get_close_matches(name.lower(), known, n=1))
    if "," in name:  # a list, as LLTM_DISABLE_BACKENDS takes: the close match of the whole would mislead
        advice = (f"name one backend, not a list: a named backend runs the call or it raises, with no fallback "
                  f"(name none, and the best that takes the tensors runs). "
                  f"Installed: {', '.join(installed) or 'none'}.")
    elif close and close[0] != name:
        advice = f"did you mean {close[0]!r}? Installed: {', '.join(installed) or 'none'}."
    else:
        hint = INSTALL_HINTS.get(name, f"install the distribution that provides the {name!r} lltm backend")
        advice = f"installed: {', '.join(installed) or 'none'}. To get it: {hint}."
    return (
        f"lltm backend {name!r} (asked for by {source}) is not installed; {advice} "
        f"`lltm info` lists every backend lltm-core can see."
    )
