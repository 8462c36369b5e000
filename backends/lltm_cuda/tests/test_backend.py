"""The backend as lltm-core sees it: metadata, and why it is unavailable. GPU-free."""

from __future__ import annotations

import math
from importlib import metadata

import pytest
import torch

try:
    import lltm_cuda
except ModuleNotFoundError as exc:
    # Only lltm-cuda's absence skips: an installed one that fails to import is a failure.
    if exc.name != "lltm_cuda":
        raise
    pytest.skip("lltm-cuda is not installed (building it needs the CUDA toolkit)", allow_module_level=True)
import lltm_core  # noqa: E402
from lltm_cuda import _build_info  # noqa: E402


def test_entry_point():
    (ep,) = [ep for ep in metadata.entry_points(group="lltm.backends") if ep.name == "cuda"]
    assert ep.value == "lltm_cuda:load_backend"


def test_backend_metadata():
    backend = lltm_cuda.load_backend()
    assert backend.name == "cuda"
    assert backend.priority == 100
    assert backend.devices == {"cuda"}
    assert backend.dtypes == {torch.float16, torch.bfloat16, torch.float32, torch.float64}
    assert lltm_core.INTERFACE_VERSION in backend.interface_versions
    assert backend.interface_versions == (1, 2, 3)  # 3: sequence_forward takes needs_backward
    assert backend.saved_layout(2, 3, 5) == {"X": (2, 8), "gates": (2, 15), "tanh_cell": (2, 5)}
    assert backend.has_sequence_kernels
    assert backend.sequence_saved_layout(7, 2, 3, 5) == {"gates": (7, 2, 15), "tanh_cell": (7, 2, 5)}


@pytest.mark.parametrize("T, B, I, S", [(1, 1, 1, 1), (64, 16, 32, 128), (3, 5, 1024, 7)])
def test_sequence_saves_within_the_bound(T, B, I, S):
    """The contract allows (6S + I)·T·B saved elements counting the input and output lltm-core holds."""
    saved = sum(math.prod(shape) for shape in lltm_cuda.sequence_saved_layout(T, B, I, S).values())
    assert saved + (I + S) * T * B <= (6 * S + I) * T * B


def _fake_runtime(monkeypatch, *, version=None, cuda="13.0", device=True, load_error=None, capability=None):
    """Make the running torch look like another one, so every branch runs on any machine."""
    monkeypatch.setattr(torch, "__version__", version or _build_info.TORCH_VERSION)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: device)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1 if device else 0)
    monkeypatch.setattr(lltm_cuda, "_build_info", type("BuildInfo", (), {
        "TORCH_VERSION": _build_info.TORCH_VERSION, "TARGET_TORCH": _build_info.TARGET_TORCH,
        "CUDA_VERSION": "13.0", "ARCH_LIST": "8.0;9.0+PTX", "LIBRARY_NAME": _build_info.LIBRARY_NAME,
        "LIBRARY_SIZE": _build_info.LIBRARY_SIZE, "LIBRARY_SHA256": _build_info.LIBRARY_SHA256}))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability or (9, 0))

    def load_library():
        if load_error is not None:
            raise load_error

    monkeypatch.setattr(lltm_cuda, "_load_library", load_library)


def test_torch_older_than_the_target(monkeypatch):
    # Checked first, before the library is touched: its stable-ABI calls are not in an older torch.
    _fake_runtime(monkeypatch, version="2.9.1+cu130", load_error=OSError("must not load"))
    reason = lltm_cuda.unavailable_reason()
    assert reason.startswith("lltm-cuda needs torch 2.10 or newer"), reason
    assert "running 2.9.1+cu130" in reason and "pip install 'torch>=2.10'" in reason


@pytest.mark.parametrize("version", ["2.10.0+cu130", "2.11.0+cu130", "2.14.1+cu130", "2.20.0.dev20270101+cu130"])
def test_any_torch_from_the_target_on(monkeypatch, version):
    """One build for every torch >= 2.10 (the stable ABI): not only the torch that built it."""
    _fake_runtime(monkeypatch, version=version)
    assert lltm_cuda.unavailable_reason() is None


def test_another_cuda_major(monkeypatch):
    _fake_runtime(monkeypatch, cuda="12.8", load_error=OSError("must not load"))
    reason = lltm_cuda.unavailable_reason()
    assert reason.startswith("lltm-cuda was built for CUDA 13 (CUDA 13.0), and the running torch"), reason
    assert "install the lltm-cuda wheel built for CUDA 12" in reason


def test_another_cuda_minor_runs(monkeypatch):
    _fake_runtime(monkeypatch, cuda="13.2")
    assert lltm_cuda.unavailable_reason() is None


def test_cpu_only_torch(monkeypatch):
    _fake_runtime(monkeypatch, cuda=None, device=False)
    assert "is a CPU-only build" in lltm_cuda.unavailable_reason()


def test_no_device(monkeypatch):
    _fake_runtime(monkeypatch, device=False)
    assert lltm_cuda.unavailable_reason().startswith("no CUDA device visible")


def test_library_fails_to_load(monkeypatch):
    _fake_runtime(monkeypatch, load_error=OSError("libcudart.so.13: cannot open shared object file"))
    reason = lltm_cuda.unavailable_reason()
    assert reason.startswith(f"the compiled library {lltm_cuda.library_path()} failed to load"), reason
    assert "libcudart.so.13" in reason


def test_gpu_the_library_has_no_code_for(monkeypatch):
    _fake_runtime(monkeypatch, capability=(7, 5))  # built for 8.0;9.0+PTX
    reason = lltm_cuda.unavailable_reason()
    assert reason.startswith("cuda:0: this GPU is sm_75 but lltm-cuda was built for TORCH_CUDA_ARCH_LIST='8.0;9.0+PTX'")
    assert "rebuild with TORCH_CUDA_ARCH_LIST=7.5" in reason


@pytest.mark.parametrize("arch_list, capability, runs", [
    ("8.0;9.0+PTX", (8, 0), True),
    ("8.0;9.0+PTX", (8, 6), True),    # sm_80 machine code runs on sm_86
    ("8.0;9.0+PTX", (9, 0), True),
    ("8.0;9.0+PTX", (10, 0), True),   # through 9.0's PTX
    ("8.0;9.0+PTX", (7, 5), False),
    ("9.0", (9, 0), True),            # what gpu_check.sh builds for the H200
    ("9.0", (10, 0), False),          # no PTX: nothing for a newer major
    ("9.0", (8, 0), False),
    ("9.0a", (9, 0), True),
    ("9.0a", (9, 1), False),          # architecture-specific: that GPU only
    ("10.0a", (10, 3), False),
    ("10.0f", (10, 3), True),         # family-specific: sm_100f runs on sm_103 ...
    ("10.0f", (10, 0), True),
    ("10.3f", (10, 0), False),        # ... not on an older member ...
    ("10.0f", (12, 0), False),        # ... nor on another major
    ("10.0f+PTX", (12, 0), False),    # its PTX is the family's too
    ("8.0;8.6", (8, 9), True),
    ("Hopper", (9, 0), True),         # a name: not guessed at
    ("", (9, 0), True),               # nothing recorded: not guessed at either
])
def test_arch_mismatch(arch_list, capability, runs):
    assert (lltm_cuda.arch_mismatch(arch_list, capability) is None) == runs


def test_available(monkeypatch):
    _fake_runtime(monkeypatch)
    assert lltm_cuda.unavailable_reason() is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible")
def test_lltm_core_reports_the_reason():
    lltm_core.refresh()
    (entry,) = [r for r in lltm_core.backend_report() if r["name"] == "cuda"]
    assert entry["status"] == "unavailable"
    assert entry["reason"] == lltm_cuda.unavailable_reason()
    inputs = [torch.zeros(shape) for shape in [(1, 2), (3, 3), (3,), (1, 1), (1, 1)]]
    with pytest.raises(lltm_core.BackendError, match="'cuda'.*unavailable"):
        lltm_core.lltm(*inputs, backend="cuda")


def test_unavailable_kernels_say_why(monkeypatch):
    _fake_runtime(monkeypatch, device=False)
    backend = lltm_cuda.load_backend()
    assert backend.availability() == lltm_cuda.unavailable_reason()
    for kernel in (backend.forward, backend.backward, backend.sequence_forward, backend.sequence_backward):
        with pytest.raises(RuntimeError, match="no CUDA device visible"):
            kernel()
