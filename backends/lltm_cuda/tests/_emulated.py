"""The build under test, for lltm-cuda's test modules: the emulated one (lltm_cuda_emulated) or the
real one, and setup.py's flags and sources.

With LLTM_CUDA_TEST_EMULATED=1 (`nox -s cuda_emulated`) it was asked for by name: its absence is an
error, never a skip.  Elsewhere (the real build's session) a module that needs it skips, saying why.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

EMULATED = os.environ.get("LLTM_CUDA_TEST_EMULATED") == "1"


def import_or_skip():
    """``lltm_cuda_emulated``, or a module-level skip where it is not asked for and not installed."""
    try:
        import lltm_cuda_emulated
    except ModuleNotFoundError as exc:
        if exc.name != "lltm_cuda_emulated" or EMULATED:
            raise
        pytest.skip("needs the emulated build of lltm-cuda (nox -s cuda_emulated)", allow_module_level=True)
    return lltm_cuda_emulated


def the_build_under_test():
    """The build under test: ``lltm_cuda_emulated`` under LLTM_CUDA_TEST_EMULATED=1 (its
    absence an error), else ``lltm_cuda``, or a module-level skip where that is not installed."""
    if EMULATED:
        import lltm_cuda_emulated

        return lltm_cuda_emulated
    try:
        import lltm_cuda
    except ModuleNotFoundError as exc:
        if exc.name != "lltm_cuda":
            raise
        pytest.skip("lltm-cuda is not installed (building it needs the CUDA toolkit)", allow_module_level=True)
    return lltm_cuda


def setup_py():
    """backends/lltm_cuda/setup.py, imported for its flags and sources (its main() runs only as a script)."""
    setup_dir = str(Path(__file__).resolve().parents[1])
    sys.path.insert(0, setup_dir)
    try:
        import setup
    finally:
        sys.path.remove(setup_dir)
    return setup
