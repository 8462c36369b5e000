"""lltm-core: the LLTM recurrent cell with interchangeable backends.

``lltm(...)`` and ``LLTM`` (one step), ``lltm_sequence(...)`` and
``LLTMLayer`` (whole sequences, nn.LSTM's interface) are the interface; the
arithmetic comes from a backend, a separately installed distribution found through the entry-point
group ``lltm.backends`` (see ``lltm_core.backend`` for the contract).
Importing this package imports no backend.
"""

from __future__ import annotations

import math

import torch

from . import _autograd, _registry
from ._checks import check_lltm_args
from ._registry import BackendError, BackendUnavailableWarning, refresh, use_backend
from ._sequence import lltm_sequence
from .backend import INTERFACE_VERSION, Backend
from .layer import LLTMLayer

try:
    from importlib.metadata import version as _dist_version

    __version__ = _dist_version("lltm-core")
except Exception:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "LLTM",
    "lltm",
    "LLTMLayer",
    "lltm_sequence",
    "get_backend",
    "available_backends",
    "backend_report",
    "use_backend",
    "refresh",
    "Backend",
    "BackendError",
    "BackendUnavailableWarning",
    "INTERFACE_VERSION",
]

_compiling = torch.compiler.is_compiling


def get_backend(name: str | None = None, *, device=None, dtype=None) -> Backend:
    """The backend called ``name``, or the one lltm-core would choose.

    ``device`` and ``dtype`` (default: ``torch.get_default_dtype()``) say which
    tensors the backend must take.  The default device is the CPU, except for a
    named backend that does not run there: ``get_backend("cuda")`` means
    lltm-cuda for CUDA tensors, and is checked on the first device it declares.
    With a name, the named backend is checked against them and an error says
    why it cannot take them; it is never swapped for another.
    """
    device_type = torch.device(device).type if device is not None else _default_device_type(name)
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    return _registry.select(device_type, dtype, name, source="get_backend()")


def _default_device_type(name: str | None) -> str:
    rec = _registry._resolve(name) if name is not None else None
    if rec is not None and rec.available and "cpu" not in rec.backend.devices:
        return min(rec.backend.devices)
    return "cpu"  # an unavailable or unknown backend: select() says why


def available_backends() -> list[str]:
    """Names of the installed backends that load and can run here."""
    return _registry.available_names()


def backend_report() -> list[dict]:
    """Every discovered entry point: distribution, version, status and, if unusable, why."""
    return _registry.report()


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
    if _compiling():
        # The choice is made while tracing and baked into the graph as a call
        # to that backend's custom operator.  Reading the registry's compile_*
        # globals here makes Dynamo guard on them, so a later use_backend()
        # block or refresh() retraces (see _registry.compile_hint).  When
        # backend= names nothing, the operator checks the choice again each
        # time it runs.
        name = _traced_choice(
            input.device.type, input.dtype, backend, _registry.compile_hint, _registry.compile_generation
        )
        named = backend if isinstance(backend, str) else backend.name if isinstance(backend, Backend) else None
        out = getattr(torch.ops.lltm, f"{name}_forward")(
            input.contiguous(), weights.contiguous(), bias.contiguous(), old_h.contiguous(), old_cell.contiguous(),
            named,
        )
        return out[0], out[1]
    device_type = "cpu" if input.is_cpu else input.device.type  # .device builds an object: skip it for CPU
    return _autograd.apply_eager(
        _registry.choose(device_type, input.dtype, backend),
        input.contiguous(), weights.contiguous(), bias.contiguous(), old_h.contiguous(), old_cell.contiguous(),
    )


@torch.compiler.assume_constant_result
def _traced_choice(device_type: str, dtype: torch.dtype, backend, compile_hint, compile_generation) -> str:
    # compile_hint and compile_generation are unused here: they are arguments so
    # that the caller reads them, and Dynamo guards on them.
    chosen = _registry.choose(device_type, dtype, backend)
    _autograd.ops_for(chosen)  # registers torch.ops.lltm.<name>_forward on first use
    return chosen.name


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
