"""The conformance kit catches a backend that breaks the contract, and says how.

Each fake backend (tests/conftest.py) is lltm-ref with one defect; the kit runs
against it in a subprocess, as an author would run it, and must fail the test
that checks that part of the contract with a message naming the problem.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import FAKE_MODULE, write_distribution


@pytest.fixture(scope="module")
def fake_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    (site / "lltm_fake_backends.py").write_text(FAKE_MODULE)
    names = ["wrong", "none_grad_x", "dense_only", "mutating", "aliasing", "bad_layout", "float32_only",
             "v1_only", "seq_wrong", "seq_no_lengths", "seq_aliasing", "seq_hoarding", "seq_keeping", "unsteady",
             "answers_none_kit"]
    write_distribution(site, "lltm-fake-broken", {n: f"lltm_fake_backends:{n}" for n in names})
    return site


def _kit(site, backend: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    env.pop("LLTM_BACKEND", None)
    env.pop("LLTM_DISABLE_BACKENDS", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs", "lltm_core.testing",
         "--lltm-backend", backend, "--lltm-dtype", "float32", *args],
        capture_output=True, text=True, env=env, cwd=site, timeout=600,
    )


@pytest.mark.parametrize("backend, failing_test, message", [
    ("wrong", "test_matches_reference", "relative error above"),
    ("none_grad_x", "test_kernels_keep_the_contract", "grad_X must be a tensor, got NoneType"),
    ("dense_only", "test_gradients_of_a_sum", "gradients of new_h.sum() + new_cell.sum(): relative error"),
    ("mutating", "test_kernels_keep_the_contract", "wrote to its argument grad_new_cell"),
    ("aliasing", "test_kernels_keep_the_contract", "saved 'tanh_cell' shares memory with its argument old_cell"),
    ("bad_layout", "test_kernels_keep_the_contract", "saved 'X' has shape (3, 9), expected (3, 5)"),
    ("seq_wrong", "test_layer_matches_reference", "LLTMLayer on seq_wrong, case T1: relative error above"),
    ("seq_no_lengths", "test_lltm_sequence_matches_reference", "relative error above"),
    ("seq_aliasing", "test_sequence_kernels_keep_the_contract", "c_n shares memory with output"),
    ("seq_hoarding", "test_sequence_keeps_at_most_the_bound", "more than the bound (6S + I_k)"),
    ("seq_keeping", "test_inference_forward_keeps_nothing", "saved slot 0 has shape (301, 7, 15), expected (0,)"),
    ("unsteady", "test_per_call_answers_are_well_formed", "answered True, then False"),
    ("answers_none_kit", "test_per_call_answers_are_well_formed",
     "returned None: it must return True, False or a reason string"),
])
def test_the_kit_catches_a_contract_breaker(fake_site, backend, failing_test, message):
    run = _kit(fake_site, backend, "-k", failing_test)
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"FAILED" in run.stdout and failing_test in run.stdout, run.stdout
    assert message in run.stdout, run.stdout
    assert "rerun with --lltm-seed" in run.stdout  # the seed is beside the failure, even under -q


def test_the_kit_says_float64_is_required(fake_site):
    run = _kit(fake_site, "float32_only", "-k", "test_declares_the_dtypes")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "the contract requires float32 and float64" in run.stdout and "missing ['float64']" in run.stdout


def test_a_v1_backend_passes_the_sequence_tests_through_its_step_kernels(fake_site):
    """A backend written before the sequence kernels: LLTMLayer loops its step kernels and is checked; the
    tests of sequence kernels skip, saying why."""
    run = _kit(fake_site, "v1_only", "-rs", "-k", "test_sequence.py and (float32 or gradcheck)")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "passed" in run.stdout and "has no sequence kernels (interface version 1)" in run.stdout, run.stdout


def test_the_kit_passes_the_reference(fake_site):
    run = _kit(fake_site, "ref", "-k", "keep_the_contract or gradients_of_a_sum or declares")
    assert run.returncode == 0, run.stdout + run.stderr


def test_an_absent_device_skips_with_its_reason(fake_site):
    """With no backend named and no GPU, every kit test skips and says why (not "empty parameter set")."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here, so --lltm-device cuda does not skip")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "--pyargs", "lltm_core.testing",
         "--lltm-device", "cuda"],
        capture_output=True, text=True, cwd=fake_site, timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "passed" not in run.stdout and "skipped" in run.stdout, run.stdout
    assert "--lltm-device cuda: " in run.stdout and "empty parameter set" not in run.stdout, run.stdout


def test_a_named_backend_that_does_not_take_the_device_fails(fake_site):
    """Named with a device it does not declare, a backend fails the run with the reason, not an empty skip."""
    run = _kit(fake_site, "float32_only", "--lltm-device", "meta", "-k", "declares or matches_reference")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "cannot take meta float32 tensors" in run.stdout and "skipped" not in run.stdout, run.stdout
