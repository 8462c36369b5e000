"""What a traced graph holds for a backend (``lltm_core.backend``, "Traced graphs and deployment").

A backend whose kernels are ``torch.library`` operators: each passes
``opcheck`` (schema, its fake kernel, lltm's autograd on it), they run under
``FakeTensorMode``, and ``torch.export`` of a model records them, with
dynamic batch and time.  A backend of Python kernels: ``torch.export`` says
the model cannot leave Python, or, for ATen compositions (``composite``),
records ATen operators only.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import lltm_core
from lltm_core.testing import make_inputs, make_sequence_inputs, max_rel_error, tolerance
from lltm_core.testing._kit import backend  # noqa: F401  (a fixture)


def _operators(backend):
    kernels = [backend.forward, backend.backward]
    if backend.has_sequence_kernels:
        kernels += [backend.sequence_forward, backend.sequence_backward]
    return kernels if all(isinstance(k, torch._ops.OpOverload) for k in kernels) else None


def _requires_operators(backend):
    if _operators(backend) is None:
        pytest.skip(f"{backend.name}'s kernels are Python functions, not torch.library operators")


def test_operators_pass_opcheck(backend, lltm_device, lltm_dtype):
    """The backend's own operators: schema, fake kernels, and lltm's autograd registered on them."""
    _requires_operators(backend)
    from lltm_core._ops import register_operator_autograd

    register_operator_autograd(backend)
    inputs = make_inputs(6, 5, 7, dtype=lltm_dtype, device=lltm_device)
    torch.library.opcheck(backend.forward, inputs)
    outputs = backend.forward(*[t.detach() for t in inputs])
    grads = [torch.randn_like(outputs[0]), torch.randn_like(outputs[1])]
    for needs_grad_X in (True, False):
        torch.library.opcheck(backend.backward, (*grads, inputs[1].detach(), *outputs[2:], needs_grad_X))
    if not backend.has_sequence_kernels:
        return
    inputs = make_sequence_inputs(3, 4, 2, 5, dtype=lltm_dtype, device=lltm_device)
    flags = [(True,), (False,)] if backend.takes_needs_backward else [()]
    for lengths, reverse in ((None, False), (torch.tensor([3, 1, 2, 3], device=lltm_device), True)):
        torch.library.opcheck(backend.sequence_forward, (*inputs, lengths, reverse, *flags[0]))
        x, weights, bias, h0, c0 = (t.detach() for t in inputs)
        for flag in flags[1:]:  # inference: empty saved slots, in the fake kernel too
            torch.library.opcheck(backend.sequence_forward, (x, weights, bias, h0, c0, lengths, reverse, *flag))
        out = backend.sequence_forward(x, weights, bias, h0, c0, lengths, reverse, *flags[0])
        grads = [torch.randn_like(t) for t in out[:3]]
        for needs_grad_input in (True, False):
            torch.library.opcheck(backend.sequence_backward, (*grads, weights, x, h0, out[0], lengths, *out[3:],
                                                              reverse, needs_grad_input))


def test_layer_under_fake_tensor_mode(backend, lltm_device, lltm_dtype):
    """LLTMLayer's forward and backward on fake tensors: shapes only, no kernel runs."""
    _requires_operators(backend)
    with FakeTensorMode():
        layer = lltm_core.LLTMLayer(5, 7, 2, bidirectional=True, backend=backend.name, device=lltm_device,
                                    dtype=lltm_dtype)
        x = torch.randn(4, 3, 5, device=lltm_device, dtype=lltm_dtype, requires_grad=True)
        output, (h_n, c_n) = layer(x)
        output.sum().backward()
        assert output.shape == (4, 3, 14) and h_n.shape == c_n.shape == (4, 3, 7)
        assert x.grad.shape == x.shape


class _Classifier(torch.nn.Module):
    """The model the deploy path documents: LLTMLayer (2 layers, bidirectional, batch_first) and a Linear head."""

    def __init__(self, backend: str, device, dtype):
        super().__init__()
        self.lltm = lltm_core.LLTMLayer(5, 7, 2, batch_first=True, bidirectional=True, backend=backend,
                                        device=device, dtype=dtype)
        self.head = torch.nn.Linear(14, 3, device=device, dtype=dtype)

    def forward(self, x):
        return self.head(self.lltm(x)[0])


def _lltm_targets(program) -> set[str]:
    return {str(n.target) for n in program.graph.nodes if n.op == "call_function" and "lltm" in str(n.target)}


def test_export_records_the_backend_operators(backend, lltm_device, lltm_dtype):
    """torch.export with dynamic batch and time records the backend's own operators, and the exported
    program agrees with eager at other batch sizes and lengths."""
    _requires_operators(backend)
    model = _Classifier(backend.name, lltm_device, lltm_dtype).eval()
    batch, time = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("time", min=2, max=64)
    example = torch.randn(3, 4, 5, device=lltm_device, dtype=lltm_dtype)
    with torch.no_grad():
        program = torch.export.export(model, (example,), dynamic_shapes=({0: batch, 1: time},))
    namespace = backend.sequence_forward._schema.name.split("::")[0]
    assert _lltm_targets(program) == {f"{namespace}.sequence_forward.default"}, _lltm_targets(program)
    exported = program.module()
    for shape in ((2, 5), (7, 3)):
        x = torch.randn(*shape, 5, device=lltm_device, dtype=lltm_dtype)
        with torch.no_grad():
            got, want = exported(x), model(x)
        assert max_rel_error(got, want) <= tolerance(lltm_dtype), (shape, max_rel_error(got, want))


def test_export_of_python_kernels_says_where_it_runs(lltm_backend_name, lltm_device):
    """Python kernels: composite ones are traced through (ATen operators only, static shapes); others
    are recorded as lltm's Python operator, and torch.export warns that the model cannot leave Python."""
    backend = lltm_core.get_backend(lltm_backend_name, device=lltm_device, dtype=torch.float32)
    if _operators(backend) is not None:
        pytest.skip(f"{backend.name}'s kernels are torch.library operators: test_export_records_the_backend_operators")
    model = _Classifier(backend.name, lltm_device, torch.float32).eval()
    example = torch.randn(3, 4, 5, device=lltm_device)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = torch.export.export(model, (example,))
    said = [str(w.message) for w in caught if "not from C++" in str(w.message)]
    assert {w.filename for w in caught if "not from C++" in str(w.message)} <= {__file__}  # export's line
    if backend.composite:
        assert _lltm_targets(program) == set() and not said, (_lltm_targets(program), said)
    else:
        assert _lltm_targets(program) == {f"lltm.{backend.name}_sequence_forward.default"}, _lltm_targets(program)
        assert said, "torch.export of Python kernels must warn that the model cannot run from C++"
    with torch.no_grad():
        assert max_rel_error(program.module()(example), model(example)) <= tolerance(torch.float32)
