"""setup.py's toolchain check: what a machine that cannot build lltm-cuda is told.

GPU-free and independent of whether lltm-cuda is installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SETUP_PY = Path(__file__).resolve().parents[1] / "setup.py"


@pytest.fixture(scope="module")
def setup_py():
    # Imported under another name, so its `if __name__ == "__main__"` build does not run.
    spec = importlib.util.spec_from_file_location("lltm_cuda_setup", SETUP_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def toolkit(tmp_path) -> str:
    """A directory laid out like a CUDA toolkit's root (nvcc itself is faked by the `nvcc` argument)."""
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cuda_runtime.h").touch()
    return str(tmp_path)


@pytest.mark.parametrize("nvcc", ["13.0", "13.2"])  # a minor-version difference is fine
def test_matching_toolchain_has_no_problems(setup_py, toolkit, nvcc):
    assert setup_py.toolchain_problems("2.14.1+cu130", "13.0", toolkit, nvcc) == []


def test_cpu_only_torch(setup_py, toolkit):
    (problem,) = setup_py.toolchain_problems("2.13.0+cpu", None, toolkit, "13.0")
    assert "torch 2.13.0+cpu is a CPU-only build" in problem
    assert "torch==2.13.0+cu130" in problem  # the build to install, for the nvcc that is there


def test_no_toolkit(setup_py):
    (problem,) = setup_py.toolchain_problems("2.14.1+cu130", "13.0", None, None)
    assert "no CUDA toolkit found" in problem and "set CUDA_HOME" in problem


def test_cuda_home_without_nvcc(setup_py):
    (problem,) = setup_py.toolchain_problems("2.14.1+cu130", "13.0", "/opt/not-cuda", None)
    assert "CUDA_HOME=/opt/not-cuda has no working bin/nvcc" in problem


def test_not_a_toolkit_root(setup_py, tmp_path):
    # What torch guesses when nvcc on PATH is a wrapper script in /usr/local/bin.
    (problem,) = setup_py.toolchain_problems("2.14.1+cu130", "13.0", str(tmp_path), "13.0")
    assert f"CUDA_HOME={tmp_path} is not a CUDA toolkit's root" in problem


def test_major_version_mismatch(setup_py, toolkit):
    (problem,) = setup_py.toolchain_problems("2.14.1+cu126", "12.6", toolkit, "13.0")
    assert "nvcc is CUDA 13.0 but torch 2.14.1+cu126 was built with CUDA 12.6" in problem
    assert "torch==2.14.1+cu130" in problem and "CUDA 12.x toolkit" in problem


def test_every_problem_is_reported(setup_py):
    problems = setup_py.toolchain_problems("2.13.0+cpu", None, None, None)
    assert len(problems) == 2
    assert "CPU-only" in problems[0] and "no CUDA toolkit" in problems[1]


def test_nvcc_release_reads_nvcc_version(setup_py, tmp_path):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    assert setup_py.nvcc_release(str(tmp_path)) == "13.0"
    assert setup_py.nvcc_release(str(tmp_path / "missing")) is None


def test_setup_py_stops_with_the_reason(tmp_path):
    """The whole build, not just the function: a clear error before anything compiles."""
    pytest.importorskip("torch")
    env = {**os.environ, "CUDA_HOME": str(tmp_path)}  # a toolkit root with no nvcc
    result = subprocess.run(
        [sys.executable, str(SETUP_PY), "--version"], cwd=SETUP_PY.parent, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "lltm-cuda cannot be built here" in result.stderr
    assert f"CUDA_HOME={tmp_path} has no working bin/nvcc" in result.stderr
