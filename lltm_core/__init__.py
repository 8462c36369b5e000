"""lltm-core: the LLTM recurrent cell with interchangeable backends.

``lltm(...)`` and ``LLTM`` (one step), ``lltm_sequence(...)`` and
``LLTMLayer`` (whole sequences, nn.LSTM's interface) are the interface; the
arithmetic comes from a backend, a separately installed distribution found through the entry-point
group ``lltm.backends`` (see ``lltm_core.backend`` for the contract).
Importing this package imports no backend.  This module only hands names on:
no module of lltm-core imports from it.
"""

from __future__ import annotations

from ._cell import LLTM, lltm
from ._discovery import BackendError, available_backends, backend_report
from ._explain import explain
from ._notices import BackendUnavailableWarning
from ._ops import get_backend
from ._registry import TraceEntry, refresh, select_by_measurement, use_backend
from . import _measure  # noqa: F401  (hands the registry its timer for the measured choice)
from ._sequence import lltm_sequence
from .backend import INTERFACE_VERSION, Backend, Call
from .layer import LLTMLayer
from ._version import __version__

__all__ = [
    "LLTM",
    "lltm",
    "LLTMLayer",
    "lltm_sequence",
    "get_backend",
    "available_backends",
    "backend_report",
    "explain",
    "use_backend",
    "select_by_measurement",
    "refresh",
    "Backend",
    "BackendError",
    "BackendUnavailableWarning",
    "Call",
    "TraceEntry",
    "INTERFACE_VERSION",
]
