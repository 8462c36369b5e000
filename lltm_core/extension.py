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


def register_fake_kernels(namespace: str, saved_layout, sequence_saved_layout=None) -> None:
    """Register fake kernels for a compiled backend's operators of the contract's schemas.

    ``namespace::forward`` and ``namespace::backward`` (the step) and, given
    ``sequence_saved_layout``, ``namespace::sequence_forward`` and
    ``namespace::sequence_backward``, with the signatures lltm_cpu's schema
    declares (backends/lltm_cpu/csrc/lltm.cpp).  With them the operators run
    under FakeTensorMode, torch.compile and torch.export (symbolic sizes
    included).  Call it once, after loading the library that defines them.
    """
    from . import _fake

    torch.library.register_fake(f"{namespace}::forward")(
        lambda input, weights, bias, old_h, old_cell: _fake.cell_forward(saved_layout, input, old_h))
    # backward(grad_new_h, grad_new_cell, weights, *saved, needs_grad_X)
    torch.library.register_fake(f"{namespace}::backward")(
        lambda grad_new_h, grad_new_cell, weights, *rest: _fake.cell_backward(grad_new_h, weights, rest[-1]))
    if sequence_saved_layout is None:
        return
    torch.library.register_fake(f"{namespace}::sequence_forward")(
        lambda input, weights, bias, h0, c0, lengths, reverse, needs_backward=True:
        _fake.sequence_forward(sequence_saved_layout, input, h0, needs_backward))
    # sequence_backward(grad_output, grad_h_n, grad_c_n, weights, input, h0, output, lengths, *saved,
    #                   reverse, needs_grad_input)
    torch.library.register_fake(f"{namespace}::sequence_backward")(
        lambda grad_output, grad_h_n, grad_c_n, weights, input, h0, output, lengths, *rest:
        _fake.sequence_backward(input, weights, h0, rest[-1]))


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


# What a backend built on torch's stable ABI checks before loading its library: the running torch
# is at least the version the library targets, and the library is the file its build recorded
# (an interrupted install or a full disk leaves a truncated one, which dlopen may crash on).


def torch_older_than(target: str, distribution: str) -> str | None:
    """``None`` if the running torch is ``target`` ("2.10") or newer, else what to do."""
    running = torch.__version__
    release = tuple(int(part) for part in running.split("+")[0].split(".")[:2])
    if release >= tuple(int(part) for part in target.split(".")[:2]):
        return None
    return (f"{distribution} needs torch {target} or newer (its library is built on torch's stable ABI for "
            f"torch >= {target}), running {running}: upgrade torch, e.g. pip install 'torch>={target}'")


def library_fingerprint(path) -> tuple[int, str]:
    """(size in bytes, BLAKE2b-128 hex digest) of the file at ``path``: a few milliseconds for a library.

    A backend's setup.py records the same pair at build time (it cannot import lltm_core, so it
    repeats these three lines; the backend's tests check that the two agree)."""
    import hashlib
    from pathlib import Path

    data = Path(path).read_bytes()
    return len(data), hashlib.blake2b(data, digest_size=16).hexdigest()


def library_damage(path, size: int, digest: str, distribution: str) -> str | None:
    """``None`` if the library at ``path`` is the one recorded at build time, else why not and what to do."""
    import os

    if not os.path.isfile(path):
        return f"the library is missing (expected {path}): reinstall {distribution}"
    found = os.path.getsize(path)
    if found != size:
        return f"the library is damaged (expected {size} bytes, found {found}): reinstall {distribution}"
    if library_fingerprint(path)[1] != digest:
        return f"the library is damaged (its content differs from the build's record): reinstall {distribution}"
    return None
