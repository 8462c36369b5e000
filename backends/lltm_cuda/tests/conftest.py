"""Seeds for lltm-cuda's own tests: fresh inputs each run, and a failure says how to repeat it.

The seed is LLTM_SEED (benchmarks/gpu_check.sh sets it and writes it in its
report) or a new one; each test draws from it and its own id.
"""

from __future__ import annotations

import os
import random
import zlib

import pytest
import torch

SEED = int(os.environ.get("LLTM_SEED") or random.SystemRandom().randrange(2**31))


@pytest.fixture(autouse=True)
def _seeded(request):
    torch.manual_seed(SEED ^ zlib.crc32(request.node.nodeid.encode()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if report.failed:
        report.sections.append(("seed", f"LLTM_SEED={SEED} repeats this run"))


def pytest_report_header(config):
    return f"lltm-cuda tests: LLTM_SEED={SEED}"
