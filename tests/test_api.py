"""The public interface: argument checks, the module, and that the kit catches wrong backends."""

from __future__ import annotations

import math

import pytest
import torch

import lltm_core
from lltm_core.testing import SeedLLTM, compare_with_reference, make_inputs, max_rel_error, reference_lltm, tolerance

B, I, S = 4, 3, 5


def _args(**replace):
    args = dict(zip(("input", "weights", "bias", "old_h", "old_cell"), make_inputs(B, I, S, requires_grad=False)))
    args.update(replace)
    return args


@pytest.mark.parametrize(
    "replace, error, pattern",
    [
        ({"input": [[1.0]]}, TypeError, r"input must be a torch.Tensor, got list"),
        ({"input": torch.randn(B, I, 1)}, ValueError, r"input must be 2-D \(batch, input_features\), got shape \(4, 3, 1\)"),
        ({"old_h": torch.randn(S)}, ValueError, r"old_h must be 2-D \(batch, state_size\), got shape \(5,\)"),
        ({"weights": torch.randn(3 * S, S + I + 1)}, ValueError, r"weights has shape \(15, 9\), expected \(15, 8\)"),
        ({"bias": torch.randn(3 * S + 1)}, ValueError, r"bias has shape \(16,\), expected \(15,\)"),
        ({"old_h": torch.randn(B + 1, S)}, ValueError, r"old_h has shape \(5, 5\), expected \(4, 5\)"),
        ({"old_cell": torch.randn(B, S + 1)}, ValueError, r"old_cell has shape \(4, 6\), expected \(4, 5\)"),
        ({"old_cell": torch.randn(B, S, dtype=torch.float64)}, TypeError, r"old_cell has dtype torch.float64, expected torch.float32"),
        ({"input": torch.ones(B, I, dtype=torch.int64)}, TypeError, r"input must be a floating-point tensor, got dtype torch.int64"),
        ({"bias": torch.randn(3 * S, device="meta")}, ValueError, r"bias is on meta, expected cpu"),
    ],
    ids=["not-tensor", "input-rank", "h-rank", "weights", "bias", "h-batch", "cell-state", "dtype-mix", "int", "device-mix"],
)
def test_bad_arguments_are_named(replace, error, pattern):
    with pytest.raises(error, match=pattern):
        lltm_core.lltm(**_args(**replace))


def test_module_state_dict_round_trips_with_the_seed_module():
    seed = SeedLLTM(I, S)
    ours = lltm_core.LLTM(I, S)
    assert ours.state_dict().keys() == seed.state_dict().keys()
    ours.load_state_dict(seed.state_dict())
    x, h, c = torch.randn(B, I), torch.randn(B, S), torch.randn(B, S)
    for got, want in zip(ours(x, (h, c)), seed(x, (h, c))):
        torch.testing.assert_close(got, want)
    back = SeedLLTM(I, S)
    back.load_state_dict(ours.state_dict())
    torch.testing.assert_close(back.weights, seed.weights)


def test_module_initialisation_matches_the_seed():
    m = lltm_core.LLTM(32, 128, dtype=torch.float64)
    assert m.weights.shape == (384, 160) and m.bias.shape == (384,)
    bound = 1 / math.sqrt(128)
    for p in (m.weights, m.bias):
        assert p.dtype == torch.float64
        assert p.abs().max() <= bound
        assert p.abs().max() > 0.9 * bound  # really uniform over the range, not tiny
        assert p.std() > 0.5 * bound


def test_module_rejects_empty_sizes():
    with pytest.raises(ValueError, match=r"input_features \(input_size\) must be an integer >= 1, got 0"):
        lltm_core.LLTM(0, 5)


def test_module_trains():
    m = lltm_core.LLTM(I, S)
    x, h, c = torch.randn(B, I), torch.randn(B, S), torch.randn(B, S)
    new_h, new_cell = m(x, (h, c))
    (new_h.sum() + new_cell.sum()).backward()
    assert m.weights.grad is not None and m.weights.grad.abs().sum() > 0
    assert m.bias.grad is not None and m.bias.grad.abs().sum() > 0


def test_no_grad_calls_skip_autograd():
    with torch.no_grad():
        new_h, _ = lltm_core.lltm(*make_inputs(B, I, S))
    assert new_h.grad_fn is None and not new_h.requires_grad


@pytest.fixture
def wrong_backend():
    import dataclasses

    import lltm_ref

    def backward(grad_h, grad_cell, weights, *saved):
        grad_X, grad_weights, grad_bias, grad_old_cell = lltm_ref.backward(grad_h, grad_cell, weights, *saved)
        return grad_X, grad_weights, grad_bias * 1.01, grad_old_cell

    return dataclasses.replace(lltm_ref.load_backend(), name="wrong_bias", backward=backward)


def test_a_nan_is_an_infinite_error():
    """A NaN must fail `error > tol` checks and win max(): it compares false both ways."""
    want = torch.randn(4, 5, dtype=torch.float64)
    got = want.clone()
    got[2, 3] = float("nan")
    assert max_rel_error(got, want) == float("inf")
    assert max_rel_error(want, got) == float("inf")
    assert max_rel_error(want.clone(), want) == 0.0


def test_the_kit_catches_a_wrong_gradient(wrong_backend):
    """The oracle comparison must fail for a backend that is off by 1% in one gradient."""
    errors = compare_with_reference(wrong_backend, make_inputs(7, 5, 9, dtype=torch.float64))
    assert errors["grad_bias"] > 100 * tolerance(torch.float64)
    assert all(v <= tolerance(torch.float64) for k, v in errors.items() if k != "grad_bias")


def test_gradcheck_catches_a_wrong_gradient(wrong_backend):
    inputs = make_inputs(3, 4, 5, dtype=torch.float64)
    assert not torch.autograd.gradcheck(
        lambda *a: lltm_core.lltm(*a, backend=wrong_backend), inputs, raise_exception=False
    )


def test_opcheck_catches_an_aliasing_backend():
    import dataclasses

    import lltm_ref

    def forward(*args):
        new_h, new_cell, *saved = lltm_ref.forward(*args)
        return new_h, new_cell, *saved[:-1], new_cell  # saves an output twice: aliasing
    aliasing = dataclasses.replace(lltm_ref.load_backend(), name="aliasing", forward=forward)
    from lltm_core._ops import CELL, register

    forward_op, _ = register(CELL, aliasing)
    with pytest.raises(Exception, match="(?i)alias"):
        torch.library.opcheck(forward_op, (*make_inputs(2, 3, 4), "aliasing"))


@pytest.mark.parametrize("backend", ["ref", *(["cpu"] if "cpu" in lltm_core.available_backends() else [])])
def test_double_backward_is_refused_with_a_reason(backend):
    """create_graph=True gives the right gradients; differentiating them again raises, naming lltm."""
    inputs = make_inputs(2, 3, 4, dtype=torch.float64)
    new_h, new_cell = lltm_core.lltm(*inputs, backend=backend)
    grads = torch.autograd.grad(new_h.sum() + new_cell.sum(), inputs, create_graph=True)
    want = torch.autograd.grad(sum(t.sum() for t in reference_lltm(*inputs)), inputs)
    for got, expected in zip(grads, want):
        torch.testing.assert_close(got, expected)
    with pytest.raises(RuntimeError, match="lltm: double backward .* is not supported"):
        sum(g.sum() for g in grads).backward()
    # A gradient penalty asks for the inputs by name: not "unused", and never None with allow_unused
    for index in range(len(inputs)):
        with pytest.raises(RuntimeError, match="lltm: double backward .* is not supported"):
            torch.autograd.grad(grads[0].pow(2).sum(), inputs[index], allow_unused=True)


@pytest.mark.parametrize("backend", ["ref", *(["cpu"] if "cpu" in lltm_core.available_backends() else [])])
@pytest.mark.parametrize("requires_grad", [False, True], ids=["plain", "requires_grad"])
def test_forward_mode_ad_is_refused_with_a_reason(backend, requires_grad):
    import torch.autograd.forward_ad as fwAD

    inputs = make_inputs(2, 3, 4, requires_grad=requires_grad)
    with fwAD.dual_level(), pytest.raises(RuntimeError, match="lltm: forward-mode AD .* is not supported"):
        dual_input = fwAD.make_dual(inputs[0], torch.randn_like(inputs[0]))
        lltm_core.lltm(dual_input, *inputs[1:], backend=backend)


@pytest.mark.parametrize("transform", ["grad", "jvp", "vmap"])
def test_torch_func_transforms_that_differentiate_are_refused_with_a_reason(transform):
    input, weights, bias, old_h, old_cell = make_inputs(2, 3, 4, requires_grad=True)

    def new_h_sum(x):
        return lltm_core.lltm(x, weights, bias, old_h, old_cell)[0].sum()

    def one_row(x, h, c):  # under vmap: the weights require grad
        return lltm_core.lltm(x[None], weights, bias, h[None], c[None])[0]

    run = {
        "grad": lambda: torch.func.grad(new_h_sum)(input),
        "jvp": lambda: torch.func.jvp(new_h_sum, (input,), (torch.randn_like(input),)),
        "vmap": lambda: torch.func.vmap(one_row)(input, old_h, old_cell),
    }[transform]
    with pytest.raises(RuntimeError, match="lltm: torch.func transforms .* cannot differentiate lltm"):
        run()


def test_vmap_without_gradients_matches_a_loop():
    inputs = make_inputs(3, 4, 5)
    with torch.no_grad():
        got = torch.func.vmap(lambda x, h, c: lltm_core.lltm(x[None], inputs[1], inputs[2], h[None], c[None]))(
            inputs[0], inputs[3], inputs[4])
        want = [lltm_core.lltm(inputs[0][i:i + 1], inputs[1], inputs[2], inputs[3][i:i + 1], inputs[4][i:i + 1])
                for i in range(3)]
    for k in range(2):
        torch.testing.assert_close(got[k][:, 0], torch.cat([w[k] for w in want]))


def test_a_compiled_backends_stand_in_kernel_says_why_it_cannot_run():
    from lltm_core.extension import torch_mismatch, unavailable_kernel

    reason = torch_mismatch("0.0.1+cpu", "lltm-cpu")
    assert reason.startswith(f"built for torch 0.0.1+cpu, running {torch.__version__}: rebuild lltm-cpu")
    with pytest.raises(RuntimeError, match=r"'cpu' is unavailable: built for torch 0.0.1\+cpu"):
        unavailable_kernel("cpu", reason)(*make_inputs(2, 3, 4))
    assert torch_mismatch(torch.__version__, "lltm-cpu") is None


def test_operator_kernels_are_the_namespaces_operators_or_stand_ins_that_say_why():
    from lltm_core.extension import operator_kernels

    kernels = operator_kernels("lltm_absent", "absent", "its library is damaged: reinstall it")
    assert len(kernels) == 4
    for kernel in kernels:
        with pytest.raises(RuntimeError, match=r"'absent' is unavailable: its library is damaged: reinstall it"):
            kernel(*make_inputs(2, 3, 4))
    # A library that defines the contract's operators: lltm-cpu's, where it is installed.
    if "cpu" not in lltm_core.available_backends():
        pytest.skip("lltm-cpu is not installed and available here")
    ops = torch.ops.lltm_cpu
    assert operator_kernels("lltm_cpu", "cpu", None) == (
        ops.forward.default, ops.backward.default, ops.sequence_forward.default, ops.sequence_backward.default)


def test_the_module_names_the_callers_mistake():
    cell = lltm_core.LLTM(6, 5)
    h, c = torch.randn(3, 5), torch.randn(3, 5)
    with pytest.raises(ValueError, match=r"LLTM\(input_features=6, state_size=5\) takes input of shape \(batch, 6\) or \(6,\) unbatched, got \(3, 7\)"):
        cell(torch.randn(3, 7), (h, c))
    with pytest.raises(TypeError, match=r"hx must be a pair \(h, c\), got Tensor"):
        cell(torch.randn(3, 6), h)
    with pytest.raises(ValueError, match=r"hx's h has shape \(3, 4\), expected \(3, 5\)"):  # the state, not the weights
        cell(torch.randn(3, 6), (torch.randn(3, 4), c))
    new_h, new_cell = cell(torch.randn(3, 6), [h, c])  # a list is a pair too
    assert new_h.shape == new_cell.shape == (3, 5)
