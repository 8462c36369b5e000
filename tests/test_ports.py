"""Code written for nn.LSTMCell and nn.LSTM ports by the class name: keywords, hx, unbatched input, bias=False."""

from __future__ import annotations

import pytest
import torch

import lltm_core


def _backends_for(dtype=torch.float64) -> list[str]:
    return [n for n in lltm_core.available_backends()
            if lltm_core.get_backend(n).supports("cpu", dtype) is None]


def test_the_cell_takes_lstmcells_arguments_by_name_and_position():
    for cell in (lltm_core.LLTM(input_size=7, hidden_size=3, bias=True), lltm_core.LLTM(7, 3, True),
                 lltm_core.LLTM(input_features=7, state_size=3)):
        assert (cell.input_size, cell.hidden_size) == (7, 3) == (cell.input_features, cell.state_size)
    with pytest.raises(TypeError, match="give input_features or input_size, not both"):
        lltm_core.LLTM(7, 3, input_size=7)
    with pytest.raises(TypeError, match="missing the size hidden_size"):
        lltm_core.LLTM(input_size=7)


def test_the_layer_takes_lstms_arguments_in_lstms_order():
    torch_layer = torch.nn.LSTM(7, 3, 2, False, True, 0.0, True)
    layer = lltm_core.LLTMLayer(7, 3, 2, False, True, 0.0, True)
    # proj_size too: code written for nn.LSTM reads it for the size of h_0 (it is always 0 here).
    for name in ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional",
                 "proj_size"):
        assert getattr(layer, name) == getattr(torch_layer, name), name
    keyword = lltm_core.LLTMLayer(input_size=7, hidden_size=3, bias=False)
    assert (keyword.input_size, keyword.hidden_size, keyword.bias) == (7, 3, False)


def test_hx_is_the_state_and_none_is_zeros():
    torch.manual_seed(1)
    cell = lltm_core.LLTM(5, 4).double()
    x = torch.randn(3, 5, dtype=torch.float64)
    zeros = torch.zeros(3, 4, dtype=torch.float64)
    h, c = torch.randn_like(zeros), torch.randn_like(zeros)
    torch.testing.assert_close(cell(x, hx=None), cell(x, (zeros, zeros)))
    torch.testing.assert_close(cell(x, hx=(h, c)), cell(x, (h, c)))
    torch.testing.assert_close(cell(x, state=(h, c)), cell(x, (h, c)))  # the older keyword still works
    layer = lltm_core.LLTMLayer(5, 4).double()
    seq = torch.randn(6, 3, 5, dtype=torch.float64)
    h0, c0 = h.unsqueeze(0), c.unsqueeze(0)
    torch.testing.assert_close(layer(seq, hx=(h0, c0)), layer(seq, (h0, c0)))


def test_unbatched_cell_input_is_1d_in_and_out_as_in_lstmcell():
    torch.manual_seed(2)
    cell = lltm_core.LLTM(5, 4).double()
    torch_cell = torch.nn.LSTMCell(5, 4).double()
    x = torch.randn(5, dtype=torch.float64)
    h, c = torch.randn(4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    for module in (torch_cell, cell):  # the same shapes in, the same shapes out
        assert [t.shape for t in module(x)] == [(4,), (4,)]
        assert [t.shape for t in module(x, (h, c))] == [(4,), (4,)]
    batched = cell(x.unsqueeze(0), (h.unsqueeze(0), c.unsqueeze(0)))
    torch.testing.assert_close(cell(x, (h, c)), tuple(t.squeeze(0) for t in batched))
    with pytest.raises(ValueError, match=r"hx's h has shape \(1, 4\), expected \(4,\)"):
        cell(x, (h.unsqueeze(0), c))


@pytest.mark.parametrize("backend", _backends_for())
def test_bias_false_has_no_parameter_and_computes_a_zero_bias(backend):
    torch.manual_seed(3)
    torch_keys = set(torch.nn.LSTMCell(5, 4, bias=False).state_dict())
    assert not any("bias" in k for k in torch_keys)
    cell = lltm_core.LLTM(5, 4, bias=False, backend=backend, dtype=torch.float64)
    assert cell.bias is None and list(cell.state_dict()) == ["weights"]
    with_bias = lltm_core.LLTM(5, 4, backend=backend, dtype=torch.float64)
    with torch.no_grad():
        with_bias.weights.copy_(cell.weights)
        with_bias.bias.zero_()
    x = torch.randn(3, 5, dtype=torch.float64)
    state = (torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64))
    torch.testing.assert_close(cell(x, state), with_bias(x, state))
    cell(x, state)[0].sum().backward()
    with_bias(x, state)[0].sum().backward()
    torch.testing.assert_close(cell.weights.grad, with_bias.weights.grad)

    layer = lltm_core.LLTMLayer(5, 4, 2, bias=False, bidirectional=True, backend=backend, dtype=torch.float64)
    assert not any("bias" in k for k in layer.state_dict()) and len(list(layer.parameters())) == 4
    reference = lltm_core.LLTMLayer(5, 4, 2, bidirectional=True, backend=backend, dtype=torch.float64)
    with torch.no_grad():
        for name, p in reference.named_parameters():
            p.copy_(layer.get_parameter(name) if name.startswith("weights") else torch.zeros_like(p))
    seq = torch.randn(6, 3, 5, dtype=torch.float64)
    torch.testing.assert_close(layer(seq), reference(seq))
    assert lltm_core.LLTMLayer.from_cell(cell).state_dict().keys() == {"weights_l0"}


def test_bias_false_moves_with_the_module():
    cell = lltm_core.LLTM(5, 4, bias=False).double()
    h, _ = cell(torch.randn(2, 5, dtype=torch.float64))
    assert h.dtype == torch.float64


def test_errors_blame_what_the_caller_passed():
    cell = lltm_core.LLTM(51, 50)
    x = torch.randn(4, 51)
    with pytest.raises(ValueError, match=r"hx's h has shape \(4, 51\), expected \(4, 50\)") as err:
        cell(x, (torch.randn(4, 51), torch.randn(4, 51)))
    assert "weights" not in str(err.value)
    with pytest.raises(ValueError, match=r"takes input of shape \(batch, 51\) or \(51,\) unbatched, got \(4, 52\)"):
        cell(torch.randn(4, 52))
    with pytest.raises(TypeError, match=r"from_cell\(\) takes an lltm_core.LLTM \(the cell\), got LLTMLayer"):
        lltm_core.LLTMLayer.from_cell(lltm_core.LLTMLayer(3, 4))


def test_lengths_on_the_meta_device_is_named():
    T, B, I, S = 4, 3, 5, 2
    args = (torch.randn(T, B, I), torch.randn(3 * S, S + I), torch.randn(3 * S), torch.randn(B, S), torch.randn(B, S))
    with pytest.raises(ValueError, match="lengths is on the meta device"):
        lltm_core.lltm_sequence(*args, lengths=torch.full((B,), 2, device="meta"))


def test_a_module_given_a_backend_object_names_it_in_its_repr_and_errors():
    # backend=<Backend> printed every field of the Backend (its kernels' functions and all) in the module's
    # repr and in each of its errors: hundreds of characters before the message.
    ref = lltm_core.get_backend("ref")
    layer, cell = lltm_core.LLTMLayer(5, 4, num_layers=2, backend=ref), lltm_core.LLTM(5, 4, backend=ref)
    assert repr(layer) == "LLTMLayer(5, 4, num_layers=2, backend=Backend('ref'))"
    assert repr(cell) == "LLTM(input_features=5, state_size=4, backend=Backend('ref'))"
    assert repr(lltm_core.LLTMLayer(5, 4, backend="ref")) == "LLTMLayer(5, 4, backend='ref')"
    with pytest.raises(ValueError, match=r"^LLTMLayer\(5, 4, num_layers=2, backend=Backend\('ref'\)\): input must "
                                         r"have 5 features"):
        layer(torch.randn(3, 2, 6))
