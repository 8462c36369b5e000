"""What lltm-core tells the user about backends, once per backend and process.

Module state (``forget()`` resets it, from ``lltm_core.refresh()``):

``_warned_unavailable``
    Names of the backends already named in a :class:`BackendUnavailableWarning`.
``_logged_raising``
    ``(backend name, question)`` pairs whose ``can_run``/``should_run`` raised
    and was logged: training with varying shapes asks anew per shape, and
    says so once.
"""

from __future__ import annotations

import logging
import warnings

import torch

from ._callers import user_stacklevel
from ._discovery import ENV_DISABLE, BackendRecord
from .backend import Backend

log = logging.getLogger("lltm_core")


class BackendUnavailableWarning(UserWarning):
    """An installed backend that would have been chosen cannot run, so a lesser one runs instead."""


_warned_unavailable: set[str] = set()
_logged_raising: set[tuple[str, str]] = set()


def forget() -> None:
    _warned_unavailable.clear()
    _logged_raising.clear()


def raising_answer(backend_name: str, question: str, reason: str) -> None:
    """Log, once per backend and question, that an answer raised (it counts as a decline)."""
    if (backend_name, question) in _logged_raising:
        return
    _logged_raising.add((backend_name, question))
    log.warning("lltm backend %s: %s (counted as a decline; said once per backend)", backend_name, reason)


def warn_if_passed_over(unavailable: list[BackendRecord], chosen: Backend, device_type: str, dtype: torch.dtype,
                        what: str) -> None:
    """Warn, once per backend, when an installed backend (of ``unavailable``) that would have won cannot run.

    ``chosen`` is the backend that runs the call: the caller hands it over after
    the per-call answers are in, so the warning names what really ran.  Nobody
    asked for the unavailable one, so falling back is right; but a broken install
    (a library built for another torch, say) would otherwise only lose its
    speed-up, unseen.  Not for a backend that could not take these tensors anyway
    (lltm-cuda for CPU tensors), nor for one disabled or shadowed on purpose.  A
    backend that failed to load might have won: it is reported too.
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
            BackendUnavailableWarning, stacklevel=user_stacklevel(),
        )
