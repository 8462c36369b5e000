"""Calls a new user tried that went wrong: bias=False modules built on the meta device, a program
exported under no_grad then run with grad on, vmap under no_grad, the contract's schemas
declared once (lltm_core/include/lltm_schema.h), and TorchScript."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

import lltm_core
from lltm_core.extension import SCHEMA_HEADER, contract_schemas, register_fake_kernels

ROOT = Path(__file__).resolve().parent.parent


def _backends():
    return [name for name in ("ref", "cpu") if name in lltm_core.available_backends()]


# --- bias=False on the meta device --------------------------------------------------------------


@pytest.mark.parametrize("make", [
    lambda **kw: lltm_core.LLTM(4, 5, bias=False, **kw),
    lambda **kw: lltm_core.LLTMLayer(4, 5, num_layers=2, bias=False, **kw),
], ids=["LLTM", "LLTMLayer"])
def test_bias_false_built_on_meta_computes_as_built_on_cpu(make):
    torch.manual_seed(0)
    built = make()
    # Garbage first in the allocator, so that storage from to_empty is not zero by luck.
    torch.full((4096,), -7e30).sum()
    meta = make(device="meta").to_empty(device="cpu")
    meta.load_state_dict(built.state_dict())
    x = torch.randn(3, 2, 4) if isinstance(built, lltm_core.LLTMLayer) else torch.randn(2, 4)
    torch.testing.assert_close(meta(x), built(x))
    assert all(b.eq(0).all() for _, b in meta.named_buffers())
    # reset_parameters (what FSDP calls after to_empty) keeps the zeros zero.
    meta.reset_parameters()
    assert all(b.eq(0).all() for _, b in meta.named_buffers())


# --- torch.export under no_grad, run with grad on -----------------------------------------------


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("reverse_layers", [False, True], ids=["forward", "bidirectional"])
def test_program_exported_under_no_grad_runs_with_grad_on(backend, reverse_layers):
    torch.manual_seed(1)
    model = lltm_core.LLTMLayer(3, 5, bidirectional=reverse_layers, backend=backend)
    x = torch.randn(4, 2, 3)
    with torch.no_grad():
        expected = model(x)
        program = torch.export.export(model, (x,))
    for grad_mode in (True, False):
        with torch.set_grad_enabled(grad_mode):
            got = program.module()(x)
        torch.testing.assert_close(got, expected)


# --- vmap under no_grad -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", _backends())
def test_vmap_under_no_grad_runs_the_layer_and_the_cell(backend):
    torch.manual_seed(2)
    layer = lltm_core.LLTMLayer(3, 5, backend=backend)
    cell = lltm_core.LLTM(3, 5, backend=backend)
    sequences, inputs = torch.randn(2, 4, 2, 3), torch.randn(2, 2, 3)
    with torch.no_grad(), warnings.catch_warnings():
        # A compiled backend's operator has no batching rule: torch runs it once per sample, and warns.
        warnings.simplefilter("ignore")
        outputs = torch.vmap(lambda seq: layer(seq)[0])(sequences)
        states = torch.vmap(lambda x: cell(x)[0])(inputs)
        torch.testing.assert_close(outputs, torch.stack([layer(seq)[0] for seq in sequences]))
        torch.testing.assert_close(states, torch.stack([cell(x)[0] for x in inputs]))


# --- the contract's schemas, declared once -------------------------------------------------------


def test_the_schema_header_declares_the_four_operators_torch_can_parse():
    schemas = contract_schemas()
    assert sorted(schemas) == ["backward", "forward", "sequence_backward", "sequence_forward"]
    for name, schema in schemas.items():
        parsed = torch._C.parse_schema(f"ns::{schema}")
        assert parsed.name == f"ns::{name}"
    assert "bool needs_backward=True" in schemas["sequence_forward"]


@pytest.mark.parametrize("backend", ["lltm_cpu", "lltm_cuda"])
def test_each_compiled_backend_defines_its_operators_with_the_header(backend):
    csrc = ROOT / "backends" / backend / "csrc"
    if not csrc.is_dir():
        pytest.skip("not a source tree")
    # A link to lltm-core's header in the source tree (a plain copy in an sdist), and what lltm_core reads.
    assert (csrc / "lltm_schema.h").resolve() == (ROOT / "lltm_core" / "include" / "lltm_schema.h").resolve()
    assert (csrc / "lltm_schema.h").read_text() == SCHEMA_HEADER.read_text()
    source = (csrc / "lltm.cpp").read_text()
    assert '#include "lltm_schema.h"' in source
    assert "(Tensor" not in source, "a schema string written out in lltm.cpp, not taken from lltm_schema.h"
    for name in ("FORWARD", "BACKWARD", "SEQUENCE_FORWARD", "SEQUENCE_BACKWARD"):
        assert f"m.def(LLTM_SCHEMA_{name});" in source


def _define(namespace: str, schemas: dict) -> torch.library.Library:
    library = torch.library.Library(namespace, "DEF")
    for schema in schemas.values():
        library.define(schema)
    return library


def test_fake_kernels_bind_the_header_arguments_by_name():
    from lltm_core.extension import saved_layout, sequence_saved_layout

    library = _define("lltm_test_schema_ok", contract_schemas())  # noqa: F841 (kept alive)
    register_fake_kernels("lltm_test_schema_ok", saved_layout, sequence_saved_layout)
    ops = torch.ops.lltm_test_schema_ok
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        T, B, I, S = 3, 2, 4, 5
        x, w, b = torch.empty(T, B, I), torch.empty(3 * S, S + I), torch.empty(3 * S)
        h0 = torch.empty(B, S)
        output, h_n, c_n, gates, tanh_cell = ops.sequence_forward(x, w, b, h0, h0, None, False)
        assert (output.shape, h_n.shape, gates.shape, tanh_cell.shape) == ((T, B, S), (B, S), (T, B, 3 * S), (T, B, S))
        *_, gates, tanh_cell = ops.sequence_forward(x, w, b, h0, h0, None, False, needs_backward=False)
        assert gates.numel() == tanh_cell.numel() == 0
        new_h, new_cell, X, gates, tanh_cell = ops.forward(x[0], w, b, h0, h0)
        assert (new_h.shape, X.shape, gates.shape) == ((B, S), (B, S + I), (B, 3 * S))
        grad_X, grad_weights, grad_bias, grad_old_cell = ops.backward(new_h, new_cell, w, X, gates, tanh_cell, False)
        assert grad_X.numel() == 0 and grad_weights.shape == w.shape and grad_bias.shape == b.shape


def test_fake_kernels_refuse_a_library_of_another_schema():
    from lltm_core.extension import saved_layout

    schemas = dict(contract_schemas())
    schemas["backward"] = schemas["backward"].replace("grad_new_h", "grad_h")
    library = _define("lltm_test_schema_old", schemas)  # noqa: F841 (kept alive)
    with pytest.raises(RuntimeError, match=r"lltm_test_schema_old::backward is defined as .*rebuild the backend"):
        register_fake_kernels("lltm_test_schema_old", saved_layout)


@pytest.mark.parametrize("make", [
    lambda **kw: lltm_core.LLTM(4, 5, bias=False, **kw),
    lambda **kw: lltm_core.LLTMLayer(4, 5, num_layers=2, bidirectional=True, bias=False, **kw),
], ids=["LLTM", "LLTMLayer"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bias_false_built_on_meta_takes_a_checkpoint_by_assignment(make, dtype):
    # load_state_dict(assign=True) takes the checkpoint's tensors, their device and dtype with them; the zero
    # bias, outside the state_dict, must follow them rather than stay on the meta device.
    torch.manual_seed(0)
    source = make(backend="ref", dtype=dtype)
    with torch.device("meta"):
        built = make()
    built.load_state_dict(source.state_dict(), assign=True)
    layer = isinstance(built, lltm_core.LLTMLayer)
    x = torch.randn(3, 2, 4, dtype=dtype) if layer else torch.randn(2, 4, dtype=dtype)
    torch.testing.assert_close(built(x), source(x))
    if not layer:  # the cell against the formula itself: its zero bias is no bias at all
        h, c = torch.zeros(2, 5, dtype=dtype), torch.zeros(2, 5, dtype=dtype)
        gates = torch.cat([h, x], 1) @ source.weights.T
        i, o, z = gates[:, :5].sigmoid(), gates[:, 5:10].sigmoid(), torch.nn.functional.elu(gates[:, 10:])
        new_c = c + z * i
        torch.testing.assert_close(built(x), (new_c.tanh() * o, new_c))


# --- TorchScript ---------------------------------------------------------------------------------


class _Model(torch.nn.Module):
    """An LLTMLayer inside a user's model, as TorchScript would be handed it."""

    def __init__(self):
        super().__init__()
        self.rnn = lltm_core.LLTMLayer(5, 7, num_layers=2, bidirectional=True, backend="ref")
        self.head = torch.nn.Linear(14, 2)

    def forward(self, x):
        return self.head(self.rnn(x)[0])


@pytest.mark.parametrize("make, shape", [
    (lambda: lltm_core.LLTM(5, 7), (3, 5)),
    (lambda: lltm_core.LLTMLayer(5, 7), (4, 3, 5)),
    (_Model, (4, 3, 5)),
], ids=["LLTM", "LLTMLayer", "inside-a-model"])
def test_torchscript_is_refused_with_what_to_use_instead(make, shape):
    # torch.jit.script failed with "Unknown type annotation: 'int'"; torch.jit.trace failed its check
    # ("Graphs differed across invocations"), or, under no_grad, recorded lltm-ref's time loop for the traced
    # length only: the loaded program then gave values near 1e27 on a longer input.
    model, x = make(), torch.randn(shape)
    name = "LLTM" if isinstance(model, lltm_core.LLTM) else "LLTMLayer"
    with pytest.raises(RuntimeError, match=rf"^{name} cannot be compiled by torch.jit.script: .* torch.export"):
        torch.jit.script(model)
    for grad in (True, False):
        with torch.set_grad_enabled(grad), pytest.raises(
                RuntimeError, match=rf"^{name} cannot be recorded by torch.jit.trace: .* torch.export"):
            torch.jit.trace(model, (x,))
    # Neither leaves anything behind: the model still runs, and torch.export takes it.
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(torch.export.export(model, (x,)).module()(x), expected)


# --- torch.fx ------------------------------------------------------------------------------------


class _FxModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = lltm_core.LLTMLayer(5, 7, num_layers=2, batch_first=True)
        self.cell = lltm_core.LLTM(7, 3)

    def forward(self, x, h_0, c_0):
        output, (h_n, c_n) = self.rnn(x, (h_0, c_0))
        h, c = self.cell(output[:, -1])
        return self.cell(output[:, 0], (h, c))[0] + h_n[1].sum() - c_n[0].sum()


def test_torch_fx_records_each_lltm_module_as_one_call_as_it_does_nn_lstm():
    # A model holding them raised "input must be a torch.Tensor or a PackedSequence, got Proxy": torch.fx
    # traced into their forward, where nn.LSTM, a module of torch.nn, is a leaf.
    torch.manual_seed(0)
    model = _FxModel()
    traced = torch.fx.symbolic_trace(model)
    targets = [node.target for node in traced.graph.nodes if node.op == "call_module"]
    assert targets == ["rnn", "cell", "cell"]
    args = (torch.randn(3, 4, 5), torch.randn(2, 3, 7), torch.randn(2, 3, 7))
    torch.testing.assert_close(traced(*args), model(*args))
    for module in (model.rnn, model.cell):  # alone, there is no model in which to be one call
        with pytest.raises(TypeError, match=rf"torch.fx.symbolic_trace cannot trace {type(module).__name__} itself"):
            torch.fx.symbolic_trace(module)


# --- a saved program, loaded in a new process -----------------------------------------------------


@pytest.mark.parametrize("backend", _backends())
def test_a_saved_program_loads_in_a_new_process_after_get_backend(backend, tmp_path):
    # import lltm_core loads no backend: torch.export.load failed to resolve lltm_cpu::sequence_forward, and
    # for lltm-ref's program lltm::ref_sequence_forward, which only a trace in the same process registered.
    import subprocess
    import sys

    torch.manual_seed(0)
    model = lltm_core.LLTMLayer(5, 7, num_layers=2, bidirectional=True, backend=backend).eval()
    x = torch.randn(4, 3, 5)
    torch.export.save(torch.export.export(model, (x,)), tmp_path / "program.pt2")
    with torch.no_grad():
        torch.save((x, model(x)), tmp_path / "expected.pt")
    script = (f"import torch, lltm_core\n"
              f"lltm_core.get_backend({backend!r})\n"
              f"program = torch.export.load({str(tmp_path / 'program.pt2')!r})\n"
              f"x, expected = torch.load({str(tmp_path / 'expected.pt')!r})\n"
              f"with torch.no_grad():\n"
              f"    torch.testing.assert_close(program.module()(x), expected)\n")
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-3000:]
