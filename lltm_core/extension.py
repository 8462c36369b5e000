"""Helpers for backends that ship a compiled torch extension.

A compiled extension links against one torch build's C++ ABI.  Loading it into
another torch fails with an undefined-symbol error at best and crashes at
worst, so a backend records the torch it was built with (its ``setup.py`` writes
a small ``_build_info.py`` beside each library it links, never into the source
tree, where an editable install's library may have been built with another
torch) and checks it *before* loading the library::

    from lltm_core.extension import torch_mismatch

    def _availability():
        return torch_mismatch(_build_info.TORCH_VERSION, "lltm-cpu")
"""

from __future__ import annotations

import torch


def unavailable_kernel(backend: str, reason: str):
    """A stand-in kernel for a backend whose library cannot load: lltm-core never
    selects an unavailable backend, so this only runs if someone calls it
    directly, and then it says why instead of failing on a missing operator."""

    def kernel(*args):
        raise RuntimeError(f"lltm backend {backend!r} is unavailable: {reason}")

    return kernel


def torch_mismatch(built_for: str, distribution: str) -> str | None:
    """``None`` if the running torch is the one the extension was built for, else what to do."""
    running = torch.__version__
    if built_for == running:
        return None
    return (
        f"built for torch {built_for}, running {running}: rebuild {distribution} against this torch "
        f"(from an lltm source tree: pip install --no-build-isolation --no-deps --force-reinstall "
        f"./backends/{distribution.replace('-', '_')}), or run the torch it was built for"
    )
