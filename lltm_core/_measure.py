"""The measured choice's timer: each backend that accepts a call, timed on that call's shape.

``_registry.decide`` asks :func:`time_backends` when the choice is measured
(``select_by_measurement()``, ``LLTM_SELECT=measure``); this module hands it
over when lltm_core is imported, since it runs the calls through the public
functions, which import the registry.  Each backend runs the call as a user's
call would (``backend=`` the Backend object, so nothing is chosen again):
forward, and backward when the call needs one, on random tensors of the
call's shape, in interleaved rounds (``lltm_core.benchmarking``) so that a
drifting machine favours none of them.
"""

from __future__ import annotations

import torch

from . import _registry
from ._cell import lltm
from ._sequence import lltm_sequence
from .backend import Backend, Call
from .benchmarking import interleaved

#: Rounds of the interleaved timing, after WARMUP untimed calls of each (first calls may compile or tune).
ROUNDS = 5
WARMUP = 2


def time_backends(backends: list[Backend], call: Call) -> dict[str, float | str]:
    """``{name: median seconds per call}``, or ``{name: "raised ..."}`` for one that failed on the call."""
    # Under torch.compile this runs at trace time, from Dynamo's call of a constant function:
    # the tensors must be real ones, whatever mode the tracer has set.
    with torch._subclasses.fake_tensor.unset_fake_temporarily(), torch.enable_grad():
        candidates = {b.name: _one_call(b, call) for b in backends}
        timings = interleaved(candidates, calls=1, rounds=ROUNDS, warmup=WARMUP, keep_going=True)
    times: dict[str, float | str] = {name: timings.median(name) for name in timings.samples}
    times.update(timings.failures)
    return times


def _one_call(backend: Backend, call: Call):
    """A zero-argument callable that makes ``call`` once on ``backend`` and waits for the device."""
    device = torch.device(call.device_type)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    B, I, S = call.batch, call.input_features, call.state_size
    shapes = [(B, I)] if call.op == "cell" else [(call.steps, B, I)]
    shapes += [(3 * S, S + I), (3 * S,), (B, S), (B, S)]
    tensors = [(torch.randn(shape, dtype=torch.float32) / (S + I) ** 0.5).to(device, call.dtype)
               for shape in shapes]
    for t in tensors:
        t.requires_grad_(call.needs_backward)
    run = lltm if call.op == "cell" else lltm_sequence

    def once():
        outputs = run(*tensors, backend=backend)
        if call.needs_backward:
            torch.autograd.backward([o.sum() for o in outputs])
        sync()

    if call.needs_backward:
        return once
    return torch.no_grad()(once)


_registry.time_backends = time_backends
