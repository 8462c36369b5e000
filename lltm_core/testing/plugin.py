"""pytest plugin (entry point ``pytest11``) behind ``pytest --pyargs lltm_core.testing``.

Tests that take the ``lltm_backend_name`` and ``lltm_dtype`` fixtures are run
once per (backend, dtype) asked for on the command line.  A backend that was
asked for by name and cannot run fails the test with its reason: a skip would
read as a pass.  Only a device that is absent (no GPU here) skips.
"""

from __future__ import annotations

import random
import zlib

import pytest
import torch

from lltm_core._device import cuda_unavailable_reason

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def pytest_addoption(parser):
    group = parser.getgroup("lltm", "lltm conformance kit")
    group.addoption("--lltm-backend", action="append", default=[], metavar="NAME",
                    help="backend to check (repeatable; default: every available backend for the device)")
    group.addoption("--lltm-device", default="cpu", metavar="DEVICE", help="device to check on (default: cpu)")
    group.addoption("--lltm-dtype", action="append", default=[], choices=sorted(_DTYPES), metavar="DTYPE",
                    help="dtype to check (repeatable; default: every dtype the backend takes)")
    group.addoption("--lltm-seed", type=int, default=None,
                    help="base random seed (default: a fresh one each run, shown in the header)")


def pytest_configure(config):
    seed = config.getoption("--lltm-seed", default=None)
    config._lltm_seed = seed if seed is not None else random.SystemRandom().randrange(2**31)


def pytest_report_header(config):
    return (f"lltm: device={config.getoption('--lltm-device')} seed={config._lltm_seed} "
            f"(rerun with --lltm-seed {config._lltm_seed})")


def _device_skip_reason(device: str) -> str | None:
    kind = torch.device(device).type
    if kind == "cuda" and (why := cuda_unavailable_reason()) is not None:
        return f"--lltm-device {device}: {why}"
    return None


def _default_backends(device: str) -> list[str]:
    import lltm_core
    from lltm_core._discovery import resolve as _resolve

    kind = torch.device(device).type
    return [n for n in lltm_core.available_backends() if kind in _resolve(n).backend.devices]


def pytest_generate_tests(metafunc):
    if "lltm_backend_name" not in metafunc.fixturenames:
        return
    config = metafunc.config
    device = config.getoption("--lltm-device")
    skip = _device_skip_reason(device)
    names = config.getoption("--lltm-backend") or ([] if skip else _default_backends(device))
    asked_dtypes = [_DTYPES[d] for d in config.getoption("--lltm-dtype")]
    default_dtypes = list(_DTYPES.values())

    params = []
    for name in names:
        # The default dtypes the backend claims on this device.  One that claims none (say, a
        # CPU-only backend named with --lltm-device cuda) keeps float32, so that its tests fail
        # with the reason rather than vanish as an empty parameter set.
        dtypes = asked_dtypes or [d for d in default_dtypes if _takes(name, device, d)] or [torch.float32]
        for dtype in dtypes:
            marks = [pytest.mark.skip(reason=skip)] if skip else []
            params.append(pytest.param(name, dtype, id=f"{name}-{str(dtype)[6:]}", marks=marks))
    if not params:
        # No backend named, and the device is absent or no backend runs on it: one skipped
        # placeholder carries the reason, where an empty parametrization says "got empty parameter set".
        why = skip or f"--lltm-device {device}: no available lltm backend runs there (`lltm info` says why)"
        params = [pytest.param("(none)", torch.float32, id=f"{device}-none", marks=[pytest.mark.skip(reason=why)])]
    if "lltm_dtype" not in metafunc.fixturenames:
        # dtype-free tests run once per backend
        seen, unique = set(), []
        for p in params:
            if p.values[0] not in seen:
                seen.add(p.values[0])
                unique.append(pytest.param(p.values[0], id=p.values[0], marks=p.marks))
        metafunc.parametrize("lltm_backend_name", unique)
    else:
        metafunc.parametrize(("lltm_backend_name", "lltm_dtype"), params)


def _takes(name: str, device: str, dtype: torch.dtype) -> bool:
    from lltm_core._discovery import resolve as _resolve

    rec = _resolve(name)
    if rec is None or not rec.available:
        return True  # keep it: the test will fail with the reason
    return rec.backend.supports(torch.device(device).type, dtype) is None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing lltm test shows the seed beside its error (the header, which also shows it, is hidden by -q)."""
    outcome = yield
    report = outcome.get_result()
    seed = getattr(item.config, "_lltm_seed", None)
    if report.failed and seed is not None and any(n.startswith("lltm_") for n in getattr(item, "fixturenames", ())):
        report.sections.append(("lltm", f"seed {seed}: rerun with --lltm-seed {seed}"))


@pytest.fixture
def lltm_seed(request) -> int:
    """The run's base seed.  Asking for it (or any lltm_ fixture) seeds torch for the test, as
    _lltm_fresh_seed does, and a failure then shows it; for backends' own tests
    (``pytestmark = pytest.mark.usefixtures("lltm_seed")``)."""
    return request.config._lltm_seed


@pytest.fixture
def lltm_device(request) -> str:
    return request.config.getoption("--lltm-device")


@pytest.fixture(autouse=True)
def _lltm_fresh_seed(request):
    """Seed torch per test from the run's base seed and the test's id: fresh each run, reproducible."""
    seed = getattr(request.config, "_lltm_seed", None)
    if seed is not None and any(name.startswith("lltm_") for name in request.fixturenames):
        torch.manual_seed(seed ^ zlib.crc32(request.node.nodeid.encode()))
