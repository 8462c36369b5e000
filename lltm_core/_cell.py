"""The cell: ``lltm()``, one LLTM step on a backend's kernels, and the ``LLTM`` module around it."""

from __future__ import annotations

import math

import torch

from . import _ops, _registry
from ._checks import (NotTorchScript, TorchSizeNames, ZeroBias, backend_repr, check_lltm_args, check_module_call,
                      check_module_options, fx_leaf_call, layer_sizes, lltm_args_valid)
from ._ops import CELL
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
    return _step(input, weights, bias, old_h, old_cell, backend)


def _step(input, weights, bias, old_h, old_cell, backend):
    """:func:`lltm` once its arguments have passed :func:`lltm_args_valid` (the module's call checks them once)."""
    if bias.dim() != 1:  # (1, 3S), as pytorch/extension-cpp passes it; autograd reshapes its gradient back
        bias = bias.view(-1)
    tensors = (input.contiguous(), weights.contiguous(), bias.contiguous(), old_h.contiguous(), old_cell.contiguous())
    if _compiling():
        from . import _trace  # imports torch._dynamo: on the first trace only (see _trace's docstring)

        out = _trace.forward(CELL, tensors, (), backend)
        return out[0], out[1]
    device_type = "cpu" if input.is_cpu else input.device.type  # .device builds an object: skip it for CPU
    if device_type == "meta":  # shape inference: no backend runs on meta
        return _ops.on_meta(CELL, tensors)
    needs = _ops.needs_autograd(*tensors)
    chosen = _registry.choose(device_type, input.dtype, backend)
    if chosen.declines_calls or _registry.measuring():  # the choice depends on the call: only then is it described
        chosen = _registry.choose(device_type, input.dtype, backend,
                                  CELL.call(device_type, input.dtype, input, old_h.shape[1], needs))
    if needs:
        return _ops.apply(CELL, chosen, *tensors)
    # Nothing to differentiate: the kernels alone (no autograd node, no saved tensors kept).
    out = chosen.forward(*tensors)
    return out[0], out[1]


class LLTM(TorchSizeNames, ZeroBias, NotTorchScript, torch.nn.Module):
    """The LLTM cell as a module, with ``torch.nn.LSTMCell``'s interface; its ``state_dict`` matches the tutorial's.

    ``LLTM(input_size, hidden_size, bias=True, *, backend=None, device=None,
    dtype=None)``; the tutorial's names ``input_features`` and ``state_size``
    are accepted too.  Porting from nn.LSTMCell means changing the class name.
    Parameters ``weights`` (3S, S+I) and ``bias`` (3S,) start uniform in
    [-1/sqrt(S), 1/sqrt(S)]; with ``bias=False`` there is no ``bias``
    parameter (the kernels get zeros).  ``forward(input, hx=None) -> (h', c')``:
    input (B, I), or (I,) unbatched (then h' and c' are (S,)); ``hx`` is
    ``(h, c)``, each (B, S) or (S,), zeros if None, as in nn.LSTMCell.  For a
    whole sequence, :class:`LLTMLayer` runs the time loop inside the backend.
    """

    def __init__(self, input_features: int | None = None, state_size: int | None = None, bias: bool = True, *,
                 input_size: int | None = None, hidden_size: int | None = None, backend: str | None = None,
                 device=None, dtype=None):
        super().__init__()
        input_features, state_size = layer_sizes("LLTM", input_features, state_size, input_size, hidden_size)
        check_module_options("LLTM", dtype, backend)
        self.input_features = input_features
        self.state_size = state_size
        self.backend = backend
        factory = {"device": device, "dtype": dtype}
        self.weights = torch.nn.Parameter(torch.empty(3 * state_size, input_features + state_size, **factory))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(3 * state_size, **factory))
        else:
            self.register_parameter("bias", None)
            # What the kernels get instead: moves with .to(), not in the state_dict (as nn.LSTMCell(bias=False)).
            self.register_buffer("_zero_bias", torch.zeros(3 * state_size, **factory), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.state_size)
        for p in self.parameters():
            torch.nn.init.uniform_(p, -bound, bound)

    def forward(self, input, hx=None, *, state=None):
        weights, bias = self._weights_and_bias()
        if state is None and hx.__class__ is tuple and len(hx) == 2:
            # The commonest call, a batch and its (h, c): one check of all five tensors, the one lltm()
            # makes; any call it does not pass takes the path below, which finds what is wrong and says it
            # in the module's words.  See benchmarks/results/core_overhead.md for what the checks cost.
            h, c = hx
            if (lltm_args_valid(input, weights, bias, h, c) and input.shape[1] == self.input_features
                    and h.shape[1] == self.state_size):
                return _step(input, weights, bias, h, c, self.backend)
        if isinstance(input, torch.fx.Proxy):
            return fx_leaf_call(self, (input,) if hx is None else (input, hx),
                                {} if state is None else {"state": state})
        if self.bias is None:
            bias = self._zero_bias_for(weights)
        if state is not None:  # the name forward's state had before it took nn.LSTMCell's
            if hx is not None:
                raise TypeError("LLTM.forward(): give the state once, as hx (state= is its older name)")
            hx = state
        unbatched = isinstance(input, torch.Tensor) and input.dim() == 1
        if unbatched:
            input = input.unsqueeze(0)
        if not (isinstance(input, torch.Tensor) and input.dim() == 2 and input.shape[1] == self.input_features):
            raise ValueError(f"LLTM({self.extra_repr()}) takes input of shape (batch, {self.input_features}) or "
                             f"({self.input_features},) unbatched, "
                             f"got {tuple(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__}")
        if hx is None:
            zeros = input.new_zeros(input.shape[0], self.state_size)
            old_h = old_cell = zeros
        else:
            old_h, old_cell = self._check_state(hx, input.shape[0], unbatched)
        check_module_call(self, input, weights, "hx", old_h, old_cell)
        new_h, new_cell = lltm(input, weights, bias, old_h, old_cell, backend=self.backend)
        if unbatched:
            return new_h.squeeze(0), new_cell.squeeze(0)
        return new_h, new_cell

    def _weights_and_bias(self):
        """(weights, bias or the zero buffer), read from the module's dicts: nn.Module.__getattr__ costs
        several times a dict lookup on every read.  A name that torch.nn.utils.parametrize has made a
        property is in neither dict, and getattr computes it."""
        weights = self._parameters.get("weights")
        if weights is None:
            weights = self.weights
        bias = self._parameters.get("bias")
        if bias is None:
            bias = self._buffers.get("_zero_bias")
            if bias is None:
                bias = self.bias if self.bias is not None else self._zero_bias
        return weights, bias

    def _check_state(self, hx, batch: int, unbatched: bool):
        """(h, c) as lltm() takes them; a wrong shape is blamed on the state, never on the module's weights."""
        # A bare tensor would unpack along its rows into a confusing shape error, or none at all.
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"LLTM.forward(input, hx): hx must be a pair (h, c), got {type(hx).__name__}")
        want = (self.state_size,) if unbatched else (batch, self.state_size)
        for name, t in zip(("h", "c"), hx):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"LLTM.forward(input, hx): hx's {name} must be a torch.Tensor, got {type(t).__name__}")
            if t.shape != want:
                raise ValueError(f"LLTM({self.extra_repr()}): hx's {name} has shape {tuple(t.shape)}, expected {want} "
                                 f"({'' if unbatched else 'batch, '}state_size) for input of "
                                 f"{'one sample' if unbatched else f'batch {batch}'}")
        h, c = hx
        return (h.unsqueeze(0), c.unsqueeze(0)) if unbatched else (h, c)

    def extra_repr(self) -> str:
        text = f"input_features={self.input_features}, state_size={self.state_size}"
        if self.bias is None:
            text += ", bias=False"
        return text + (f", backend={backend_repr(self.backend)}" if self.backend is not None else "")
