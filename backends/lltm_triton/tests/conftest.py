"""lltm-triton's own tests run on a GPU when there is one, else under Triton's interpreter.

TRITON_INTERPRET=1 must be in the environment before Python starts: Triton reads it when each
@triton.jit function is defined, its own tl.zeros and the like included, and torch imports triton
early.  Without a GPU and without it there is nothing to run the kernels on: that is a usage
error, not a skip (nox -s triton sets it).  What the interpreter cannot check is in test_gpu.py;
test_compiled.py compiles the kernels for sm_90 in a process of its own, without it.
"""

from __future__ import annotations

import os

import pytest
import torch


def pytest_configure(config):
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise pytest.UsageError("lltm-triton's tests: no GPU here, so run them under Triton's interpreter: "
                                "TRITON_INTERPRET=1 python -m pytest backends/lltm_triton/tests "
                                "(as nox -s triton does)")


def pytest_report_header(config):
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "lltm-triton: kernels under Triton's interpreter (TRITON_INTERPRET=1), on CPU tensors"
    return f"lltm-triton: kernels compiled by Triton for {torch.cuda.get_device_name()}"
