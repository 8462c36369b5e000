"""What the conformance kit does not reach: the kernels' two paths, streams, devices, big indices.

Needs a CUDA device; elsewhere every test skips with the reason lltm-cuda gives.
With LLTM_REQUIRE_GPU=1 (benchmarks/gpu_check.sh on the GPU machine) that reason
is an error instead: there, a skip would read as a pass.
The general checks (every dtype against the float64 oracle, gradcheck, opcheck,
torch.compile) are the kit's: pytest --pyargs lltm_core.testing --lltm-backend cuda --lltm-device cuda
"""

from __future__ import annotations

import os

import pytest
import torch

_REQUIRED = os.environ.get("LLTM_REQUIRE_GPU") == "1"
try:
    import lltm_cuda
except ModuleNotFoundError as exc:
    # Only lltm-cuda's absence skips: an installed one that fails to import is a failure.
    if exc.name != "lltm_cuda" or _REQUIRED:
        raise
    pytest.skip("lltm-cuda is not installed (building it needs the CUDA toolkit)", allow_module_level=True)
import lltm_core  # noqa: E402
from lltm_core.testing import compare_with_reference, make_inputs, max_rel_error, reference_lltm, tolerance  # noqa: E402

_REASON = lltm_cuda.unavailable_reason()
if _REQUIRED and _REASON is not None:
    raise RuntimeError(f"LLTM_REQUIRE_GPU=1, but lltm-cuda cannot run here: {_REASON}")
pytestmark = [
    pytest.mark.skipif(_REASON is not None, reason=f"lltm-cuda cannot run here: {_REASON}"),
    # Fresh inputs each run from the kit's seed, shown beside a failure: --lltm-seed N repeats it.
    pytest.mark.usefixtures("lltm_seed"),
]

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# State sizes that take the 16-byte-vector path for every dtype (multiples of
# 8), the element path (odd), one element, and more than a 1024-thread block.
SHAPES = [(7, 5, 64), (3, 4, 13), (5000, 3, 1), (2, 9, 1032), (2, 9, 1031), (1, 1, 8)]


def _lltm(*inputs):
    return lltm_core.lltm(*inputs, backend="cuda")


def _offset_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t whose data starts one element past a 16-byte boundary."""
    storage = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = storage[1:].view(t.shape)
    return view.copy_(t)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-I{}-S{}".format(*s))
def test_matches_reference(dtype, shape):
    inputs = make_inputs(*shape, dtype=dtype, device="cuda")
    errors = compare_with_reference("cuda", inputs)
    assert max(errors.values()) <= tolerance(dtype), errors


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_misaligned_inputs_take_the_element_path(dtype):
    """An input at an odd address takes the element-wise path; it computes the same numbers.

    (Not required to be bit-identical: the compiler may contract the two paths' arithmetic differently.)
    """
    input, weights, bias, old_h, old_cell = make_inputs(6, 5, 64, dtype=dtype, device="cuda", requires_grad=False)
    forward, backward = torch.ops.lltm_cuda.forward, torch.ops.lltm_cuda.backward
    aligned = forward(input, weights, bias, old_h, old_cell)
    shifted = forward(input, weights, bias, old_h, _offset_copy(old_cell))
    for got, want in zip(shifted, aligned):
        torch.testing.assert_close(got, want)

    grad_h, grad_cell = torch.randn_like(old_cell), torch.randn_like(old_cell)
    saved = aligned[2:]
    want = backward(grad_h, grad_cell, weights, *saved, True)
    got = backward(_offset_copy(grad_h), _offset_copy(grad_cell), weights, *saved, True)
    # grad_X, grad_weights and grad_bias sum d_gates over a batch or a state:
    # a last-bit difference between the paths can grow there, so those are held
    # to the kit's tolerance; grad_old_cell is pointwise, like forward's outputs.
    for name, g, w in zip(("grad_X", "grad_weights", "grad_bias"), got[:3], want[:3]):
        assert max_rel_error(g, w) <= tolerance(dtype), name
    torch.testing.assert_close(got[3], want[3])


@pytest.mark.parametrize("shape", [(3, 4, 4), (3, 4, 5), (2, 3, 1)], ids=lambda s: "B{}-I{}-S{}".format(*s))
def test_gradcheck_float64(shape):
    inputs = make_inputs(*shape, dtype=torch.float64, device="cuda")
    assert torch.autograd.gradcheck(_lltm, inputs)


def test_runs_on_the_current_stream():
    """If a kernel ran on the default stream it would read old_cell before the side stream wrote it."""
    input, weights, bias, old_h, old_cell = make_inputs(64, 32, 256, device="cuda", requires_grad=False)
    want = _lltm(input, weights, bias, old_h, old_cell)
    side = torch.cuda.Stream()
    late_cell = torch.zeros_like(old_cell)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keep the side stream busy for tens of milliseconds
        late_cell.copy_(old_cell)
        got = _lltm(input, weights, bias, old_h, late_cell)
    side.synchronize()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_runs_on_the_tensors_device():
    inputs = make_inputs(4, 3, 16, device="cuda:1")
    with torch.cuda.device(0):
        errors = compare_with_reference("cuda", inputs)
    assert max(errors.values()) <= tolerance(torch.float32), errors


def test_honours_allow_tf32():
    """The gate GEMM is cuBLAS through ATen: TF32 changes its rounding only when allowed."""
    inputs = make_inputs(64, 512, 256, device="cuda", requires_grad=False)
    reference = reference_lltm(*[t.double() for t in inputs])[1]
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        errors = {}
        for allow in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = allow
            errors[allow] = (_lltm(*inputs)[1].double() - reference).abs().max().item()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert errors[True] > 10 * errors[False], errors


@pytest.mark.parametrize("misaligned", [False, True], ids=["vector-path", "element-path"])
def test_offsets_past_2_pow_31(misaligned):
    """The last rows of gates sit past element 2**31: checked against the reference on just those rows."""
    B, I, S = 720_000, 1, 1024  # gates has 3 * B * S = 2.2e9 elements
    need = 32 * 2**30  # bytes, float16, forward and backward together
    if torch.cuda.mem_get_info()[0] < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory")
    fp16 = {"dtype": torch.float16, "device": "cuda"}
    input, old_h, old_cell = torch.randn(B, I, **fp16), torch.randn(B, S, **fp16), torch.randn(B, S, **fp16)
    weights, bias = torch.randn(3 * S, S + I, **fp16) / (S + I) ** 0.5, torch.randn(3 * S, **fp16)
    if misaligned:
        old_cell = _offset_copy(old_cell)
    new_h, new_cell, *saved = torch.ops.lltm_cuda.forward(input, weights, bias, old_h, old_cell)
    grad_h, grad_cell = torch.randn_like(new_h), torch.randn_like(new_h)
    if misaligned:  # backward's inputs too, or backward would still take the vector path
        grad_h, grad_cell = _offset_copy(grad_h), _offset_copy(grad_cell)
    grad_X, _, _, grad_old_cell = torch.ops.lltm_cuda.backward(grad_h, grad_cell, weights, *saved, True)

    rows = slice(B - 3, B)
    tail = [t.float().requires_grad_() for t in (input[rows], weights, bias, old_h[rows], old_cell[rows])]
    want_h, want_cell = reference_lltm(*tail)
    grad_input, _, _, grad_old_h, want_grad_old_cell = torch.autograd.grad(
        (want_h, want_cell), tail, (grad_h[rows].float(), grad_cell[rows].float())
    )
    tol = {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(new_h[rows].float(), want_h, **tol)
    torch.testing.assert_close(new_cell[rows].float(), want_cell, **tol)
    torch.testing.assert_close(grad_old_cell[rows].float(), want_grad_old_cell, **tol)
    torch.testing.assert_close(grad_X[rows, :S].float(), grad_old_h, **tol)
    torch.testing.assert_close(grad_X[rows, S:].float(), grad_input, **tol)
