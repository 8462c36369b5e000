"""Where a warning should point: the user's line, the first frame outside lltm-core and torch.

A leaf module (it imports nothing of lltm-core), so that every module that warns can use it.
"""

from __future__ import annotations

import os
import sys

import torch

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
    return stacklevel_from(sys._getframe(1))


def stacklevel_from(frame, also_skip: tuple[str, ...] = ()) -> int:
    """:func:`user_stacklevel` for a ``warnings.warn`` in ``frame``'s function, with the frames in the
    folders ``also_skip`` (each ending in ``os.sep``: a backend's package) on the way as well."""
    not_the_callers = _NOT_THE_CALLERS + also_skip
    level = 1  # frame, the function that calls warnings.warn, is level 1
    while frame is not None and _on_the_way(frame, not_the_callers):
        frame = frame.f_back
        while frame is not None and _is_importlib(frame):
            frame = frame.f_back
        level += 1
    return level


def _on_the_way(frame, not_the_callers: tuple[str, ...]) -> bool:
    """Whether ``frame`` is in ``not_the_callers``, or code torch generated (``<string>``, called from torch)."""
    filename = frame.f_code.co_filename
    if filename.startswith(_KIT):
        return False
    if filename.startswith(not_the_callers):
        return True
    caller = frame.f_back
    return filename.startswith("<") and caller is not None and caller.f_code.co_filename.startswith(_TORCH)


def _is_importlib(frame) -> bool:
    """A frame ``warnings.warn`` steps over without counting (its own ``_is_internal_frame``)."""
    filename = frame.f_code.co_filename
    return "importlib" in filename and "_bootstrap" in filename
