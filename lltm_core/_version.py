"""The installed lltm-core's version, read from its distribution's metadata."""

from __future__ import annotations

try:
    from importlib.metadata import version as _dist_version

    __version__ = _dist_version("lltm-core")
except Exception:  # running from a source tree that was never installed
    __version__ = "0+unknown"
