"""What Triton's interpreter cannot check, kept for a GPU (benchmarks/gpu_check.sh runs it on the H200).

The interpreter's gaps, each with the test here that covers it:

* it runs the programs of a grid one after another, so a race between programs, or between the
  threads of one program (the streaming kernels' barriers), cannot show:
  test_streaming_matches_resident, test_many_programs_at_once;
* its tl.dot on bfloat16 multiplies widened float32 copies (_config.dot_dtype), where a GPU uses
  its bfloat16 MMA, and it truncates float32 -> bfloat16 (pointwise.to_storage rounds first):
  test_bfloat16_on_the_mma;
* it has no TF32: test_tf32_follows_torch;
* it compiles nothing.  test_compiled.py compiles every variant for sm_90 without a GPU (shared
  memory, registers, spills); whether a GPU loads and runs the largest W_h kept on chip:
  test_resident_kernels_compile_at_the_limit; nor does Triton's OutOfResources come under the
  interpreter, which _fit.py falls back from: test_too_large_falls_back.

Needs a CUDA GPU; elsewhere every test skips with the reason.  With LLTM_REQUIRE_GPU=1
(gpu_check.sh on the GPU machine) that reason is an error instead: there a skip would read as a pass.
"""

from __future__ import annotations

import os

import pytest
import torch

import lltm_ref
from _helpers import TOLERANCE, rel_error
from lltm_core.testing import make_sequence_inputs

_REQUIRED = os.environ.get("LLTM_REQUIRE_GPU") == "1"
if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    _REASON = None
else:
    _REASON = "needs a CUDA GPU with Triton compiling for it (no GPU here, or TRITON_INTERPRET=1)"
if _REQUIRED and _REASON is not None:
    raise RuntimeError(f"LLTM_REQUIRE_GPU=1, but: {_REASON}")
# pytest refuses a boolean condition without a reason string, even a False one (on a GPU _REASON is None).
pytestmark = [pytest.mark.skipif(_REASON is not None, reason=_REASON or "a GPU is here"),
              pytest.mark.usefixtures("lltm_seed")]


def _run(T, B, I, S, dtype, lengths=None, reverse=False):
    from lltm_triton import _sequence

    inputs = [t.detach() for t in make_sequence_inputs(T, B, I, S, dtype=dtype, device="cuda")]
    got = _sequence.sequence_forward(*inputs, lengths, reverse, True)
    grads = [torch.randn_like(t) for t in got[:3]]
    x, weights, _, h0, _ = inputs
    got_b = _sequence.sequence_backward(*grads, weights, x, h0, got[0], lengths, *got[3:], reverse, True)
    want = lltm_ref.sequence_forward(*[t.double() for t in inputs], lengths, reverse)
    want_b = lltm_ref.sequence_backward(*[g.double() for g in grads], weights.double(), x.double(), h0.double(),
                                        want[0], lengths, *want[3:], reverse, True)
    return (*got[:3], *got_b), (*want[:3], *want_b)


def _errors(got, want):
    names = ("output", "h_n", "c_n", "grad_input", "grad_weights", "grad_bias", "grad_h0", "grad_c0")
    return {n: rel_error(g, w) for n, g, w in zip(names, got, want)}


@pytest.fixture
def ieee():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("S", [37, 64, 200])  # resident up to 64 in float32; 200 streams both times
def test_streaming_matches_resident(monkeypatch, ieee, S):
    """Many steps, several programs, tiles of the GPU's size: the barriers between steps hold."""
    from lltm_triton import _sequence

    lengths = torch.randint(1, 49, (40,), device="cuda")
    torch.manual_seed(0)
    resident = _run(48, 40, 24, S, torch.float32, lengths, True)
    monkeypatch.setattr(_sequence, "resident", lambda S, dtype: False)
    torch.manual_seed(0)
    streaming = _run(48, 40, 24, S, torch.float32, lengths, True)
    # Each against the float64 oracle, not element by element against the other: their tl.dot tiles sum in
    # another order, which over 48 steps and 1920-row weight sums moved grad_weights by up to 1.9e-4 (H200).
    for variant, (got, want) in (("resident", resident), ("streaming", streaming)):
        for name, error in _errors(got, want).items():
            assert error <= TOLERANCE[torch.float32], (variant, name, error)


def test_many_programs_at_once(ieee):
    """B=16·300 rows: 300 programs in flight together, none touching another's rows."""
    got, want = _run(8, 16 * 300, 16, 64, torch.float32)
    errors = _errors(got, want)
    assert max(errors.values()) <= TOLERANCE[torch.float32], errors


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_bfloat16_on_the_mma(dtype):
    """The tutorial's B16 I32 S128 in 16-bit on the GPU's MMA, against lltm-ref in float64, for 8 steps.

    Over the tutorial's 64 steps h, rounded to 16 bits each step, drifts past the kit's tolerance
    whatever the kernel (bfloat16: 0.045 on an H200; forward alone under the interpreter 0.049 and
    0.086 for 2 seeds, lltm-ref's own bfloat16 on the CPU 0.1 to 0.56 for 4).  At 8 steps the
    interpreter's worst of 6 seeds, backward included, was 0.0076 (float16 0.0009).
    """
    got, want = _run(8, 16, 32, 128, dtype)
    errors = _errors(got, want)
    assert max(errors.values()) <= TOLERANCE[dtype], errors


def test_tf32_follows_torch():
    """TF32 allowed: results move by TF32's rounding (so tl.dot used it) and stay within TF32's error."""
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        results = {}
        for allowed in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = allowed
            torch.manual_seed(0)
            results[allowed] = _run(16, 16, 32, 128, torch.float32)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    assert max(_errors(*results[False]).values()) <= TOLERANCE[torch.float32]
    tf32_errors = _errors(*results[True])
    assert max(tf32_errors.values()) <= 1e-2, tf32_errors
    assert max(tf32_errors.values()) > 1e-5, f"TF32 allowed, yet IEEE-accurate: tl.dot ignored it ({tf32_errors})"


@pytest.fixture
def fit_memory(monkeypatch):
    """_fit's memory of what did not fit this GPU, empty for the test."""
    from lltm_triton import _fit

    memory = {}
    monkeypatch.setattr(_fit, "too_large", memory)
    return memory


@pytest.mark.parametrize("S, dtype", [(128, torch.bfloat16), (64, torch.float32), (64, torch.float64)], ids=str)
def test_resident_kernels_compile_at_the_limit(S, dtype, capsys, ieee, fit_memory):
    """The largest W_h kept on chip compiles and runs, resident (no fallback to streaming: else
    _policy.RESIDENT_BYTES is too large for this GPU); registers and spills are printed for _policy.py."""
    from lltm_triton import _policy, _sequence

    assert _policy.resident(S, dtype) and not _policy.resident(S * 2, dtype)
    compiled = []
    for kernel in (_sequence._forward_resident, _sequence._backward_resident):
        run = kernel.run
        kernel.run = lambda *a, _run=run, **kw: compiled.append(_run(*a, **kw)) or compiled[-1]
    try:
        got, want = _run(4, 16, 8, S, dtype)
    finally:
        del _sequence._forward_resident.run, _sequence._backward_resident.run
    errors = _errors(got, want)
    assert max(errors.values()) <= TOLERANCE[dtype], errors
    assert not fit_memory and len(compiled) == 2, f"did not fit {torch.cuda.get_device_name()}: {fit_memory}"
    with capsys.disabled():  # what Triton's CompiledKernel reports (attributes vary between versions)
        for k in compiled:
            meta = getattr(k, "metadata", None)
            print(f"\n  {getattr(k, 'name', '?')} S={S} {dtype}: {getattr(k, 'n_regs', '?')} registers, "
                  f"{getattr(k, 'n_spills', '?')} spilled, {getattr(meta, 'shared', '?')} bytes shared memory, "
                  f"{getattr(meta, 'num_warps', '?')} warps")


def test_too_large_falls_back(monkeypatch, ieee, fit_memory):
    """W_h of float32 S128 (192 KB) forced resident: its backward needed 311296 bytes of shared memory on an
    H200 (232448 allowed), so Triton refuses it as it loads and the streaming kernel computes the call."""
    from triton.runtime.driver import driver

    from lltm_triton import _sequence

    limit = driver.active.utils.get_device_properties(torch.cuda.current_device())["max_shared_mem"]  # Triton's
    if limit >= 311296:
        pytest.skip(f"{torch.cuda.get_device_name()} allows {limit} bytes a block: the resident backward fits")
    monkeypatch.setattr(_sequence, "resident", lambda S, dtype: True)
    with pytest.warns(UserWarning, match="_backward_resident .* does not fit this GPU"):
        got, want = _run(8, 40, 16, 128, torch.float32, torch.randint(1, 9, (40,), device="cuda"))
    errors = _errors(got, want)
    assert max(errors.values()) <= TOLERANCE[torch.float32], errors
    assert "_backward_resident" in {key[0] for key in fit_memory}, list(fit_memory)
    assert all("shared memory" in message for message in fit_memory.values()), fit_memory
