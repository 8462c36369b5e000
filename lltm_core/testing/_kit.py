"""What the conformance kit's test modules share: the backend fixture and the contract checks."""

from __future__ import annotations

import pytest
import torch

import lltm_core
from lltm_core.testing import tolerance


@pytest.fixture
def backend(lltm_backend_name, lltm_device, lltm_dtype):
    # An explicit request: fails (never falls back) if the backend cannot take these tensors.
    return lltm_core.get_backend(lltm_backend_name, device=lltm_device, dtype=lltm_dtype)


def assert_close(errors: dict, dtype, what: str):
    tol = tolerance(dtype)
    bad = {k: f"{v:.3g}" for k, v in errors.items() if not v <= tol}
    assert not bad, f"{what}: relative error above {tol:g} in {bad} (all: { {k: f'{v:.2g}' for k, v in errors.items()} })"


def check_returned(what: str, returned, expected: dict, like: torch.Tensor, inputs: dict):
    """Each returned tensor: the declared shape, the inputs' dtype and device, memory of its own."""
    assert isinstance(returned, (tuple, list)) and len(returned) == len(expected), (
        f"{what} must return {len(expected)} tensors ({', '.join(expected)}), got "
        f"{type(returned).__name__} of {len(returned) if isinstance(returned, (tuple, list)) else '?'}")
    for (name, shape), t in zip(expected.items(), returned):
        assert isinstance(t, torch.Tensor), f"{what}: {name} must be a tensor, got {type(t).__name__}"
        if shape is not None:
            assert tuple(t.shape) == shape, f"{what}: {name} has shape {tuple(t.shape)}, expected {shape}"
        assert t.dtype == like.dtype and t.device == like.device, (
            f"{what}: {name} is {t.dtype} on {t.device}, expected {like.dtype} on {like.device} (the inputs')")
        for input_name, x in inputs.items():
            if t.numel() and x.numel():
                assert t.untyped_storage().data_ptr() != x.untyped_storage().data_ptr(), (
                    f"{what}: {name} shares memory with its argument {input_name}; every tensor a kernel "
                    f"returns must be newly allocated (custom operators may not alias)")
    storages = {}
    for name, t in zip(expected, returned):
        if t.numel():
            other = storages.setdefault(t.untyped_storage().data_ptr(), name)
            assert other == name, (f"{what}: {name} shares memory with {other}, which it also returns; every "
                                   f"tensor a kernel returns must be newly allocated (custom operators may not alias)")


def snapshot(inputs: dict) -> dict:
    return {k: (v.clone(), v._version) for k, v in inputs.items()}


def check_untouched(what: str, inputs: dict, before: dict):
    for name, x in inputs.items():
        value, version = before[name]
        assert x._version == version and torch.equal(x, value), (
            f"{what} wrote to its argument {name}: kernels must not modify their inputs")
