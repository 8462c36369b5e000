"""Discovery, loading and the selection rule, through real entry points."""

from __future__ import annotations

import logging
import warnings
import subprocess
import sys

import pytest
import torch

import lltm_core
from lltm_core import BackendError
from lltm_core.testing import make_inputs


def _report_rows():
    """backend_report() keyed by (backend name, distribution)."""
    return {(r["name"], r["distribution"]): r for r in lltm_core.backend_report()}


def test_import_loads_no_backend():
    code = (
        "import sys, lltm_core; "
        "loaded = [m for m in sys.modules if m.startswith(('lltm_ref', 'lltm_cpu', 'lltm_cuda'))]; "
        "assert not loaded, loaded; "
        "lltm_core.available_backends(); "
        "assert 'lltm_ref' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_reference_is_always_there():
    assert "ref" in lltm_core.available_backends()


def test_priority_then_name(fake_backends):
    fake_backends("lltm-fake", {"fast": "fast", "alpha": "alpha"})
    # Both priority 50 > ref's 0: the tie goes to the name that sorts first.
    assert lltm_core.get_backend(device="cpu", dtype=torch.float32).name == "alpha"
    # Neither takes float64: the reference does.
    assert lltm_core.get_backend(device="cpu", dtype=torch.float64).name == "ref"


def test_broken_backends_are_reported_not_raised(fake_backends):
    fake_backends("lltm-fake", {"broken": "broken", "future": "future", "nogpu": "nogpu",
                                "misnamed": "misnamed", "not_backend": "not_backend", "bad_devices": "bad_devices",
                                "bad_priority": "bad_priority", "exits": "exits"})
    report = {r["name"]: r for r in lltm_core.backend_report()}
    assert "TypeError: Backend 'bad_devices': devices must be a set of device type names" in report["bad_devices"]["reason"]
    assert "priority must be an int, got '100'" in report["bad_priority"]["reason"]
    assert "SystemExit: a plugin that calls sys.exit()" in report["exits"]["reason"]
    assert report["broken"]["status"] == "unavailable"
    assert "ImportError: libfoo.so" in report["broken"]["reason"]
    assert "interface [99]" in report["future"]["reason"] and "speaks [1, 2, 3]" in report["future"]["reason"]
    assert report["nogpu"]["reason"] == "no CUDA device visible"
    assert "calls itself 'something_else'" in report["misnamed"]["reason"]
    assert "not lltm_core.Backend" in report["not_backend"]["reason"]
    assert report["broken"]["distribution"] == "lltm-fake" and report["broken"]["version"] == "0.1"
    # ...and none of them stops the reference from working, though each that might have won is named.
    assert lltm_core.available_backends() == ["ref"]
    with pytest.warns(lltm_core.BackendUnavailableWarning) as warned:
        new_h, _ = lltm_core.lltm(*make_inputs(2, 3, 4))
    assert new_h.shape == (2, 4)
    named = {str(w.message).split("'")[1] for w in warned}
    assert named == set(report) - {"ref"}, named


def test_explicit_request_for_unavailable_backend_fails_with_reason(fake_backends):
    fake_backends("lltm-fake", {"nogpu": "nogpu"})
    with pytest.raises(BackendError, match=r"'nogpu'.*backend=.*unavailable: no CUDA device visible.*Also installed: ref"):
        lltm_core.lltm(*make_inputs(2, 3, 4), backend="nogpu")


def test_a_named_backend_is_checked_on_a_device_it_runs_on(fake_backends):
    """get_backend("cuda") asks for lltm-cuda: it must not fail for not taking CPU tensors."""
    fake_backends("lltm-fake", {"gpu_only": "gpu_only"})
    assert lltm_core.get_backend("gpu_only").name == "gpu_only"
    assert lltm_core.get_backend("ref").name == "ref"  # takes the CPU: checked there
    with pytest.raises(BackendError, match=r"'gpu_only'.*cannot take cpu float32 tensors"):
        lltm_core.get_backend("gpu_only", device="cpu")


def test_unknown_backend_names_it_and_says_what_to_install(fake_backends):
    # fake_backends: only lltm-ref is visible, even where lltm-cuda is installed
    with pytest.raises(BackendError) as err:
        lltm_core.get_backend("cuda")
    message = str(err.value)
    assert "'cuda'" in message and "not installed" in message
    assert "installed: ref" in message
    assert "pip install" in message and "./backends/lltm_cuda" in message
    # every backend of this repository has its command (triton's said "install the distribution that provides it")
    for name in ("ref", "cpu", "cuda", "triton"):
        assert f"./backends/lltm_{name}" in lltm_core._discovery.not_found_message(name, "backend=")


def test_explicit_request_never_falls_back(fake_backends):
    fake_backends("lltm-fake", {"fast": "fast"})
    inputs = make_inputs(2, 3, 4, dtype=torch.float64)
    with pytest.raises(BackendError, match=r"'fast'.*cannot take cpu float64.*takes float32.*`lltm info` shows which backend takes which tensors"):
        lltm_core.lltm(*inputs, backend="fast")


def test_env_backend(fake_backends, monkeypatch):
    fake_backends("lltm-fake", {"fast": "fast"})
    monkeypatch.setenv("LLTM_BACKEND", "ref")
    assert lltm_core.get_backend().name == "ref"
    monkeypatch.setenv("LLTM_BACKEND", "nosuch")
    with pytest.raises(BackendError, match=r"'nosuch' \(asked for by LLTM_BACKEND=nosuch\) is not installed"):
        lltm_core.lltm(*make_inputs(2, 3, 4))


def test_use_backend_context_beats_env_and_nests(fake_backends, monkeypatch):
    fake_backends("lltm-fake", {"fast": "fast"})
    monkeypatch.setenv("LLTM_BACKEND", "fast")
    assert lltm_core.get_backend().name == "fast"
    with lltm_core.use_backend("ref"):
        assert lltm_core.get_backend().name == "ref"
        with lltm_core.use_backend("fast"):
            assert lltm_core.get_backend().name == "fast"
        assert lltm_core.get_backend().name == "ref"
        # the argument beats the context
        assert lltm_core.get_backend("fast").name == "fast"
    assert lltm_core.get_backend().name == "fast"


def test_disable_backends(fake_backends, monkeypatch):
    fake_backends("lltm-fake", {"fast": "fast"})
    assert lltm_core.get_backend().name == "fast"
    monkeypatch.setenv("LLTM_DISABLE_BACKENDS", "fast, other")
    assert lltm_core.get_backend().name == "ref"
    assert "fast" not in lltm_core.available_backends()
    assert _report_rows()[("fast", "lltm-fake")]["status"] == "disabled"
    with pytest.raises(BackendError, match="disabled: hidden by LLTM_DISABLE_BACKENDS"):
        lltm_core.get_backend("fast")


def test_duplicate_names_warn_and_working_copy_wins(fake_backends):
    fake_backends("lltm-fake-a", {"dup": "dup_bad"})
    fake_backends("lltm-fake-b", {"dup": "dup_good"})
    with pytest.warns(RuntimeWarning, match=r"'dup' is claimed by several distributions: lltm-fake-\w.*lltm-fake-\w"):
        names = lltm_core.available_backends()
    assert "dup" in names
    report = _report_rows()
    assert report[("dup", "lltm-fake-a")]["status"] == "unavailable"
    assert report[("dup", "lltm-fake-b")]["status"] == "available"


def test_no_backend_can_take_it_lists_every_rejection(fake_backends, monkeypatch):
    fake_backends("lltm-fake", {"fast": "fast", "broken": "broken"})
    monkeypatch.setenv("LLTM_DISABLE_BACKENDS", "ref")
    with pytest.raises(BackendError) as err:
        lltm_core.get_backend(device="cpu", dtype=torch.float64)
    message = str(err.value)
    assert "no lltm backend can take cpu float64" in message
    assert "broken: unavailable: failed to load: ImportError" in message
    assert "fast: it takes float32, not float64" in message
    assert "ref: disabled: hidden by LLTM_DISABLE_BACKENDS" in message
    # lltm-ref is installed: the advice is about the variable, not about installing it.
    assert "LLTM_DISABLE_BACKENDS=ref hides ref." in message and "pip install" not in message


def test_no_backend_for_the_device_says_so_without_install_advice(fake_backends):
    with pytest.raises(BackendError) as err:
        lltm_core.get_backend(device="meta", dtype=torch.float32)
    message = str(err.value)
    assert "ref: it runs on cpu/cuda/mps/xpu, not meta" in message
    assert "None of the installed backends takes these tensors" in message and "pip install" not in message


def test_decisions_are_logged(fake_backends, caplog):
    fake_backends("lltm-fake", {"fast": "fast"})
    with caplog.at_level(logging.DEBUG, logger="lltm_core"):
        lltm_core.get_backend(device="cpu", dtype=torch.float32)
    assert any("cpu float32 tensors -> fast (priority 50" in r.getMessage() for r in caplog.records)


def test_a_passed_over_broken_backend_warns_once(fake_backends, monkeypatch):
    """nogpu (priority 500, takes CPU float32) cannot run: ref runs, and the user is told, once."""
    fake_backends("lltm-fake", {"nogpu": "nogpu"})
    with pytest.warns(lltm_core.BackendUnavailableWarning, match=r"'nogpu' \(lltm-fake .*unavailable: no CUDA device visible.*use 'ref'"):
        assert lltm_core.get_backend().name == "ref"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lltm_core.get_backend(dtype=torch.float64)  # once per backend, not per device/dtype
        lltm_core.refresh()
        monkeypatch.setenv("LLTM_DISABLE_BACKENDS", "nogpu")  # hidden on purpose: nothing to say
        assert lltm_core.get_backend().name == "ref"


def test_a_backend_that_could_not_win_does_not_warn(fake_backends):
    """Like lltm-cuda on a machine with no GPU: it takes no CPU tensors, so CPU calls lose nothing."""
    fake_backends("lltm-fake", {"cuda_nogpu": "cuda_nogpu"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lltm_core.get_backend().name == "ref"
        fake_backends("lltm-fake-2", {"nogpu": "nogpu"})
        assert lltm_core.get_backend("ref").name == "ref"  # named: nothing was passed over


def test_a_mistyped_name_gets_a_suggestion_and_a_wrong_type_a_type_error(fake_backends):
    with pytest.raises(BackendError, match=r"'REF' \(asked for by get_backend\(\)\) is not installed; did you mean 'ref'\?"):
        lltm_core.get_backend("REF")
    with pytest.raises(TypeError, match="backend= takes a backend name or an lltm_core.Backend, got int 3"):
        lltm_core.lltm(*make_inputs(2, 3, 4), backend=3)


def test_a_list_of_names_is_told_to_name_one(fake_backends, monkeypatch):
    # LLTM_BACKEND=cpu,ref, written as LLTM_DISABLE_BACKENDS takes its names, was answered "did you mean 'ref'?".
    monkeypatch.setenv("LLTM_BACKEND", "cpu,ref")
    with pytest.raises(BackendError, match=r"'cpu,ref' \(asked for by LLTM_BACKEND=cpu,ref\) is not installed; "
                                           r"name one backend, not a list") as raised:
        lltm_core.lltm(*make_inputs(2, 3, 4))
    assert "did you mean" not in str(raised.value)


@pytest.mark.parametrize("name", ["lltm-ref", "lltm_ref", "LLTM-REF"])
def test_a_distributions_name_is_told_its_backends(name):
    # "lltm-ref", as the README's tables name it, was "not installed ... To get it: install the distribution
    # that provides the 'lltm-ref' lltm backend", with lltm-ref installed.
    with pytest.raises(BackendError, match=rf"'{name}' \(asked for by get_backend\(\)\): no backend has that name; "
                                           r"it names the distribution, whose backend is called 'ref'") as raised:
        lltm_core.get_backend(name)
    assert "not installed" not in str(raised.value)


def test_use_backend_checks_the_name_on_entry(fake_backends):
    with pytest.raises(BackendError, match=r"'nosuch' \(asked for by use_backend\(\)\) is not installed"):
        with lltm_core.use_backend("nosuch"):
            pass
