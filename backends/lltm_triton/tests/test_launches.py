"""The launch count does not grow with T: the time loop runs inside the kernels, not in Python.

Every Triton kernel of lltm-triton is wrapped to count its launches (``kernel[grid](...)`` calls the
kernel's ``run``), and every torch operator too (a TorchDispatchMode sees each one, lltm-core's
included): a forward and backward at T=4 and at T=32 must launch the same kernels the same number of
times, and dispatch the same torch operators.
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.jit import KernelInterface

import lltm_core
from _helpers import DEVICE
from lltm_core.testing import make_sequence_inputs
from lltm_triton import _cell, _sequence

pytestmark = pytest.mark.usefixtures("lltm_seed")


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture
def launches(monkeypatch):
    """A Counter of Triton launches per kernel name, filled by every lltm-triton kernel."""
    counts = collections.Counter()
    kernels = [(module, name) for module in (_cell, _sequence) for name, obj in vars(module).items()
               if isinstance(obj, KernelInterface)]
    # Device functions (called from kernels, never launched) are wrapped too: harmless, and no
    # kernel can escape the count by being left out of a list.
    assert {"_forward_kernel", "_backward_kernel", "_forward_resident", "_forward_streaming", "_backward_resident",
            "_backward_streaming"} <= {name for _, name in kernels}
    for module, name in kernels:
        kernel = getattr(module, name)
        run = kernel.run

        def counted(*args, _run=run, _name=name, **kwargs):
            counts[_name] += 1
            return _run(*args, **kwargs)

        monkeypatch.setattr(kernel, "run", counted)
    return counts


def _forward_backward(T, reverse, lengths):
    inputs = make_sequence_inputs(T, 3, 2, 5, device=DEVICE)
    lengths = torch.tensor([T, 1, T // 2], device=DEVICE) if lengths else None
    mode = _CountOps()
    with mode:
        outputs = lltm_core.lltm_sequence(*inputs, lengths=lengths, reverse=reverse, backend="triton")
        sum(t.sum() for t in outputs).backward()
    assert all(t.grad is not None for t in inputs)
    return mode.ops


@pytest.mark.parametrize("lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_sequence_launches_do_not_grow_with_T(launches, reverse, lengths):
    ops_short = _forward_backward(4, reverse, lengths)
    short = dict(launches)
    launches.clear()
    ops_long = _forward_backward(32, reverse, lengths)
    assert short == dict(launches), f"Triton launches at T=4 {short}, at T=32 {dict(launches)}"
    assert short == {"_forward_resident": 1, "_backward_resident": 1}, short
    assert ops_short == ops_long, (f"torch operators differ between T=4 and T=32: {ops_short - ops_long} "
                                   f"vs {ops_long - ops_short}")


def test_inference_is_one_launch(launches):
    """Under no_grad (needs_backward False) one chunk of the projection covers T=32 at B=3: one launch."""
    for T in (4, 32):
        launches.clear()
        inputs = make_sequence_inputs(T, 3, 2, 5, device=DEVICE, requires_grad=False)
        with torch.no_grad():
            lltm_core.lltm_sequence(*inputs, backend="triton")
        assert dict(launches) == {"_forward_resident": 1}, (T, dict(launches))


def test_cell_is_one_launch_each_way(launches):
    from lltm_core.testing import make_inputs

    inputs = make_inputs(4, 3, 5, device=DEVICE)
    new_h, new_cell = lltm_core.lltm(*inputs, backend="triton")
    (new_h.sum() + new_cell.sum()).backward()
    assert dict(launches) == {"_forward_kernel": 1, "_backward_kernel": 1}
