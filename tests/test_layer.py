"""LLTMLayer and lltm_sequence: nn.LSTM's conventions, errors that name the argument, loading a cell.

The numerics of every backend are the conformance kit's (lltm_core/testing/test_sequence.py);
these tests hold the interface to its promises.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import logging
import pickle

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import lltm_core
from lltm_core.testing import make_inputs, make_sequence_inputs

T, B, I, S = 6, 4, 3, 5


def _sequence_args(**replace):
    names = ("input", "weights", "bias", "h0", "c0")
    args = dict(zip(names, make_sequence_inputs(T, B, I, S, requires_grad=False)))
    args.update(replace)
    return args


@pytest.mark.parametrize("replace, error, pattern", [
    ({"input": torch.randn(T, I)}, ValueError,
     r"input must be 3-D \(time, batch, input_features\), got shape \(6, 3\)"),
    ({"input": torch.randn(T, B, I + 1)}, ValueError,
     r"weights has shape \(15, 8\), expected \(15, 9\) for input of shape \(6, 4, 4\)"),
    ({"h0": torch.randn(B + 1, S)}, ValueError, r"h0 has shape \(5, 5\), expected \(4, 5\)"),
    ({"c0": torch.randn(B, S, 1)}, ValueError, r"c0 has shape \(4, 5, 1\), expected \(4, 5\)"),
    ({"bias": torch.randn(2, 3 * S)}, ValueError, r"bias has shape \(2, 15\), expected \(15,\) or \(1, 15\)"),
    ({"c0": torch.randn(B, S, dtype=torch.float64)}, TypeError,
     r"c0 has dtype torch.float64, expected torch.float32 \(the dtype of input\)"),
    ({"h0": torch.randn(B, S, device="meta")}, ValueError, r"h0 is on meta, expected cpu \(the device of input\)"),
    ({"input": torch.randn(0, B, I)}, ValueError, r"input has 0 time steps \(shape \(0, 4, 3\)\)"),
    ({"input": torch.ones(T, B, I, dtype=torch.int32)}, TypeError, r"input must be a floating-point tensor"),
    ({"lengths": [6, 6, 6, 6]}, TypeError, r"lengths must be None or an integer tensor of shape \(4,\), got list"),
    ({"lengths": torch.full((B,), 6.0)}, TypeError, r"lengths must be an integer tensor, got dtype torch.float32"),
    ({"lengths": torch.full((B, 1), 6)}, ValueError, r"lengths must be 1-D .* shape \(4,\), got shape \(4, 1\)"),
    ({"lengths": torch.tensor([6, 0, 3, 2])}, ValueError, r"lengths must lie in \[1, 6\] .* got values from 0 to 6"),
    ({"lengths": torch.tensor([7, 1, 3, 2])}, ValueError, r"lengths must lie in \[1, 6\] .* got values from 1 to 7"),
    ({"reverse": 1}, TypeError, r"reverse must be a bool \(Python's or numpy's\), got int"),
], ids=["rank", "feature-width", "h0-batch", "c0-rank", "bias", "dtype-mix", "device-mix", "T0", "int-input",
        "lengths-list", "lengths-float", "lengths-2d", "lengths-zero", "lengths-past-T", "reverse"])
def test_lltm_sequence_names_bad_arguments(replace, error, pattern):
    args = _sequence_args()
    options = {k: replace.pop(k) for k in ("lengths", "reverse") if k in replace}
    args.update(replace)
    with pytest.raises(error, match="lltm_sequence\\(\\): " + pattern):
        lltm_core.lltm_sequence(**args, **options)


LAYER = "LLTMLayer\\(3, 5, num_layers=2, bidirectional=True\\): "


@pytest.mark.parametrize("input, state, error, pattern", [
    (torch.randn(T, B, 7), None, ValueError,
     LAYER + r"input must have 3 features \(its last dimension\), got shape \(6, 4, 7\)"),
    (torch.randn(T), None, ValueError, LAYER + r"input must be 3-D \(time, batch, features\), .* got shape \(6,\)"),
    (torch.randn(T, B, I, 2), None, ValueError, LAYER + r"input must be 3-D .* got shape \(6, 4, 3, 2\)"),
    (torch.randn(0, B, I), None, ValueError, LAYER + r"input has 0 time steps"),
    (torch.randn(T, B, I, dtype=torch.float64), None, TypeError,
     LAYER + r"input has dtype torch.float64, expected torch.float32 \(the dtype of the parameters"),
    (torch.randn(T, B, I, device="meta"), None, ValueError, LAYER + r"input is on meta, expected cpu"),
    (torch.randn(T, B, I), (torch.randn(2, B, S), torch.randn(4, B, S)), ValueError,
     LAYER + r"state's h_0 has shape \(2, 4, 5\), expected \(4, 4, 5\) \(num_layers \* directions, batch, state_size\)"),
    (torch.randn(T, I), (torch.randn(4, 1, S), torch.randn(4, 1, S)), ValueError,
     LAYER + r"state's h_0 has shape \(4, 1, 5\), expected \(4, 5\) \(num_layers \* directions, state_size\)"),
    (torch.randn(T, B, I), (torch.randn(4, B, S), torch.randn(4, B, S, dtype=torch.float64)), TypeError,
     LAYER + r"state's c_0 has dtype torch.float64, expected torch.float32"),
    (torch.randn(T, B, I), torch.randn(4, B, S), TypeError, r"state must be a pair \(h_0, c_0\), got Tensor"),
    ([[1.0]], None, TypeError, r"input must be a torch.Tensor or a PackedSequence, got list"),
], ids=["feature-width", "rank-1", "rank-4", "T0", "dtype", "device", "state-shape", "unbatched-state",
        "state-dtype", "state-not-a-pair", "not-a-tensor"])
def test_layer_names_bad_input(input, state, error, pattern):
    layer = lltm_core.LLTMLayer(I, S, 2, bidirectional=True)
    with pytest.raises(error, match=pattern):
        layer(input, state)


ONE_LAYER = r"LLTMLayer\(3, 5\): "


def _replace(name, value):
    def change(layer):
        setattr(layer, name, torch.nn.Parameter(value))
    return change


@pytest.mark.parametrize("input, change, error, pattern", [
    (torch.randn(T, B, 7), None, ValueError, ONE_LAYER + r"input must have 3 features"),
    (torch.randn(0, B, I), None, ValueError, ONE_LAYER + r"input has 0 time steps"),
    (torch.randn(T, B, I, dtype=torch.float64), None, TypeError, ONE_LAYER + r"input has dtype torch.float64"),
    (torch.randint(-3, 4, (T, B, I)), None, TypeError, ONE_LAYER + r"input has dtype torch.int64"),
    (torch.randn(T, B, I, device="meta"), None, ValueError, ONE_LAYER + r"input is on meta, expected cpu"),
    (torch.randn(T, B, I), _replace("weights_l0", torch.randn(3 * S, S + I + 1)), ValueError,
     r"lltm_sequence\(\): weights has shape \(15, 9\), expected \(15, 8\)"),
    (torch.randn(T, B, I), _replace("bias_l0", torch.randn(3 * S, dtype=torch.float64)), TypeError,
     r"lltm_sequence\(\): .*bias.*float64"),
    (torch.randn(T, B, I), _replace("bias_l0", torch.randn(3 * S, device="meta")), ValueError,
     r"lltm_sequence\(\): .*bias.*meta"),
], ids=["feature-width", "T0", "dtype", "integer", "device", "weights-shape", "bias-dtype", "bias-device"])
def test_the_one_layer_call_names_bad_input_as_the_general_path_does(input, change, error, pattern):
    # One layer, one direction, no state: the call LLTMLayer checks once before lltm_sequence's eager half.
    layer = lltm_core.LLTMLayer(I, S)
    if change is not None:
        change(layer)
    with pytest.raises(error, match=pattern):
        layer(input)


def test_layer_rejects_bad_construction_arguments():
    with pytest.raises(ValueError, match=r"state_size \(hidden_size\) must be an integer >= 1, got 0"):
        lltm_core.LLTMLayer(3, 0)
    with pytest.raises(ValueError, match=r"num_layers must be an integer >= 1, got 1.5"):
        lltm_core.LLTMLayer(3, 4, 1.5)
    with pytest.raises(ValueError, match=r"dropout must be a probability in \[0, 1\], got 2"):
        lltm_core.LLTMLayer(3, 4, dropout=2)


@pytest.mark.parametrize("module", [lltm_core.LLTM, lltm_core.LLTMLayer])
@pytest.mark.parametrize("dtype", [torch.int32, torch.complex64, "float32"])
def test_a_module_of_a_dtype_the_lltm_cannot_compute_in_is_refused_as_built(module, dtype):
    # An integer dtype raised torch's "Only Tensors of floating point and complex dtype can require
    # gradients"; a complex one was built, and its first call said "dtype complex64, expected complex64".
    with pytest.raises(TypeError, match=rf"{module.__name__}\(\): dtype must be a floating-point dtype .*, "
                                        rf"got {dtype!r}"):
        module(3, 4, dtype=dtype)


@pytest.mark.parametrize("module", [lltm_core.LLTM, lltm_core.LLTMLayer])
def test_a_backend_of_the_wrong_type_is_refused_as_built(module):
    # backend=3 was kept, and every call then raised "backend= takes a backend name or an lltm_core.Backend".
    with pytest.raises(TypeError, match=rf"^{module.__name__}\(\): backend must be a backend's name or an "
                                        r"lltm_core.Backend .*got int 3"):
        module(3, 4, backend=3)
    assert module(3, 4, backend=lltm_core.get_backend("ref")).backend.name == "ref"


@pytest.mark.parametrize("module", [lltm_core.LLTM, lltm_core.LLTMLayer])
def test_a_module_built_on_a_backend_object_pickles_it_by_name(module, fake_backends, monkeypatch):
    # Pickling (torch.save, spawning workers) failed on the Backend's kernels: a lambda here, a
    # pybind11 function in lltm-cpu.  It is stored by name, and found again where the pickle is loaded.
    fake_backends("lltm-fake", {"fresh": "fresh"})
    backend = lltm_core.get_backend("fresh")
    built = module(I, S, backend=backend)
    buffer = io.BytesIO()
    torch.save(built, buffer)
    for copied in (pickle.loads(pickle.dumps(built)), torch.load(io.BytesIO(buffer.getvalue()), weights_only=False),
                   copy.deepcopy(built)):
        assert copied.backend is backend
        x = torch.randn(T, B, I) if module is lltm_core.LLTMLayer else torch.randn(B, I)
        torch.testing.assert_close(copied(x), built(x), rtol=0, atol=0)

    pickled = pickle.dumps(built)
    monkeypatch.setenv("LLTM_DISABLE_BACKENDS", "fresh")  # as a process where it cannot run
    lltm_core.refresh()
    with pytest.raises(lltm_core.BackendError, match=r"loading a pickled lltm Backend 'fresh', this process's "
                                                     r"backend of that name is needed: .*LLTM_DISABLE_BACKENDS"):
        pickle.loads(pickled)


@pytest.mark.parametrize("name", lltm_core.available_backends())
def test_every_installed_backend_unpickles_as_itself(name):
    backend = lltm_core.get_backend(name)  # lltm-cpu's kernels are operators: pickling them failed
    assert pickle.loads(pickle.dumps(backend)) is backend


@pytest.mark.parametrize("module", [lltm_core.LLTM, lltm_core.LLTMLayer])
def test_a_module_on_a_backend_built_by_hand_deep_copies_but_refuses_to_pickle(module):
    handmade = dataclasses.replace(lltm_core.get_backend("ref"), name="handmade")
    built = module(I, S, backend=handmade)
    assert copy.deepcopy(built).backend is handmade  # same process: the object itself
    with pytest.raises(pickle.PicklingError, match=r"lltm Backend 'handmade' cannot be pickled: a Backend pickles "
                                                   r"by name, and no installed backend is called that\. Register it"):
        pickle.dumps(built)
    tweaked = dataclasses.replace(lltm_core.get_backend("ref"), priority=7)
    with pytest.raises(pickle.PicklingError, match=r"'ref' cannot be pickled: .*the one installed under that name "
                                                   r"\(lltm-ref .*\) is another"):
        pickle.dumps(module(I, S, backend=tweaked))


def test_a_layer_moved_to_a_complex_dtype_says_the_parameters_are_what_is_wrong():
    layer = lltm_core.LLTMLayer(I, S, 2).to(torch.complex64)
    with pytest.raises(TypeError, match=r"the parameters have dtype torch.complex64; the LLTM computes in a "
                                        r"floating-point dtype: .to\(\) the module"):
        layer(torch.randn(T, B, I, dtype=torch.complex64))


@pytest.mark.parametrize("num_layers, bidirectional, batch_first",
                         [(1, False, False), (2, True, True), (3, False, True), (2, True, False)])
def test_shapes_and_packing_follow_nn_lstm(num_layers, bidirectional, batch_first):
    """The same calls on nn.LSTM and LLTMLayer give the same shapes and the same packing."""
    options = dict(batch_first=batch_first, bidirectional=bidirectional)
    lstm = torch.nn.LSTM(I, S, num_layers, **options)
    ours = lltm_core.LLTMLayer(I, S, num_layers, **options)
    assert (ours.input_size, ours.hidden_size, ours.num_layers) == (lstm.input_size, lstm.hidden_size, lstm.num_layers)
    ours.flatten_parameters()  # nn.LSTM code calls it; a no-op here
    x = torch.randn((B, T, I) if batch_first else (T, B, I))
    D = 2 if bidirectional else 1
    state = (torch.randn(num_layers * D, B, S), torch.randn(num_layers * D, B, S))
    for args in ((x,), (x, state)):
        want, (want_h, want_c) = lstm(*args)
        got, (h, c) = ours(*args)
        assert got.shape == want.shape and h.shape == want_h.shape and c.shape == want_c.shape
    unbatched = torch.randn(T, I)
    want, (want_h, _) = lstm(unbatched)
    got, (h, _) = ours(unbatched)
    assert got.shape == want.shape and h.shape == want_h.shape
    lengths = torch.tensor([2, 6, 1, 4])
    packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    want, (want_h, _) = lstm(packed, state)
    got, (h, _) = ours(packed, state)
    assert isinstance(got, type(want)) and h.shape == want_h.shape
    assert torch.equal(got.batch_sizes, want.batch_sizes)
    assert torch.equal(got.sorted_indices, want.sorted_indices)
    assert torch.equal(got.unsorted_indices, want.unsorted_indices)
    assert got.data.shape == want.data.shape


@pytest.mark.parametrize("bidirectional", [False, True], ids=["forward", "bidirectional"])
def test_a_packed_batch_is_each_sequence_on_its_own(bidirectional):
    """Padded outputs are zero; each sequence's outputs and h_n, c_n are those of running it alone."""
    layer = lltm_core.LLTMLayer(I, S, 2, bidirectional=bidirectional, dtype=torch.float64)
    lengths = [3, 6, 1, 5]
    x = torch.randn(T, B, I, dtype=torch.float64)
    D = 2 if bidirectional else 1
    h0, c0 = torch.randn(2 * D, B, S, dtype=torch.float64), torch.randn(2 * D, B, S, dtype=torch.float64)
    packed = pack_padded_sequence(x, torch.tensor(lengths), enforce_sorted=False)
    output, (h_n, c_n) = layer(packed, (h0, c0))
    padded, _ = pad_packed_sequence(output, total_length=T)
    for b, length in enumerate(lengths):
        alone, (h_alone, c_alone) = layer(x[:length, b], (h0[:, b], c0[:, b]))
        torch.testing.assert_close(padded[:length, b], alone, rtol=1e-12, atol=1e-12)
        assert not padded[length:, b].any()
        torch.testing.assert_close(h_n[:, b], h_alone, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(c_n[:, b], c_alone, rtol=1e-12, atol=1e-12)


def test_parameters_are_named_and_shaped_like_nn_lstm():
    torch.manual_seed(0)
    layer = lltm_core.LLTMLayer(I, S, 2, bidirectional=True, dtype=torch.float64)
    shapes = {name: tuple(p.shape) for name, p in layer.named_parameters()}
    assert shapes == {
        "weights_l0": (3 * S, S + I), "bias_l0": (3 * S,),
        "weights_l0_reverse": (3 * S, S + I), "bias_l0_reverse": (3 * S,),
        "weights_l1": (3 * S, S + 2 * S), "bias_l1": (3 * S,),
        "weights_l1_reverse": (3 * S, S + 2 * S), "bias_l1_reverse": (3 * S,),
    }
    bound = 1 / S ** 0.5
    for p in layer.parameters():
        assert p.dtype == torch.float64 and p.abs().max() <= bound and p.unique().numel() == p.numel()
    # The spread over every parameter together: a bias alone is 15 values, whose sample std fell under
    # 0.4 * bound in about 1 draw of 75 (uniform's std is bound / sqrt(3), about 0.58 * bound).
    assert torch.cat([p.flatten() for p in layer.parameters()]).std() > 0.5 * bound


def test_a_trained_cell_loads_as_layer_zero():
    """from_cell: the layer over a sequence computes what the cell looped over it does, and so does the state_dict."""
    cell = lltm_core.LLTM(I, S, dtype=torch.float64)
    x = torch.randn(B, T, I, dtype=torch.float64)
    h = c = torch.zeros(B, S, dtype=torch.float64)
    steps = []
    for t in range(T):
        h, c = cell(x[:, t], (h, c))
        steps.append(h)
    layer = lltm_core.LLTMLayer.from_cell(cell, batch_first=True)
    assert layer.batch_first and layer.backend is None and layer.weights_l0.dtype == torch.float64
    output, (h_n, c_n) = layer(x)
    torch.testing.assert_close(output, torch.stack(steps, dim=1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h_n[0], h, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c_n[0], c, rtol=1e-12, atol=1e-12)
    # The same mapping by hand, through the state_dicts.
    by_hand = lltm_core.LLTMLayer(I, S, batch_first=True, dtype=torch.float64)
    by_hand.load_state_dict({"weights_l0": cell.state_dict()["weights"], "bias_l0": cell.state_dict()["bias"]})
    torch.testing.assert_close(by_hand(x)[0], output, rtol=0, atol=0)
    assert not layer.weights_l0.data_ptr() == cell.weights.data_ptr()  # copied, not shared


def test_a_trained_cell_takes_no_sizes_of_its_layer():
    # from_cell(cell, input_size=3) said "give input_features or input_size, not both", for a size given once.
    with pytest.raises(TypeError, match=r"from_cell\(\): the sizes are the cell's \(input_features=3, state_size=5\): "
                                        r"leave out input_size, hidden_size"):
        lltm_core.LLTMLayer.from_cell(lltm_core.LLTM(I, S), input_size=I, hidden_size=S)


def test_a_trained_cell_converts_to_a_layer_of_another_dtype():
    # from_cell(cell, dtype=...) raised "got multiple values for keyword argument 'dtype'", though its
    # keyword arguments go to the constructor.
    torch.manual_seed(0)
    cell = lltm_core.LLTM(I, S)
    layer = lltm_core.LLTMLayer.from_cell(cell, dtype=torch.float64, device="cpu")
    assert layer.weights_l0.dtype == layer.bias_l0.dtype == torch.float64
    x = torch.randn(T, B, I, dtype=torch.float64)
    expected = lltm_core.LLTMLayer.from_cell(cell.double(), backend="ref")(x)
    torch.testing.assert_close(layer(x), expected)


@pytest.mark.parametrize("num_layers, bidirectional, bias", [(1, False, True), (2, True, True), (1, False, False)],
                         ids=["one-layer", "two-layers-bidirectional", "no-bias"])
def test_parametrized_weights_are_used_as_nn_lstm_uses_them(num_layers, bidirectional, bias):
    """torch.nn.utils.parametrize (weight_norm here; spectral_norm, orthogonal alike) turns a parameter
    into a property: the layer must compute with it and differentiate through it, as nn.LSTM does."""
    from torch.nn.utils import parametrizations

    torch.manual_seed(0)
    layer = lltm_core.LLTMLayer(I, S, num_layers, bias=bias, bidirectional=bidirectional, dtype=torch.float64)
    names = [name for name, _ in layer.named_parameters() if name.startswith("weights")]
    for name in names:
        parametrizations.weight_norm(layer, name=name)
        getattr(layer.parametrizations, name).original0.data.mul_(1.5)  # so the norm matters: w != original
    x = torch.randn(T, B, I, dtype=torch.float64)
    output, (h_n, c_n) = layer(x)
    plain = lltm_core.LLTMLayer(I, S, num_layers, bias=bias, bidirectional=bidirectional, dtype=torch.float64)
    with torch.no_grad():
        for name, p in plain.named_parameters():
            p.copy_(getattr(layer, name))
    assert not torch.equal(plain.weights_l0, layer.parametrizations.weights_l0.original1)
    want, (want_h, want_c) = plain(x)
    for got, expected in ((output, want), (h_n, want_h), (c_n, want_c)):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    (output.sum() + c_n.sum()).backward()
    for name in names:
        originals = getattr(layer.parametrizations, name)
        assert originals.original0.grad is not None and originals.original0.grad.abs().sum() > 0, name
        assert originals.original1.grad is not None and originals.original1.grad.abs().sum() > 0, name


def test_dropout_applies_between_layers_in_training_only():
    torch.manual_seed(0)
    layer = lltm_core.LLTMLayer(I, S, 2, dropout=1.0, dtype=torch.float64)
    x = torch.randn(T, B, I, dtype=torch.float64)
    # dropout=1 zeroes everything layer 0 hands to layer 1: layer 1 then runs on zeros.
    second = lltm_core.LLTMLayer(S, S, dtype=torch.float64)
    second.load_state_dict({"weights_l0": layer.weights_l1, "bias_l0": layer.bias_l1})
    output, (h_n, _) = layer(x)
    torch.testing.assert_close(output, second(torch.zeros(T, B, S, dtype=torch.float64))[0], rtol=0, atol=0)
    assert h_n[0].abs().sum() > 0  # layer 0's own state is not dropped
    layer.eval()
    no_dropout = copy.deepcopy(layer)
    no_dropout.dropout = 0.0
    torch.testing.assert_close(layer(x)[0], no_dropout(x)[0], rtol=0, atol=0)
    single = lltm_core.LLTMLayer(I, S, dropout=1.0)  # one layer: no layer after it, nothing dropped
    assert single(torch.randn(T, B, I))[0].abs().sum() > 0


def test_an_empty_batch_is_handled():
    output, (h_n, c_n) = lltm_core.LLTMLayer(I, S, 2, bidirectional=True)(torch.randn(T, 0, I))
    assert output.shape == (T, 0, 2 * S) and h_n.shape == c_n.shape == (4, 0, S)


def test_a_v1_backend_runs_sequences_through_its_step_kernels(fake_backends, caplog):
    fake_backends("lltm-fake", {"v1_only": "v1_only"})
    assert not lltm_core.get_backend("v1_only").has_sequence_kernels
    layer = lltm_core.LLTMLayer(I, S, 2, bidirectional=True, backend="v1_only", dtype=torch.float64)
    reference = copy.deepcopy(layer)
    reference.backend = "ref"
    x = torch.randn(T, B, I, dtype=torch.float64, requires_grad=True)
    def packed():
        return pack_padded_sequence(x, torch.tensor([6, 2, 1, 4]), enforce_sorted=False)

    with caplog.at_level(logging.DEBUG, logger="lltm_core"):
        got, (h, c) = layer(packed())
    assert any("v1_only has no sequence kernels; looping its step kernels" in r.getMessage() for r in caplog.records)
    want, (want_h, want_c) = reference(packed())
    for g, w in ((got.data, want.data), (h, want_h), (c, want_c)):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(got.data.sum() + h.sum(), [x, *layer.parameters()])
    want_grads = torch.autograd.grad(want.data.sum() + want_h.sum(), [x, *reference.parameters()])
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    rows = {r["name"]: r for r in lltm_core.backend_report()}
    assert rows["v1_only"]["sequence_kernels"] is False and rows["ref"]["sequence_kernels"] is True


def test_a_backend_with_half_its_sequence_kernels_is_refused():
    import dataclasses

    import lltm_ref

    with pytest.raises(TypeError, match="the sequence kernels come together: it sets sequence_forward"):
        dataclasses.replace(lltm_ref.load_backend(), sequence_backward=None)
    with pytest.raises(TypeError, match=r"sequence kernels came with interface version 2, .* add 2"):
        dataclasses.replace(lltm_ref.load_backend(), interface_versions=(1,))


@pytest.mark.parametrize("function", ["lltm", "lltm_sequence"])
def test_bias_of_shape_1_by_3S_as_extension_cpp_passes_it(function):
    """pytorch/extension-cpp's tests call lltm with a (1, 3S) bias; its gradient keeps that shape."""
    if function == "lltm":
        x, weights, bias, h, c = make_inputs(B, I, S, dtype=torch.float64)
        run = lambda b: lltm_core.lltm(x, weights, b, h, c)  # noqa: E731
    else:
        x, weights, bias, h, c = make_sequence_inputs(T, B, I, S, dtype=torch.float64)
        run = lambda b: lltm_core.lltm_sequence(x, weights, b, h, c)  # noqa: E731
    row = bias.detach().reshape(1, -1).requires_grad_()
    flat = bias.detach().clone().requires_grad_()
    got, want = run(row), run(flat)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    (grad_row,) = torch.autograd.grad(sum(t.sum() for t in got), row)
    (grad_flat,) = torch.autograd.grad(sum(t.sum() for t in want), flat)
    assert grad_row.shape == (1, 3 * S)
    torch.testing.assert_close(grad_row[0], grad_flat, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"bias has shape \(1, 16\), expected \(15,\) or \(1, 15\)"):
        run(torch.randn(1, 3 * S + 1, dtype=torch.float64))


def test_the_cell_starts_from_zeros_without_a_state():
    cell = lltm_core.LLTM(I, S)
    x = torch.randn(B, I)
    zeros = torch.zeros(B, S)
    for got, want in zip(cell(x), cell(x, (zeros, zeros))):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"takes input of shape \(batch, 3\) or \(3,\) unbatched, got \(4, 3, 1\)"):
        cell(torch.randn(B, I, 1))


def test_differentiating_a_sequence_twice_is_refused_with_a_reason():
    """create_graph=True gives the right gradients; differentiating them again raises lltm's error."""
    inputs = make_sequence_inputs(3, 2, 3, 4, dtype=torch.float64)
    got = lltm_core.lltm_sequence(*inputs, backend="ref")
    grads = torch.autograd.grad(sum(t.sum() for t in got), inputs, create_graph=True)
    want = torch.autograd.grad(sum(t.sum() for t in lltm_core.lltm_sequence(*inputs, backend="ref")), inputs)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="lltm: double backward .* is not supported"):
        sum(g.sum() for g in grads).backward()
    for index in range(len(inputs)):  # each argument by name, as a gradient penalty asks
        with pytest.raises(RuntimeError, match="lltm: double backward .* is not supported"):
            torch.autograd.grad(grads[0].pow(2).sum(), inputs[index], allow_unused=True)


def test_forward_mode_ad_of_a_sequence_is_refused_with_a_reason():
    import torch.autograd.forward_ad as fwAD

    x, *rest = make_sequence_inputs(3, 2, 3, 4, requires_grad=False)
    with fwAD.dual_level(), pytest.raises(RuntimeError, match="lltm: forward-mode AD .* is not supported"):
        lltm_core.lltm_sequence(fwAD.make_dual(x, torch.randn_like(x)), *rest, backend="ref")


@pytest.mark.parametrize("backend", ["ref", "cpu"])
def test_torch_export_gives_one_sequence_operator_per_layer_and_direction(backend):
    """lltm-cpu's own operator once per layer and direction, or lltm's wrapper of lltm-ref's kernels."""
    if backend not in lltm_core.available_backends():
        pytest.skip(f"{backend} is not installed here")
    layer = lltm_core.LLTMLayer(I, S, 2, bidirectional=True, backend=backend)
    x = torch.randn(T, B, I)
    exported = torch.export.export(layer, (x,))  # with grad: ref's kernels stay behind lltm's operator
    ops = [str(n.target) for n in exported.graph.nodes if n.op == "call_function" and "lltm" in str(n.target)]
    assert ops == (["lltm.ref_sequence_forward.default"] * 4 if backend == "ref"
                   else ["lltm_cpu.sequence_forward.default"] * 4), ops
    torch.testing.assert_close(exported.module()(x)[0], layer(x)[0], rtol=0, atol=0)


def test_the_kept_zero_state_follows_batch_size_dtype_and_inference_mode():
    # The commonest call keeps its zero state between calls: a later call of another batch size or dtype,
    # or a training call after one under inference_mode, must still start from a zero state of its own.
    torch.manual_seed(0)
    layer = lltm_core.LLTMLayer(I, S, backend="ref")
    reference = copy.deepcopy(layer)
    for batch, dtype in ((B, torch.float32), (B + 3, torch.float32), (1, torch.float32), (B, torch.float64)):
        layer.to(dtype)
        reference.to(dtype)
        x = torch.randn(T, batch, I, dtype=dtype)
        with torch.inference_mode():
            got = layer(x)
        zeros = torch.zeros(1, batch, S, dtype=dtype)
        want = reference(x, (zeros, zeros))  # the general path, given the zero state
        torch.testing.assert_close(got[0], want[0].detach())
        torch.testing.assert_close(got[1][1], want[1][1].detach())
        x.requires_grad_()
        output, (h_n, c_n) = layer(x)  # training after inference: the kept state is not an inference tensor
        (output.sum() + c_n.sum()).backward()
        assert x.grad is not None and x.grad.abs().sum() > 0
