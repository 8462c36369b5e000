"""Conformance tests every backend must pass; see ``lltm_core.testing`` for how to run them."""

from __future__ import annotations

import pytest
import torch

import lltm_core
from lltm_core.testing import GRAD_NAMES, compare_with_reference, make_inputs, max_rel_error
from lltm_core.testing._kit import backend  # noqa: F401  (a fixture)
from lltm_core.testing._kit import assert_close, check_returned, check_untouched, snapshot

# (batch, input_features, state_size): ones, odd and prime sizes, the seed's
# size, a state larger than a 1024-thread block, and a batch/state product
# that is not a multiple of any vector width.
SHAPES = [
    (1, 1, 1),
    (1, 3, 7),
    (33, 5, 129),
    (16, 32, 128),
    (2, 17, 1000),
    (3, 2, 1031),
]


def test_declares_the_dtypes_the_contract_requires(lltm_backend_name, lltm_device):
    backend = lltm_core.get_backend(lltm_backend_name, device=lltm_device)
    missing = {torch.float32, torch.float64} - backend.dtypes
    assert not missing, (
        f"{backend.name} declares dtypes {sorted(str(d)[6:] for d in backend.dtypes)}; the contract requires "
        f"float32 and float64 (this kit runs gradcheck in float64 and torch.compile in float32), "
        f"missing {sorted(str(d)[6:] for d in missing)}"
    )


def _names_and_shapes(backend, B, I, S):
    saved = dict(backend.saved_layout(B, I, S))
    forward = {"new_h": (B, S), "new_cell": (B, S), **{f"saved {k!r}": tuple(v) for k, v in saved.items()}}
    backward = {"grad_X": (B, S + I), "grad_weights": (3 * S, S + I), "grad_bias": (3 * S,), "grad_old_cell": (B, S)}
    return forward, backward


@pytest.mark.parametrize("needs_grad_X", [True, False], ids=["needs_grad_X", "parameters_only"])
def test_kernels_keep_the_contract(backend, lltm_device, lltm_dtype, needs_grad_X):
    """backend.forward and backend.backward called directly: what they return, and what they leave alone.

    The other tests see the kernels through autograd and torch.library, whose
    errors name outputs by position; this one names them as backend.py does.
    """
    B, I, S = 3, 4, 5
    x, weights, bias, h, c = (t.detach() for t in make_inputs(B, I, S, dtype=lltm_dtype, device=lltm_device))
    forward_shapes, backward_shapes = _names_and_shapes(backend, B, I, S)
    forward_args = {"input": x, "weights": weights, "bias": bias, "old_h": h, "old_cell": c}
    before = snapshot(forward_args)
    out = backend.forward(x, weights, bias, h, c)
    check_returned(f"{backend.name}.forward", out, forward_shapes, x, forward_args)
    check_untouched(f"{backend.name}.forward", forward_args, before)

    grads = {"grad_new_h": torch.randn_like(out[0]), "grad_new_cell": torch.randn_like(out[1])}
    saved = dict(zip(list(forward_shapes)[2:], out[2:]))
    backward_args = {**grads, "weights": weights, **saved}
    before = snapshot(backward_args)
    got = backend.backward(grads["grad_new_h"], grads["grad_new_cell"], weights, *out[2:], needs_grad_X)
    if not needs_grad_X:
        backward_shapes["grad_X"] = None  # any empty tensor: checked below
    check_returned(f"{backend.name}.backward (needs_grad_X={needs_grad_X})", got, backward_shapes, x, backward_args)
    if not needs_grad_X:
        assert got[0].numel() == 0, (
            f"{backend.name}.backward: with needs_grad_X=False, grad_X must be an empty tensor "
            f"(weights.new_empty(0)), got shape {tuple(got[0].shape)}")
    check_untouched(f"{backend.name}.backward", backward_args, before)


def test_gradients_of_a_sum(backend, lltm_device, lltm_dtype):
    """The tutorial's loss: backward gets expanded (stride-0) gradients, which a dense read gets wrong."""
    from lltm_core.testing import reference_lltm

    inputs = make_inputs(5, 4, 6, dtype=lltm_dtype, device=lltm_device)
    new_h, new_cell = lltm_core.lltm(*inputs, backend=backend.name)
    got = torch.autograd.grad(new_h.sum() + new_cell.sum(), inputs)
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    want = torch.autograd.grad(sum(t.sum() for t in reference_lltm(*ref_inputs)), ref_inputs)
    errors = {f"grad_{name}": max_rel_error(g, w) for name, g, w in zip(GRAD_NAMES, got, want)}
    assert_close(errors, lltm_dtype, "gradients of new_h.sum() + new_cell.sum()")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-I{}-S{}".format(*s))
def test_matches_reference(backend, lltm_device, lltm_dtype, shape):
    inputs = make_inputs(*shape, dtype=lltm_dtype, device=lltm_device)
    assert_close(compare_with_reference(backend.name, inputs), lltm_dtype, f"{backend.name} at B,I,S={shape}")


@pytest.mark.parametrize("route", ["lltm", "operator"])
@pytest.mark.parametrize("used", ["new_h", "new_cell"])
def test_one_output_used(backend, lltm_device, lltm_dtype, used, route):
    """Only one output is differentiated: autograd has no gradient for the other.

    Both routes to the kernels are checked: lltm()'s Function and the custom
    operator torch.compile uses (called directly here).
    """
    from lltm_core._ops import CELL, register
    from lltm_core.testing import reference_lltm

    index = ("new_h", "new_cell").index(used)
    inputs = make_inputs(4, 6, 9, dtype=lltm_dtype, device=lltm_device)
    if route == "lltm":
        outputs = lltm_core.lltm(*inputs, backend=backend.name)
    else:
        outputs = register(CELL, backend)[0](*inputs, backend.name)
    upstream = torch.randn(4, 9, dtype=torch.float64).to(inputs[0])
    got = torch.autograd.grad(outputs[index], inputs, upstream)
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    want = torch.autograd.grad(reference_lltm(*ref_inputs)[index], ref_inputs, upstream.double())
    errors = {f"grad_{name}": max_rel_error(g, w) for name, g, w in zip(GRAD_NAMES, got, want)}
    assert_close(errors, lltm_dtype, f"only {used} used, through {route}")


def test_only_parameters_need_gradients(backend, lltm_device, lltm_dtype):
    """The tutorial's setting: the backward skips grad_X, and weights/bias grads still match."""
    from lltm_core.testing import reference_lltm

    x, weights, bias, h, c = make_inputs(5, 4, 6, dtype=lltm_dtype, device=lltm_device)
    x, h, c = x.detach(), h.detach(), c.detach()
    new_h, new_cell = lltm_core.lltm(x, weights, bias, h, c, backend=backend.name)
    upstream = (torch.randn_like(new_h), torch.randn_like(new_cell))
    got = torch.autograd.grad((new_h, new_cell), (weights, bias), upstream)
    ref_params = [weights.detach().double().requires_grad_(), bias.detach().double().requires_grad_()]
    want = torch.autograd.grad(reference_lltm(x.double(), *ref_params, h.double(), c.double()), ref_params,
                               [u.double() for u in upstream])
    errors = {name: max_rel_error(g, w) for name, g, w in zip(("grad_weights", "grad_bias"), got, want)}
    assert_close(errors, lltm_dtype, "only the parameters need gradients")


def test_noncontiguous_inputs(backend, lltm_device, lltm_dtype):
    """Strided inputs through lltm() give the contiguous result, bit for bit.

    The contract has lltm-core hand kernels contiguous tensors, so this checks that promise end to
    end with this backend, not the kernels' own stride handling (they never see a stride).
    """
    B, I, S = 5, 7, 11
    contiguous = make_inputs(B, I, S, dtype=lltm_dtype, device=lltm_device, requires_grad=False)
    # Same values, other strides: transposed storage and every-other-column views.
    strided = (
        contiguous[0].t().contiguous().t(),
        contiguous[1].repeat_interleave(2, dim=1)[:, ::2],
        contiguous[2].repeat_interleave(2)[::2],
        contiguous[3].t().contiguous().t(),
        contiguous[4].repeat_interleave(3, dim=1)[:, ::3],
    )
    assert not any(t.is_contiguous() for t in strided)
    want = lltm_core.lltm(*contiguous, backend=backend.name)
    got = lltm_core.lltm(*strided, backend=backend.name)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert_close(compare_with_reference(backend.name, strided), lltm_dtype, "non-contiguous inputs")


def test_empty_batch(backend, lltm_device, lltm_dtype):
    inputs = make_inputs(0, 3, 5, dtype=lltm_dtype, device=lltm_device)
    new_h, new_cell = lltm_core.lltm(*inputs, backend=backend.name)
    assert new_h.shape == new_cell.shape == (0, 5)
    (new_h.sum() + new_cell.sum()).backward()
    for t in inputs:
        assert t.grad is not None and t.grad.shape == t.shape
        assert not t.grad.any()


def test_gradcheck_float64(lltm_backend_name, lltm_device):
    """Finite differences against the backend's own backward kernel, in float64."""
    backend = lltm_core.get_backend(lltm_backend_name, device=lltm_device, dtype=torch.float64)
    inputs = make_inputs(3, 4, 5, dtype=torch.float64, device=lltm_device)
    assert torch.autograd.gradcheck(lambda *a: lltm_core.lltm(*a, backend=backend.name), inputs)


def test_opcheck(backend, lltm_device, lltm_dtype):
    """The custom operators torch.compile sees: schema, fake kernels, autograd registration."""
    from lltm_core._ops import CELL, register

    forward_op, backward_op = register(CELL, backend)
    inputs = make_inputs(6, 5, 7, dtype=lltm_dtype, device=lltm_device)
    torch.library.opcheck(forward_op, (*inputs, backend.name))
    outputs = forward_op(*[t.detach() for t in inputs], backend.name)
    grads = [torch.randn_like(outputs[0]), torch.randn_like(outputs[1])]
    for needs_grad_X in (True, False):
        torch.library.opcheck(backward_op, (*grads, inputs[1].detach(), outputs[2:], needs_grad_X))


@pytest.mark.parametrize("how", ["backend=", "use_backend"])
def test_compile_fullgraph(lltm_backend_name, lltm_device, how):
    """torch.compile(fullgraph=True) traces lltm with no graph break and agrees with eager, forward and
    backward, whether the caller names the backend or lltm chooses it (the operator then gets no name)."""
    dtype = torch.float32
    backend = lltm_core.get_backend(lltm_backend_name, device=lltm_device, dtype=dtype)
    torch._dynamo.reset()

    named = backend.name if how == "backend=" else None

    def step(*args):
        return lltm_core.lltm(*args, backend=named)

    compiled = torch.compile(step, fullgraph=True)
    inputs = make_inputs(8, 5, 13, dtype=dtype, device=lltm_device)
    eager_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    # Compile for real: torch's on-disk caches key on the graph, not on the
    # custom operators' implementations, so a cached graph could test old code.
    with lltm_core.use_backend(backend.name), torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        got = compiled(*inputs)
        upstream = [torch.randn_like(got[0]), torch.randn_like(got[1])]
        got_grads = torch.autograd.grad(got, inputs, upstream)
        want = step(*eager_inputs)
        want_grads = torch.autograd.grad(want, eager_inputs, upstream)
    for g, w in zip((*got, *got_grads), (*want, *want_grads)):
        torch.testing.assert_close(g, w)
