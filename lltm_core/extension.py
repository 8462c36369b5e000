"""Helpers for backends that ship a compiled torch extension.

A library built on torch's stable ABI for torch 2.10 loads on every later torch, and on no
earlier one; a truncated library (an interrupted install) may crash the process as it loads.
So a backend's ``setup.py`` writes a small ``_build_info.py`` beside the library it links (the
target torch, the library's size and sha256), and the backend checks both *before* loading it::

    from lltm_core.extension import library_damage, torch_too_old

    def _unavailable_reason():
        return (torch_too_old(_build_info.TARGET_TORCH, "lltm-cpu")
                or library_damage(path, _build_info.LIBRARY_SIZE, _build_info.LIBRARY_SHA256, "lltm-cpu"))

A library built against torch's full C++ ABI (a JIT build) runs only on the torch that built it:
``torch_mismatch`` says so.  ``backends/lltm_cpu/`` and ``backends/lltm_cuda/`` use these.

The standard saved layouts, :func:`saved_layout` and :func:`sequence_saved_layout`, are here too:
a backend that saves what lltm-ref saves passes them as its ``Backend`` fields, and
:func:`user_stacklevel` makes any backend's warnings point at the user's line.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path

import torch

from ._callers import stacklevel_from


# --- the standard saved layouts -------------------------------------------------
#
# What every in-tree backend's forward saves for its backward, declared once (a backend's
# Backend.saved_layout / sequence_saved_layout may be these, or its own).  Only arithmetic on
# the sizes: they build the fake kernels, where the sizes may be symbolic.  What each tensor
# holds is the backend's (lltm-cuda keeps the gates before activation, the others after).


def saved_layout(batch: int, input_features: int, state_size: int) -> dict:
    """The step's saved tensors: ``{name: shape}``, in the order ``forward`` returns them."""
    return {
        "X": (batch, state_size + input_features),  # cat([old_h, input]), for grad_weights
        "gates": (batch, 3 * state_size),  # the input, output and candidate gates
        "tanh_cell": (batch, state_size),  # tanh(new_cell)
    }


def sequence_saved_layout(steps: int, batch: int, input_features: int, state_size: int) -> dict:
    """The sequence's saved tensors: with the input and output lltm-core holds, (5S + I)·T·B elements, under
    the contract's (6S + I)·T·B.  No c_t: with no forget gate, d c_{t-1} = d c_t."""
    return {
        "gates": (steps, batch, 3 * state_size),  # per step, the three gates
        "tanh_cell": (steps, batch, state_size),  # per step tanh(c_t)
    }


def unavailable_kernel(backend: str, reason: str):
    """A stand-in kernel for a backend whose library cannot load: lltm-core never
    selects an unavailable backend, so this only runs if someone calls it
    directly, and then it says why instead of failing on a missing operator."""

    def kernel(*args):
        raise RuntimeError(f"lltm backend {backend!r} is unavailable: {reason}")

    return kernel


def operator_kernels(namespace: str, backend: str, unavailable: str | None) -> tuple:
    """``(forward, backward, sequence_forward, sequence_backward)`` of a backend whose library defines the
    contract's operators in ``torch.ops.<namespace>``: the operators themselves (no Python frame per call),
    or, when ``unavailable`` says why the library cannot load, :func:`unavailable_kernel` in each place."""
    if unavailable is not None:
        kernel = unavailable_kernel(backend, unavailable)
        return kernel, kernel, kernel, kernel
    ops = getattr(torch.ops, namespace)
    return ops.forward.default, ops.backward.default, ops.sequence_forward.default, ops.sequence_backward.default


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


#: The contract's schemas, declared once for C++ and Python: compiled backends define their
#: operators with this header's strings, and register_fake_kernels reads it.
SCHEMA_HEADER = Path(__file__).resolve().parent / "include" / "lltm_schema.h"


@functools.cache
def contract_schemas() -> dict[str, str]:
    """``{operator name: schema}`` of the contract, as ``lltm_core/include/lltm_schema.h`` declares them."""
    text = SCHEMA_HEADER.read_text().replace("\\\n", " ")  # one line per #define
    schemas = {}
    for literals in re.findall(r'^#define LLTM_SCHEMA_\w+\s+((?:"[^"]*"\s*)+)$', text, re.MULTILINE):
        schema = "".join(re.findall(r'"([^"]*)"', literals))
        schemas[schema.split("(", 1)[0]] = schema
    if set(schemas) != {"forward", "backward", "sequence_forward", "sequence_backward"}:
        raise RuntimeError(f"{SCHEMA_HEADER} declares {sorted(schemas)}: reinstall lltm-core")
    return schemas


def _bind_by_name(namespace: str, name: str):
    """For ``namespace::name``: a function from a call's (args, kwargs) to {argument name: value}, after
    checking that the library defines the operator with the contract's schema."""
    declared = torch._C.parse_schema(f"{namespace}::{contract_schemas()[name]}")
    defined = getattr(getattr(torch.ops, namespace), name).default._schema
    if str(defined) != str(declared):
        raise RuntimeError(
            f"{namespace}::{name} is defined as {defined}, and lltm-core's contract ({SCHEMA_HEADER.name}) "
            f"declares {declared}: rebuild the backend against this lltm-core")
    names = [argument.name for argument in declared.arguments]
    defaults = {a.name: a.default_value for a in declared.arguments if a.has_default_value()}

    def bind(args, kwargs):
        return {**defaults, **dict(zip(names, args)), **kwargs}

    return bind


def register_fake_kernels(namespace: str, saved_layout, sequence_saved_layout=None) -> None:
    """Register fake kernels for a compiled backend's operators of the contract's schemas.

    ``namespace::forward`` and ``namespace::backward`` (the step) and, given
    ``sequence_saved_layout``, ``namespace::sequence_forward`` and
    ``namespace::sequence_backward``, which the library must define with the schemas of
    ``lltm_core/include/lltm_schema.h`` (checked here: a library built against another contract
    is an error).  With them the operators run under FakeTensorMode, torch.compile and
    torch.export (symbolic sizes included), and ``torch.utils.flop_counter.FlopCounterMode``
    counts their GEMMs (``lltm_core._flops``).  Call it once, after loading the library that
    defines them.
    """
    from . import _fake, _flops

    fakes = {
        "forward": lambda a: _fake.cell_forward(saved_layout, a["input"], a["old_h"]),
        "backward": lambda a: _fake.cell_backward(a["grad_new_h"], a["weights"], a["needs_grad_X"]),
    }
    if sequence_saved_layout is not None:
        fakes["sequence_forward"] = lambda a: _fake.sequence_forward(
            sequence_saved_layout, a["input"], a["h0"], a["needs_backward"])
        fakes["sequence_backward"] = lambda a: _fake.sequence_backward(
            a["input"], a["weights"], a["h0"], a["needs_grad_input"])
    for name, fake in fakes.items():
        bind = _bind_by_name(namespace, name)
        torch.library.register_fake(f"{namespace}::{name}")(
            lambda *args, _fake=fake, _bind=bind, **kwargs: _fake(_bind(args, kwargs)))
    _flops.register_namespace(namespace, fakes)


def user_stacklevel(package_folder) -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the caller point at the user's line: the first
    frame outside ``package_folder`` (the backend's package), lltm-core and torch, however deep the call
    path (a backend's first call, lltm-core loading it, autograd)::

        warnings.warn(message, stacklevel=user_stacklevel(os.path.dirname(__file__)))
    """
    return stacklevel_from(sys._getframe(1), (os.path.join(os.fspath(package_folder), ""),))


# What a backend built on torch's stable ABI checks before it loads its library, in this order:
# the running torch is at least the version the library targets (an older one lacks the calls it
# makes), and the library is the file its build recorded (an interrupted install or a full disk
# leaves a truncated one, on which dlopen may crash the process).  Both answer None or the reason.


def torch_too_old(target: tuple[int, int], distribution: str) -> str | None:
    """``None`` if the running torch is ``target`` -- (2, 10) -- or newer, else what to do."""
    wanted = f"{target[0]}.{target[1]}"
    running = torch.__version__
    try:
        release = tuple(int(part) for part in running.split("+")[0].split(".")[:2])
    except ValueError:
        return f"cannot read torch's version {running!r}: {distribution} needs torch {wanted} or newer"
    if release >= tuple(target):
        return None
    return (f"{distribution} needs torch {wanted} or newer (its library is built on torch's stable ABI for "
            f"torch >= {wanted}), running {running}: upgrade torch, e.g. pip install 'torch>={wanted}'")


def library_fingerprint(path) -> tuple[int, str]:
    """(size in bytes, sha256 hex digest) of the file at ``path``: what a backend's build records of
    its library.  A setup.py cannot import lltm_core (an isolated build has none), so
    backends/lltm_build.py repeats these lines; each backend's tests check that its record and
    this function agree."""
    import hashlib

    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def library_damage(path, size: int, sha256: str, distribution: str) -> str | None:
    """``None`` if the library at ``path`` is the one its build recorded (size and sha256), else why
    it must not be loaded and what to do."""
    import os

    if not os.path.isfile(path):
        return f"the library is missing (expected {path}): reinstall {distribution}"
    try:
        found = os.path.getsize(path)
        if found != size:
            return f"the library is damaged (expected {size} bytes, found {found}): reinstall {distribution}"
        if library_fingerprint(path)[1] != sha256:
            return f"the library is damaged (its content differs from the build's record): reinstall {distribution}"
    except OSError as exc:
        return f"the library {path} cannot be read ({exc}): reinstall {distribution}"
    return None
