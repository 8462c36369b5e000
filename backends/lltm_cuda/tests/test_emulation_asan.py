"""lltm-cuda's kernels under AddressSanitizer: an access outside a tensor is an error naming the kernel.

compute-sanitizer's memcheck finds a kernel reading or writing past the end of a buffer on a GPU.
The emulated build's NaN fill finds a kernel reading what nothing wrote inside a buffer, but not an
access outside it: that may crash the process, or pass unseen; nor does it see a misaligned access,
which x86 forgives and a GPU traps on, or other undefined behaviour.  Here the emulated library is
built again with -fsanitize=address,undefined (every CUDA thread a fiber, as in the emulated build,
each switch announced to ASan; UBSan's checks include alignment), and run in a child with libasan
preloaded:

* the kit's sequence comparisons on each sequence path, in the three dtypes the persistent kernels
  take;
* the whole kit on the default path (the cell, float64 per step);
* the emulator's own tests, checks thrown inside fibers among them.

The child must pass and the sanitizers must report nothing: no error, and no stack ASan was not told
of.  The grid's h buffers allocated without the rows that pad the batch to whole tiles (B rows, not
batch_groups * group_rows) fail here with a heap-buffer-overflow in
persistent_grid_forward_mma_kernel; the plain emulated build only crashes.

Shared memory is an arena that holds the device's per-block limit, so in the plain build a kernel
may run past its own shared memory unseen.  Under ASan the emulator poisons the arena past what the
block has (its dynamic shared memory, then each static declaration as it is reached): a planted
defect, the cluster forward's shared memory one h row short, passes the plain build's kit and is
reported here as a use-after-poison in persistent_forward_kernel.  Another, the cluster backward's
float d_gates two bytes off their boundary, is reported as a misaligned store in
persistent_backward_kernel; the plain build sees only wrong numbers.

Runs on the emulated build (`nox -s cuda_emulated`, which sets LLTM_CUDA_REQUIRE_ASAN=1: a
missing libasan is then an error); elsewhere it skips, saying so.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
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
    elif _runtime("libasan.so") is None or _runtime("libstdc++.so.6") is None or _runtime("libubsan.so") is None:
        why = ("needs the C++ compiler's AddressSanitizer and UndefinedBehaviorSanitizer runtimes (libasan.so, "
               "libubsan.so): install gcc's libasan and libubsan")
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
name, build_dir, root, *sources = sys.argv[1:]
sources = sources or ["csrc/lltm.cpp", *EMULATED_SOURCES]
cpp_extension.load(name=name, sources=[root + "/" + s for s in sources], build_directory=build_dir,
                   is_python_module=False,
                   extra_cflags=["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                                 "-fno-sanitize-recover=undefined", "-DLLTM_CUDA_EMULATE",
                                 "-Wno-unknown-pragmas", *CXX_FLAGS],
                   extra_ldflags=["-fsanitize=address,undefined"])
""".format(setup_dir=str(ROOT))


def _build(build_dir: Path, name: str, root: Path = ROOT, sources: tuple[str, ...] = ()) -> Path:
    """The emulated library built with AddressSanitizer from ``root``/csrc (``sources``: all by default)."""
    # Loading it in the builder's own process fails (libasan not preloaded there): the file is what counts.
    run = subprocess.run([sys.executable, "-c", _BUILD, name, str(build_dir), str(root), *sources],
                         capture_output=True, text=True, timeout=900)
    library = build_dir / f"{name}.so"
    assert library.is_file(), f"building the AddressSanitizer library failed:\n{run.stdout}\n{run.stderr}"
    return library


@pytest.fixture(scope="module")
def asan_library(tmp_path_factory):
    """(the emulated library built with AddressSanitizer, LD_PRELOAD for a child that loads it)."""
    preload = _preload()
    return _build(tmp_path_factory.mktemp("asan"), "lltm_cuda_asan"), preload


def _run_kit(library: Path, preload: str, path: dict, kit: list, tmp_path: Path):
    """(the child's CompletedProcess, the sanitizers' reports) of ``kit`` run on ``library`` on sequence ``path``."""
    env = {k: v for k, v in os.environ.items() if k not in ("LLTM_CUDA_SEQUENCE", "LLTM_CUDA_CLUSTER")}
    env.update(path)
    env.update({"LD_PRELOAD": preload, lltm_cuda_emulated.ENV_EMULATED_LIBRARY: str(library),
                "ASAN_OPTIONS": f"detect_leaks=0:log_path={tmp_path / 'asan'}", "UBSAN_OPTIONS": "print_stacktrace=1"})
    # No faulthandler: ASan reports through its own handler, into log_path.  UBSan writes to the
    # child's stderr, and stops it there: --capture=sys leaves that file descriptor to this pipe.
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:faulthandler", "-q",
                          "--capture=sys", "-rf", *kit], capture_output=True, text=True, env=env, timeout=900)
    reports = [p.read_text() for p in tmp_path.glob("asan*")]
    return run, reports + ([run.stderr] if "runtime error:" in run.stderr else [])


def _errors(reports: list[str]) -> list[str]:
    return [r for r in reports if "ERROR: AddressSanitizer" in r or "runtime error:" in r]


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
    run, reports = _run_kit(*asan_library, path, kit, tmp_path)
    errors = _errors(reports)
    assert not errors, "sanitizer reports:\n" + "\n".join(r[:4000] for r in errors)
    # A check thrown in a fiber unwinds a stack ASan was told of (the emulator announces each switch)
    unknown_stacks = [r for r in reports if "__asan_handle_no_return" in r]
    assert not unknown_stacks, "AddressSanitizer did not know the stack it ran on:\n" + unknown_stacks[0][:2000]
    assert run.returncode == 0, f"the kit under AddressSanitizer failed (exit {run.returncode}):\n" \
                                f"{run.stdout[-6000:]}\n{run.stderr[-3000:]}"


# Defects a GPU would trap on, planted in a copy of the sources: (old, new, what the report says).
PLANTED = {
    # The cluster forward's shared memory sized one h row short: its second h buffer's last row lies
    # past the block's shared memory, inside the device's limit.  The plain emulated build passes the
    # kit so.
    "shared-memory-one-row-short": (
        "(cluster ? 2 * batch * row_stride(state_size, element) * element : 0)",
        "(cluster ? (2 * batch - 1) * row_stride(state_size, element) * element : 0)",
        r"use-after-poison(.|\n)*persistent_forward_kernel"),
    # The cluster backward's float d_gates two bytes off their 16-byte boundary, as an offset counted
    # in 16-bit elements would put them: "misaligned address" on a GPU; the plain emulated build,
    # on x86, only gets other numbers (its last float overlaps the next buffer).
    "misaligned-float-d-gates": (
        "float* const dg_s = reinterpret_cast<float*>(bytes);",
        "float* const dg_s = reinterpret_cast<float*>(bytes + 2);",
        r"store to misaligned address .* for type 'float'(.|\n)*persistent_backward_kernel"),
}


@pytest.mark.parametrize("defect", list(PLANTED))
def test_a_planted_access_a_gpu_traps_on_is_an_error_naming_the_kernel(tmp_path, defect):
    old, new, says = PLANTED[defect]
    preload = _preload()
    root = tmp_path / "planted"
    shutil.copytree(ROOT / "csrc", root / "csrc")
    source = root / "csrc" / "cuda" / "lltm_persistent.cu"
    text = source.read_text()
    assert text.count(old) == 1, (
        f"{defect}: the text to edit is not in csrc/cuda/lltm_persistent.cu exactly once: update this test "
        f"to plant the same defect in the sources as they are now")
    source.write_text(text.replace(old, new))
    (tmp_path / "build").mkdir()
    library = _build(tmp_path / "build", "lltm_cuda_asan_planted", root,
                     ("csrc/lltm.cpp", "csrc/emulation/lltm_sequence.cpp", "csrc/emulation/lltm_persistent.cpp"))
    kit = [*SEQUENCE_KIT[:4], "--lltm-dtype", "float32", *SEQUENCE_KIT[-2:]]
    run, reports = _run_kit(library, preload, {"LLTM_CUDA_SEQUENCE": "persistent", "LLTM_CUDA_CLUSTER": "2"}, kit,
                            tmp_path)
    errors = _errors(reports)
    assert errors, f"no sanitizer report (child exit {run.returncode}):\n{run.stdout[-3000:]}"
    assert re.search(says, errors[0]), errors[0][:4000]
