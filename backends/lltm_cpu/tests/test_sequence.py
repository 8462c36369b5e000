"""lltm-cpu's fused sequence kernels (torch.ops.lltm_cpu.sequence_forward / sequence_backward).

Checked against lltm-ref's sequence kernels (the algorithm they follow), against
the tutorial's cell looped in float64 (the kit's oracle), and through float64
gradcheck.  Each GEMM route forced by LLTM_CPU_GEMM (read once) runs the
kit's sequence checks in a subprocess, as other thread counts run this file's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
import torch

import lltm_core
import lltm_cpu
import lltm_ref
from cpu_flags import cpu_flags
from lltm_core.testing import make_sequence_inputs, max_rel_error, reference_sequence, tolerance

pytestmark = pytest.mark.usefixtures("lltm_seed")

DTYPES = [torch.float32, torch.float64, torch.bfloat16]
# (T, B, I, S): length-1 sequences, one row, odd sizes that leave partial
# vectors at every ISA's width, a batch that splits unevenly over threads, a
# state past 1024, one row with GEMMs large enough to run on MKL's threads, and
# blocks of 16 rows by K 64 / 192, which the AMX kernel reads in place (no padding),
# and weight gradients over T x B = 279 rows: the float32 kernel's transposed A
# in two slices of K, the second partial, over two panels of rows; and gates
# (T x B x 3S) of 2.7 MB in bfloat16 to 10.8 MB in float64, beyond a core's L2,
# where the passes ask for each next row ahead.
SHAPES = [(1, 1, 1, 1), (4, 3, 5, 7), (5, 33, 6, 129), (2, 2, 3, 1100), (2, 1, 3, 1200), (3, 32, 5, 64),
          (9, 31, 6, 35), (16, 40, 9, 700)]


@pytest.fixture(autouse=True, scope="module")
def cpu_backend():
    return lltm_core.get_backend("cpu")


def shape_id(shape) -> str:
    return "T{}-B{}-I{}-S{}".format(*shape)


def random_lengths(steps: int, batch: int) -> torch.Tensor:
    """Unsorted lengths in [1, T], with a 1 and a T among them where the batch has room."""
    lengths = torch.randint(1, steps + 1, (batch,))
    lengths[0] = 1
    if batch > 1:
        lengths[-1] = steps
    return lengths[torch.randperm(batch)]


def run_fused(inputs, lengths, reverse, grads):
    """The backend's sequence, forward and backward, through lltm_core's autograd."""
    inputs = [t.detach().requires_grad_() for t in inputs]
    outputs = lltm_core.lltm_sequence(*inputs, lengths=lengths, reverse=reverse, backend="cpu")
    return [*outputs, *torch.autograd.grad(outputs, inputs, grads)]


def run_oracle(inputs, lengths, reverse, grads):
    """The tutorial's cell looped over each sequence alone, in float64, differentiated by autograd."""
    inputs = [t.detach().double().requires_grad_() for t in inputs]
    outputs = reference_sequence(*inputs, lengths=lengths, reverse=reverse)
    return [*outputs, *torch.autograd.grad(outputs, inputs, [g.double() for g in grads])]


NAMES = ["output", "h_n", "c_n", "grad_input", "grad_weights", "grad_bias", "grad_h0", "grad_c0"]


def zero_state(kind: str, batch: int, state_size: int, dtype: torch.dtype) -> torch.Tensor:
    """h0 "zero", of both signs (the kernels skip a zero h0's products), or "zero-but-one", zero except
    its last element, which the kernels must not skip."""
    signs = torch.where(torch.rand(batch, state_size) < 0.5, -1.0, 1.0)
    h0 = (torch.zeros(batch, state_size) * signs).to(dtype)
    if kind == "zero-but-one":
        h0.view(-1)[-1] = 0.75
    return h0


def errors_against_oracle(shape, dtype, lengths, reverse, state="random") -> dict:
    """state: "random" (make_sequence_inputs's h0), or a kind of zero_state."""
    T, B, I, S = shape
    inputs = list(make_sequence_inputs(T, B, I, S, dtype=dtype))
    if state != "random":
        inputs[3] = zero_state(state, B, S, dtype).requires_grad_()
    grads = [torch.randn(T, B, S, dtype=torch.float64).to(dtype), *(torch.randn(B, S).to(dtype) for _ in range(2))]
    got = run_fused(inputs, lengths, reverse, grads)
    want = run_oracle(inputs, lengths, reverse, grads)
    return {name: max_rel_error(g, w) for name, g, w in zip(NAMES, got, want)}


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matches_looped_cell(shape, dtype, with_lengths, reverse):
    """Outputs and every gradient against the tutorial's cell looped in float64."""
    T, B = shape[:2]
    lengths = random_lengths(T, B) if with_lengths else None
    assert_matches_oracle(shape, dtype, lengths, reverse, "random")


@pytest.mark.parametrize("state", ["zero", "zero-but-one"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [SHAPES[2], SHAPES[4]], ids=shape_id)
def test_zero_h0_matches_looped_cell(shape, dtype, with_lengths, reverse, state):
    """From a zero h0, whose first-step products the kernels skip, and from one that is zero but for one element."""
    T, B = shape[:2]
    lengths = random_lengths(T, B) if with_lengths else None
    assert_matches_oracle(shape, dtype, lengths, reverse, state)


def assert_matches_oracle(shape, dtype, lengths, reverse, state):
    errors = errors_against_oracle(shape, dtype, lengths, reverse, state)
    bad = {k: v for k, v in errors.items() if v > tolerance(dtype)}
    assert not bad, f"relative error above {tolerance(dtype)} (lengths {lengths}, h0 {state}): {bad}"


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_lltm_ref_kernels(dtype, with_lengths, reverse):
    """The operators against lltm-ref's sequence kernels, called the same way, saved tensors included."""
    T, B, I, S = 6, 9, 5, 33
    inputs = [t.detach() for t in make_sequence_inputs(T, B, I, S, dtype=dtype)]
    lengths = random_lengths(T, B) if with_lengths else None
    ops = torch.ops.lltm_cpu
    got = ops.sequence_forward(*inputs, lengths, reverse)
    want = lltm_ref.sequence_forward(*inputs, lengths, reverse)
    loose = 5 * tolerance(dtype)  # two implementations in `dtype`, not one against float64
    for name, g, w in zip(["output", "h_n", "c_n"], got, want):
        assert max_rel_error(g, w) <= loose, name
    # Saved tensors: where a row took part in a step (elsewhere lltm-cpu saves zeros, lltm-ref whatever it computed).
    valid = torch.ones(T, B, 1, dtype=torch.bool) if lengths is None else (
        torch.arange(T).unsqueeze(1) < lengths.unsqueeze(0)).unsqueeze(2)
    for name, g, w in zip(["gates", "tanh_cell"], got[3:], want[3:]):
        assert g.shape == w.shape
        assert max_rel_error(g * valid, w * valid) <= loose, name
    x, weights, _, h0, _ = inputs
    upstream = [torch.randn(T, B, S, dtype=torch.float64).to(dtype), torch.randn(B, S).to(dtype),
                torch.randn(B, S).to(dtype)]
    got_grads = ops.sequence_backward(*upstream, weights, x, h0, got[0], lengths, *got[3:], reverse, True)
    want_grads = lltm_ref.sequence_backward(*upstream, weights, x, h0, want[0], lengths, *want[3:], reverse, True)
    for name, g, w in zip(NAMES[3:], got_grads, want_grads):
        assert max_rel_error(g, w) <= loose, name


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("with_lengths", [False, True], ids=["full", "lengths"])
def test_gradcheck(with_lengths, reverse):
    T, B, I, S = 4, 3, 2, 5
    inputs = make_sequence_inputs(T, B, I, S, dtype=torch.float64)
    lengths = torch.tensor([2, 4, 1]) if with_lengths else None

    def sequence(*args):
        return lltm_core.lltm_sequence(*args, lengths=lengths, reverse=reverse, backend="cpu")

    assert torch.autograd.gradcheck(sequence, inputs)


def test_gradcheck_fast_mode_large():
    inputs = make_sequence_inputs(3, 17, 4, 130, dtype=torch.float64)
    lengths = random_lengths(3, 17)
    assert torch.autograd.gradcheck(
        lambda *a: lltm_core.lltm_sequence(*a, lengths=lengths, backend="cpu"), inputs, fast_mode=True)


def test_full_lengths_are_no_lengths():
    T, B, I, S = 5, 4, 3, 9
    inputs = [t.detach() for t in make_sequence_inputs(T, B, I, S)]
    for reverse in (False, True):
        plain = torch.ops.lltm_cpu.sequence_forward(*inputs, None, reverse)
        full = torch.ops.lltm_cpu.sequence_forward(*inputs, torch.full((B,), T), reverse)
        for a, b in zip(plain, full):
            assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_batch(dtype):
    T, I, S = 3, 4, 5
    inputs = make_sequence_inputs(T, 0, I, S, dtype=dtype)
    output, h_n, c_n = lltm_core.lltm_sequence(*inputs, backend="cpu")
    assert (output.shape, h_n.shape, c_n.shape) == ((T, 0, S), (0, S), (0, S))
    (output.sum() + h_n.sum() + c_n.sum()).backward()
    x, weights, bias, h0, c0 = inputs
    assert x.grad.shape == (T, 0, I) and h0.grad.shape == (0, S) and c0.grad.shape == (0, S)
    assert torch.equal(weights.grad, torch.zeros_like(weights)) and torch.equal(bias.grad, torch.zeros_like(bias))


@pytest.mark.parametrize("layout", ["dense", "broadcast", "batch-broadcast", "transposed"])
def test_any_grad_output_strides(layout):
    """sequence_backward reads grad_output rows of any stride, and rows that are one broadcast value."""
    T, B, I, S = 4, 5, 3, 17
    inputs = [t.detach() for t in make_sequence_inputs(T, B, I, S)]
    output, h_n, c_n, *saved = torch.ops.lltm_cpu.sequence_forward(*inputs, None, False)
    dense = torch.randn(T, B, S)
    grad_output = {
        "dense": dense,
        "broadcast": torch.tensor(0.7).expand(T, B, S),
        "batch-broadcast": dense[:, :1, :].expand(T, B, S),
        "transposed": dense.transpose(0, 2).contiguous().transpose(0, 2),
    }[layout]
    x, weights, _, h0, _ = inputs
    zeros = torch.zeros(B, S)
    got = torch.ops.lltm_cpu.sequence_backward(grad_output, zeros, zeros, weights, x, h0, output, None, *saved,
                                               False, True)
    want = torch.ops.lltm_cpu.sequence_backward(grad_output.contiguous(), zeros, zeros, weights, x, h0, output, None,
                                                *saved, False, True)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_new_memory_and_arguments_untouched():
    """Every result is new memory, none a view of another or of an argument, and no argument is written."""
    T, B, I, S = 3, 4, 5, 6
    inputs = [t.detach() for t in make_sequence_inputs(T, B, I, S)]

    def storages(tensors):
        return [t.untyped_storage().data_ptr() for t in tensors if t.numel()]

    for lengths in (None, torch.tensor([3, 1, 2, 3])):
        before = [t.clone() for t in inputs]
        forward = torch.ops.lltm_cpu.sequence_forward(*inputs, lengths, True)
        assert all(torch.equal(a, b) for a, b in zip(inputs, before))
        x, weights, _, h0, _ = inputs
        args = [torch.randn(T, B, S), torch.randn(B, S), torch.randn(B, S), weights, x, h0, forward[0], *forward[3:]]
        before = [t.clone() for t in args]
        backward = torch.ops.lltm_cpu.sequence_backward(*args[:7], lengths, *args[7:], True, True)
        assert all(torch.equal(a, b) for a, b in zip(args, before))
        for results, arguments in ((forward, inputs), (backward, args)):
            assert len(set(storages(results))) == len(storages(results))
            assert not set(storages(results)) & set(storages(arguments))


def test_operators_take_noncontiguous_inputs():
    T, B, I, S = 3, 4, 5, 6
    inputs = [t.detach() for t in make_sequence_inputs(T, B, I, S)]
    strided = [t.transpose(0, -1).contiguous().transpose(0, -1) if t.dim() > 1 else t.repeat_interleave(2)[::2]
               for t in inputs]
    assert not any(t.is_contiguous() for t in strided)
    for got, want in zip(torch.ops.lltm_cpu.sequence_forward(*strided, None, False),
                         torch.ops.lltm_cpu.sequence_forward(*inputs, None, False)):
        assert torch.equal(got, want)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.update(lengths=torch.tensor([1, 4, 2])), r"lengths must be in \[1, 3\], got 4 at 1"),
        (lambda a: a.update(lengths=torch.tensor([1, 2])), r"lengths must have shape \[3\]"),
        (lambda a: a.update(lengths=torch.tensor([1, 2, 3], dtype=torch.int32)), "lengths must be an int64"),
        (lambda a: a.update(c0=a["c0"][:, :-1]), r"c0 must have shape \[3, 4\]"),
        (lambda a: a.update(weights=a["weights"].double()), "weights has dtype float64, expected float32"),
    ],
    ids=["length-too-long", "lengths-shape", "lengths-dtype", "c0-shape", "mixed-dtypes"],
)
def test_operator_names_the_bad_argument(change, message):
    names = ["input", "weights", "bias", "h0", "c0"]
    args = dict(zip(names, [t.detach() for t in make_sequence_inputs(3, 3, 2, 4)]), lengths=None)
    change(args)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.lltm_cpu.sequence_forward(*(args[n] for n in names), args["lengths"], False)


def test_saved_memory_within_the_contract():
    """At most (6S + I)·T·B elements saved per layer and direction, counting each storage once
    (input and output included; the weights and h0 are the only other tensors autograd keeps)."""
    T, B, I, S = 6, 5, 7, 11
    inputs = make_sequence_inputs(T, B, I, S)
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        output, _, _ = lltm_core.lltm_sequence(*inputs, backend="cpu")
    weights, h0 = inputs[1], inputs[3]
    per_step = sum(saved.values()) - weights.numel() - h0.numel()
    assert per_step <= (6 * S + I) * T * B
    assert output.untyped_storage().data_ptr() in saved  # output counted, not copied

    saved.clear()
    with torch.no_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lltm_core.lltm_sequence(*inputs, backend="cpu")
    assert not saved


# T23 B128 S512: the inference forward projects the input in chunks of at most
# 2^22 gate elements, 21 steps here: two chunks (12 and 11 steps).
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(23, 128, 5, 512), (4, 3, 5, 7)], ids=shape_id)
def test_inference_forward_is_the_training_forward(shape, dtype, reverse):
    """needs_backward=False (contract v3): the same results, chunk by chunk, and empty saved slots."""
    T, B, I, S = shape
    inputs = [t.detach() for t in make_sequence_inputs(T, B, I, S, dtype=dtype)]
    for lengths in (None, random_lengths(T, B)):
        training = torch.ops.lltm_cpu.sequence_forward(*inputs, lengths, reverse, True)
        inference = torch.ops.lltm_cpu.sequence_forward(*inputs, lengths, reverse, False)
        assert [t.shape for t in inference[3:]] == [(0,), (0,)]
        assert all(t.dtype == dtype for t in inference)
        for name, a, b in zip(["output", "h_n", "c_n"], training, inference):
            assert max_rel_error(a, b) <= tolerance(dtype), name
    # Version 2's call, without needs_backward, is the training forward.
    assert [t.shape for t in torch.ops.lltm_cpu.sequence_forward(*inputs, None, reverse)[3:]] == [
        (T, B, 3 * S), (T, B, S)]


_PEAK_MEMORY_PROBE = """
import torch, lltm_core
from lltm_core.testing import make_sequence_inputs

def status_kib(field):  # VmRSS: resident now; VmHWM: the peak since the last reset
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

torch.set_num_threads(1)
lltm_core.get_backend("cpu")
T, B, I, S = 512, 64, 64, 512
inputs = [t.detach() for t in make_sequence_inputs(T, B, I, S)]
with torch.no_grad():
    torch.ops.lltm_cpu.sequence_forward(inputs[0][:2], *inputs[1:], None, False, False)  # loads what a call needs
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the resident set now
    before = status_kib("VmRSS")
    output = torch.ops.lltm_cpu.sequence_forward(*inputs, None, False, False)[0]
    print((status_kib("VmHWM") - before) * 1024, inputs[0].nbytes, output.nbytes)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak resident set from /proc (Linux)")
def test_inference_peak_memory_in_subprocess():
    """Contract v3: at T512 B64 I64 S512 float32 an inference forward raises the peak memory
    by at most 1.25x (input + output) (measured here: the output plus about 17 MB, a chunk's gates).
    Measured in a fresh process, as the rise of its peak resident set (reset just before the call)."""
    run = subprocess.run([sys.executable, "-c", _PEAK_MEMORY_PROBE], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    raised, input_bytes, output_bytes = map(int, run.stdout.split())
    assert output_bytes <= raised  # the probe saw the output's pages: it measures something
    assert raised <= 1.25 * (input_bytes + output_bytes), (raised, input_bytes, output_bytes)


def test_reported_as_fused():
    """`lltm info` reads lltm_core.backend_report(): cpu runs sequences in its own kernels."""
    (record,) = [r for r in lltm_core.backend_report() if r["name"] == "cpu" and r["status"] == "available"]
    assert record["sequence_kernels"] is True
    assert {2, 3} <= set(lltm_core.get_backend("cpu").interface_versions)


def test_layer_uses_the_fused_kernels():
    """LLTMLayer on cpu calls the sequence kernels, not the step kernels looped."""
    assert lltm_core.get_backend("cpu").has_sequence_kernels
    layer = lltm_core.LLTMLayer(3, 4, num_layers=2, bidirectional=True, backend="cpu")
    with torch.autograd.profiler.profile() as prof:
        layer(torch.randn(5, 2, 3))
    names = [e.name for e in prof.function_events]
    assert names.count("lltm_cpu::sequence_forward") == 4  # 2 layers x 2 directions
    assert "lltm_cpu::forward" not in names


def records() -> list[dict]:
    """This process's GEMM and split choices so far (lltm_cpu.gemm_routes())."""
    return lltm_cpu.gemm_routes()


def routes_chosen() -> dict:
    """{key: route} of this process's choices so far."""
    return {record["key"]: record["chosen"] for record in records()}


# The recurrent routes that lay out a copy of W_h are chosen only where they measure this share of
# the others' times or less (gemm_routes.cpp's kLaidOutWithin).
LAID_OUT = {"amx-bf16", "avx512-bf16", "avx512-fma", "avx2-fma", "mkl-packed"}
LAID_OUT_WITHIN = 0.90


def recurrent_route_by_rule(times: dict) -> str:
    """The recurrent route that kLaidOutWithin's rule chooses from {route: us}."""
    return min(times, key=lambda route: times[route] / (LAID_OUT_WITHIN if route in LAID_OUT else 1.0))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_routes_measured_once_per_shape(dtype):
    """The first call of a shape chooses each GEMM's route among those this torch offers the dtype;
    later calls of that shape reuse the choice; a new shape gets its own (for the GEMMs over all
    steps, a new size class: test_a_new_sequence_length_reuses_its_size_class)."""
    for variable in ("LLTM_CPU_GEMM", "LLTM_CPU_SPLIT"):
        if os.environ.get(variable):
            pytest.skip(f"{variable}={os.environ[variable]} chose the route or the GEMMs' shapes")
    offered = {torch.float32: {"avx512-fma", "avx2-fma", "mkl-packed", "mkl", "aten"}, torch.float64: {"mkl", "aten"},
               torch.bfloat16: {"amx-bf16", "avx512-bf16", "avx512-fma", "avx2-fma", "mkl", "aten"}}[dtype]
    name = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16"}[dtype]
    T, B, I = 3, 5, 4
    S = {torch.float32: 45, torch.float64: 46, torch.bfloat16: 47}[dtype]  # a shape no other test runs
    inputs = [t.detach().requires_grad_() for t in make_sequence_inputs(T, B, I, S, dtype=dtype)]
    before = routes_chosen()

    def train():
        output, h_n, c_n = lltm_core.lltm_sequence(*inputs, backend="cpu")
        (output.sum() + h_n.sum() + c_n.sum()).backward()

    train()
    new = {k: v for k, v in routes_chosen().items() if k not in before}
    recurrent = {r["key"]: r["chosen"] for r in records()
                 if r["key"] in new and r["kind"] == "recurrent" and r["dtype"] == name}
    # Forward's h W_h^T (N 3S, K S) and backward's d_gates W_h (N S, K 3S).
    assert sorted((r["n"], r["k"]) for r in records() if r["key"] in recurrent) == [(S, 3 * S), (3 * S, S)], new
    assert set(recurrent.values()) <= offered, new
    train()
    assert routes_chosen() == {**before, **new}  # cached: nothing measured again
    chosen = [record for record in records() if record["key"] in recurrent]
    assert len(chosen) == 2, chosen
    for record in chosen:
        assert record["kind"] == "recurrent" and record["dtype"] == name and record["threads"] >= 1, record
        if torch.backends.mkl.is_available():  # more than one route: each timed, the fastest kept (by the margin)
            times = record["measured_us"]
            assert record["source"] == "measured" and set(times) <= offered and len(times) >= 2, record
            assert all(us > 0 for us in times.values()) and record["chosen"] == recurrent_route_by_rule(times), record
    own = [route for route, runs in (("amx-bf16", dtype == torch.bfloat16 and amx_bf16_kernel()),
                                     ("avx512-bf16", dtype == torch.bfloat16 and avx512_bf16_kernel()),
                                     ("avx512-fma", dtype != torch.float64 and avx512_fma_kernel()),
                                     ("avx2-fma", dtype != torch.float64 and avx2_fma_kernel())) if runs]
    for route in own:  # lltm-cpu's own kernels are among those timed
        assert all(route in record["measured_us"] for record in chosen), (route, chosen)
    # The GEMMs over all steps: in float32, lltm-cpu's kernel timed against MKL, and a small GEMM
    # on more than one thread against both on one thread; the fastest kept.
    all_steps = [record for record in records() if record["key"] in new and record["kind"] == "all steps"]
    if dtype == torch.float32 and avx2_fma_kernel():
        assert len(all_steps) >= 4 and all(record["dtype"] == "float32" for record in all_steps), new
        for record in all_steps:
            times = record["measured_us"]
            if torch.backends.mkl.is_available():
                m, n, k = record["size_class"]  # the candidates follow the class, not the shape timed
                assert record["m"] <= m and record["n"] <= n and record["k"] <= k, record
                small = record["threads"] > 1 and m * n * k <= 1 << 24
                own = ["avx512-fma", "avx2-fma"] if avx512_fma_kernel() else ["avx2-fma"]
                offered = {*own, "mkl"} | ({f"{r} 1 thread" for r in [*own, "mkl"]} if small else set())
                assert set(times) == offered and record["chosen"] == min(times, key=times.get), record
    else:
        assert not all_steps, new


def size_class(size: int) -> int:
    """csrc/cpu/blas.cpp's size_class: the smallest of 1, 2, 3, 4, 6, 8, 12, ... that holds ``size``."""
    power = 1
    while True:
        if size <= power:
            return power
        if power >= 2 and size <= power // 2 * 3:
            return power // 2 * 3
        power *= 2


def test_a_new_sequence_length_reuses_its_size_class():
    """The GEMMs over all steps are timed once per size class of their sizes, not once per shape: a
    training loop over 15 sequence lengths times the input projection (M = T*B) once per class of
    T*B, at the first length of each, and every length still matches the reference."""
    if os.environ.get("LLTM_CPU_GEMM"):
        pytest.skip(f"LLTM_CPU_GEMM={os.environ['LLTM_CPU_GEMM']} chose the route")
    if not avx2_fma_kernel():
        pytest.skip("no float32 kernel of lltm-cpu's own here: the GEMMs over all steps are not timed")
    B, I, S = 16, 5, 39
    lengths = range(10, 25)  # T*B from 160 to 384: the classes 192, 256 and 384
    before = {record["key"] for record in records()}
    for T in lengths:
        inputs = [t.detach().requires_grad_() for t in make_sequence_inputs(T, B, I, S)]
        got = lltm_core.lltm_sequence(*inputs, backend="cpu")
        want = reference_sequence(*[t.detach().double() for t in inputs])
        for a, b in zip(got, want):
            assert max_rel_error(a, b) <= tolerance(torch.float32), T
    # The input projection: x (T*B, I) times W_x^T, one record per class of T*B.  Another test may
    # have measured a class already, with sizes of the same classes; a class this test measured was
    # timed at its first length.
    projection = [r for r in records() if r["kind"] == "all steps" and not r["a_transposed"] and r["b_transposed"]
                  and r["size_class"][1:] == [size_class(3 * S), size_class(I)]
                  and r["threads"] == torch.get_num_threads()]
    classes = sorted({size_class(T * B) for T in lengths})
    assert classes == [192, 256, 384]
    assert sorted(r["size_class"][0] for r in projection if r["size_class"][0] in classes) == classes, projection
    for record in projection:
        if record["key"] not in before:
            first = min(T * B for T in lengths if size_class(T * B) == record["size_class"][0])
            assert record["m"] == first, record
    assert len([r for r in records() if r["key"] not in before and r["kind"] == "all steps"]) <= 4 * len(classes)


def call_at_once(call, count: int, timeout: float = 120) -> list:
    """``call()``'s results from ``count`` threads released together; fails if one raised or hung."""
    results, errors = [None] * count, []
    barrier = threading.Barrier(count)

    def run(index):
        try:
            barrier.wait()
            results[index] = call()
        except Exception as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(thread.is_alive() for thread in threads), "a call hung"
    assert not errors, errors
    return results


def test_concurrent_first_calls():
    """Threads making the first call of one shape at once: no crash, one measurement, the same results."""
    T, B, I, S = 4, 9, 6, 61  # a shape no other test runs
    inputs = [t.detach() for t in make_sequence_inputs(T, B, I, S)]
    results = call_at_once(lambda: torch.ops.lltm_cpu.sequence_forward(*inputs, None, False, True), 4)
    # One forward recurrent GEMM shape, measured once (its N is 3S, or a block of columns' with LLTM_CPU_SPLIT).
    keys = [r["key"] for r in records() if r["kind"] == "recurrent" and r["k"] == S and r["b_transposed"]]
    assert len(keys) == 1, keys
    want = torch.ops.lltm_cpu.sequence_forward(*inputs, None, False, True)
    for got in results:
        for a, b in zip(got, want):
            assert torch.equal(a, b)


_THREADS_PROBE = """
import torch, lltm_core
from lltm_core.testing import make_sequence_inputs
lltm_core.get_backend("cpu")
before = torch.get_num_threads()
torch.ops.lltm_cpu.sequence_forward(*make_sequence_inputs(3, 8, 4, 40), None, False)  # measures its GEMMs' routes
# The cell's GEMMs, which may keep to the calling thread, then a parallel region on torch's threads.
lltm_core.lltm(*(torch.randn(*shape) for shape in ((16, 32), (384, 160), (384,), (16, 128), (16, 128))),
               backend="cpu")
torch.ops.lltm_cpu.sequence_forward(*make_sequence_inputs(3, 8, 4, 40), None, False)
print(before, torch.get_num_threads())
"""


def test_first_call_keeps_torchs_threads_in_subprocess():
    """Measuring the GEMM routes, and running a GEMM on the calling thread alone, leave torch's
    thread count as it was, in a process that never called torch.set_num_threads (it once dropped
    to one thread for good)."""
    run = subprocess.run([sys.executable, "-c", _THREADS_PROBE], env={**os.environ, "OMP_NUM_THREADS": "2"},
                         capture_output=True, text=True, check=True)
    before, after = map(int, run.stdout.split())
    assert after == before, run.stdout


def run_this_file(env: dict, seed: int, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "--lltm-seed", str(seed),
               "-k", "not in_subprocess", *extra]
    return subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True)


# What LLTM_CPU_GEMM=<route> gives each dtype's recurrent GEMMs where torch
# has MKL: the route itself, or, for a dtype without it (float64 has no
# packed GEMM nor own kernel, only bfloat16 has amx-bf16 and avx512-bf16), an error naming the dtype.
FORCED = {
    "amx-bf16": {"float32": None, "float64": None, "bfloat16": "amx-bf16"},
    "avx512-bf16": {"float32": None, "float64": None, "bfloat16": "avx512-bf16"},
    "avx512-fma": {"float32": "avx512-fma", "float64": None, "bfloat16": "avx512-fma"},
    "avx2-fma": {"float32": "avx2-fma", "float64": None, "bfloat16": "avx2-fma"},
    "mkl-packed": {"float32": "mkl-packed", "float64": None, "bfloat16": None},
    "mkl": {"float32": "mkl", "float64": "mkl", "bfloat16": "mkl"},
    "aten": {"float32": "aten", "float64": "aten", "bfloat16": "aten"},
}
_ROUTE_PROBE = """
import json, torch, lltm_core, lltm_cpu
from lltm_core.testing import make_sequence_inputs
lltm_core.get_backend("cpu")
errors = {}
for dtype in (torch.float32, torch.float64, torch.bfloat16):
    try:
        torch.ops.lltm_cpu.sequence_forward(*make_sequence_inputs(2, 3, 4, 5, dtype=dtype), None, False)
    except RuntimeError as exc:
        errors[str(dtype).split(".")[1]] = str(exc)
print(json.dumps({"records": lltm_cpu.gemm_routes(), "errors": errors}))
"""


_RECURRENT_PROBE = """
import json, torch, lltm_core, lltm_cpu
from lltm_core.testing import make_sequence_inputs
inputs = [t.detach().requires_grad_() for t in make_sequence_inputs(3, 5, 4, 33)]
output, h_n, c_n = lltm_core.lltm_sequence(*inputs, backend="cpu")
(output.sum() + h_n.sum()).backward()
print(json.dumps([r for r in lltm_cpu.gemm_routes() if r["kind"] == "recurrent"]))
"""


@pytest.mark.parametrize("faster_by", [0.95, 0.85])
@pytest.mark.parametrize("laid_out", ["mkl-packed", "avx2-fma"])
def test_recurrent_route_that_lays_out_wins_by_a_margin_in_subprocess(laid_out, faster_by):
    """A recurrent route that lays out a copy of W_h each call (here mkl-packed or lltm-cpu's
    avx2-fma) is chosen over MKL's plain GEMM only where it measures faster by the margin
    (kLaidOutWithin): the times are set (LLTM_CPU_TEST_SLOW_ROUTES's "route=us"), the other routes
    far slower."""
    if not torch.backends.mkl.is_available():
        pytest.skip("this torch has no MKL: neither mkl nor mkl-packed is offered")
    if laid_out == "avx2-fma" and not avx2_fma_kernel():
        pytest.skip("no avx2-fma kernel on this CPU or in this build")
    others = ["amx-bf16", "avx512-bf16", "avx512-fma", "avx2-fma", "mkl-packed", "aten"]
    times = {**{route: 1000.0 for route in others}, laid_out: 100.0 * faster_by, "mkl": 100.0}
    env = {k: v for k, v in os.environ.items() if k not in ("LLTM_CPU_GEMM", "LLTM_CPU_SPLIT")}
    env["LLTM_CPU_TEST_SLOW_ROUTES"] = ",".join(f"{route}={us}" for route, us in times.items())
    run = subprocess.run([sys.executable, "-c", _RECURRENT_PROBE], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    recurrent = json.loads(run.stdout.splitlines()[-1])
    assert len(recurrent) >= 2, recurrent  # forward's and backward's
    want = laid_out if faster_by < LAID_OUT_WITHIN else "mkl"
    for record in recurrent:
        assert record["measured_us"][laid_out] == times[laid_out] and record["measured_us"]["mkl"] == 100.0, record
        assert record["chosen"] == want, record


@pytest.mark.parametrize("route", sorted(FORCED))
def test_forced_gemm_routes_in_subprocess(route, lltm_seed):
    """LLTM_CPU_GEMM=<route> is honoured (nothing measured), and the kit's sequence checks
    pass with the recurrent GEMMs on it."""
    if not torch.backends.mkl.is_available() and route != "aten":
        pytest.skip("this torch has no MKL: the forced routes fall back to aten")
    if route == "avx512-bf16" and not avx512_bf16_kernel():
        pytest.skip("this CPU has no AVX512_BF16 (or ATEN_CPU_CAPABILITY is below avx512, or the library was built "
                    f"without it: {lltm_cpu.kernels_left_out()}): lltm-cpu's bfloat16 kernel never runs here")
    if route == "amx-bf16" and not amx_bf16_kernel():
        pytest.skip("this CPU has no AMX-BF16 (or ATEN_CPU_CAPABILITY is below avx512, or the library was built "
                    f"without it: {lltm_cpu.kernels_left_out()}): lltm-cpu's AMX kernel never runs here")
    if route == "avx512-fma" and not avx512_fma_kernel():
        pytest.skip("this CPU has no AVX-512 (or ATEN_CPU_CAPABILITY is below avx512, or the library was built "
                    f"without it: {lltm_cpu.kernels_left_out()}): lltm-cpu's AVX-512 float32 kernel never runs here")
    if route == "avx2-fma" and not avx2_fma_kernel():
        pytest.skip("this CPU has no AVX2 and FMA (or ATEN_CPU_CAPABILITY=default, or the library was built without "
                    f"it: {lltm_cpu.kernels_left_out()}): lltm-cpu's float32 kernel never runs here")
    env = {**os.environ, "LLTM_CPU_GEMM": route}
    probe = subprocess.run([sys.executable, "-c", _ROUTE_PROBE], env=env, capture_output=True, text=True, check=True)
    result = json.loads(probe.stdout)
    recurrent = [r for r in result["records"] if r["kind"] == "recurrent"]
    assert recurrent and all(r["source"] == "LLTM_CPU_GEMM" and not r["measured_us"] for r in recurrent), result
    for dtype, expected in FORCED[route].items():
        chosen = {r["chosen"] for r in recurrent if r["dtype"] == dtype}
        if expected is None:  # no such route for the dtype: a clear error, not a quiet substitute
            assert not chosen, result
            assert f"LLTM_CPU_GEMM={route} has no route for {dtype} tensors" in result["errors"][dtype], result
        else:
            assert chosen == {expected} and dtype not in result["errors"], result
    # The conformance kit's sequence checks (reference, gradcheck, opcheck), on this route.
    kit = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "lltm_core.testing",
           "--lltm-backend", "cpu", "--lltm-seed", str(lltm_seed), "-rs",
           "-k", kit_selection(route),
           *(f"--lltm-dtype={dtype}" for dtype, expected in FORCED[route].items() if expected)]
    run = subprocess.run(kit, env=env, capture_output=True, text=True)
    assert run.returncode == 0, f"with LLTM_CPU_GEMM={route}:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"
    # Skipped only: the kit's checks of can_run / should_run, which lltm-cpu does not define.
    skips = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    assert " passed" in run.stdout and all("no can_run or should_run" in line for line in skips), run.stdout[-2000:]
    if route in ("amx-bf16", "avx512-bf16", "avx512-fma", "avx2-fma"):  # own kernels: this file's odd shapes too
        dtypes = "(bfloat16 or float32)" if route in ("avx512-fma", "avx2-fma") else "bfloat16"
        run = run_this_file({"LLTM_CPU_GEMM": route}, lltm_seed, "-k", f"matches and {dtypes} and not in_subprocess")
        assert run.returncode == 0, f"with LLTM_CPU_GEMM={route}:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"


# The kit's sequence checks under a forced route or split, less its torch.compile checks: those
# trace the operators' schemas and fake kernels, the same whichever route runs inside, and compile
# afresh (no cache) each time, the longest part of each run; the default run of the kit has them.
FORCED_KIT = "sequence and not compile_fullgraph"


def kit_selection(route: str) -> str:
    """FORCED_KIT on the dtypes `route` serves: its gradcheck is float64's, whatever --lltm-dtype says."""
    return FORCED_KIT + (" and not float64" if FORCED[route]["float64"] is None else "")


def avx2_fma_kernel() -> bool:
    """Whether lltm-cpu's own float32 kernel can run here: it is then a measured route."""
    return ({"avx2", "fma"} <= cpu_flags() and torch.backends.cpu.get_cpu_capability() != "DEFAULT"
            and "avx2-fma" not in lltm_cpu.kernels_left_out())


def avx512_fma_kernel() -> bool:
    """Whether lltm-cpu's AVX-512 float32 kernel can run here: it is then a measured route."""
    return ("avx512f" in cpu_flags() and torch.backends.cpu.get_cpu_capability() == "AVX512"
            and "avx512-fma" not in lltm_cpu.kernels_left_out())


def avx512_bf16_kernel() -> bool:
    """Whether lltm-cpu's own bfloat16 kernel can run here: it is then a measured route."""
    return ("avx512_bf16" in cpu_flags() and torch.backends.cpu.get_cpu_capability() == "AVX512"
            and "avx512-bf16" not in lltm_cpu.kernels_left_out())


def amx_bf16_kernel() -> bool:
    """Whether lltm-cpu's AMX kernel can run here (Linux lists the flags only where it hands out the
    tiles): it is then a measured route."""
    return ({"amx_bf16", "amx_tile"} <= cpu_flags() and avx512_bf16_kernel()
            and "amx-bf16" not in lltm_cpu.kernels_left_out())


_BAD_SETTING_PROBE = """
import json, torch, lltm_core
from lltm_core.testing import make_sequence_inputs
report = {r["name"]: r for r in lltm_core.backend_report()}["cpu"]
output = lltm_core.lltm_sequence(*make_sequence_inputs(2, 3, 4, 5))[0]
print(json.dumps({"available": report["status"] == "available", "reason": report["reason"],
                  "answered_by": lltm_core.get_backend(dtype=torch.float32).name}))
"""


@pytest.mark.parametrize("settings, message", [
    ({"LLTM_CPU_GEMM": "fast"}, "LLTM_CPU_GEMM must be amx-bf16, avx512-bf16, avx512-fma, avx2-fma, mkl-packed, mkl "
                                "or aten (or unset), got 'fast'"),
    ({"LLTM_CPU_SPLIT": "diagonal"}, "LLTM_CPU_SPLIT must be rows or columns (or unset), got 'diagonal'"),
    # A route this CPU lacks (faked by lowering the instruction sets lltm-cpu may use, as on a CPU
    # without AVX-512): said where `lltm info` shows the backend, not at every call.
    ({"LLTM_CPU_GEMM": "amx-bf16", "ATEN_CPU_CAPABILITY": "avx2"},
     "LLTM_CPU_GEMM=amx-bf16 cannot run in this process: lltm-cpu's AMX kernel needs a CPU with AMX-BF16"),
    ({"LLTM_CPU_GEMM": "avx512-fma", "ATEN_CPU_CAPABILITY": "avx2"},
     "LLTM_CPU_GEMM=avx512-fma cannot run in this process: lltm-cpu's AVX-512 float32 kernel needs a CPU with "
     "AVX-512"),
], ids=["unknown route", "unknown split", "amx-bf16 absent", "avx512-fma absent"])
def test_bad_setting_makes_the_backend_unavailable_in_subprocess(settings, message):
    """A value that names nothing, or a route this CPU lacks: lltm-cpu is unavailable with the reason,
    and calls go on elsewhere, rather than every call raising while cpu looks available."""
    run = subprocess.run([sys.executable, "-c", _BAD_SETTING_PROBE], env={**os.environ, **settings},
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert not result["available"] and message in result["reason"], result
    assert result["answered_by"] != "cpu", result


@pytest.mark.parametrize("threads", [1])
def test_thread_counts_in_subprocess(threads, lltm_seed):
    """One thread: no blocks of rows at all.  Three threads (more blocks than this machine may have
    cores) run this file's comparisons under each forced split (test_forced_split_in_subprocess)."""
    run = run_this_file({"OMP_NUM_THREADS": str(threads)}, lltm_seed, "-k", "matches and not in_subprocess")
    assert run.returncode == 0, f"with {threads} threads:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_same_results_for_any_thread_count(threads):
    """Each row's recurrence is the same whichever block it falls in: results agree to rounding.

    Each row here has 1.5M MACs of recurrent GEMMs, well past the 2^18 that
    earn a row a thread of its own, so `threads` blocks of rows run."""
    T, B, I, S = 8, 11, 6, 256
    inputs = [t.detach() for t in make_sequence_inputs(T, B, I, S)]
    lengths = random_lengths(T, B)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = torch.ops.lltm_cpu.sequence_forward(*inputs, lengths, True)
        torch.set_num_threads(threads)
        got = torch.ops.lltm_cpu.sequence_forward(*inputs, lengths, True)
    finally:
        torch.set_num_threads(previous)
    # MKL's GEMMs may round a block of rows differently from the whole batch.
    for a, b in zip(got, want):
        assert max_rel_error(a, b) <= tolerance(torch.float32)


# ---- The time loop's partition: blocks of batch rows or of state columns (csrc/cpu/partition.h).

SPLITS = ["rows", "columns"]
# The columns are chosen only where they measure this share of the rows' time or less (partition.h's
# kColumnsWithin).
COLUMNS_WITHIN = 0.90


def split_records(key_part: str = "") -> dict:
    """{key: record} of this process's time-loop choices so far."""
    return {r["key"]: r for r in records() if r["kind"] == "time loop" and key_part in r["key"]}


def train_once(inputs, lengths=None, reverse=False):
    inputs = [t.detach().requires_grad_() for t in inputs]
    outputs = lltm_core.lltm_sequence(*inputs, lengths=lengths, reverse=reverse, backend="cpu")
    grads = torch.autograd.grad([o.sum() for o in outputs], inputs)
    return [o.detach() for o in outputs] + list(grads)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_split_measured_once_and_cached(dtype):
    """With two threads, a problem big enough for both partitions: the first call of its (dtype, B, S,
    threads, direction) times rows against columns and keeps the rows unless the columns measure
    faster by a margin; later calls reuse it and give the same results, bit for bit."""
    if os.environ.get("LLTM_CPU_SPLIT"):
        pytest.skip(f"LLTM_CPU_SPLIT={os.environ['LLTM_CPU_SPLIT']} chose the split")
    if torch.get_num_threads() < 2:
        pytest.skip("one thread: the time loop is not split")
    # B8 S96 is past the work both splits need for a second block (2^18 multiply-adds per block);
    # S differs per dtype so that no other test has measured the key.
    T, B, I = 4, 8, 5
    S = {torch.float32: 96, torch.float64: 97, torch.bfloat16: 98}[dtype]
    name = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16"}[dtype]
    inputs = make_sequence_inputs(T, B, I, S, dtype=dtype)
    lengths = random_lengths(T, B)
    threads = torch.get_num_threads()
    first = train_once(inputs, lengths)
    chosen = split_records(f"time loop {name} B{B} S{S} ")
    assert sorted(chosen) == [f"time loop {name} B{B} S{S} threads {threads} {d}" for d in ("backward", "forward")], chosen
    for record in chosen.values():
        times = record["measured_us"]
        assert set(times) == set(SPLITS) and all(us > 0 for us in times.values()), record
        faster = "columns" if times["columns"] < COLUMNS_WITHIN * times["rows"] else "rows"
        assert record["chosen"] == faster and record["source"] == "measured", record
        assert (record["dtype"], record["batch"], record["state_size"]) == (name, B, S), record
    again = train_once(inputs, lengths)
    assert split_records(f"time loop {name} B{B} S{S} ") == chosen  # cached: nothing timed again
    for a, b in zip(first, again):
        assert torch.equal(a, b)


def test_concurrent_first_split_calls():
    """Threads making the first call of one partition key at once: no crash or hang, one measurement
    per direction, the same results as a later call.  Their parallel regions then run at once, more
    threads than cores, which the column split's barrier must survive."""
    if torch.get_num_threads() < 2:
        pytest.skip("one thread: the time loop is not split")
    T, B, I, S = 3, 10, 4, 94  # a key no other test runs
    inputs = make_sequence_inputs(T, B, I, S)
    results = call_at_once(lambda: train_once(inputs), 4)
    assert len(split_records(f" B{B} S{S} ")) == 2  # forward and backward, once each
    want = train_once(inputs)
    for got in results:
        for a, b in zip(got, want):
            assert torch.equal(a, b)


_SPLIT_PROBE = """
import json, torch, lltm_core, lltm_cpu
from lltm_core.testing import make_sequence_inputs
lltm_core.get_backend("cpu")
torch.set_num_threads(2)
for dtype in (torch.float32, torch.float64, torch.bfloat16):
    inputs = [t.detach().requires_grad_() for t in make_sequence_inputs(3, 2, 4, 33, dtype=dtype)]
    output, h_n, c_n = lltm_core.lltm_sequence(*inputs, backend="cpu")
    (output.sum() + h_n.sum()).backward()
print(json.dumps(lltm_cpu.gemm_routes()))
"""


@pytest.mark.parametrize("split", SPLITS)
def test_forced_split_in_subprocess(split, lltm_seed):
    """LLTM_CPU_SPLIT=<split> is honoured (nothing timed, even for a problem small enough to stay on
    one thread otherwise), and with it the kit's sequence checks (on 2 threads) and this file's
    comparisons with the looped cell (odd sizes, B=1, S=1, lengths, reverse, every dtype; on 3
    threads, more blocks than this machine may have cores) pass."""
    env = {"LLTM_CPU_SPLIT": split}
    probe = subprocess.run([sys.executable, "-c", _SPLIT_PROBE], env={**os.environ, **env}, capture_output=True,
                           text=True, check=True)
    loops = [r for r in json.loads(probe.stdout) if r["kind"] == "time loop"]
    assert len(loops) == 6, probe.stdout  # 3 dtypes, forward and backward
    assert all(r["chosen"] == split and r["source"] == "LLTM_CPU_SPLIT" for r in loops), loops
    kit = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "lltm_core.testing",
           "--lltm-backend", "cpu", "--lltm-seed", str(lltm_seed), "-k", FORCED_KIT, "-rs"]
    run = subprocess.run(kit, env={**os.environ, **env, "OMP_NUM_THREADS": "2"}, capture_output=True, text=True)
    assert run.returncode == 0, f"with LLTM_CPU_SPLIT={split}:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"
    assert " passed" in run.stdout, run.stdout[-2000:]
    run = run_this_file({**env, "OMP_NUM_THREADS": "3"}, lltm_seed, "-k",
                        "(matches or inference_forward or any_thread_count) and not in_subprocess")
    assert run.returncode == 0, f"with LLTM_CPU_SPLIT={split}, 3 threads:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_splits_agree_in_subprocess(dtype, reverse):
    """Rows and columns forced in two processes compute the same sequence, gradients included, to
    rounding (the bias gradient sums in another order; nothing else should differ)."""
    code = """
import sys, torch, lltm_core
from lltm_core.testing import make_sequence_inputs
lltm_core.get_backend("cpu")
torch.manual_seed(0)
dtype, reverse = getattr(torch, sys.argv[1]), sys.argv[2] == "1"
inputs = [t.detach().requires_grad_() for t in make_sequence_inputs(5, 9, 6, 77, dtype=dtype)]
lengths = torch.tensor([5, 1, 3, 5, 2, 4, 5, 1, 2])
outputs = lltm_core.lltm_sequence(*inputs, lengths=lengths, reverse=reverse, backend="cpu")
grads = torch.autograd.grad([o.float().pow(2).sum() for o in outputs], inputs)
torch.save([o.detach() for o in outputs] + list(grads), sys.argv[3])
"""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        got = {}
        for split in SPLITS:
            path = os.path.join(tmp, f"{split}.pt")
            subprocess.run([sys.executable, "-c", code, str(dtype).split(".")[1], str(int(reverse)), path],
                           env={**os.environ, "LLTM_CPU_SPLIT": split, "OMP_NUM_THREADS": "2"}, check=True)
            got[split] = torch.load(path)
    for name, a, b in zip(NAMES, got["rows"], got["columns"]):
        assert max_rel_error(a, b) <= tolerance(dtype), name
        if dtype != torch.bfloat16 and name != "grad_bias":  # bfloat16 rounds each GEMM's sums differently
            assert max_rel_error(a, b) <= (1e-5 if dtype == torch.float32 else 1e-12), name


_REPRODUCIBLE_PROBE = """
import hashlib, json, sys, torch, lltm_core, lltm_cpu
from lltm_core.testing import make_sequence_inputs
torch.use_deterministic_algorithms(sys.argv[1] == "1")
torch.manual_seed(0)
inputs = [t.detach().requires_grad_() for t in make_sequence_inputs(12, 16, 32, 128)]
output, h_n, c_n = lltm_core.lltm_sequence(*inputs, backend="cpu")
(output.square().sum() + h_n.sum() + c_n.sum()).backward()
digest = hashlib.sha256()
for t in (output, h_n, c_n, *(i.grad for i in inputs)):
    digest.update(t.detach().contiguous().numpy().tobytes())
print(json.dumps({"digest": digest.hexdigest(),
                  "chosen": sorted((r["kind"], r["m"] if "m" in r else r["batch"], r["chosen"], r["source"])
                                   for r in lltm_cpu.gemm_routes() if r["dtype"] == "float32")}))
"""


_FLAG_PROBE = """
import json, warnings, torch, lltm_core, lltm_cpu
from lltm_core.testing import make_sequence_inputs
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    lltm_cpu.gemm_routes()  # loads the library
    lltm_cpu.gemm_routes()
    lltm_cpu.load_backend()
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
output, h_n, c_n = lltm_core.lltm_sequence(*make_sequence_inputs(12, 16, 32, 128), backend="cpu")
print(json.dumps({"warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
                  "finite": bool(output.isfinite().all()),
                  "sources": sorted({r["source"] for r in lltm_cpu.gemm_routes()})}))
"""


@pytest.mark.parametrize("hidden", ["", "_ZNK2at7Context23deterministicAlgorithmsEv", "_ZN2at13globalContextEv"])
def test_an_unreadable_deterministic_flag_warns_once(hidden):
    """lltm-cpu reads torch.use_deterministic_algorithms's flag through two symbols of libtorch_cpu
    (the stable ABI has no getter).  A torch without either (LLTM_CPU_TEST_MISSING_SYMBOLS hides it
    here) must not leave the flag silently ignored: one RuntimeWarning as the library loads, naming
    the symbol and the settings that fix the choice instead; the kernels still run.  With the
    symbols found, no warning, and the flag fixes the choice."""
    env = {k: v for k, v in os.environ.items() if k not in ("LLTM_CPU_GEMM", "LLTM_CPU_SPLIT")}
    run = subprocess.run([sys.executable, "-c", _FLAG_PROBE], env={**env, "LLTM_CPU_TEST_MISSING_SYMBOLS": hidden},
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["finite"]
    about_flag = [message for message in result["warnings"] if "use_deterministic_algorithms" in message]
    if not hidden:
        assert about_flag == [], result
        assert "deterministic" in result["sources"], result
        return
    assert len(about_flag) == 1, result
    assert hidden in about_flag[0] and "LLTM_CPU_GEMM=aten" in about_flag[0], about_flag
    assert "deterministic" not in result["sources"], result  # the flag is indeed unseen


def test_the_deterministic_flag_warning_names_the_callers_line(monkeypatch):
    """The warning above points at the line that loaded lltm-cpu (here load_backend(), as lltm-core
    calls it), not at a frame of lltm-cpu's own, however deep the library is loaded."""
    from lltm_cpu import _factory, _library

    def c_function(name, path=None):  # the library as loaded, but reporting the flag unreadable
        message = "the flag is unseen" if name == "lltm_cpu_deterministic_flag_error" else ""
        return lambda: message.encode()

    monkeypatch.delenv("LLTM_CPU_JIT", raising=False)
    monkeypatch.setattr(_library, "_load_built_library", lambda: None)  # loaded already
    monkeypatch.setattr(_library, "_c_function", c_function)
    monkeypatch.setattr(_factory, "_load_library", _library._load_library.__wrapped__)  # not the cached answer
    with pytest.warns(RuntimeWarning, match="lltm_cpu: the flag is unseen") as caught:
        lltm_cpu.load_backend()
    assert [w.filename for w in caught] == [__file__]


def test_deterministic_algorithms_fix_the_choice_across_processes():
    """Under torch.use_deterministic_algorithms(True) nothing is timed: two processes whose timings
    disagree (LLTM_CPU_TEST_SLOW_ROUTES slows different routes and splits in each) choose the same
    routes and give bitwise-equal float32 results.  Without it, the same two processes choose
    differently, which shows the timings were made to disagree."""
    env = {k: v for k, v in os.environ.items() if k not in ("LLTM_CPU_GEMM", "LLTM_CPU_SPLIT")}
    slowed = {"own kernels, rows": "avx512-fma,avx2-fma,amx-bf16,avx512-bf16,rows",
              "libraries, columns": "mkl-packed,mkl,aten,columns"}

    def probe(deterministic: bool) -> dict:
        results = {}
        for name, routes in slowed.items():
            run = subprocess.run([sys.executable, "-c", _REPRODUCIBLE_PROBE, "1" if deterministic else "0"],
                                 env={**env, "LLTM_CPU_TEST_SLOW_ROUTES": routes}, capture_output=True, text=True)
            assert run.returncode == 0, run.stderr[-3000:]
            results[name] = json.loads(run.stdout.splitlines()[-1])
        return results

    measured = probe(False)
    first, second = measured.values()
    if first["chosen"] == second["chosen"]:
        pytest.skip(f"only one route and split are offered here, so no timing can disagree: {first['chosen']}")
    fixed = probe(True)
    first, second = fixed.values()
    assert first["chosen"] == second["chosen"], fixed
    assert all(source in ("deterministic", "the only one") for *_, source in first["chosen"]), fixed
    assert first["digest"] == second["digest"], fixed
