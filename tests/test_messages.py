"""What an nn.LSTM user tries first, and the messages and conveniences they expect: proj_size=0,
the one-layer dropout warning, autocast, errors that name what the caller passed, and
`lltm info` refusing arguments it cannot use with a clear message."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

import lltm_core
from lltm_core import _notices, cli
from lltm_core.testing import make_inputs, make_sequence_inputs


def test_layer_takes_nn_lstm_proj_size_zero_and_calls_others_unsupported():
    layer = lltm_core.LLTMLayer(3, 5, proj_size=0)
    assert layer(torch.randn(4, 2, 3))[0].shape == (4, 2, 5)
    with pytest.raises(ValueError, match=r"proj_size=2 is unsupported"):
        lltm_core.LLTMLayer(3, 5, proj_size=2)


def test_dropout_with_one_layer_warns_as_nn_lstm_does():
    with warnings.catch_warnings(record=True) as lstm_warnings:
        warnings.simplefilter("always")
        torch.nn.LSTM(3, 5, dropout=0.25)
    with pytest.warns(UserWarning) as ours:
        lltm_core.LLTMLayer(3, 5, dropout=0.25)
    assert [str(w.message) for w in ours] == [str(w.message) for w in lstm_warnings]
    assert ours[0].filename == __file__  # the caller's line, not lltm's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lltm_core.LLTMLayer(3, 5, num_layers=2, dropout=0.25)
        lltm_core.LLTMLayer(3, 5)


def test_the_dropout_warning_of_a_layer_made_from_a_cell_names_the_callers_line():
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1") as said:
        lltm_core.LLTMLayer.from_cell(lltm_core.LLTM(3, 5), dropout=0.25)
    assert said[0].filename == __file__  # it named lltm_core/layer.py's from_cell


# Each public entry point, called as a user calls it; the first choice of a backend warns.
ENTRY_POINTS = {
    "lltm": lambda: lltm_core.lltm(*make_inputs(2, 3, 4)),
    "lltm_sequence": lambda: lltm_core.lltm_sequence(*make_sequence_inputs(3, 2, 3, 4)),
    "LLTM": lambda: lltm_core.LLTM(3, 4)(torch.randn(2, 3)),
    "LLTMLayer": lambda: lltm_core.LLTMLayer(3, 4)(torch.randn(3, 2, 3)),
    "LLTMLayer no_grad": lambda: torch.no_grad()(lltm_core.LLTMLayer(3, 4, batch_first=True))(torch.randn(2, 3, 3)),
    "get_backend": lambda: lltm_core.get_backend(),
}


@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_warnings_about_the_installed_backends_name_the_callers_line(entry_point, fake_backends):
    # They named lltm_core's files (_cell.py, _registry.py, _ops.py, ...), a fixed number of frames up
    # from the warning whatever the path to it: a -W error filter or a warning's line pointed there.
    fake_backends("lltm-fake", {"nogpu": "nogpu"})  # unavailable, and would have won
    fake_backends("lltm-fake-a", {"dup": "dup_good"})  # one name, two distributions
    fake_backends("lltm-fake-b", {"dup": "dup_bad"})
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ENTRY_POINTS[entry_point]()
    ours = [w for w in said if "lltm backend" in str(w.message)]
    assert {w.category for w in ours} == {RuntimeWarning, lltm_core.BackendUnavailableWarning}, ours
    assert [w.filename for w in ours] == [__file__] * len(ours), [(w.filename, w.lineno) for w in ours]


def test_a_warning_under_torch_and_code_it_generates_names_the_callers_line():
    # torch.export runs a forward through torch's frames and a <string> function of its making: the export
    # warning of Python kernels (lltm_core/_trace.py) named that.  Exporting takes seconds; these frames
    # stand in for it, each compiled under the file name it would have.
    namespace = {"warnings": warnings, "_notices": _notices}
    for source, filename in (
            ("def warn_in_lltm():\n    warnings.warn('deep', stacklevel=_notices.user_stacklevel())",
             os.path.join(os.path.dirname(lltm_core.__file__), "_exporting.py")),
            ("generated = lambda: warn_in_lltm()", "<string>"),
            ("def torch_runs(function):\n    return function()", os.path.join(os.path.dirname(torch.__file__), "_x.py"))):
        exec(compile(source, filename, "exec"), namespace)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        namespace["torch_runs"](namespace["generated"])
    assert [(w.filename, str(w.message)) for w in said] == [(__file__, "deep")]


def test_a_backends_warning_names_the_callers_line_through_its_own_frames(tmp_path):
    # lltm_core.extension.user_stacklevel(package): the backend's frames are on the way too, as deep as
    # they go, and lltm-core's and torch's above them.  Each frame is compiled under the file name it
    # would have.
    from lltm_core.extension import user_stacklevel

    package = tmp_path / "backend_pkg"
    namespace = {"warnings": warnings, "user_stacklevel": user_stacklevel, "package": str(package)}
    for source, filename in (
            ("def warn_in_backend():\n    warnings.warn('deep', stacklevel=user_stacklevel(package))",
             str(package / "_fit.py")),
            ("def backend_kernel():\n    return warn_in_backend()", str(package / "_sequence.py")),
            ("def lltm_calls(function):\n    return function()",
             os.path.join(os.path.dirname(lltm_core.__file__), "_x.py")),
            ("def torch_runs(function):\n    return lltm_calls(function)",
             os.path.join(os.path.dirname(torch.__file__), "_x.py"))):
        exec(compile(source, filename, "exec"), namespace)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        namespace["torch_runs"](namespace["backend_kernel"])
    assert [(w.filename, str(w.message)) for w in said] == [(__file__, "deep")]


@pytest.mark.parametrize("packed", [False, True], ids=["tensor", "packed"])
def test_autocast_runs_the_layer_in_its_dtype_as_it_runs_nn_lstm(packed):
    torch.manual_seed(3)
    linear, layer = torch.nn.Linear(3, 3), lltm_core.LLTMLayer(3, 5, num_layers=2, bidirectional=True)
    x = torch.randn(6, 2, 3)
    hx = (torch.randn(4, 2, 5), torch.randn(4, 2, 5))  # float32 state, as nn.LSTM takes under autocast
    with torch.autocast("cpu", torch.bfloat16):
        features = linear(x)
        assert features.dtype == torch.bfloat16
        assert torch.nn.LSTM(3, 5)(features)[0].dtype == torch.bfloat16  # the rule followed
        if packed:
            features = torch.nn.utils.rnn.pack_padded_sequence(features, torch.tensor([6, 4]))
        output, (h_n, c_n) = layer(features, hx)
    if packed:
        output = torch.nn.utils.rnn.pad_packed_sequence(output)[0]
    assert output.dtype == h_n.dtype == c_n.dtype == torch.bfloat16
    # What it computes: the layer with input, state and parameters in bfloat16.
    expected = layer.to(torch.bfloat16)(
        features.to(torch.bfloat16), tuple(t.to(torch.bfloat16) for t in hx))[0]
    if packed:
        expected = torch.nn.utils.rnn.pad_packed_sequence(expected)[0]
    torch.testing.assert_close(output, expected)
    layer.float()
    with torch.autocast("cpu", torch.bfloat16):
        output = layer(linear(x))[0]
    output.float().sum().backward()  # gradients reach the float32 parameters, in float32
    assert layer.weights_l0.grad.dtype == torch.float32 and layer.weights_l0.grad.abs().sum() > 0


def test_autocast_leaves_a_float64_layer_in_float64_as_it_leaves_nn_lstm():
    # A float64 layer under autocast computed in bfloat16 (about 3 significant digits), silently: autocast
    # casts no float64 tensor, for nn.LSTM or any other op.
    torch.manual_seed(4)
    layer = lltm_core.LLTMLayer(3, 5, num_layers=2, dtype=torch.float64)
    x = torch.randn(6, 2, 3, dtype=torch.float64)
    with torch.autocast("cpu", torch.bfloat16):
        assert torch.nn.LSTM(3, 5, dtype=torch.float64)(x)[0].dtype == torch.float64  # the rule followed
        output, (h_n, c_n) = layer(x)
    assert output.dtype == h_n.dtype == c_n.dtype == torch.float64
    reference = lltm_core.LLTMLayer(3, 5, num_layers=2, dtype=torch.float64, backend="ref")
    reference.load_state_dict(layer.state_dict())
    torch.testing.assert_close(output, reference(x)[0], rtol=1e-12, atol=1e-12)


def test_cell_blames_hx_and_input_not_old_h_and_weights():
    cell = lltm_core.LLTM(3, 5)
    hx = (torch.randn(2, 5, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"^LLTM\(.*\): hx's h has dtype torch.float64, expected torch.float32"):
        cell(torch.randn(2, 3), hx)
    with pytest.raises(TypeError, match=r"^LLTM\(.*\): input has dtype torch.float64, expected torch.float32 "
                                        r"\(the dtype of the parameters"):
        cell(torch.randn(2, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"input has dtype torch.float64"):
        cell(torch.randn(2, 3, dtype=torch.float64), hx)


def test_reverse_takes_numpy_bool():
    """Configuration read from numpy arrives as numpy's bool: it runs as Python's bool does."""
    numpy = pytest.importorskip("numpy")
    torch.manual_seed(0)
    layer = lltm_core.LLTMLayer(3, 5)
    args = (torch.randn(3, 2, 3), layer.weights_l0, layer.bias_l0, torch.randn(2, 5), torch.randn(2, 5))
    for flag in (True, False):
        got = lltm_core.lltm_sequence(*args, reverse=numpy.bool_(flag))
        want = lltm_core.lltm_sequence(*args, reverse=flag)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert not torch.equal(lltm_core.lltm_sequence(*args, reverse=numpy.bool_(True))[1],
                           lltm_core.lltm_sequence(*args, reverse=numpy.bool_(False))[1])


@pytest.mark.parametrize("reverse, named", [(1, "int 1"), ("yes", "str 'yes'"), (None, "NoneType None")])
def test_reverse_refuses_what_is_not_a_bool(reverse, named):
    layer = lltm_core.LLTMLayer(3, 5)
    with pytest.raises(TypeError, match=rf"reverse must be a bool \(Python's or numpy's\), got {named} "
                                        rf"\(pass bool\(reverse\) if you mean its truth value\)"):
        lltm_core.lltm_sequence(torch.randn(3, 2, 3), layer.weights_l0, layer.bias_l0, torch.zeros(2, 5),
                                torch.zeros(2, 5), reverse=reverse)


def test_reverse_refusal_names_a_foreign_type_with_its_module():
    numpy = pytest.importorskip("numpy")
    layer = lltm_core.LLTMLayer(3, 5)
    with pytest.raises(TypeError, match=r"reverse must be a bool .*, got numpy\.int64 "):
        lltm_core.lltm_sequence(torch.randn(3, 2, 3), layer.weights_l0, layer.bias_l0, torch.zeros(2, 5),
                                torch.zeros(2, 5), reverse=numpy.int64(1))


def test_info_device_that_torch_does_not_know_is_a_clear_error(capsys):
    assert cli.main(["info", "--explain", "cell", "--shape", "1,2,3", "--device", "foo"]) == 2
    err = capsys.readouterr().err
    assert "--device 'foo' is not a device torch knows" in err and "Traceback" not in err


def test_info_shape_without_explain_says_it_needs_explain(capsys):
    assert cli.main(["info", "--shape", "1,2,3"]) == 2
    assert "--shape goes with --explain cell|sequence" in capsys.readouterr().err


def test_info_explains_a_call_the_checks_reject_as_rejected(capsys):
    code = cli.main(["info", "--explain", "sequence", "--shape", "0,1,1,1"])
    out = capsys.readouterr().out
    assert "rejected before any backend is asked" in out and "input has 0 time steps" in out, out
    assert code == 1 and "chosen" not in out


def test_info_says_what_to_do_with_a_torch_older_than_the_wheels_need():
    assert cli._torch_too_old_note("2.10.0") == cli._torch_too_old_note("2.14.1+cu130") == ""
    note = cli._torch_too_old_note("2.9.1+cpu")
    assert "torch 2.9.1+cpu is older than 2.10" in note and "pip install 'torch>=2.10'" in note
    assert "replaces it with the newest torch" in note


def test_info_prints_the_torch_note(monkeypatch, capsys):
    monkeypatch.setattr(cli.torch, "__version__", "2.9.1")
    data = cli.info_data()
    cli.print_info(data)
    assert "note: torch 2.9.1 is older than 2.10" in capsys.readouterr().out


def test_autocast_under_torch_compile_fullgraph():
    torch.manual_seed(5)
    layer, linear = lltm_core.LLTMLayer(3, 5, backend="ref"), torch.nn.Linear(3, 3)
    compiled = torch.compile(lambda x: layer(linear(x))[0], fullgraph=True)
    x = torch.randn(4, 2, 3)
    with torch.autocast("cpu", torch.bfloat16):
        got, want = compiled(x), layer(linear(x))[0]
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert compiled(x).dtype == torch.float32  # recompiled without autocast
