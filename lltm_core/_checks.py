"""Argument checks that run before any kernel, with errors that name the argument."""

from __future__ import annotations

import torch

NAMES = ("input", "weights", "bias", "old_h", "old_cell")


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def check_lltm_args(input, weights, bias, old_h, old_cell) -> None:
    """Raise TypeError/ValueError unless the five tensors make one valid LLTM call.

    Shapes: input (B, I), weights (3S, S+I), bias (3S,), old_h (B, S),
    old_cell (B, S); one floating dtype and one device for all five.
    """
    # One expression for the common, valid case: at the seed's size a call is
    # tens of microseconds, and the loop that builds good messages costs a few.
    T = torch.Tensor
    try:
        B, I = input.shape
        _, S = old_h.shape
        dtype, device = input.dtype, input.device
        valid = (
            weights.shape == (3 * S, S + I) and bias.shape == (3 * S,)
            and old_h.shape[0] == B and old_cell.shape == (B, S)
            and dtype.is_floating_point
            and weights.dtype == dtype and bias.dtype == dtype and old_h.dtype == dtype and old_cell.dtype == dtype
            and weights.device == device and bias.device == device
            and old_h.device == device and old_cell.device == device
            # last: the duck-typed reads above do not prove these are tensors
            and isinstance(input, T) and isinstance(weights, T) and isinstance(bias, T)
            and isinstance(old_h, T) and isinstance(old_cell, T)
        )
    except (AttributeError, TypeError, ValueError):  # not tensors, or wrong ranks
        valid = False
    if not valid:
        _raise_for(input, weights, bias, old_h, old_cell)


def _raise_for(input, weights, bias, old_h, old_cell) -> None:
    """Find the first problem and raise an error that names the argument."""
    args = (input, weights, bias, old_h, old_cell)
    for name, t in zip(NAMES, args):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"lltm(): {name} must be a torch.Tensor, got {type(t).__name__}")
    if input.dim() != 2:
        raise ValueError(f"lltm(): input must be 2-D (batch, input_features), got shape {_shape(input)}")
    if old_h.dim() != 2:
        raise ValueError(f"lltm(): old_h must be 2-D (batch, state_size), got shape {_shape(old_h)}")
    B, I = input.shape
    S = old_h.shape[1]
    expected = {
        "weights": (3 * S, S + I),
        "bias": (3 * S,),
        "old_h": (B, S),
        "old_cell": (B, S),
    }
    for name, t in zip(NAMES[1:], args[1:]):
        want = expected[name]
        if t.shape != want:
            raise ValueError(
                f"lltm(): {name} has shape {_shape(t)}, expected {want} for input of shape "
                f"{_shape(input)} (batch={B}, input_features={I}) and state_size={S} (from old_h)"
            )
    dtype = input.dtype
    if not dtype.is_floating_point:
        raise TypeError(f"lltm(): input must be a floating-point tensor, got dtype {dtype}")
    device = input.device
    for name, t in zip(NAMES[1:], args[1:]):
        if t.dtype != dtype:
            raise TypeError(f"lltm(): {name} has dtype {t.dtype}, expected {dtype} (the dtype of input)")
        if t.device != device:
            raise ValueError(f"lltm(): {name} is on {t.device}, expected {device} (the device of input)")
