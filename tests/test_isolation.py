"""A disabled backend is never imported, a named one is the only one loaded, and none can break a report.

The heavy plugin below sleeps at import, as a plugin that loads a large
library or probes hardware would.  Whether it ran is read from sys.modules,
not from a clock.
"""

from __future__ import annotations

import logging
import sys
import warnings

import pytest
import torch

import lltm_core
from lltm_core import cli
from lltm_core.testing import make_inputs

from conftest import write_distribution

HEAVY = '''
import time
import dataclasses
import lltm_ref

time.sleep(0.5)

def load_backend():
    return dataclasses.replace(lltm_ref.load_backend(), name="heavy", priority=40)
'''


@pytest.fixture
def heavy(fake_backends, tmp_path):
    """Installs a plugin, 'heavy', whose module takes seconds to import; yields whether it was imported."""
    (tmp_path / "lltm_fake_heavy.py").write_text(HEAVY)
    write_distribution(tmp_path, "lltm-fake-heavy", {"heavy": "lltm_fake_heavy:load_backend"})
    fake_backends("lltm-fake", {})  # refresh: discovery sees it
    yield lambda: "lltm_fake_heavy" in sys.modules
    sys.modules.pop("lltm_fake_heavy", None)


def test_a_disabled_backend_is_never_imported(heavy, monkeypatch):
    monkeypatch.setenv("LLTM_DISABLE_BACKENDS", "heavy")
    lltm_core.lltm(*make_inputs(2, 3, 4))
    lltm_core.LLTMLayer(3, 4)(torch.randn(5, 2, 3))
    assert lltm_core.available_backends() == ["ref"]
    rows = {r["name"]: r for r in lltm_core.backend_report()}
    assert rows["heavy"]["status"] == "disabled" and rows["heavy"]["distribution"] == "lltm-fake-heavy"
    cli.info_data()
    lltm_core.explain(lltm_core.Call("cell", "cpu", torch.float32, 2, 3, 4, None, True))
    with pytest.raises(lltm_core.BackendError, match="disabled: hidden by LLTM_DISABLE_BACKENDS"):
        lltm_core.get_backend("heavy")
    assert not heavy()


@pytest.mark.parametrize("how", ["backend=", "LLTM_BACKEND", "use_backend"])
def test_a_named_backend_is_the_only_one_loaded(heavy, monkeypatch, how):
    inputs = make_inputs(2, 3, 4)
    if how == "backend=":
        lltm_core.lltm(*inputs, backend="ref")
        lltm_core.LLTMLayer(3, 4, backend="ref")(torch.randn(5, 2, 3))
    elif how == "LLTM_BACKEND":
        monkeypatch.setenv("LLTM_BACKEND", "ref")
        lltm_core.lltm(*inputs)
        lltm_core.explain(lltm_core.Call("sequence", "cpu", torch.float32, 2, 3, 4, 5, True))
    else:
        with lltm_core.use_backend("ref"):
            lltm_core.lltm(*inputs)
    assert not heavy()
    # Choosing among all loads it: the check above can fail.
    monkeypatch.delenv("LLTM_BACKEND", raising=False)
    assert lltm_core.get_backend().name == "heavy"
    assert heavy()


def test_reports_survive_backends_whose_import_or_factory_raises(fake_backends):
    fake_backends("lltm-fake", {"broken": "broken", "exits": "exits", "not_backend": "not_backend",
                                "bad_devices": "bad_devices"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", lltm_core.BackendUnavailableWarning)
        assert lltm_core.available_backends() == ["ref"]
        rows = {r["name"]: r for r in lltm_core.backend_report()}
        data = cli.info_data()
    assert {n: r["status"] for n, r in rows.items()} == {
        "broken": "unavailable", "exits": "unavailable", "not_backend": "unavailable", "bad_devices": "unavailable",
        "ref": "available"}
    assert "ImportError: libfoo.so" in rows["broken"]["reason"]
    assert "SystemExit" in rows["exits"]["reason"]
    assert {s["backend"] for s in data["selection"] if s["dtype"] in ("float32", "float64")} == {"ref"}


def test_the_fallback_warning_names_the_backend_that_ran(fake_backends):
    """A higher-priority backend declines every call through should_run; another is broken: ref runs it."""
    fake_backends("lltm-fake", {"declines_all": "declines_all", "broken": "broken"})
    with pytest.warns(lltm_core.BackendUnavailableWarning) as warned:
        lltm_core.lltm(*make_inputs(2, 3, 4))
    assert [str(w.message).split("'")[1] for w in warned] == ["broken"]
    assert "cpu float32 tensors use 'ref' instead" in str(warned[0].message), str(warned[0].message)


def test_a_raising_should_run_is_logged_once_per_backend(fake_backends, caplog):
    fake_backends("lltm-fake", {"raising": "raising"})
    with caplog.at_level(logging.WARNING, logger="lltm_core"):
        for S in (4, 5, 6, 7):  # a new call shape each time, as training with varying shapes makes
            lltm_core.lltm(*make_inputs(2, 3, S))
    said = [r for r in caplog.records if "should_run raised ZeroDivisionError" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    # ... and every call still declined it: the trace for a shape not yet met says so too.
    trace = {t.name: t for t in lltm_core.explain(lltm_core.Call("cell", "cpu", torch.float32, 2, 3, 9, None, False))}
    assert trace["raising"].verdict == "declined"
