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


def torch_too_old(target: tuple[int, int], distribution: str) -> str | None:
    """``None`` if the running torch is at least ``target`` (major, minor), the oldest torch whose
    stable ABI a library was built for, else what to do.  Such a library loads on every later torch."""
    running = torch.__version__
    try:
        major_minor = tuple(int(part) for part in running.split("+")[0].split(".")[:2])
    except ValueError:
        return f"cannot read torch's version {running!r}: {distribution} needs torch >= {target[0]}.{target[1]}"
    if major_minor >= tuple(target):
        return None
    return (
        f"needs torch >= {target[0]}.{target[1]} (built for its stable ABI), running {running}: "
        f"upgrade torch (pip install 'torch>={target[0]}.{target[1]}'), or install an older {distribution}"
    )


def damaged_library(path, expected_size: int, expected_sha256: str, distribution: str) -> str | None:
    """``None`` if the library at ``path`` is the file its build recorded (size and sha256), else
    why it must not be loaded: a truncated or replaced library can crash the process on load."""
    import hashlib
    import os

    try:
        found = os.path.getsize(path)
        if found != expected_size:
            return f"the library is damaged (expected {expected_size} bytes, found {found}): reinstall {distribution}"
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        return f"the library {path} cannot be read ({exc}): reinstall {distribution}"
    if digest.hexdigest() != expected_sha256:
        return f"the library is damaged (its contents differ from the build's, {found} bytes): reinstall {distribution}"
    return None
