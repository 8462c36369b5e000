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


@pytest.mark.skipif(not _AOTI, reason="AOTInductor compiles C++ for minutes on a 2-core machine: "
                    "LLTM_CUDA_TEST_AOTI=1 runs it (benchmarks/gpu_check.sh's aoti step does)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_aoti_package_runs_the_operator(tmp_path, dtype):
    """The exported layer through AOTInductor: the package calls torch.ops.lltm_cuda.sequence_forward
    (its proxy executor), at other batch sizes and lengths than traced, against lltm-ref."""
    x, w, b, h0, c0 = _sequence_args(T=5, B=3, I=6, S=8, dtype=dtype)
    layer = _Layer(w, b).eval()
    T, B = torch.export.Dim("T", min=2, max=4096), torch.export.Dim("B", min=2, max=4096)
    with torch.no_grad():
        exported = torch.export.export(layer, (x, h0, c0), dynamic_shapes=({0: T, 1: B}, {0: B}, {0: B}))
    package = torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp_path / "lltm.pt2"))
    runner = torch._inductor.aoti_load_package(package)
    for steps, batch in [(5, 3), (17, 2), (3, 12)]:
        x2, _, _, h2, c2 = _sequence_args(T=steps, B=batch, I=6, S=8, dtype=dtype)
        with torch.no_grad():
            got = runner(x2, h2, c2)
            want = lltm_core.lltm_sequence(x2, w, b, h2, c2, backend="ref")
        for g, w_ in zip(got, want):
            assert max_rel_error(g, w_) <= tolerance(dtype)
