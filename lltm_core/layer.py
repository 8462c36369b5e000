"""``LLTMLayer``: the LLTM over whole sequences, with ``torch.nn.LSTM``'s interface and conventions."""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from ._checks import (NotTorchScript, TorchSizeNames, ZeroBias, backend_repr, check_module_options, fx_leaf_call,
                      layer_sizes, sequence_args_valid)
from ._callers import user_stacklevel
from ._sequence import lltm_sequence, run_checked

_functorch_active = torch._C._are_functorch_transforms_active


class LLTMLayer(TorchSizeNames, ZeroBias, NotTorchScript, torch.nn.Module):
    """A stack of LLTM layers run over sequences, as ``torch.nn.LSTM`` runs LSTMs.

    ``LLTMLayer(input_size, hidden_size, num_layers=1, bias=True,
    batch_first=False, dropout=0.0, bidirectional=False, proj_size=0, *,
    backend=None, device=None, dtype=None)``, nn.LSTM's signature (``proj_size``
    0 only: the LLTM has no projection); the tutorial's names
    ``input_features`` and ``state_size`` are accepted too.  Porting from
    nn.LSTM means changing the class name.  With D = 2 if bidirectional else
    1 and L = num_layers, ``forward(input, hx=None)`` returns
    ``(output, (h_n, c_n))``:

    * input: (T, B, I), (B, T, I) with ``batch_first``, (T, I) unbatched, or a
      ``PackedSequence`` (then output is one too, in the same order);
    * hx: ``(h_0, c_0)``, each (L*D, B, S), or (L*D, S) unbatched; zeros if None;
    * output: (T, B, D*S) (or batch first), the forward direction's features
      first; zero at the padded positions of a packed input;
    * h_n, c_n: (L*D, B, S), indexed ``layer * D + direction``; for a packed
      input, each sequence's state after its own last valid step (the reverse
      direction starts there).

    Parameters ``weights_l{k}`` (3S, S + I_k) and ``bias_l{k}`` (3S,), plus
    ``weights_l{k}_reverse`` and ``bias_l{k}_reverse``, with I_0 = I and
    I_k = D*S: the cell's layout (columns [h, x], gate rows [input, output,
    candidate]), initialised as the cell is.  ``dropout`` applies to the
    outputs of every layer but the last, in training only.  Each layer and
    direction is one :func:`lltm_core.lltm_sequence` call, on the backend
    chosen for the tensors (or ``backend``).

    Under ``torch.autocast`` for the input's device the layer follows autocast's rule for
    recurrent layers (nn.LSTM's ``mkldnn_rnn_layer`` on CPU, ``_cudnn_rnn`` on CUDA, both
    "lower precision" ops): input, state and parameters are cast to the autocast dtype, and the
    outputs come in it.
    """

    #: Always 0 (the LLTM has no projection): nn.LSTM's attribute, which code written for it reads for h_0's size.
    proj_size = 0
    # Set by __init__; these defaults serve a module pickled before forward's commonest call had them.
    _zero_state = None
    _single_names = None

    def __init__(self, input_features: int | None = None, state_size: int | None = None, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 proj_size: int = 0, *,
                 input_size: int | None = None, hidden_size: int | None = None, backend: str | None = None,
                 device=None, dtype=None):
        super().__init__()
        input_features, state_size = layer_sizes("LLTMLayer", input_features, state_size, input_size, hidden_size)
        check_module_options("LLTMLayer", dtype, backend)
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"LLTMLayer(): num_layers must be an integer >= 1, got {num_layers!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
            raise ValueError(f"LLTMLayer(): dropout must be a probability in [0, 1], got {dropout!r}")
        if dropout and num_layers == 1:  # nn.LSTM's warning, in its words
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so non-zero dropout "
                          f"expects num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}",
                          stacklevel=user_stacklevel())
        if proj_size != 0:
            raise ValueError(f"LLTMLayer(): proj_size={proj_size!r} is unsupported: the LLTM has no projection of "
                             f"its hidden state (nn.LSTM's proj_size); leave it 0")
        self.input_features = input_features
        self.state_size = state_size
        self.num_layers = num_layers
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.dropout = float(dropout)
        self.bidirectional = bool(bidirectional)
        self.backend = backend
        self._zero_state = None  # see _new_zero_state
        directions = 2 if bidirectional else 1
        factory = {"device": device, "dtype": dtype}
        # (weights, bias) names per layer and direction, in forward's order: not rebuilt on every call.
        # Without bias, every layer's bias name is the one zero buffer's: not a parameter, not in the state_dict.
        self._parameter_names = tuple(
            tuple((f"weights_l{layer}{suffix}", f"bias_l{layer}{suffix}" if bias else "_zero_bias")
                  for suffix in self._suffixes())
            for layer in range(num_layers)
        )
        # forward's commonest call: the (weights, bias) names of a single layer and direction, else None
        self._single_names = self._parameter_names[0][0] if len(self._parameter_names[0]) * num_layers == 1 else None
        if not bias:
            self.register_buffer("_zero_bias", torch.zeros(3 * state_size, **factory), persistent=False)
        for layer, names in enumerate(self._parameter_names):
            features = input_features if layer == 0 else directions * state_size
            for weights_name, bias_name in names:
                self.register_parameter(weights_name, torch.nn.Parameter(
                    torch.empty(3 * state_size, state_size + features, **factory)))
                if bias:
                    self.register_parameter(bias_name, torch.nn.Parameter(torch.empty(3 * state_size, **factory)))
        self.reset_parameters()

    def _suffixes(self) -> tuple[str, ...]:
        return ("", "_reverse") if self.bidirectional else ("",)

    def reset_parameters(self) -> None:
        """Uniform in [-1/sqrt(S), 1/sqrt(S)], as the cell (and nn.LSTM) start."""
        bound = 1.0 / math.sqrt(self.state_size)
        for p in self.parameters():
            torch.nn.init.uniform_(p, -bound, bound)

    def flatten_parameters(self) -> None:
        """A no-op, so that code written for nn.LSTM (which packs its weights for cuDNN here) runs."""

    @classmethod
    def from_cell(cls, cell, **kwargs) -> "LLTMLayer":
        """A layer whose first layer, forward direction, is a trained ``lltm_core.LLTM`` cell.

        ``cell.weights`` becomes ``weights_l0`` and ``cell.bias`` ``bias_l0``
        (copied: same layout, columns [h, x]), so the layer over a sequence
        computes what the cell looped over it does.  ``kwargs`` go to the
        constructor (``batch_first=True``, say; ``dtype=`` or ``device=`` converts the copies from the
        cell's); more layers or a reverse
        direction start freshly initialised.  The backend is the cell's unless
        ``backend=`` is given.
        """
        from ._cell import LLTM

        if not isinstance(cell, LLTM):
            raise TypeError(f"LLTMLayer.from_cell() takes an lltm_core.LLTM (the cell), got {type(cell).__name__}"
                            + ("; a layer is already one: copy it with copy.deepcopy or load_state_dict"
                               if isinstance(cell, LLTMLayer) else ""))
        sizes = [name for name in ("input_size", "hidden_size", "input_features", "state_size") if name in kwargs]
        if sizes:  # else the constructor's "give input_features or input_size, not both", for sizes given once
            raise TypeError(f"LLTMLayer.from_cell(): the sizes are the cell's (input_features={cell.input_features}, "
                            f"state_size={cell.state_size}): leave out {', '.join(sizes)}")
        kwargs.setdefault("backend", cell.backend)
        kwargs.setdefault("bias", cell.bias is not None)
        kwargs.setdefault("device", cell.weights.device)  # device= or dtype= given: the copies are converted
        kwargs.setdefault("dtype", cell.weights.dtype)
        layer = cls(cell.input_features, cell.state_size, **kwargs)
        with torch.no_grad():
            layer.weights_l0.copy_(cell.weights)
            if layer.bias:
                layer.bias_l0.copy_(cell.bias if cell.bias is not None else torch.zeros_like(layer.bias_l0))
        return layer

    def extra_repr(self) -> str:
        text = f"{self.input_features}, {self.state_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0), ("bidirectional", False)):
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)!r}"
        return text + (f", backend={backend_repr(self.backend)}" if self.backend is not None else "")

    def forward(self, input, hx=None, *, state=None):
        if (hx is None and state is None and self._single_names is not None and type(input) is torch.Tensor
                and input.dim() == 3 and not torch._C._is_any_autocast_enabled() and not torch.compiler.is_compiling()):
            # The commonest call, one layer and direction over a batched tensor from a zero state, checked here once
            # for what lltm_sequence would check again; anything unusual takes the general path, whose checks name
            # what is wrong.  Why each read counts: core_overhead.md, lltm-core's share of the sequence.
            weights_name, bias_name = self._single_names
            parameters = self._parameters
            weights, bias = parameters.get(weights_name), parameters.get(bias_name)
            if weights is None or bias is None:  # bias=False's zero buffer, or a parametrization's property
                weights, bias = self._tensor(weights_name), self._tensor(bias_name)
            sequence = input.transpose(0, 1) if self.batch_first else input
            zeros = self._zero_state  # checked with the call's tensors: another batch, dtype or device fails
            valid = zeros is not None and not _functorch_active() and sequence_args_valid(sequence, weights, bias,
                                                                                          zeros, zeros)
            if not valid:
                zeros = self._new_zero_state(sequence, sequence.shape[1])
                valid = sequence_args_valid(sequence, weights, bias, zeros, zeros)
            if valid and bias.dim() == 1 and sequence.shape[2] == self.input_features:  # else: the general path
                output, h, c = run_checked((sequence.contiguous(), weights.contiguous(), bias.contiguous(),
                                            zeros, zeros), None, False, self.backend)
                return (output.transpose(0, 1) if self.batch_first else output), (h[None], c[None])
        if isinstance(input, torch.fx.Proxy):
            return fx_leaf_call(self, (input,) if hx is None else (input, hx),
                                {} if state is None else {"state": state})
        if state is not None:  # the name forward's state had before it took nn.LSTM's
            if hx is not None:
                raise TypeError("LLTMLayer.forward(): give the state once, as hx (state= is its older name)")
            hx = state
        cast = _autocast_dtype(input)
        if cast is not None:
            input, hx = _cast_input_and_state(input, hx, cast)
        state = hx
        lengths = None
        if isinstance(input, PackedSequence):
            if torch.compiler.is_exporting():
                # Unpacking reads the lengths' values on the host, which an exported graph cannot hold.
                raise TypeError(
                    "LLTMLayer: torch.export cannot take a PackedSequence (unpacking it needs its lengths' "
                    "values while tracing). Export the model on padded tensors (batch, time, features), "
                    "or keep packed sequences in Python")
            # Padded, in the callers' batch order, which h_0 and h_n follow too (as in nn.LSTM).
            sequence, lengths = pad_packed_sequence(input)
            batched = True
        elif isinstance(input, torch.Tensor):
            if input.dim() not in (2, 3):
                raise ValueError(f"LLTMLayer({self.extra_repr()}): input must be 3-D "
                                 f"({'batch, time' if self.batch_first else 'time, batch'}, features), or 2-D "
                                 f"(time, features) unbatched, got shape {tuple(input.shape)}")
            batched = input.dim() == 3
            sequence = input if batched else input.unsqueeze(1)
            if batched and self.batch_first:
                sequence = sequence.transpose(0, 1)
        else:
            raise TypeError(f"LLTMLayer.forward(): input must be a torch.Tensor or a PackedSequence, "
                            f"got {type(input).__name__}")
        self._check_input(sequence, input, cast)
        initial = self._initial_states(state, sequence, batched)

        directions = 2 if self.bidirectional else 1
        h_n, c_n = [], []
        layer_input = sequence
        for layer, names in enumerate(self._parameter_names):
            outputs = []
            for direction, (weights_name, bias_name) in enumerate(names):
                index = layer * directions + direction
                weights, bias = self._tensor(weights_name), self._tensor(bias_name)
                if not self.bias:
                    bias = self._zero_bias_for(weights)
                if cast is not None:
                    weights, bias = weights.to(cast), bias.to(cast)
                output, h, c = lltm_sequence(
                    layer_input, weights, bias, *initial[index],
                    lengths=lengths, reverse=direction == 1, backend=self.backend,
                )
                outputs.append(output)
                h_n.append(h)
                c_n.append(c)
            layer_input = outputs[0] if directions == 1 else torch.cat(outputs, dim=2)
            if self.dropout and self.training and layer + 1 < self.num_layers:
                layer_input = F.dropout(layer_input, self.dropout, training=True)
        if len(h_n) == 1:  # one layer, one direction: a view, not a copy (and one autograd node fewer)
            output, h_n, c_n = layer_input, h_n[0].unsqueeze(0), c_n[0].unsqueeze(0)
        else:
            output, h_n, c_n = layer_input, torch.stack(h_n), torch.stack(c_n)

        if isinstance(input, PackedSequence):
            return _repack_like(output, lengths, input), (h_n, c_n)
        if not batched:
            return output.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        if self.batch_first:
            output = output.transpose(0, 1)
        return output, (h_n, c_n)

    def _new_zero_state(self, sequence: torch.Tensor, batch: int) -> torch.Tensor:
        """A (batch, S) zero state, kept for the next call of the same batch size, dtype and device.

        Making one was about a quarter of the call's own Python beside a kernel (core_overhead.md, the no_grad
        share); keeping it is safe because kernels never write their inputs (the kit checks).  Under a
        torch.func transform, new_zeros makes the transform's own (batched) tensor, which must not outlive
        it: made afresh there, and not kept.
        """
        if _functorch_active():
            return sequence.new_zeros((batch, self.state_size))
        with torch.inference_mode(False):  # an inference tensor could not be saved by a later training call
            zeros = torch.zeros((batch, self.state_size), dtype=sequence.dtype, device=sequence.device)
        self._zero_state = zeros
        return zeros

    def _tensor(self, name: str) -> torch.Tensor:
        """The parameter (or, with bias=False, the zero buffer) ``name``, read from the module's dicts:
        nn.Module.__getattr__ costs 0.45 us against 0.04 us, a visible share of a short sequence's call.
        A name that torch.nn.utils.parametrize has turned into a property (weight_norm, spectral_norm,
        orthogonal) is in neither dict, and getattr computes it, as nn.LSTM's own read does."""
        tensor = self._parameters.get(name)
        if tensor is None:
            tensor = self._buffers.get(name)
        return tensor if tensor is not None else getattr(self, name)

    def _check_input(self, sequence: torch.Tensor, input, cast: torch.dtype | None = None) -> None:
        # The valid case first, in one expression: at short sequences a microsecond here is a visible share.
        parameter = self._tensor(self._parameter_names[0][0][0])
        dtype = sequence.dtype
        if (sequence.shape[-1] == self.input_features and sequence.shape[0] != 0
                and dtype is (cast or parameter.dtype)
                and dtype.is_floating_point and sequence.device == parameter.device):
            return
        shown = (f"got shape {tuple(input.shape)}" if isinstance(input, torch.Tensor)
                 else f"got a PackedSequence of {sequence.shape[-1]} features")
        if sequence.shape[-1] != self.input_features:
            raise ValueError(f"LLTMLayer({self.extra_repr()}): input must have {self.input_features} features "
                             f"(its last dimension), {shown}")
        if sequence.shape[0] == 0:
            raise ValueError(f"LLTMLayer({self.extra_repr()}): input has 0 time steps ({shown}); "
                             f"a sequence needs at least one")
        if not parameter.dtype.is_floating_point:  # moved by .to(torch.complex64), say
            raise TypeError(f"LLTMLayer({self.extra_repr()}): the parameters have dtype {parameter.dtype}; the LLTM "
                            f"computes in a floating-point dtype: .to() the module and the input to float32, "
                            f"float64, bfloat16 or float16")
        if not dtype.is_floating_point or dtype != parameter.dtype:
            raise TypeError(f"LLTMLayer({self.extra_repr()}): input has dtype {dtype}, expected "
                            f"{parameter.dtype} (the dtype of the parameters; .to() the module or the input)")
        raise ValueError(f"LLTMLayer({self.extra_repr()}): input is on {sequence.device}, expected "
                         f"{parameter.device} (where the parameters are; .to() the module or the input)")

    def _initial_states(self, state, sequence: torch.Tensor, batched: bool) -> list:
        """(h, c) for each layer and direction, in h_0's order: layer * D + direction, each (B, S)."""
        count = self.num_layers * len(self._suffixes())
        if state is None:
            # One zeros tensor for every h and c: the kernels never write their inputs.
            zeros = sequence.new_zeros((sequence.shape[1], self.state_size))
            return [(zeros, zeros)] * count
        batch = sequence.shape[1]
        want = (count, batch, self.state_size) if batched else (count, self.state_size)
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise TypeError(f"LLTMLayer.forward(input, state): state must be a pair (h_0, c_0), "
                            f"got {type(state).__name__}")
        for name, t in zip(("h_0", "c_0"), state):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"LLTMLayer.forward(): state's {name} must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != want:
                raise ValueError(
                    f"LLTMLayer({self.extra_repr()}): state's {name} has shape {tuple(t.shape)}, expected {want} "
                    f"(num_layers * directions, {'batch, ' if batched else ''}state_size)")
            if t.dtype != sequence.dtype:
                raise TypeError(f"LLTMLayer({self.extra_repr()}): state's {name} has dtype {t.dtype}, "
                                f"expected {sequence.dtype} (the dtype of input)")
            if t.device != sequence.device:
                raise ValueError(f"LLTMLayer({self.extra_repr()}): state's {name} is on {t.device}, "
                                 f"expected {sequence.device} (the device of input)")
        h_0, c_0 = state
        if not batched:
            h_0, c_0 = h_0.unsqueeze(1), c_0.unsqueeze(1)
        return list(zip(h_0.unbind(0), c_0.unbind(0)))


def _autocast_dtype(input) -> torch.dtype | None:
    """The dtype autocast computes recurrent layers in on the input's device, or None where it is off."""
    if not torch._C._is_any_autocast_enabled():  # the common case, in one cheap call
        return None
    data = input.data if isinstance(input, PackedSequence) else input
    # float64 is left alone, as autocast leaves it for every op (nn.LSTM's included): a double model stays double.
    if not isinstance(data, torch.Tensor) or not data.is_floating_point() or data.dtype is torch.float64:
        return None
    device_type = data.device.type
    if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return None


def _cast_input_and_state(input, hx, dtype: torch.dtype):
    """input and hx's tensors in ``dtype`` (what autocast does to a lower-precision op's arguments)."""
    if isinstance(hx, (tuple, list)):
        hx = type(hx)(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in hx)
    return input.to(dtype), hx


def _repack_like(output: torch.Tensor, lengths: torch.Tensor, like: PackedSequence) -> PackedSequence:
    """``output`` (T, B, F), in the callers' batch order, packed exactly as ``like`` is."""
    if like.sorted_indices is not None:
        order = like.sorted_indices
        output, lengths = output.index_select(1, order), lengths[order.cpu()]
    data = pack_padded_sequence(output, lengths, enforce_sorted=True).data
    return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)
