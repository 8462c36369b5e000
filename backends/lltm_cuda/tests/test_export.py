"""lltm-cuda's own operators under tracing: fake kernels, opcheck, torch.export with dynamic shapes.

On the emulated build (`nox -s cuda_emulated`) these run on CPU tensors: the same operators, the
same fake kernels (lltm_core.extension.register_fake_kernels).  On the real build they need a GPU and skip without one,
with lltm-cuda's reason.
"""

from __future__ import annotations

import os

import pytest
import torch

from _emulated import EMULATED, the_build_under_test

lltm_cuda = the_build_under_test()
import lltm_core  # noqa: E402
from lltm_core.testing import make_inputs, make_sequence_inputs, max_rel_error, tolerance  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

_REASON = lltm_cuda.unavailable_reason()
pytestmark = [pytest.mark.skipif(_REASON is not None, reason=f"lltm-cuda cannot run here: {_REASON}"),
              pytest.mark.usefixtures("lltm_seed")]
DEVICE = "cpu" if EMULATED else "cuda"
ops = torch.ops.lltm_cuda


def _step_args(B=3, I=5, S=7, dtype=torch.float64):
    return [t.to(DEVICE) for t in make_inputs(B, I, S, dtype=dtype, requires_grad=False)]


def _sequence_args(T=4, B=3, I=5, S=7, dtype=torch.float64):
    return [t.to(DEVICE) for t in make_sequence_inputs(T, B, I, S, dtype=dtype, requires_grad=False)]


def _backward_args(B=3, I=5, S=7, dtype=torch.float64):
    x, w, b, h, c = _step_args(B, I, S, dtype)
    _, _, X, gates, tanh_cell = ops.forward(x, w, b, h, c)
    return [torch.randn_like(h), torch.randn_like(c), w, X, gates, tanh_cell]


def _sequence_backward_args(T=4, B=3, I=5, S=7, lengths=None, reverse=False, dtype=torch.float64):
    x, w, b, h0, c0 = _sequence_args(T, B, I, S, dtype)
    output, _, _, gates, tanh_cell = ops.sequence_forward(x, w, b, h0, c0, lengths, reverse, True)
    return [torch.randn_like(output), torch.randn_like(h0), torch.randn_like(c0), w, x, h0, output, lengths, gates,
            tanh_cell, reverse]


def _cases():
    lengths = torch.tensor([4, 1, 3], device=DEVICE)
    return {
        "forward": (ops.forward.default, lambda: _step_args()),
        "backward": (ops.backward.default, lambda: [*_backward_args(), True]),
        "backward-no-grad-X": (ops.backward.default, lambda: [*_backward_args(), False]),
        "sequence_forward": (ops.sequence_forward.default, lambda: [*_sequence_args(), None, False, True]),
        "sequence_forward-inference": (ops.sequence_forward.default,
                                       lambda: [*_sequence_args(), lengths, True, False]),
        "sequence_backward": (ops.sequence_backward.default, lambda: [*_sequence_backward_args(), True]),
        "sequence_backward-lengths-reverse": (
            ops.sequence_backward.default,
            lambda: [*_sequence_backward_args(lengths=lengths, reverse=True), False]),
    }


CASES = list(_cases()) if _REASON is None else []


@pytest.mark.parametrize("case", CASES)
def test_fake_kernels_give_the_real_shapes(case):
    op, make_args = _cases()[case]
    args = make_args()
    real = op(*args)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = op(*fake_args)
    assert [(t.shape, t.dtype, t.device) for t in fake] == [(t.shape, t.dtype, t.device) for t in real]


@pytest.mark.parametrize("case", CASES)
def test_opcheck(case):
    op, make_args = _cases()[case]
    torch.library.opcheck(op, make_args())


class _Layer(torch.nn.Module):
    """One LLTM direction over a whole sequence, calling the library's operator itself."""

    def __init__(self, weights, bias):
        super().__init__()
        self.weights = torch.nn.Parameter(weights)
        self.bias = torch.nn.Parameter(bias)

    def forward(self, x, h0, c0):
        output, h_n, c_n, _, _ = ops.sequence_forward(x, self.weights, self.bias, h0, c0, None, False, False)
        return output, h_n, c_n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_export_with_dynamic_batch_and_time(dtype):
    x, w, b, h0, c0 = _sequence_args(T=5, B=3, I=6, S=8, dtype=dtype)
    layer = _Layer(w, b).eval()
    T, B = torch.export.Dim("T", min=2, max=4096), torch.export.Dim("B", min=2, max=4096)
    with torch.no_grad():
        exported = torch.export.export(layer, (x, h0, c0),
                                       dynamic_shapes=({0: T, 1: B}, {0: B}, {0: B}))
    targets = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
    assert "lltm_cuda.sequence_forward.default" in targets, targets
    # Other sizes than the traced ones, from the one exported program, against lltm-ref.
    for steps, batch in [(5, 3), (9, 2), (3, 11)]:
        x2, _, _, h2, c2 = _sequence_args(T=steps, B=batch, I=6, S=8, dtype=dtype)
        with torch.no_grad():
            got = exported.module()(x2, h2, c2)
            want = lltm_core.lltm_sequence(x2, w, b, h2, c2, backend="ref")
        for g, w_ in zip(got, want):
            assert max_rel_error(g, w_) <= tolerance(dtype)


_AOTI = os.environ.get("LLTM_CUDA_TEST_AOTI") == "1"


# Opt-in: a package compiles C++ (some seconds each), and on a GPU a crash in its load would end the
# whole test run; gpu_check.sh runs these in a step of their own.
_NEEDS_AOTI = pytest.mark.skipif(not _AOTI, reason="AOTInductor packages compile C++: LLTM_CUDA_TEST_AOTI=1 runs "
                                 "them (nox's cuda_emulated session and benchmarks/gpu_check.sh's aoti step do)")


def _package_matches(tmp_path, module, dtype, weights_as_inputs=False, expected=None):
    """`module` (built from the weights and bias) exported with dynamic batch and time, compiled by
    AOTInductor into a package, loaded and run at other batch sizes and lengths than traced, against
    ``expected(x, w, b, h0, c0)``: lltm-ref's sequence unless given.  The module takes (x, h0, c0), or
    (x, w, b, h0, c0) where `weights_as_inputs`."""
    x, w, b, h0, c0 = _sequence_args(T=5, B=3, I=6, S=8, dtype=dtype)
    T, B = torch.export.Dim("T", min=2, max=4096), torch.export.Dim("B", min=2, max=4096)
    args, dynamic = (x, h0, c0), ({0: T, 1: B}, {0: B}, {0: B})
    if weights_as_inputs:
        args, dynamic = (x, w, b, h0, c0), ({0: T, 1: B}, None, None, {0: B}, {0: B})
    with torch.no_grad():
        exported = torch.export.export(module(w, b).eval(), args, dynamic_shapes=dynamic)
    package = torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp_path / "lltm.pt2"))
    runner = torch._inductor.aoti_load_package(package)
    expected = expected or (lambda *a: lltm_core.lltm_sequence(*a, backend="ref"))
    for steps, batch in [(5, 3), (17, 2), (3, 12)]:
        x2, _, _, h2, c2 = _sequence_args(T=steps, B=batch, I=6, S=8, dtype=dtype)
        with torch.no_grad():
            got = runner(x2, w, b, h2, c2) if weights_as_inputs else runner(x2, h2, c2)
            want = expected(x2, w, b, h2, c2)
        assert len(got) == len(want)
        for g, w_ in zip(got, want):
            assert max_rel_error(g, w_) <= tolerance(dtype)


@_NEEDS_AOTI
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_aoti_package_runs_the_operator(tmp_path, dtype):
    """The exported layer through AOTInductor: the package calls torch.ops.lltm_cuda.sequence_forward
    (its proxy executor), at other batch sizes and lengths than traced, against lltm-ref."""
    _package_matches(tmp_path, _Layer, dtype)


class _TorchOpsGates(torch.nn.Module):
    """Every step's gates as if each started from h0, in plain torch operators: weights held as
    constants as _Layer holds them, and no lltm-cuda operator in the graph."""

    def __init__(self, weights, bias):
        super().__init__()
        self.weights = torch.nn.Parameter(weights)
        self.bias = torch.nn.Parameter(bias)

    def forward(self, x, h0, c0):
        return (_gates_from_h0(x, self.weights, self.bias, h0),)


def _gates_from_h0(x, weights, bias, h0):
    T, B, I = x.shape
    w_h, w_x = weights.split([h0.shape[1], I], dim=1)
    projected = torch.addmm(bias, x.reshape(T * B, I), w_x.t()).view(T, B, -1)
    return torch.sigmoid(projected + h0 @ w_h.t())


class _LayerTakingWeights(torch.nn.Module):
    """lltm-cuda's operator with the weights as the program's inputs: the package holds no constants."""

    def __init__(self, weights, bias):  # the caller passes them to forward
        super().__init__()

    def forward(self, x, weights, bias, h0, c0):
        output, h_n, c_n, _, _ = ops.sequence_forward(x, weights, bias, h0, c0, None, False, False)
        return output, h_n, c_n


@_NEEDS_AOTI
@pytest.mark.parametrize("control", ["torch-ops-only", "weights-as-inputs"])
def test_aoti_control(tmp_path, control):
    """Controls for a package of lltm-cuda's operator that fails to load (benchmarks/gpu_check.sh runs
    each in its own process after such a crash): a package with no lltm-cuda operator in it (does any
    package with constants load on this machine?), and lltm-cuda's operator in a package with no
    constants."""
    if control == "torch-ops-only":
        _package_matches(tmp_path, _TorchOpsGates, torch.float32,
                         expected=lambda x, w, b, h0, c0: (_gates_from_h0(x, w, b, h0),))
    else:
        _package_matches(tmp_path, _LayerTakingWeights, torch.float32, weights_as_inputs=True)
