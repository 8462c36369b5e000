"""The cell: ``lltm()``, one LLTM step on a backend's kernels, and the ``LLTM`` module around it."""

from __future__ import annotations

import math

import torch

from . import _autograd, _registry, _trace
from ._checks import check_lltm_args
from .backend import Backend

_compiling = torch.compiler.is_compiling


def lltm(input, weights, bias, old_h, old_cell, *, backend: str | Backend | None = None):
    """One LLTM step; returns ``(new_h, new_cell)``, differentiable in all five tensors.

    Shapes: input (B, I), weights (3S, S+I), bias (3S,) or (1, 3S), old_h
    (B, S), old_cell (B, S): a drop-in for pytorch/extension-cpp's ``lltm``.
    ``backend`` names the backend to use (or is a
    :class:`Backend`); by default the best available one for the tensors'
    device and dtype is chosen (see ``lltm_core._registry.select``).
    """
    check_lltm_args(input, weights, bias, old_h, old_cell)
    if bias.dim() != 1:  # (1, 3S), as pytorch/extension-cpp passes it; autograd reshapes its gradient back
        bias = bias.view(-1)
    tensors = (input.contiguous(), weights.contiguous(), bias.contiguous(), old_h.contiguous(), old_cell.contiguous())
    if _compiling():
        needs = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        out = _trace.forward("cell", tensors, (), backend, needs)
        return out[0], out[1]
    device_type = "cpu" if input.is_cpu else input.device.type  # .device builds an object: skip it for CPU
    needs = _autograd.needs_autograd(input, weights, bias, old_h, old_cell)
    chosen = _registry.choose(device_type, input.dtype, backend)
    if chosen.declines_calls:  # then the choice depends on the call: only then is it described
        chosen = _registry.choose(device_type, input.dtype, backend,
                                  ("cell", input.shape[0], input.shape[1], old_h.shape[1], None, needs))
    return _autograd.apply_eager(chosen, needs, *tensors)


class LLTM(torch.nn.Module):
    """The LLTM cell as a module; its ``state_dict`` matches the tutorial's ``LLTM``.

    Parameters ``weights`` (3S, I+S) and ``bias`` (3S,) start uniform in
    [-1/sqrt(S), 1/sqrt(S)].  ``forward(input, (h, c)) -> (new_h, new_cell)``;
    without a state, h and c start at zero, as in ``torch.nn.LSTMCell``.  For a
    whole sequence, :class:`LLTMLayer` runs the time loop inside the backend.
    """

    def __init__(self, input_features: int, state_size: int, *, backend: str | None = None, device=None, dtype=None):
        super().__init__()
        if input_features < 1 or state_size < 1:
            raise ValueError(
                f"LLTM(): input_features and state_size must be >= 1, got {input_features} and {state_size}"
            )
        self.input_features = input_features
        self.state_size = state_size
        self.backend = backend
        factory = {"device": device, "dtype": dtype}
        self.weights = torch.nn.Parameter(torch.empty(3 * state_size, input_features + state_size, **factory))
        self.bias = torch.nn.Parameter(torch.empty(3 * state_size, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.state_size)
        for p in (self.weights, self.bias):
            torch.nn.init.uniform_(p, -bound, bound)

    def forward(self, input, state=None):
        if state is None:
            if not (isinstance(input, torch.Tensor) and input.dim() == 2):
                raise ValueError(f"LLTM({self.extra_repr()}) takes input of shape (batch, {self.input_features}), "
                                 f"got {tuple(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__}")
            zeros = input.new_zeros(input.shape[0], self.state_size)
            state = (zeros, zeros)
        # A bare tensor would unpack along its rows into a confusing shape error, or none at all.
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise TypeError(f"LLTM.forward(input, state): state must be a pair (h, c), got {type(state).__name__}")
        old_h, old_cell = state
        try:
            return lltm(input, self.weights, self.bias, old_h, old_cell, backend=self.backend)
        except ValueError:
            # lltm() blames the weights for a width mismatch; here the weights are the module's own.
            if isinstance(input, torch.Tensor) and input.dim() == 2 and input.shape[1] != self.input_features:
                raise ValueError(
                    f"LLTM({self.extra_repr()}) takes input of shape (batch, {self.input_features}), "
                    f"got {tuple(input.shape)}"
                ) from None
            raise

    def extra_repr(self) -> str:
        chosen = f", backend={self.backend!r}" if self.backend is not None else ""
        return f"input_features={self.input_features}, state_size={self.state_size}{chosen}"
