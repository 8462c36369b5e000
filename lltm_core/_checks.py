"""Argument checks that run before any kernel, with errors that name the argument."""

from __future__ import annotations

import sys

import torch

from .backend import Backend

NAMES = ("input", "weights", "bias", "old_h", "old_cell")


def _shape(t: torch.Tensor) -> tuple:
    return tuple(t.shape)


def check_lltm_args(input, weights, bias, old_h, old_cell) -> None:
    """Raise TypeError/ValueError unless the five tensors make one valid LLTM call.

    Shapes: input (B, I), weights (3S, S+I), bias (3S,) or (1, 3S) (as
    pytorch/extension-cpp's lltm takes it), old_h (B, S), old_cell (B, S); one
    floating dtype and one device for all five.
    """
    if not lltm_args_valid(input, weights, bias, old_h, old_cell):
        _raise_for(input, weights, bias, old_h, old_cell)


def lltm_args_valid(input, weights, bias, old_h, old_cell) -> bool:
    """Whether :func:`check_lltm_args` passes, without building any message: the check of every call."""
    # One expression for the common, valid case: at the seed's size a call is
    # tens of microseconds, and the loop that builds good messages costs a few.
    T = torch.Tensor
    try:
        B, I = input.shape
        _, S = old_h.shape
        dtype = input.dtype
        return (
            weights.shape == (3 * S, S + I) and (bias.shape == (3 * S,) or bias.shape == (1, 3 * S))
            and old_h.shape[0] == B and old_cell.shape == (B, S)
            and dtype.is_floating_point  # dtypes are singletons: `is` compares them cheapest
            and weights.dtype is dtype and bias.dtype is dtype and old_h.dtype is dtype and old_cell.dtype is dtype
            and _same_device(input, weights, bias, old_h, old_cell)
            # last: the duck-typed reads above do not prove these are tensors
            and isinstance(input, T) and isinstance(weights, T) and isinstance(bias, T)
            and isinstance(old_h, T) and isinstance(old_cell, T)
        )
    except (AttributeError, TypeError, ValueError):  # not tensors, or wrong ranks
        return False


def _same_device(first, *others) -> bool:
    """Whether all these tensors are on ``first``'s device.  ``.device`` builds an object on every read:
    on the CPU (the commonest case) ``is_cpu`` answers for a fraction of the cost."""
    if first.is_cpu:
        for t in others:
            if not t.is_cpu:
                return False
        return True
    device = first.device
    for t in others:
        if t.device != device:
            return False
    return True


def _raise_for(input, weights, bias, old_h, old_cell) -> None:
    """Find the first problem and raise an error that names the argument."""
    args = (input, weights, bias, old_h, old_cell)
    _require_tensors("lltm()", zip(NAMES, args))
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
    _check_shapes("lltm()", zip(NAMES[1:], args[1:]), expected, S,
                  f"input of shape {_shape(input)} (batch={B}, input_features={I}) and state_size={S} (from old_h)")
    _check_dtypes_and_devices("lltm()", zip(NAMES, args))


def _require_tensors(caller: str, named_tensors) -> None:
    for name, t in named_tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{caller}: {name} must be a torch.Tensor, got {type(t).__name__}")


def _check_shapes(caller: str, named_tensors, expected: dict, S: int, context: str) -> None:
    """Each tensor has its ``expected`` shape; bias may also be (1, 3S), as pytorch/extension-cpp passes it."""
    for name, t in named_tensors:
        want = expected[name]
        if t.shape != want and not (name == "bias" and t.shape == (1, 3 * S)):
            also = f" or {(1, 3 * S)}" if name == "bias" else ""
            raise ValueError(f"{caller}: {name} has shape {_shape(t)}, expected {want}{also} for {context}")


def _check_dtypes_and_devices(caller: str, named_tensors) -> None:
    """One floating dtype and one device, the first tensor's; errors name the odd one out."""
    (first_name, first), *rest = named_tensors
    dtype, device = first.dtype, first.device
    if not dtype.is_floating_point:
        raise TypeError(f"{caller}: {first_name} must be a floating-point tensor, got dtype {dtype}")
    for name, t in rest:
        if t.dtype != dtype:
            raise TypeError(f"{caller}: {name} has dtype {t.dtype}, expected {dtype} (the dtype of {first_name})")
        if t.device != device:
            raise ValueError(f"{caller}: {name} is on {t.device}, expected {device} (the device of {first_name})")


def layer_sizes(caller: str, input_features, state_size, input_size, hidden_size) -> tuple[int, int]:
    """(I, S) from the tutorial's names (input_features, state_size) or nn.LSTM's (input_size, hidden_size)."""
    sizes = []
    for tutorial, torch_name, a, b in (("input_features", "input_size", input_features, input_size),
                                       ("state_size", "hidden_size", state_size, hidden_size)):
        if a is not None and b is not None:
            raise TypeError(f"{caller}(): give {tutorial} or {torch_name}, not both (they are the same size)")
        value = a if a is not None else b
        if value is None:
            raise TypeError(f"{caller}(): missing the size {torch_name} (or {tutorial})")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{caller}(): {tutorial} ({torch_name}) must be an integer >= 1, got {value!r}")
        sizes.append(value)
    return sizes[0], sizes[1]


def backend_repr(backend) -> str:
    """A module's ``backend=`` as its repr and its errors show it: a Backend object by its name, not by its
    fields (kernels, functions and all: hundreds of characters in every message)."""
    return f"Backend({backend.name!r})" if isinstance(backend, Backend) else repr(backend)


def check_module_options(caller: str, dtype, backend) -> None:
    """A module's ``dtype=``: None or a floating dtype (torch would refuse an integer one only as the
    parameters require grad, in its own words; a complex one would fail at the first call).  Its
    ``backend=``: None, a name or a Backend (whether that is installed is the first call's question)."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"{caller}(): dtype must be a floating-point dtype (float32, float64, bfloat16 or "
                        f"float16), got {dtype!r}")
    if backend is not None and not isinstance(backend, (str, Backend)):
        raise TypeError(f"{caller}(): backend must be a backend's name or an lltm_core.Backend (or None: the best "
                        f"for the tensors), got {type(backend).__name__} {backend!r}")


class TorchSizeNames:
    """nn.LSTMCell's and nn.LSTM's names for the sizes, so that code reading them ports unchanged."""

    input_features: int
    state_size: int

    @property
    def input_size(self) -> int:
        return self.input_features

    @property
    def hidden_size(self) -> int:
        return self.state_size


def check_module_call(module, input: torch.Tensor, parameter: torch.Tensor, state_name: str, h, c) -> None:
    """A module's call: ``input`` in its parameters' dtype and on their device, the state ``h`` and
    ``c`` (named ``state_name``, as the module's caller passed it) in the input's.

    The functional checks compare everything with ``input`` and name lltm()'s arguments: from a
    module, an input of the wrong dtype is the input's to change, and ``hx`` is what its caller
    gave, not ``old_h``.
    """
    dtype, device = input.dtype, input.device
    # Written out, no generator: this runs on every step of a loop over the cell.
    if (dtype is parameter.dtype and h.dtype is dtype and c.dtype is dtype
            and device == parameter.device and h.device == device and c.device == device):
        return
    described = f"{type(module).__name__}({module.extra_repr()})"
    if dtype != parameter.dtype:
        raise TypeError(f"{described}: input has dtype {dtype}, expected {parameter.dtype} "
                        f"(the dtype of the parameters; .to() the module or the input)")
    if device != parameter.device:
        raise ValueError(f"{described}: input is on {device}, expected {parameter.device} "
                         f"(where the parameters are; .to() the module or the input)")
    for name, t in (("h", h), ("c", c)):
        if t.dtype != dtype:
            raise TypeError(f"{described}: {state_name}'s {name} has dtype {t.dtype}, expected {dtype} "
                            f"(the dtype of input)")
        if t.device != device:
            raise ValueError(f"{described}: {state_name}'s {name} is on {t.device}, expected {device} "
                             f"(the device of input)")


class NotTorchScript:
    """TorchScript's compiler and tracer refused, with what to use instead, for LLTM and LLTMLayer.

    A module's backend is chosen, and its autograd applied, in Python, which TorchScript cannot hold:
    torch.jit.script failed on an annotation, and torch.jit.trace kept one call's path (lltm-ref's time loop
    for that input's length only, wrong on any other) or failed its own check of the graphs."""

    def __prepare_scriptable__(self):  # torch.jit.script calls it on every module it is given, submodules too
        raise RuntimeError(_torchscript_refusal(self, "compiled by torch.jit.script"))

    def _slow_forward(self, *args, **kwargs):  # what nn.Module calls instead of forward under torch.jit.trace
        raise RuntimeError(_torchscript_refusal(self, "recorded by torch.jit.trace"))


def _torchscript_refusal(module, what: str) -> str:
    return (f"{type(module).__name__} cannot be {what}: its backend is chosen, and its gradients applied, in "
            f"Python, which TorchScript cannot hold. To run it without Python, export it with torch.export.export "
            f"and AOTInductor (README, 'Deploying'); to speed it up in Python, torch.compile(model, fullgraph=True)")


def fx_leaf_call(module, args: tuple, kwargs: dict):
    """``module``'s call as one node, under torch.fx.symbolic_trace (its input is then a Proxy).

    torch.fx records nn.LSTM so, being a module of torch.nn; tracing into LLTM or LLTMLayer would reach the
    choice of a backend, which needs the tensors' device and dtype, which a Proxy does not have."""
    tracer = args[0].tracer
    path = tracer.path_of_module(module)
    if not path:
        raise TypeError(f"torch.fx.symbolic_trace cannot trace {type(module).__name__} itself (its backend is "
                        f"chosen from the tensors, which tracing does not have): trace the model that holds it, in "
                        f"which its call is one node, as nn.LSTM's is; or use torch.export.export")
    return tracer.create_proxy("call_module", path, args, kwargs)


class ZeroBias:
    """For a module built with ``bias=False``: the zeros its kernels get as bias, a non-persistent buffer
    ``_zero_bias`` (not in the state_dict, as nn.LSTM(bias=False) has none), zero again after every
    ``_apply``.  ``to_empty()`` (how a module built on the meta device gets its storage) leaves any
    buffer uninitialised, and load_state_dict never fills one that is not persisted."""

    def _apply(self, fn, recurse=True):
        module = super()._apply(fn, recurse)
        zero_bias = self._buffers.get("_zero_bias")
        if zero_bias is not None and zero_bias.device.type != "meta":
            with torch.no_grad():
                zero_bias.zero_()
        return module

    def _zero_bias_for(self, weights: torch.Tensor) -> torch.Tensor:
        """The zero bias on ``weights``' device and in their dtype, remade where it is not.

        ``load_state_dict(assign=True)`` (how a module built on the meta device takes a checkpoint's
        tensors) replaces the parameters, device and dtype included, and never reaches this buffer."""
        zero_bias = self._buffers["_zero_bias"]
        if zero_bias.device != weights.device or zero_bias.dtype != weights.dtype:
            zero_bias = torch.zeros(zero_bias.shape, dtype=weights.dtype, device=weights.device)
            self._buffers["_zero_bias"] = zero_bias
        return zero_bias


SEQUENCE_NAMES = ("input", "weights", "bias", "h0", "c0")


def sequence_args_valid(input, weights, bias, h0, c0) -> bool:
    """Whether these tensors pass :func:`check_sequence_args` (``lengths`` and ``reverse`` aside), without
    building any message: the check of every call, and of LLTMLayer's commonest once for the call."""
    # One expression for the common, valid case, as lltm_args_valid: the messages cost microseconds.
    T_ = torch.Tensor
    try:
        T, B, I = input.shape
        B_h0, S = h0.shape
        dtype = input.dtype
        return (
            T > 0 and B_h0 == B and weights.shape == (3 * S, S + I)
            and (bias.shape == (3 * S,) or bias.shape == (1, 3 * S))
            and dtype.is_floating_point and weights.dtype is dtype and bias.dtype is dtype and h0.dtype is dtype
            and (c0 is h0 or c0.shape == (B, S) and c0.dtype is dtype)  # LLTMLayer passes its zero state twice
            and _same_device(input, weights, bias, h0, c0)
            # last: the duck-typed reads above do not prove these are tensors
            and isinstance(input, T_) and isinstance(weights, T_) and isinstance(bias, T_)
            and isinstance(h0, T_) and isinstance(c0, T_)
        )
    except (AttributeError, TypeError, ValueError):  # not tensors, or wrong ranks
        return False


def check_sequence_args(input, weights, bias, h0, c0, lengths, reverse, *, check_values: bool = True) -> None:
    """Raise TypeError/ValueError unless these make one valid ``lltm_sequence`` call.

    Shapes: input (T, B, I) with T >= 1, weights (3S, S+I), bias (3S,) or
    (1, 3S), h0 and c0 (B, S); one floating dtype and one device.  ``lengths``
    is None or an integer tensor (B,) with values in [1, T]; its values are
    only read when ``check_values`` (not while torch.compile traces, where they
    are unknown).
    """
    if lengths is None and reverse.__class__ is bool and sequence_args_valid(input, weights, bias, h0, c0):
        return
    caller = "lltm_sequence()"
    args = (input, weights, bias, h0, c0)
    _require_tensors(caller, zip(SEQUENCE_NAMES, args))
    if input.dim() != 3:
        raise ValueError(f"{caller}: input must be 3-D (time, batch, input_features), got shape {_shape(input)}")
    if h0.dim() != 2:
        raise ValueError(f"{caller}: h0 must be 2-D (batch, state_size), got shape {_shape(h0)}")
    T, B, I = input.shape
    S = h0.shape[1]
    if T == 0:
        raise ValueError(f"{caller}: input has 0 time steps (shape {_shape(input)}); a sequence needs at least one")
    expected = {"weights": (3 * S, S + I), "bias": (3 * S,), "h0": (B, S), "c0": (B, S)}
    _check_shapes(caller, zip(SEQUENCE_NAMES[1:], args[1:]), expected, S,
                  f"input of shape {_shape(input)} (time={T}, batch={B}, input_features={I}) and state_size={S} "
                  f"(from h0)")
    _check_dtypes_and_devices(caller, zip(SEQUENCE_NAMES, args))
    if not (isinstance(reverse, bool) or is_numpy_bool(reverse)):
        kind = type(reverse)  # a type from elsewhere may be called like a builtin one: name its module
        named = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        raise TypeError(f"{caller}: reverse must be a bool (Python's or numpy's), got {named} {reverse!r} "
                        f"(pass bool(reverse) if you mean its truth value)")
    if lengths is not None:
        check_lengths(caller, lengths, T, B, check_values=check_values)


def is_numpy_bool(value) -> bool:
    """Whether ``value`` is numpy's bool (configuration read from numpy arrives as one), without importing numpy:
    if numpy is not imported, nothing can be one of its values."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.bool_)


def check_lengths(caller: str, lengths, T: int, B: int, *, check_values: bool = True) -> None:
    if not isinstance(lengths, torch.Tensor):
        raise TypeError(f"{caller}: lengths must be None or an integer tensor of shape ({B},), got {type(lengths).__name__}")
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise TypeError(f"{caller}: lengths must be an integer tensor, got dtype {lengths.dtype}")
    if lengths.shape != (B,):
        raise ValueError(f"{caller}: lengths must be 1-D with one length per sequence, shape ({B},), "
                         f"got shape {_shape(lengths)}")
    if check_values and B:
        if lengths.device.type == "meta":
            raise ValueError(f"{caller}: lengths is on the meta device, which holds no values; the lengths are "
                             f"needed to run the sequence: pass them on the CPU or on the input's device")
        low, high = int(lengths.min()), int(lengths.max())
        if low < 1 or high > T:
            raise ValueError(f"{caller}: lengths must lie in [1, {T}] (1 to the number of time steps), "
                             f"got values from {low} to {high}")
