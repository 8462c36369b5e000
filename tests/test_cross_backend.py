"""Every installed backend against every other, and the choice each device/dtype gets.

Run in each nox session, so these see whichever backends that session installed
(the `cpu` session: ref and cpu).
"""

from __future__ import annotations

import itertools

import pytest
import torch

import lltm_core
from lltm_core.testing import make_inputs, max_rel_error, tolerance

CPU_BACKENDS = sorted(
    r["name"] for r in lltm_core.backend_report()
    if r["status"] == "available" and "cpu" in r["devices"] and {"float32", "float64"} <= set(r["dtypes"])
)
PAIRS = list(itertools.combinations(CPU_BACKENDS, 2))


def _run(name, inputs, upstream):
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    outputs = lltm_core.lltm(*inputs, backend=name)
    grads = torch.autograd.grad(outputs, inputs, upstream)
    return (*outputs, *grads)


@pytest.mark.skipif(not PAIRS, reason=f"only one CPU backend installed ({CPU_BACKENDS}); the cpu nox session has two")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("pair", PAIRS, ids="-vs-".join)
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 3, 33), (33, 17, 129)], ids=str)
def test_backends_agree(pair, dtype, shape):
    B, I, S = shape
    inputs = make_inputs(B, I, S, dtype=dtype)
    upstream = (torch.randn(B, S, dtype=dtype), torch.randn(B, S, dtype=dtype))
    first, second = (_run(name, inputs, upstream) for name in pair)
    names = ("new_h", "new_cell", "grad_input", "grad_weights", "grad_bias", "grad_old_h", "grad_old_cell")
    # Both are within tolerance of the float64 oracle, so within twice that of each other.
    errors = {n: max_rel_error(a, b.double()) for n, a, b in zip(names, first, second)}
    assert all(e <= 2 * tolerance(dtype) for e in errors.values()), errors


@pytest.mark.skipif("cpu" not in lltm_core.available_backends(), reason="lltm-cpu is not installed here")
def test_the_fused_cpu_backend_is_chosen_for_what_it_takes():
    assert lltm_core.get_backend(device="cpu", dtype=torch.float32).name == "cpu"
    assert lltm_core.get_backend(device="cpu", dtype=torch.float64).name == "cpu"
    # ...and the reference takes the rest: a fallback, because nothing was asked for explicitly.
    assert lltm_core.get_backend(device="cpu", dtype=torch.float16).name == "ref"
    from lltm_core.cli import info_data

    chosen = {(s["device"], s["dtype"]): s["backend"] for s in info_data()["selection"]}
    assert chosen[("cpu", "float32")] == chosen[("cpu", "float64")] == "cpu"
