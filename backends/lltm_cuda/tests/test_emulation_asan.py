"""lltm-cuda's kernels under AddressSanitizer: an access outside a tensor is an error naming the kernel.

compute-sanitizer's memcheck finds a kernel reading or writing past the end of a buffer on a GPU.
The emulated build's NaN fill finds a kernel reading what nothing wrote inside a buffer, but not an
access outside it: that may crash the process, or pass unseen.  Here the emulated library is built
again with -fsanitize=address (every CUDA thread a fiber, as in the emulated build, each switch
announced to ASan), and run in a child with libasan preloaded:

* the kit's sequence comparisons on each sequence path, in the three dtypes the persistent kernels
  take;
* the whole kit on the default path (the cell, float64 per step);
* the emulator's own tests, checks thrown inside fibers among them.

The child must pass and ASan must report nothing: no error, and no stack it was not told of.  The
grid's h buffers allocated without the rows that pad the batch to whole tiles (B rows, not
batch_groups * group_rows) fail here with a heap-buffer-overflow in
persistent_grid_forward_mma_kernel; the plain emulated build only crashes.

Runs on the emulated build (`nox -s cuda_emulated`, which sets LLTM_CUDA_REQUIRE_ASAN=1: a
missing libasan is then an error); elsewhere it skips, saying so.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from _emulated import import_or_skip

lltm_cuda_emulated = import_or_skip()

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = os.environ.get("LLTM_CUDA_REQUIRE_ASAN") == "1"


def _runtime(name: str) -> str | None:
    """The absolute path of a shared library the C++ compiler ships (libasan.so, libstdc++.so.6), or None."""
    compiler = os.environ.get("CXX", "c++")
    try:
        found = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True, text=True,
                               timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return os.path.realpath(found) if os.path.isabs(found) and os.path.exists(found) else None


def _preload() -> str:
    why = None
    if sys.platform != "linux" or platform.machine() != "x86_64":
        why = "runs on Linux x86-64 (the emulator's fibers switch stacks in x86-64 assembly there)"
    elif _runtime("libasan.so") is None or _runtime("libstdc++.so.6") is None:
        why = "needs the C++ compiler's AddressSanitizer runtime (libasan.so): install gcc's libasan"
    if why is not None:
        if REQUIRED:
            pytest.fail(f"LLTM_CUDA_REQUIRE_ASAN=1, but this test {why}")
        pytest.skip(why)
    # libstdc++ after libasan: ASan then finds the __cxa_throw it intercepts (a check that throws).
    return f"{_runtime('libasan.so')} {_runtime('libstdc++.so.6')}"


_BUILD = """
import sys
from torch.utils import cpp_extension
sys.path.insert(0, {setup_dir!r})
from setup import CXX_FLAGS, EMULATED_SOURCES
name, build_dir = sys.argv[1:]
cpp_extension.load(name=name, sources=[{root!r} + "/csrc/lltm.cpp"] + [{root!r} + "/" + s for s in EMULATED_SOURCES],
                   build_directory=build_dir, is_python_module=False,
                   extra_cflags=["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address", "-DLLTM_CUDA_EMULATE",
                                 "-Wno-unknown-pragmas", *CXX_FLAGS],
                   extra_ldflags=["-fsanitize=address"])
""".format(setup_dir=str(ROOT), root=str(ROOT))


@pytest.fixture(scope="module")
def asan_library(tmp_path_factory):
    """(the emulated library built with AddressSanitizer, LD_PRELOAD for a child that loads it)."""
    preload = _preload()
    build_dir = tmp_path_factory.mktemp("asan")
    # Loading it in the builder's own process fails (libasan not preloaded there): the file is what counts.
    run = subprocess.run([sys.executable, "-c", _BUILD, "lltm_cuda_asan", str(build_dir)], capture_output=True,
                         text=True, timeout=900)
    library = build_dir / "lltm_cuda_asan.so"
    assert library.is_file(), f"building the AddressSanitizer library failed:\n{run.stdout}\n{run.stderr}"
    return library, preload


SEQUENCE_KIT = ["--pyargs", "lltm_core.testing.test_sequence", "--lltm-backend", "cuda_emulated",
                "--lltm-dtype", "float32", "--lltm-dtype", "bfloat16", "--lltm-dtype", "float16",
                "-k", "(lltm_sequence_matches or layer_matches or inference) and not S1031 and not float64"]


@pytest.mark.parametrize("path, kit", [
    ({"LLTM_CUDA_SEQUENCE": "persistent", "LLTM_CUDA_CLUSTER": "2"}, SEQUENCE_KIT),
    ({"LLTM_CUDA_SEQUENCE": "grid"}, SEQUENCE_KIT),
    ({"LLTM_CUDA_SEQUENCE": "per-step"}, SEQUENCE_KIT),
    ({}, ["--pyargs", "lltm_core.testing", "--lltm-backend", "cuda_emulated"]),
    ({}, [str(ROOT / "tests" / "test_emulator.py")]),
], ids=["persistent", "grid", "per-step", "default-whole-kit", "emulator"])
def test_no_kernel_reaches_outside_its_tensors(asan_library, tmp_path, path, kit):
    library, preload = asan_library
    env = {k: v for k, v in os.environ.items() if k not in ("LLTM_CUDA_SEQUENCE", "LLTM_CUDA_CLUSTER")}
    env.update(path)
    env.update({"LD_PRELOAD": preload, lltm_cuda_emulated.ENV_EMULATED_LIBRARY: str(library),
                "ASAN_OPTIONS": f"detect_leaks=0:log_path={tmp_path / 'asan'}"})
    # No faulthandler: ASan reports through its own handler, into log_path.
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:faulthandler", "-q",
                          "-rf", *kit], capture_output=True, text=True, env=env, timeout=900)
    reports = [p.read_text() for p in tmp_path.glob("asan*")]
    errors = [r for r in reports if "ERROR: AddressSanitizer" in r]
    assert not errors, "AddressSanitizer:\n" + "\n".join(r[:4000] for r in errors)
    # A check thrown in a fiber unwinds a stack ASan was told of (the emulator announces each switch)
    unknown_stacks = [r for r in reports if "__asan_handle_no_return" in r]
    assert not unknown_stacks, "AddressSanitizer did not know the stack it ran on:\n" + unknown_stacks[0][:2000]
    assert run.returncode == 0, f"the kit under AddressSanitizer failed (exit {run.returncode}):\n" \
                                f"{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
