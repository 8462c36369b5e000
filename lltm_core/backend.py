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

Non-finite values
-----------------
A NaN or an infinity in any argument reaches the results as in the reference
(``lltm_core.testing.reference_lltm``): NaN where it gives NaN, the same
infinities.  The one permitted difference: where the state multiplied by
``W_h`` is zero everywhere (``old_h``, or ``h0`` at a sequence's first step),
a backend may skip ``W_h @ h``, so ``0 * inf`` there gives 0 instead of NaN.
Each element is then the reference's, or the reference's with that product
taken as zero; the kit's ``test_non_finite`` checks exactly that.

Sequence kernels (interface version 2, optional)
------------------------------------------------
A backend may also run a whole sequence, one layer in one direction, with the
time loop inside its kernels.  One that does not still runs in
``lltm_core.LLTMLayer``: lltm-core then loops its step kernels, which is
correct and slower.  The three fields come together or not at all, and a
backend that has them lists 2 (or later) in ``interface_versions``.  With ``T`` time
steps:

* ``sequence_forward(input, weights, bias, h0, c0, lengths, reverse)``
  receives input (T, B, I), weights (3S, S+I), bias (3S,), h0 and c0 (B, S),
  ``lengths`` (an int64 tensor (B,) on the inputs' device, each in [1, T]) or
  None, and ``reverse`` (a bool).  It returns
  ``(output, h_n, c_n, *saved)``: output (T, B, S), the final states (B, S),
  then what its backward needs, as ``sequence_saved_layout`` declares.
  Steps run t = 0 .. T-1, or T-1 .. 0 when ``reverse``; each is the cell's
  step with ``old_h``/``old_cell`` the state the previous step left.  With
  ``lengths``, row b takes part in steps t < lengths[b] only: at the others it
  keeps its state and its output is zero, so h_n and c_n are the state after
  its own last valid step (and, reversed, it starts at step lengths[b] - 1).
* ``sequence_backward(grad_output, grad_h_n, grad_c_n, weights, input, h0,
  output, lengths, *saved, reverse, needs_grad_input)`` receives the output
  gradients (zeros, never None, for an unused output; any strides), then the
  forward's own arguments and output that lltm-core holds anyway (so that a
  backend need not keep copies of them, which would cost memory and break
  the no-alias rule below), its saved tensors, and whether ``input`` needs a
  gradient.  It returns ``(grad_input, grad_weights, grad_bias, grad_h0,
  grad_c0)``; ``grad_input`` is ``weights.new_empty(0)`` when
  ``needs_grad_input`` is false.
* ``sequence_saved_layout(T, B, I, S)`` returns ``{name: shape}`` of
  ``saved``, as ``saved_layout`` does for a step.

lltm-core has checked the arguments (``lltm_core._checks``), made every
tensor contiguous and handles T = 0 itself; B = 0 reaches the kernels.  The
same rules hold as for the step: new memory for every returned tensor,
nothing written to an argument, saved tensors in the inputs' dtype.  What
``lltm_core.LLTMLayer`` promises about memory, a fused backend should keep
too: at most (6S + I)·T·B saved elements, counting the input and output that
lltm-core holds, and nothing kept at all under ``torch.no_grad()``.

Declining calls, and inference that keeps nothing (interface version 3)
-----------------------------------------------------------------------
A backend may be fast only in some regime (a persistent GPU kernel that
keeps W_h on chip, say, for small state sizes).  Version 3 lets it say so per
call, as networkx's backends do with ``can_run``/``should_run``.  Every call
is described by a :class:`Call`; a backend may set either or both of:

* ``can_run(call)``: whether its kernels can compute that call at all;
* ``should_run(call)``: whether they are a good choice for it.

Each returns ``True``, or ``False`` or a string (the reason, which ``lltm
info --explain`` shows: "state_size 1024 > 256: W_h does not fit on chip").
They must be cheap, deterministic functions of the Call: lltm-core memoizes
the answers.  The selection rule is ``lltm_core._registry.rank`` and ``decide``: a named
backend is asked ``can_run`` only; otherwise the first by priority for which
both answers are True runs the call (or, with ``select_by_measurement()``, the
fastest measured of those).  An answer that raises is a decline,
reported in the trace, never an error of the call.

A version-3 backend's ``sequence_forward`` takes one more argument,
``needs_backward`` (a bool, after ``reverse``).  When it is False (under
``torch.no_grad()``, or nothing requires a gradient) no backward will follow:
the backend returns an empty tensor (``input.new_empty(0)``) in each saved
slot, keeps no tanh(c_t), and projects the input a chunk of steps at a time,
so that inference costs the output plus a bounded workspace.  A version-2
backend is called as before and lltm-core drops what it saved.

Traced graphs and deployment (torch.compile, torch.export, AOTInductor)
-----------------------------------------------------------------------
One rule decides what a traced graph holds for a backend's kernel:

* A kernel that is a ``torch.library`` operator (an ``OpOverload`` such as
  ``torch.ops.mylib.sequence_forward.default``) is put in the graph as
  itself.  The backend registers a fake kernel for each of its operators
  (``lltm_core.extension.register_fake_kernels`` does it for the standard
  schemas); lltm-core registers the autograd formula, which calls the
  backend's backward operator.  ``torch.export`` of such a model, compiled
  by AOTInductor, runs from C++ once the operator library is loaded: set
  ``operator_library`` to its path, and keep the library free of libpython.
* Any other kernel (a Python function) is wrapped in lltm-core's Python
  custom operator ``lltm::<name>_*``.  That graph compiles and runs, but only
  in a Python process.  If the kernels are compositions of ATen operators and
  nothing else, set ``composite=True``: ``torch.export`` under
  ``torch.no_grad()`` then traces through them, and the exported graph holds
  ATen operators only (lltm-ref does; its time loop is Python, so the shapes
  are static).  Otherwise ``torch.export`` warns that the model cannot leave
  Python.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple, Sequence, Union

import torch

#: The version of this contract.  It changes only when the kernel signatures or
#: their guarantees change; a backend lists the versions it implements in
#: :attr:`Backend.interface_versions`.  Version 2 added the optional sequence
#: kernels; version 3 added ``can_run``/``should_run`` and ``sequence_forward``'s
#: ``needs_backward``; the step kernels are those of version 1.
INTERFACE_VERSION = 3
#: The versions this lltm-core accepts: a backend must list at least one.  A
#: version-1 backend (step kernels only) runs sequences through its step kernels.
SUPPORTED_INTERFACE_VERSIONS = (1, 2, 3)
#: The first version with sequence kernels.
SEQUENCE_INTERFACE_VERSION = 2
#: The first version with per-call answers (can_run, should_run) and needs_backward.
CALL_INTERFACE_VERSION = 3

Shape = Sequence[int]
ForwardKernel = Callable[..., Sequence[torch.Tensor]]
BackwardKernel = Callable[..., Sequence[torch.Tensor]]
SEQUENCE_FIELDS = ("sequence_forward", "sequence_backward", "sequence_saved_layout")
CALL_FIELDS = ("can_run", "should_run")


class Call(NamedTuple):
    """One call lltm-core is about to make, as ``can_run``/``should_run`` see it.

    A plain tuple underneath: cheap to build and to hash, since lltm-core
    memoizes every answer per (backend, Call).
    """

    #: "cell" (one step: ``lltm()``, ``LLTM``) or "sequence" (``lltm_sequence()``, ``LLTMLayer``).
    op: str
    #: The tensors' device type ("cpu", "cuda", ...) and dtype.
    device_type: str
    dtype: torch.dtype
    batch: int
    input_features: int
    state_size: int
    #: Time steps of a sequence; None for the cell.
    steps: int | None = None
    #: Whether autograd will call the backward (something requires a gradient, with grad mode on).
    needs_backward: bool = True

    def describe(self) -> str:
        """``sequence T64 B16 I32 S128, cpu float32, with backward``: for traces and errors."""
        steps = f"T{self.steps} " if self.steps is not None else ""
        mode = "with backward" if self.needs_backward else "inference"
        return (f"{self.op} {steps}B{self.batch} I{self.input_features} S{self.state_size}, "
                f"{self.device_type} {str(self.dtype).removeprefix('torch.')}, {mode}")


#: What ``can_run``/``should_run`` return: True, or False or a reason string for no.
Verdict = Union[bool, str]


class Kernels(NamedTuple):
    """A backend's kernels for one op (``Call.op``: "cell" or "sequence"), by name: ``Backend.kernels[op]``."""

    forward: ForwardKernel
    backward: BackwardKernel
    saved_layout: Callable[..., Mapping[str, Shape]]
    #: Whether ``forward`` takes ``needs_backward`` after its arguments (a version-3 sequence_forward).
    takes_needs_backward: bool


def always_available() -> str | None:
    """The default availability check: nothing to check."""
    return None


@dataclass(frozen=True)
class Backend:
    """One LLTM implementation, as returned by an ``lltm.backends`` entry point.

    A Backend is a process-level object: copying it gives it back, and pickling
    it (a module built with ``backend=get_backend(name)``, saved with
    ``torch.save`` or sent to another process) stores its name alone; see
    :meth:`__reduce__`.
    """

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
    #: Contract versions this backend implements; lltm-core accepts it when one
    #: of them is in :data:`SUPPORTED_INTERFACE_VERSIONS`.
    interface_versions: tuple[int, ...] = (INTERFACE_VERSION,)
    #: Returns ``None`` when the backend can run here, otherwise a short reason
    #: that tells the user what to do ("no CUDA device visible", "built for
    #: torch 2.13.0, running 2.14.1: rebuild lltm-cpu").  Called once, when the
    #: backend is loaded.
    availability: Callable[[], str | None] = field(default=always_available)
    #: One line for ``lltm info``.
    description: str = ""
    #: ``sequence_forward(input, weights, bias, h0, c0, lengths, reverse[, needs_backward])
    #: -> (output, h_n, c_n, *saved)`` (needs_backward from version 3); None: lltm-core loops the step kernels.
    sequence_forward: ForwardKernel | None = None
    #: ``sequence_backward(grad_output, grad_h_n, grad_c_n, weights, input, h0, output, lengths,
    #: *saved, reverse, needs_grad_input) -> (grad_input, grad_weights, grad_bias, grad_h0, grad_c0)``
    sequence_backward: BackwardKernel | None = None
    #: ``sequence_saved_layout(T, B, I, S) -> {name: shape}`` of the tensors sequence_forward saves.
    sequence_saved_layout: Callable[[int, int, int, int], Mapping[str, Shape]] | None = None
    #: ``can_run(call: Call) -> True | False | reason``: whether the kernels can compute ``call`` at all
    #: (version 3; None: every call of a declared device and dtype).
    can_run: Callable[[Call], Verdict] | None = None
    #: ``should_run(call: Call) -> True | False | reason``: whether they are a good choice for it
    #: (version 3; None: always).  Skipped when the user names this backend.
    should_run: Callable[[Call], Verdict] | None = None
    #: The shared library whose loading registers the kernels' ``torch.library`` operators, for a
    #: program without Python (AOTInductor's C++ runner) to load; None for kernels written in Python.
    operator_library: str | None = None
    #: The kernels are compositions of ATen operators alone: ``torch.export`` traces through them
    #: (see "Traced graphs and deployment" above).
    composite: bool = False
    #: ``describe_call(call: Call) -> str | None``: how the backend runs a call it was chosen for,
    #: where it has several paths of its own (lltm-cuda: the persistent or the per-step sequence), for
    #: ``explain()`` and ``lltm info --explain``; None: nothing to add.  Any interface version.
    describe_call: Callable[[Call], str | None] | None = None

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
        given = [name for name in SEQUENCE_FIELDS if getattr(self, name) is not None]
        if given and len(given) != len(SEQUENCE_FIELDS):
            missing = [name for name in SEQUENCE_FIELDS if name not in given]
            raise TypeError(f"Backend {self.name!r}: the sequence kernels come together: it sets {', '.join(given)} "
                            f"but not {', '.join(missing)}")
        for name in given:
            if not callable(getattr(self, name)):
                raise bad(name, "callable or None")
        if given and max(self.interface_versions, default=0) < SEQUENCE_INTERFACE_VERSION:
            raise TypeError(f"Backend {self.name!r}: sequence kernels came with interface version "
                            f"{SEQUENCE_INTERFACE_VERSION}, but interface_versions is {self.interface_versions}: "
                            f"add {SEQUENCE_INTERFACE_VERSION}")

        for name in CALL_FIELDS:
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise bad(name, "callable or None")
        declines = [name for name in CALL_FIELDS if getattr(self, name) is not None]
        if declines and CALL_INTERFACE_VERSION not in self.interface_versions:
            raise TypeError(f"Backend {self.name!r}: {' and '.join(declines)} came with interface version "
                            f"{CALL_INTERFACE_VERSION}, but interface_versions is {self.interface_versions}: "
                            f"add {CALL_INTERFACE_VERSION}")
        if self.operator_library is not None and not isinstance(self.operator_library, str):
            raise bad("operator_library", "a path (str) or None")
        if not isinstance(self.composite, bool):
            raise bad("composite", "a bool")
        if self.describe_call is not None and not callable(self.describe_call):
            raise bad("describe_call", "callable or None")
        # Which sequence_forward signature to call: the newest version both sides speak.
        spoken = [v for v in self.interface_versions if v in SUPPORTED_INTERFACE_VERSIONS]
        takes_needs_backward = bool(spoken) and max(spoken) >= CALL_INTERFACE_VERSION
        kernels = {"cell": Kernels(self.forward, self.backward, self.saved_layout, False)}
        if self.sequence_forward is not None:
            kernels["sequence"] = Kernels(self.sequence_forward, self.sequence_backward, self.sequence_saved_layout,
                                          takes_needs_backward)
        object.__setattr__(self, "_takes_needs_backward", takes_needs_backward)
        #: ``{op: Kernels}``: the kernels each op runs on (no "sequence" without sequence kernels).
        object.__setattr__(self, "kernels", kernels)

    def __copy__(self) -> "Backend":
        return self  # immutable, and its kernels are the process's: nothing to copy

    def __deepcopy__(self, memo) -> "Backend":
        return self

    def __reduce__(self):
        """Pickle by name: the loading process gets ``lltm_core.get_backend(name)``, its own backend of that name.

        Kernels are the process's (loaded libraries, registered operators), so they
        are never pickled; the backend the name finds where the pickle is loaded
        runs the loaded module.  Only the backend installed under ``name`` pickles:
        a Backend built by hand (``dataclasses.replace`` of one, say) raises
        ``pickle.PicklingError`` here, when it is pickled, since no process could
        find it by name.  Loading where that backend is not installed or cannot run
        raises :class:`~lltm_core.BackendError` with the reason; a module whose
        ``backend=`` is a name (a str) loads anywhere and is checked at its first call.
        """
        import pickle

        from . import _discovery

        record = _discovery.resolve(self.name)
        installed = record.backend if record is not None else None
        if installed is not self and installed != self:
            found = ("no installed backend is called that" if record is None else
                     f"the one installed is {record.status}: {record.reason}" if installed is None else
                     f"the one installed under that name ({record.distribution} {record.version}) is another")
            raise pickle.PicklingError(
                f"lltm Backend {self.name!r} cannot be pickled: a Backend pickles by name, and {found}. "
                f"Register it through an '{_discovery.ENTRY_POINT_GROUP}' entry point, or keep the module "
                f"in this process (copy.deepcopy works)")
        return _backend_named, (self.name,)

    @property
    def takes_needs_backward(self) -> bool:
        """Whether ``sequence_forward`` takes ``needs_backward`` (it speaks version 3 or later)."""
        return self._takes_needs_backward

    @property
    def declines_calls(self) -> bool:
        """Whether the choice of this backend depends on the call (it has ``can_run`` or ``should_run``)."""
        return self.can_run is not None or self.should_run is not None

    @property
    def has_sequence_kernels(self) -> bool:
        """Whether sequences run through this backend's own sequence kernels (else its step kernels, looped)."""
        return self.sequence_forward is not None

    def supports(self, device_type: str, dtype: torch.dtype) -> str | None:
        """``None`` if this backend takes tensors of that device type and dtype, else why not."""
        if device_type not in self.devices:
            return f"runs on {'/'.join(sorted(self.devices))}, not {device_type}"
        if dtype not in self.dtypes:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes))
            return f"takes {names}, not {str(dtype).removeprefix('torch.')}"
        return None


def _backend_named(name: str) -> Backend:
    """What a pickled :class:`Backend` loads as: this process's backend called ``name`` (pickles name this function)."""
    from ._discovery import BackendError
    from ._ops import get_backend

    try:
        return get_backend(name)
    except BackendError as exc:
        raise BackendError(f"loading a pickled lltm Backend {name!r}, this process's backend of that name is "
                           f"needed: {exc}") from exc
