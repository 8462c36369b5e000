"""Checks specific to lltm-cpu.  The shared conformance kit runs with
``pytest --pyargs lltm_core.testing --lltm-backend cpu``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import lltm_core
import lltm_cpu
from cpu_flags import cpu_flags
from lltm_core.testing import compare_with_reference, make_inputs, tolerance

# Fresh inputs each run, seeded from the kit's --lltm-seed, which a failure prints.
pytestmark = pytest.mark.usefixtures("lltm_seed")

DTYPES = [torch.float32, torch.float64, torch.bfloat16]
# Odd state sizes leave a partial vector at every ISA's width; B33 x S1000 is
# large enough for the pointwise passes to run on several threads.
SHAPES = [(B, 5, S) for B in (0, 1, 33) for S in (1, 7, 129, 1000)]


@pytest.fixture(autouse=True, scope="module")
def cpu_backend():
    """Loads the backend, and with it the torch.ops.lltm_cpu operators."""
    return lltm_core.get_backend("cpu")


@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_other_isa_builds(capability):
    """Runs the rest of this file on each other build of the pointwise passes.

    The build in use follows ATen's CPU capability, which ATEN_CPU_CAPABILITY
    can lower; this process already tests the CPU's best one.
    """
    # torch takes ATEN_CPU_CAPABILITY at its word (an AVX-512 CPU capability on an AVX2-only CPU runs
    # torch's own AVX-512 kernels, and dies of SIGILL): ask the CPU first.
    needs = {"default": set(), "avx2": {"avx2", "fma"}, "avx512": {"avx2", "fma", "avx512f", "avx512bw", "avx512vl",
                                                                    "avx512dq"}}[capability]
    flags = cpu_flags()
    if flags and not needs <= flags:
        pytest.skip(f"this CPU has no {' '.join(sorted(needs - flags))}: it cannot run {capability}")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    probe = [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"]
    chosen = subprocess.run(probe, env=env, capture_output=True, text=True, check=True).stdout.strip()
    if chosen != capability.upper():
        pytest.skip(f"this CPU cannot run {capability} (ATen chose {chosen})")
    if capability.upper() == torch.backends.cpu.get_cpu_capability():
        pytest.skip(f"{chosen} is what this process tests")
    rest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", "not other_isa"]
    run = subprocess.run(rest, env=env, capture_output=True, text=True)
    assert run.returncode == 0, f"with ATEN_CPU_CAPABILITY={capability}:\n{run.stdout[-4000:]}{run.stderr[-2000:]}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-I{}-S{}".format(*s))
def test_matches_reference(shape, dtype):
    errors = compare_with_reference("cpu", make_inputs(*shape, dtype=dtype))
    bad = {k: v for k, v in errors.items() if v > tolerance(dtype)}
    assert not bad, f"relative error above {tolerance(dtype)}: {bad}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_activations_within_two_ulp(dtype):
    """Each element of sigmoid, elu and tanh is right to ~1 ulp, tiny inputs included.

    Weights [0 | identity] make the gate pre-activations exactly the input, so
    the activations can be checked one by one against float64.
    """
    B, S = 16, 500
    values = torch.cat(
        [torch.linspace(-20, 20, B * S // 4), torch.linspace(-80, 80, B * S // 4),  # exp's reduction: n up to 115
         torch.logspace(-12, 1, B * S // 4), -torch.logspace(-12, 1, B * S // 4)]
    )
    pre = values.to(dtype).reshape(B, S)
    input = torch.cat([pre, pre, pre], dim=1)
    weights = torch.cat([torch.zeros(3 * S, S, dtype=dtype), torch.eye(3 * S, dtype=dtype)], dim=1)
    zeros = torch.zeros(B, S, dtype=dtype)
    _, new_cell, _, gates, tanh_cell = torch.ops.lltm_cpu.forward(
        input, weights, torch.zeros(3 * S, dtype=dtype), zeros, zeros
    )

    def ulps(got, want):
        spacing = want.abs() * torch.finfo(dtype).eps
        return ((got.double() - want) / spacing.clamp_min(torch.finfo(dtype).tiny)).abs().max().item()

    exact = pre.double()
    assert ulps(gates[:, :S], torch.sigmoid(exact)) <= 2
    assert ulps(gates[:, S : 2 * S], torch.sigmoid(exact)) <= 2
    assert ulps(gates[:, 2 * S :], F.elu(exact)) <= 2
    assert ulps(tanh_cell, torch.tanh(new_cell.double())) <= 2


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_activations_at_the_limits(dtype):
    """Infinities, NaN and values past exp's range give what torch's activations give.

    Zero weights make each pre-activation its bias entry, so infinities reach the activations
    (through [0 | identity] weights, inf * 0 would turn them into NaN first).
    """
    values = torch.tensor([float("inf"), -float("inf"), float("nan"), 100.0, -100.0, 88.8, -88.8, 104.5, -104.5,
                           0.0, 1e-30, -1e-30, 3.0, -3.0], dtype=dtype)
    S = values.numel()
    zeros = torch.zeros(2, S, dtype=dtype)
    _, new_cell, _, gates, tanh_cell = torch.ops.lltm_cpu.forward(
        torch.randn(2, 3, dtype=dtype), torch.zeros(3 * S, S + 3, dtype=dtype), values.repeat(3), zeros, zeros
    )
    expected = torch.stack([values] * 2)
    torch.testing.assert_close(gates[:, :S], torch.sigmoid(expected), equal_nan=True)
    torch.testing.assert_close(gates[:, S : 2 * S], torch.sigmoid(expected), equal_nan=True)
    torch.testing.assert_close(gates[:, 2 * S :], F.elu(expected), equal_nan=True)
    torch.testing.assert_close(tanh_cell, torch.tanh(new_cell), equal_nan=True)


@pytest.mark.parametrize("shape", [(1, 3, 1), (3, 5, 7), (0, 5, 7)], ids=str)
def test_gradcheck(shape):
    inputs = make_inputs(*shape, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda *a: lltm_core.lltm(*a, backend="cpu"), inputs)


@pytest.mark.parametrize("shape", [(33, 5, 129), (2, 3, 1000)], ids=str)
def test_gradcheck_fast_mode_large(shape):
    inputs = make_inputs(*shape, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda *a: lltm_core.lltm(*a, backend="cpu"), inputs, fast_mode=True)


def test_operator_takes_noncontiguous_inputs():
    """torch.ops.lltm_cpu.forward called directly, without lltm_core making inputs contiguous."""
    inputs = make_inputs(4, 3, 9, requires_grad=False)
    strided = [t.t().contiguous().t() if t.dim() == 2 else t.repeat_interleave(2)[::2] for t in inputs]
    assert not any(t.is_contiguous() for t in strided)
    for got, want in zip(torch.ops.lltm_cpu.forward(*strided), torch.ops.lltm_cpu.forward(*inputs)):
        assert torch.equal(got, want)


@pytest.mark.parametrize(
    "position, change, message",
    [
        (4, lambda t: t[:, :-1], "old_cell must have shape"),
        (2, lambda t: t[:-1], "bias must have shape"),
        (1, lambda t: t.double(), "weights has dtype float64, expected float32"),
    ],
    ids=["old_cell-shape", "bias-shape", "mixed-dtypes"],
)
def test_operator_names_the_bad_argument(position, change, message):
    args = list(make_inputs(2, 3, 4, requires_grad=False))
    args[position] = change(args[position])
    with pytest.raises(RuntimeError, match=message):
        torch.ops.lltm_cpu.forward(*args)


def test_operator_rejects_half():
    with pytest.raises(RuntimeError, match="takes float32, float64 or bfloat16 tensors, got input of dtype Half"):
        torch.ops.lltm_cpu.forward(*make_inputs(2, 3, 4, dtype=torch.half, requires_grad=False))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_chosen_by_default(dtype):
    backend = lltm_core.get_backend(dtype=dtype)
    assert (backend.name, backend.priority) == ("cpu", 100)


def test_older_torch_is_reported_not_loaded(monkeypatch):
    """A torch older than the stable ABI the library targets: the reason, before any loading."""
    from lltm_cpu import _build_info, _library

    monkeypatch.delenv("LLTM_CPU_JIT", raising=False)
    monkeypatch.setattr(_build_info, "TARGET_TORCH", (99, 0))
    reason = _library._load_library.__wrapped__()
    assert reason.startswith(f"lltm-cpu needs torch 99.0 or newer (its library is built on torch's stable ABI "
                             f"for torch >= 99.0), running {torch.__version__}: upgrade torch")
