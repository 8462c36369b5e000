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
import os
import sys
import warnings

import torch

from ._discovery import ENV_DISABLE, BackendRecord
from .backend import Backend

log = logging.getLogger("lltm_core")


class BackendUnavailableWarning(UserWarning):
    """An installed backend that would have been chosen cannot run, so a lesser one runs instead."""


# Frames in these folders are between the user's line and a warning: lltm-core's own, and torch's
# (nn.Module.__call__, autograd, the compilers) that a module's forward or a traced call runs under.
# The conformance kit's are the caller's: it calls lltm-core as a user does.
_TORCH = os.path.dirname(torch.__file__) + os.sep
_NOT_THE_CALLERS = (os.path.dirname(__file__) + os.sep, _TORCH)
_KIT = os.path.join(os.path.dirname(__file__), "testing") + os.sep


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the caller point at the user's line.

    That is the first frame outside lltm-core and torch: ``LLTMLayer(...)(x)``, ``lltm(...)``,
    ``import lltm_core`` or ``torch.export.export(...)``, however deep the path to the warning.
    Python 3.12's ``skip_file_prefixes`` does this; lltm-core supports 3.11, so it counts the
    frames itself, as ``warnings.warn`` will: importlib's frames are skipped without counting.
    """
    frame, level = sys._getframe(1), 1  # the function that calls warnings.warn is level 1
    while frame is not None and _on_the_way(frame):
        frame = frame.f_back
        while frame is not None and _is_importlib(frame):
            frame = frame.f_back
        level += 1
    return level


def _on_the_way(frame) -> bool:
    """Whether ``frame`` is lltm-core's or torch's, or code torch generated (``<string>``, called from torch)."""
    filename = frame.f_code.co_filename
    if filename.startswith(_KIT):
        return False
    if filename.startswith(_NOT_THE_CALLERS):
        return True
    caller = frame.f_back
    return filename.startswith("<") and caller is not None and caller.f_code.co_filename.startswith(_TORCH)


def _is_importlib(frame) -> bool:
    """A frame ``warnings.warn`` steps over without counting (its own ``_is_internal_frame``)."""
    filename = frame.f_code.co_filename
    return "importlib" in filename and "_bootstrap" in filename


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
