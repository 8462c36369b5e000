"""The backend contract: everything a backend must provide, in one place.

Read this file first if you are writing a backend; ``docs/writing-a-backend.md``
walks through a complete example.

A backend is a distribution that registers an entry point in the group
``lltm.backends``.  The entry point's *name* is the backend's name and its
*value* is a zero-argument callable returning a :class:`Backend`::

    [project.entry-points."lltm.backends"]
    mybackend = "my_package:load_backend"

lltm-core calls that factory the first time the backend is needed, never at
``import lltm_core``, so a backend may do expensive work there (load a shared
library, probe the GPU).  Anything the factory raises (including the
TypeError that :class:`Backend` raises for a malformed field) is recorded as
the backend's reason for being unavailable; it never breaks lltm-core or
another backend.

What lltm-core guarantees to the kernels
----------------------------------------
Before ``forward`` runs, lltm-core has checked the arguments (shapes, one
dtype, one device; see ``lltm_core._checks``) and made every tensor
contiguous.  ``backward`` gets the saved tensors as forward returned them, and
the output gradients as autograd hands them over: right shape, dtype and
device, but any strides (the gradient of ``new_h.sum()`` is an expanded,
stride-0 tensor).  A kernel that needs dense memory calls ``.contiguous()`` on
them itself; a backend that can broadcast them (lltm-ref) skips the copy.
With ``B`` = batch, ``I`` = input features, ``S`` = state size:

* ``forward(input, weights, bias, old_h, old_cell)`` receives tensors of shape
  (B, I), (3S, I+S), (3S,), (B, S), (B, S) and returns a sequence
  ``(new_h, new_cell, *saved)``: the two (B, S) results followed by whatever
  the backend wants to keep for its backward, exactly as declared by
  ``saved_layout``.
* ``backward(grad_new_h, grad_new_cell, weights, *saved, needs_grad_X)``
  receives the two (B, S) output gradients (zeros, never ``None``, for an
  unused output), the weights, the saved tensors, and whether ``input`` or
  ``old_h`` needs a gradient.  It returns
  ``(grad_X, grad_weights, grad_bias, grad_old_cell)`` where
  ``grad_X`` is the (B, S+I) gradient of ``X = cat([old_h, input], dim=1)``:
  lltm-core splits it into the gradients of ``old_h`` and ``input``.
  Returning ``grad_X`` whole lets a backend do one GEMM ``d_gates @ weights``;
  when ``needs_grad_X`` is false (the tutorial's benchmark: only the
  parameters need gradients) it skips that GEMM and returns an empty tensor
  (``weights.new_empty(0)``) in its place.

Every tensor a kernel returns must be newly allocated: not an input, not a view
of an input, not a view of another output.  lltm-core registers each backend's
kernels as ``torch.library`` custom operators (so ``torch.compile`` and
``torch.library.opcheck`` work), and custom operators may not alias.

Saved tensors have the inputs' dtype and device.  ``saved_layout(B, I, S)``
returns their names and shapes, in the order ``forward`` returns them; it is
used to build the fake (meta) kernel for ``torch.compile`` and must therefore
only do arithmetic on its arguments (they may be symbolic integers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch

#: The version of this contract.  It changes only when the kernel signatures or
#: their guarantees change; a backend lists the versions it implements in
#: :attr:`Backend.interface_versions`.
INTERFACE_VERSION = 1

Shape = Sequence[int]
ForwardKernel = Callable[..., Sequence[torch.Tensor]]
BackwardKernel = Callable[..., Sequence[torch.Tensor]]


def always_available() -> str | None:
    """The default availability check: nothing to check."""
    return None


@dataclass(frozen=True)
class Backend:
    """One LLTM implementation, as returned by an ``lltm.backends`` entry point."""

    #: Must equal the entry point's name; a Python identifier (it names the
    #: custom operators ``lltm::<name>_forward`` / ``lltm::<name>_backward``).
    name: str
    #: ``forward(input, weights, bias, old_h, old_cell) -> (new_h, new_cell, *saved)``
    forward: ForwardKernel
    #: ``backward(grad_new_h, grad_new_cell, weights, *saved, needs_grad_X)
    #: -> (grad_X, grad_weights, grad_bias, grad_old_cell)``
    backward: BackwardKernel
    #: ``saved_layout(B, I, S) -> {name: shape}`` of the tensors forward saves.
    saved_layout: Callable[[int, int, int], Mapping[str, Shape]]
    #: torch device types the kernels run on, e.g. ``{"cpu"}`` or ``{"cuda"}``.
    devices: frozenset[str]
    #: dtypes the kernels accept; every tensor of a call has the same dtype.
    #: Must include float32 and float64: the conformance kit runs gradcheck in
    #: float64 and its torch.compile check in float32.
    dtypes: frozenset[torch.dtype]
    #: Higher wins when several available backends can take a call.  The
    #: reference uses 0; fused backends use 100 or more.
    priority: int = 0
    #: Contract versions this backend implements; must include
    #: :data:`INTERFACE_VERSION` of the running lltm-core.
    interface_versions: tuple[int, ...] = (INTERFACE_VERSION,)
    #: Returns ``None`` when the backend can run here, otherwise a short reason
    #: that tells the user what to do ("no CUDA device visible", "built for
    #: torch 2.13.0, running 2.14.1: rebuild lltm-cpu").  Called once, when the
    #: backend is loaded.
    availability: Callable[[], str | None] = field(default=always_available)
    #: One line for ``lltm info``.
    description: str = ""

    def __post_init__(self):
        # A backend is someone else's code: a malformed field fails here, when
        # its factory runs (lltm-core then records the error against that one
        # backend), not later inside every selection and `lltm info`.
        def bad(field_name: str, want: str):
            return TypeError(f"Backend {self.name!r}: {field_name} must be {want}, got {getattr(self, field_name)!r}")

        if not (isinstance(self.name, str) and self.name.isidentifier()):
            raise TypeError(f"Backend: name must be a Python identifier (it names the custom operators), "
                            f"got {self.name!r}")
        for name in ("forward", "backward", "saved_layout", "availability"):
            if not callable(getattr(self, name)):
                raise bad(name, "callable")
        for name, kind, want in (("devices", str, "a set of device type names such as {'cpu'}"),
                                 ("dtypes", torch.dtype, "a set of torch.dtype")):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, (set, frozenset, list, tuple)) \
                    or not all(isinstance(v, kind) for v in value):
                raise bad(name, want)
            object.__setattr__(self, name, frozenset(value))
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise bad("priority", "an int")
        if not isinstance(self.interface_versions, (tuple, list)) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in self.interface_versions):
            raise bad("interface_versions", "a tuple of ints")
        object.__setattr__(self, "interface_versions", tuple(self.interface_versions))
        if not isinstance(self.description, str):
            raise bad("description", "a str")

    def supports(self, device_type: str, dtype: torch.dtype) -> str | None:
        """``None`` if this backend takes tensors of that device type and dtype, else why not."""
        if device_type not in self.devices:
            return f"runs on {'/'.join(sorted(self.devices))}, not {device_type}"
        if dtype not in self.dtypes:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes))
            return f"takes {names}, not {str(dtype).removeprefix('torch.')}"
        return None
