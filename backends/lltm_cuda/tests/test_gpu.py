"""What the conformance kit does not reach: the kernels' two paths, streams, devices, big indices.

Needs a CUDA device; elsewhere every test skips with the reason lltm-cuda gives.
With LLTM_REQUIRE_GPU=1 (benchmarks/gpu_check.sh on the GPU machine) that reason
is an error instead: there, a skip would read as a pass.
The general checks (every dtype against the float64 oracle, gradcheck, opcheck,
torch.compile) are the kit's: pytest --pyargs lltm_core.testing --lltm-backend cuda --lltm-device cuda

With LLTM_CUDA_TEST_EMULATED=1 (`nox -s cuda_emulated`) the same tests run on the emulated build
(lltm_cuda_emulated: these kernels compiled for the CPU, backend cuda_emulated, CPU tensors),
except those marked ``needs_gpu``: they test what the emulation cannot see (streams, a second
device, cuBLAS's TF32, 2**31-element buffers in GPU memory) and skip there, saying so.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

_REQUIRED = os.environ.get("LLTM_REQUIRE_GPU") == "1"
EMULATED = os.environ.get("LLTM_CUDA_TEST_EMULATED") == "1"
if EMULATED and _REQUIRED:
    raise RuntimeError("LLTM_REQUIRE_GPU=1 and LLTM_CUDA_TEST_EMULATED=1 ask for opposite things: unset one")
try:
    if EMULATED:  # asked for by name: its absence is an error, never a skip
        import lltm_cuda_emulated as lltm_cuda
    else:
        import lltm_cuda
except ModuleNotFoundError as exc:
    # Only lltm-cuda's absence skips: an installed one that fails to import is a failure.
    if exc.name != "lltm_cuda" or _REQUIRED:
        raise
    pytest.skip("lltm-cuda is not installed (building it needs the CUDA toolkit)", allow_module_level=True)
import lltm_core  # noqa: E402
from lltm_core.testing import (  # noqa: E402
    compare_with_reference, make_inputs, make_sequence_inputs, max_rel_error, reference_lltm, tolerance,
)

_REASON = lltm_cuda.unavailable_reason()
if _REQUIRED and _REASON is not None:
    raise RuntimeError(f"LLTM_REQUIRE_GPU=1, but lltm-cuda cannot run here: {_REASON}")
pytestmark = [
    pytest.mark.skipif(_REASON is not None, reason=f"lltm-cuda cannot run here: {_REASON}"),
    # Fresh inputs each run from the kit's seed, shown beside a failure: --lltm-seed N repeats it.
    pytest.mark.usefixtures("lltm_seed"),
]

BACKEND, DEVICE = ("cuda_emulated", "cpu") if EMULATED else ("cuda", "cuda")
needs_gpu = pytest.mark.skipif(EMULATED, reason="checks what only a GPU has; the emulated build cannot see it")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# State sizes that take the 16-byte-vector path for every dtype (multiples of
# 8), the element path (odd), one element, and more than a 1024-thread block.
SHAPES = [(7, 5, 64), (3, 4, 13), (5000, 3, 1), (2, 9, 1032), (2, 9, 1031), (1, 1, 8)]


def _lltm(*inputs):
    return lltm_core.lltm(*inputs, backend=BACKEND)


def _offset_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t whose data starts one element past a 16-byte boundary."""
    storage = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = storage[1:].view(t.shape)
    return view.copy_(t)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-I{}-S{}".format(*s))
def test_matches_reference(dtype, shape):
    inputs = make_inputs(*shape, dtype=dtype, device=DEVICE)
    errors = compare_with_reference(BACKEND, inputs)
    assert max(errors.values()) <= tolerance(dtype), errors


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_misaligned_inputs_take_the_element_path(dtype):
    """An input at an odd address takes the element-wise path; it computes the same numbers.

    (Not required to be bit-identical: the compiler may contract the two paths' arithmetic differently.)
    """
    input, weights, bias, old_h, old_cell = make_inputs(6, 5, 64, dtype=dtype, device=DEVICE, requires_grad=False)
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
    inputs = make_inputs(*shape, dtype=torch.float64, device=DEVICE)
    assert torch.autograd.gradcheck(_lltm, inputs)


@needs_gpu
def test_runs_on_the_current_stream():
    """If a kernel ran on the default stream it would read old_cell before the side stream wrote it."""
    input, weights, bias, old_h, old_cell = make_inputs(64, 32, 256, device=DEVICE, requires_grad=False)
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


@needs_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_runs_on_the_tensors_device():
    inputs = make_inputs(4, 3, 16, device="cuda:1")
    with torch.cuda.device(0):
        errors = compare_with_reference(BACKEND, inputs)
    assert max(errors.values()) <= tolerance(torch.float32), errors


@needs_gpu
def test_honours_allow_tf32():
    """The gate GEMM is cuBLAS through ATen: TF32 changes its rounding only when allowed."""
    inputs = make_inputs(64, 512, 256, device=DEVICE, requires_grad=False)
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


@needs_gpu
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


# --- sequences: lltm_cuda::sequence_forward / sequence_backward ---------------------------------

# (T, B, I, S): the 16-byte-vector path in every dtype (S a multiple of 8), the element path (odd S),
# more state than a 1024-thread block, one step, and one state element.
SEQUENCE_SHAPES = [(5, 4, 3, 64), (6, 3, 5, 13), (3, 5, 4, 1032), (1, 3, 2, 8), (4, 2, 3, 1)]


def _lengths(T: int, B: int) -> torch.Tensor:
    """Random lengths in [1, T] with both ends present: a row that runs every step and one that runs one."""
    lengths = torch.randint(1, T + 1, (B,))
    lengths[0], lengths[-1] = T, 1
    return lengths.to(DEVICE)


def _sequence(*inputs, backend=BACKEND, **kwargs):
    return lltm_core.lltm_sequence(*inputs, backend=backend, **kwargs)


def _matches_ref(dtype, shape, with_lengths, reverse):
    """Outputs and all five gradients against lltm-ref's sequence on CUDA in float64, on the same inputs."""
    T, B, I, S = shape
    inputs = make_sequence_inputs(T, B, I, S, dtype=dtype, device=DEVICE)
    lengths = _lengths(T, B) if with_lengths else None
    got = _sequence(*inputs, lengths=lengths, reverse=reverse)
    upstream = [torch.randn(t.shape, dtype=torch.float64, device=DEVICE) for t in got]
    grads = torch.autograd.grad(got, inputs, [u.to(dtype) for u in upstream])
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    want = _sequence(*ref_inputs, lengths=lengths, reverse=reverse, backend="ref")
    want_grads = torch.autograd.grad(want, ref_inputs, upstream)
    names = ("output", "h_n", "c_n", "grad_input", "grad_weights", "grad_bias", "grad_h0", "grad_c0")
    errors = {n: max_rel_error(g, w) for n, g, w in zip(names, (*got, *grads), (*want, *want_grads))}
    assert max(errors.values()) <= tolerance(dtype), errors


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SEQUENCE_SHAPES, ids=lambda s: "T{}-B{}-I{}-S{}".format(*s))
def test_sequence_matches_ref(dtype, shape, with_lengths, reverse):
    _matches_ref(dtype, shape, with_lengths, reverse)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_grid_sequence_matches_ref(monkeypatch, dtype, with_lengths, reverse):
    """The grid path (LLTM_CUDA_SEQUENCE=grid) over as many blocks as the device has multiprocessors
    (up to S = 200: on an H100 132 blocks of one or two units, all resident and exchanging h through
    global memory each step), outputs and gradients against lltm-ref in float64."""
    monkeypatch.setenv("LLTM_CUDA_SEQUENCE", "grid")
    path, blocks, why = lltm_cuda.sequence_path(dtype, 9, 200)
    assert path == "grid" and 1 < blocks <= 200, why
    _matches_ref(dtype, (5, 9, 7, 200), with_lengths, reverse)


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("shape", [(3, 4, 2, 4), (4, 3, 2, 5)], ids=lambda s: "T{}-B{}-I{}-S{}".format(*s))
def test_sequence_gradcheck_float64(shape, with_lengths, reverse):
    """Finite differences through lltm-cuda's own sequence backward (vector path at S=4, element path at S=5)."""
    inputs = make_sequence_inputs(*shape, dtype=torch.float64, device=DEVICE)
    lengths = _lengths(shape[0], shape[1]) if with_lengths else None
    assert torch.autograd.gradcheck(lambda *a: _sequence(*a, lengths=lengths, reverse=reverse), inputs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sequence_empty_batch(dtype):
    """B = 0 reaches the kernels (lltm-core handles only T = 0): empty outputs, zero parameter gradients."""
    x, weights, bias, h0, c0 = make_sequence_inputs(4, 0, 3, 8, dtype=dtype, device=DEVICE)
    lengths = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    for kwargs in ({}, {"lengths": lengths, "reverse": True}):
        output, h_n, c_n = _sequence(x, weights, bias, h0, c0, **kwargs)
        assert output.shape == (4, 0, 8) and h_n.shape == c_n.shape == (0, 8)
        grads = torch.autograd.grad(output.sum() + h_n.sum() + c_n.sum(), (x, weights, bias, h0, c0))
        assert grads[0].shape == x.shape and grads[3].shape == h0.shape
        assert not grads[1].any() and not grads[2].any()


def _copies(run) -> int:
    """How many aten::copy_ calls run() makes (from C++ too: the profiler sees every dispatched op)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::copy_")


def test_cell_forward_builds_its_gemm_operand_in_one_kernel():
    """X = [old_h | input] is written by a kernel of lltm-cuda's own (one launch), not by a copy for
    each column block (two kernels): at a small batch a kernel boundary costs more than the work."""
    from torch.profiler import ProfilerActivity, profile

    x, weights, bias, old_h, old_cell = make_inputs(16, 32, 128, device=DEVICE, requires_grad=False)
    forward = torch.ops.lltm_cuda.forward
    X = forward(x, weights, bias, old_h, old_cell)[2]
    assert torch.equal(X, torch.cat([old_h, x], dim=1))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        forward(x, weights, bias, old_h, old_cell)
    # Only the GEMM may copy: CPU ATen's addmm broadcasts the bias into its (B, 3S) output first.
    copies = [e.input_shapes[0] for e in prof.events() if e.name == "aten::copy_"]
    assert all(shape == [16, 3 * 128] for shape in copies), copies


@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_sequence_copies_nothing_per_step(with_lengths):
    """Each step's GEMM writes its slice of gates (forward) and d_h (backward) as it is, and d_W's two
    column blocks are written in place in grad_weights: no copy grows with T, and the backward's
    only copies are its two running state gradients."""
    forward, backward = torch.ops.lltm_cuda.sequence_forward, torch.ops.lltm_cuda.sequence_backward
    counts = {}
    for T in (2, 7):
        x, weights, bias, h0, c0 = make_sequence_inputs(T, 8, 16, 32, device=DEVICE, requires_grad=False)
        lengths = _lengths(T, 8) if with_lengths else None
        for reverse in (False, True):
            out = forward(x, weights, bias, h0, c0, lengths, reverse)
            grads = [torch.randn_like(t) for t in out[:3]]
            if not EMULATED:
                torch.cuda.synchronize()
            counts[T, reverse, "forward"] = _copies(lambda: forward(x, weights, bias, h0, c0, lengths, reverse))
            counts[T, reverse, "backward"] = _copies(
                lambda: backward(*grads, weights, x, h0, out[0], lengths, *out[3:], reverse, True))
    for key, n in counts.items():
        assert n == counts[(2,) + key[1:]], counts
        if key[2] == "backward":
            assert n <= 2, counts


def _device_profile(path: str, T: int):
    """(lltm-cuda's own kernels by name, torch operators dispatched by name) of one forward+backward on
    `path` at T steps (B8 I16 S32), from torch's profiler on the device."""
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile

    os.environ["LLTM_CUDA_SEQUENCE"] = path  # the caller's monkeypatch restores it
    inputs = make_sequence_inputs(T, 8, 16, 32, device=DEVICE)
    out = _sequence(*inputs)
    grads = [torch.randn_like(t) for t in out]
    torch.autograd.backward(out, grads)  # first calls: cuBLAS's handles, the occupancy queries
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.autograd.backward(_sequence(*inputs), grads)
        torch.cuda.synchronize()
    # Demangled or not, a kernel's name holds its function's: persistent_*kernel, sequence_*_step_kernel.
    found = (re.search(r"persistent_\w*?kernel|sequence_\w+?_step_kernel", e.name) for e in prof.events()
             if e.device_type == torch.autograd.DeviceType.CUDA)
    kernels = Counter(m.group(0) for m in found if m is not None)
    operators = Counter(e.name for e in prof.events() if e.name.startswith("aten::"))
    return kernels, operators


@needs_gpu
@pytest.mark.parametrize("path", ["persistent", "grid"])
def test_persistent_paths_launch_as_many_kernels_at_any_length(monkeypatch, path):
    """Issue 49's count on the device: a forward+backward on a persistent path runs each of
    lltm-cuda's loop kernels once and dispatches the same torch operators (the GEMMs around the
    loop) at 3 steps as at 33; the per-step path, for contrast, runs its step kernels once a step."""
    monkeypatch.setenv("LLTM_CUDA_SEQUENCE", path)
    short, long = _device_profile(path, 3), _device_profile(path, 33)
    assert short == long, (short, long)
    loops = {name: n for name, n in short[0].items() if name.startswith("persistent_")}
    assert sorted(loops.values()) == [1, 1] and any("backward" in name for name in loops), short[0]
    steps = _device_profile("per-step", 33)[0]
    assert steps["sequence_forward_step_kernel"] == steps["sequence_backward_step_kernel"] == 33, steps


@needs_gpu
def test_sequence_runs_on_the_current_stream():
    """If a kernel or GEMM ran on the default stream it would read c0 before the side stream wrote it."""
    x, weights, bias, h0, c0 = make_sequence_inputs(8, 32, 16, 256, device=DEVICE, requires_grad=False)
    lengths = _lengths(8, 32)
    want = _sequence(x, weights, bias, h0, c0, lengths=lengths)
    side = torch.cuda.Stream()
    late_c0 = torch.zeros_like(c0)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keep the side stream busy for tens of milliseconds
        late_c0.copy_(c0)
        got = _sequence(x, weights, bias, h0, late_c0, lengths=lengths)
    side.synchronize()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@needs_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_sequence_runs_on_the_tensors_device():
    inputs = make_sequence_inputs(3, 4, 3, 16, device="cuda:1")
    with torch.cuda.device(0):
        got = _sequence(*inputs, lengths=torch.tensor([3, 1, 2, 3], device="cuda:1"))
    want = _sequence(*[t.detach().double() for t in inputs], lengths=torch.tensor([3, 1, 2, 3]).cuda(1),
                     backend="ref")
    for g, w in zip(got, want):
        assert max_rel_error(g, w) <= tolerance(torch.float32)


@needs_gpu
def test_sequence_honours_allow_tf32():
    """The input projection and the per-step GEMMs are ATen's: TF32 changes their rounding only when allowed."""
    inputs = make_sequence_inputs(4, 64, 512, 256, device=DEVICE, requires_grad=False)
    reference = _sequence(*[t.double() for t in inputs], backend="ref")[0]
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        errors = {}
        for allow in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = allow
            errors[allow] = (_sequence(*inputs)[0].double() - reference).abs().max().item()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    assert errors[True] > 10 * errors[False], errors


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sequence_misaligned_gradient_takes_the_element_path(dtype):
    """An output gradient at an odd address (a contiguous view one element in) computes the same numbers."""
    x, weights, bias, h0, c0 = make_sequence_inputs(4, 5, 3, 64, dtype=dtype, device=DEVICE, requires_grad=False)
    lengths = _lengths(4, 5)
    out = torch.ops.lltm_cuda.sequence_forward(x, weights, bias, h0, c0, lengths, True)
    grads = [torch.randn_like(t) for t in out[:3]]
    backward = torch.ops.lltm_cuda.sequence_backward
    want = backward(*grads, weights, x, h0, out[0], lengths, *out[3:], True, True)
    got = backward(_offset_copy(grads[0]), *grads[1:], weights, x, h0, out[0], lengths, *out[3:], True, True)
    for name, g, w in zip(("grad_input", "grad_weights", "grad_bias", "grad_h0", "grad_c0"), got, want):
        assert max_rel_error(g, w) <= tolerance(dtype), name


# --- contract v3: sequence_forward(..., needs_backward=False), inference -------------------------


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sequence_inference_projects_in_chunks(dtype, with_lengths, reverse):
    """needs_backward=False: the outputs of a training forward, empty saved tensors, and the input
    projected in chunks of 2048 rows: at B=2, 1024 steps and then 6 (each chunk's gates at its
    own offset in the reused buffer, in the order the steps run, both ways)."""
    T, B, I, S = 1030, 2, 3, 8  # S=8: the vector path in every dtype
    x, weights, bias, h0, c0 = make_sequence_inputs(T, B, I, S, dtype=dtype, device=DEVICE, requires_grad=False)
    lengths = torch.tensor([T, 700], device=DEVICE) if with_lengths else None
    forward = torch.ops.lltm_cuda.sequence_forward
    training = forward(x, weights, bias, h0, c0, lengths, reverse, True)
    inference = forward(x, weights, bias, h0, c0, lengths, reverse, False)
    assert [tuple(t.shape) for t in inference[3:]] == [(0,), (0,)], "with needs_backward=False nothing is saved"
    want = _sequence(*(t.double() for t in (x, weights, bias, h0, c0)), lengths=lengths, reverse=reverse,
                     backend="ref")
    for name, got, train, ref in zip(("output", "h_n", "c_n"), inference, training, want):
        assert max_rel_error(got, train) <= tolerance(dtype), name
        # 1030 steps of rounding drift past the kit's tolerance for a short sequence but in float64.
        if dtype == torch.float64:
            assert max_rel_error(got, ref) <= tolerance(dtype), name


@needs_gpu
def test_sequence_inference_memory():
    """Under torch.no_grad() one forward at T512 B64 I64 S512 raises the peak by at most 1.25x its
    input and output: the output plus a workspace that does not grow with T."""
    T, B, I, S = 512, 64, 64, 512
    layer = lltm_core.LLTMLayer(I, S, backend=BACKEND, device=DEVICE)
    x = torch.randn(T, B, I, device=DEVICE)
    with torch.no_grad():
        layer(x)  # warm up: cuBLAS's workspace and handles are not the layer's memory
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        output, _ = layer(x)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    budget = 1.25 * (x.numel() + output.numel()) * x.element_size()
    assert peak <= budget, f"peak rose by {peak / 2**20:.1f} MiB, over {budget / 2**20:.1f} MiB"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layer_matches_ref(dtype):
    """LLTMLayer, two layers both ways, on lltm-cuda's sequence kernels against lltm-ref's in float64."""
    torch.manual_seed(torch.initial_seed())
    layer = lltm_core.LLTMLayer(6, 16, 2, bidirectional=True, backend=BACKEND, device=DEVICE, dtype=dtype)
    ref = lltm_core.LLTMLayer(6, 16, 2, bidirectional=True, backend="ref", device=DEVICE, dtype=torch.float64)
    ref.load_state_dict({k: v.double() for k, v in layer.state_dict().items()})
    x = torch.randn(7, 3, 6, device=DEVICE, dtype=dtype, requires_grad=True)
    got = layer(x)
    got = (got[0], *got[1])
    x_ref = x.detach().double().requires_grad_()
    want = ref(x_ref)
    want = (want[0], *want[1])
    upstream = [torch.randn(t.shape, dtype=torch.float64, device=DEVICE) for t in want]
    grads = torch.autograd.grad(got, [x, *layer.parameters()], [u.to(dtype) for u in upstream])
    want_grads = torch.autograd.grad(want, [x_ref, *ref.parameters()], upstream)
    names = ["output", "h_n", "c_n", "grad_input"] + [f"grad_{n}" for n, _ in layer.named_parameters()]
    errors = {n: max_rel_error(g, w) for n, g, w in zip(names, (*got, *grads), (*want, *want_grads))}
    assert max(errors.values()) <= tolerance(dtype), errors
