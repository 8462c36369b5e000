"""Build and test each lltm distribution in its own fresh virtual environment.

    nox -l           # list the sessions
    nox              # run them all (what `python3 dev.py test` and CI run)
    nox -s cpu       # one of them

Every install of an lltm distribution uses --no-build-isolation: an extension
must be compiled against the very torch it will run with, and an isolated
build environment would fetch whatever torch the index offers instead.
torch is pinned, because an unpinned `pip install torch` pulls a multi-GB CUDA
build.

With LLTM_NOX_DISCARD_VENVS=1 (what `python3 dev.py test` sets) each session deletes its venv
when it ends, pass or fail: the venvs together take about 16 GB, the largest (oldest_torch, torch
2.10.0 with its CUDA 12 libraries) 7 GB, and a CI machine's disk may not hold them all at once.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import shutil
import tempfile
from pathlib import Path

import nox

ROOT = Path(__file__).parent
TORCH_CPU = "torch==2.13.0"  # the CPU build: tests run against it
TORCH_CUDA = "torch==2.14.1"  # the CUDA 13.0 build: only to compile lltm-cuda here
TORCH_OLDEST = "torch==2.10.0"  # the oldest torch the libraries target (TORCH_TARGET_VERSION): see oldest_torch
TORCH_DEVICE = "torch==2.11.0"  # the GPU check's preinstalled torch (2.11.0+cu130): see the device_torch session
TRITON = "triton==3.9.0"  # lltm-triton's kernels, run here by its numpy interpreter (with torch 2.13.0's CPU build)
ZIGLANG = "ziglang==0.17.1"  # zig's clang, a cross compiler from PyPI: lltm-cpu built for Arm (cpu_aarch64)
BUILD_TOOLS = ("setuptools>=64", "wheel", "ninja")
TEST_TOOLS = ("pytest", "numpy", "matplotlib")  # matplotlib: lltm bench --plot is tested too
WHEELHOUSE = ROOT / "wheelhouse"

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "no"
nox.options.error_on_missing_interpreters = True
# The default sessions, in two lanes that `python3 dev.py test` runs side by side (each lane in
# order, the second in a copy of the tree, so that no two builds share a build folder): most of
# a session is one core's work (pip, a compiler, pytest).  On 2-core Intel Xeons (2026-12): one
# session after another, 50 minutes (Sapphire Rapids class); in these lanes, 27 and 28 minutes,
# 28 in all (Ice Lake class); with cpu_sanitized added to the first, 35 in all on a 2-core AMD EPYC
# Zen 4 (2026-12-07).  On a fresh 2-core AMD EPYC Zen 5 (Triton's cache empty, so lltm-triton's
# test_compiled compiles its 161 kernels, about 2.5 minutes): 43.5 minutes in all (2026-12-07);
# 34 (2026-12-08: lanes of 30 and 33 session-minutes) once the oracle ran sequences of one length
# together, the forced-route kits left torch.compile to the default one, the planted defects built
# incrementally and one set of wheels served both torches.  Builds of one distribution stay in one lane.
LANES = (["ref", "cpu", "wheels", "cpu_sanitized"],
         ["core", "cpu_aarch64", "cuda", "cuda_emulated", "triton", "oldest_torch"])
nox.options.sessions = [name for lane in LANES for name in lane]


def _session(func):
    """A nox session that, under LLTM_NOX_DISCARD_VENVS=1, deletes its venv when it ends."""

    @functools.wraps(func)
    def run(session):
        try:
            func(session)
        finally:
            if os.environ.get("LLTM_NOX_DISCARD_VENVS") == "1":
                location = getattr(session.virtualenv, "location", None)
                if location and Path(location).is_dir():
                    session.log(f"deleting the venv {location} (LLTM_NOX_DISCARD_VENVS=1)")
                    shutil.rmtree(location, ignore_errors=True)

    return nox.session(run)


def _setup(session, torch_req=TORCH_CPU, *dists):
    """Fresh venv: pinned torch and build tools first, then lltm distributions from this tree."""
    session.install(torch_req, *BUILD_TOOLS, *TEST_TOOLS)
    session.install("--no-build-isolation", "--no-deps", *dists)
    session.run("python", "-m", "pip", "check")


@contextlib.contextmanager
def _source_tree_build_info_untouched(session):
    """Fail the session if a (non-editable) build inside wrote a source tree's _build_info.py.

    A build records its torch beside the library it links.  A _build_info.py in the source tree
    describes an editable install's library, perhaps built with another torch: a wheel built
    here must not relabel it.
    """
    infos = [ROOT / f"backends/{name}/{name}/_build_info.py" for name in ("lltm_cpu", "lltm_cuda")]
    before = [p.read_bytes() if p.exists() else None for p in infos]
    yield
    for path, old in zip(infos, before):
        if (path.read_bytes() if path.exists() else None) != old:
            session.error(f"a non-editable build wrote {path.relative_to(ROOT)}, which describes the source tree's library")


def _pytest(session, *args):
    # Run from a scratch folder so the installed packages are tested, not the source tree.
    # torch.compile's caches go there too: no run reads another's, and none outlives the session.
    with tempfile.TemporaryDirectory() as tmp, session.chdir(tmp):
        session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *args, *session.posargs,
                    env={"TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "torchinductor")})


@_session
def core(session):
    """lltm-core (with lltm-ref, its dependency): registry, API, CLI and example tests."""
    _setup(session, TORCH_CPU, ".", "./backends/lltm_ref")
    _pytest(session, str(ROOT / "tests"))


@_session
def ref(session):
    """lltm-ref: the conformance kit against the reference backend, in every dtype it takes."""
    _setup(session, TORCH_CPU, ".", "./backends/lltm_ref")
    _pytest(session, "--pyargs", "lltm_core.testing", "--lltm-backend", "ref")


@_session
def cpu(session):
    """lltm-cpu: compile the fused C++ extension, run its tests, the kit and the cross-backend tests."""
    _setup(session, TORCH_CPU, ".", "./backends/lltm_ref", "./backends/lltm_cpu")
    session.run("lltm", "info")
    _pytest(session, str(ROOT / "backends/lltm_cpu/tests"), "--ignore", str(CROSS_BUILD_TEST))
    _pytest(session, "--pyargs", "lltm_core.testing", "--lltm-backend", "cpu")
    # With lltm-cpu here, the deploy path (export, AOTInductor, the C++ runner) must run, not skip.
    # test_kit.py checks the kit against planted fakes alone, whatever is installed: core runs it.
    session.env["LLTM_REQUIRE_DEPLOY"] = "1"
    _pytest(session, str(ROOT / "tests"), "--ignore", str(ROOT / "tests/test_kit.py"))


CROSS_BUILD_TEST = ROOT / "backends/lltm_cpu/tests/test_cross_build.py"

SANITIZERS = "-fsanitize=address,undefined"


def _sanitizer_preload(session) -> str:
    """LD_PRELOAD for a Python that loads a library built with SANITIZERS: libasan first (it must
    come before anything else), then libstdc++ (so a C++ exception meets ASan's interceptor)."""
    found = []
    for name in ("libasan.so", "libstdc++.so.6"):
        path = session.run(os.environ.get("CXX", "c++"), f"-print-file-name={name}", silent=True,
                           external=True).strip()
        if not os.path.isabs(path) or not os.path.exists(path):
            session.error(f"the C++ compiler has no {name}: install gcc's AddressSanitizer runtime (libasan)")
        found.append(os.path.realpath(path))
    return " ".join(found)


@_session
def cpu_sanitized(session):
    """lltm-cpu built with AddressSanitizer and UBSan: the kit and its sequence tests, any report fatal.

    Its hand-vectorised kernels read and write through raw pointers: a full vector load past a
    tensor's end where a tail mask was due, a misaligned typed access, a null pointer handed to
    memcpy.  x86 forgives all three, so the plain build's tests pass over them; here each stops
    the test run with the sanitizer's report, naming the function.
    """
    _setup(session, TORCH_CPU, ".", "./backends/lltm_ref")
    with _source_tree_build_info_untouched(session):
        session.install("--no-build-isolation", "--no-deps", "./backends/lltm_cpu",
                        env={"CFLAGS": f"{SANITIZERS} -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g",
                             "LDFLAGS": SANITIZERS, "MAX_JOBS": os.environ.get("MAX_JOBS", "2")})
    session.run("python", "-m", "pip", "check")
    # No faulthandler (ASan reports through its own handler); --capture=sys leaves the sanitizers'
    # reports on the file descriptor they write to.
    session.env.update({"LD_PRELOAD": _sanitizer_preload(session), "ASAN_OPTIONS": "detect_leaks=0",
                        "UBSAN_OPTIONS": "print_stacktrace=1"})
    # The library built is the instrumented one (not objects a plain build left in the build folder).
    session.run("python", "-c", "import pathlib, sys, lltm_cpu; sys.exit(b'__asan_init' not in "
                "pathlib.Path(lltm_cpu.library_path()).read_bytes() and 'lltm-cpu was built without AddressSanitizer')")
    _pytest(session, "-p", "no:faulthandler", "--capture=sys", "--pyargs", "lltm_core.testing", "--lltm-backend",
            "cpu")
    # lltm-cpu's own tests: each pointwise build (AVX-512, AVX2, default) and, of the GEMM routes a
    # run in a subprocess forces, the AVX2 one (the rest of those runs takes ten minutes under ASan).
    _pytest(session, "-p", "no:faulthandler", "--capture=sys", str(ROOT / "backends/lltm_cpu/tests/test_sequence.py"),
            str(ROOT / "backends/lltm_cpu/tests/test_lltm_cpu.py"),
            "-k", "not in_subprocess or (forced_gemm_routes and avx2)")


@_session
def cpu_aarch64(session):
    """lltm-cpu's sources built for 64-bit Arm Linux (its sdist's build there, without the x86
    kernels), by zig's clang: they compile, link, and need nothing of torch but its stable C API.
    Nothing runs (no Arm machine); installs no lltm distribution."""
    session.install(TORCH_CPU, ZIGLANG, "pytest", "numpy")
    session.env["LLTM_REQUIRE_CROSS_BUILD"] = "1"
    _pytest(session, str(CROSS_BUILD_TEST))


@_session
def oldest_torch(session):
    """Every distribution on the oldest torch it promises, 2.10: the compiled backends built from source
    as a user with that torch builds them, then the kit run there on lltm-ref, on lltm-cpu and on
    lltm-cuda's sources in its emulated build (the same stable headers; the real build would need
    that torch's CUDA 12 toolkit).

    A stable header a newer torch added (torch 2.13's STABLE_TORCH_ERROR_CODE_CHECK, once) compiles
    against the newer torch the other sessions use and fails only here.  torch 2.10.0 is a CUDA 12
    build, about 3 GB with its libraries; nothing here uses a GPU.
    """
    _setup(session, TORCH_OLDEST, ".", "./backends/lltm_ref")
    with _source_tree_build_info_untouched(session):
        session.install("--no-build-isolation", "--no-deps", "./backends/lltm_cpu")
        session.install("--no-build-isolation", "--no-deps", "./backends/lltm_cuda",
                        env={"LLTM_CUDA_EMULATE": "1", "MAX_JOBS": os.environ.get("MAX_JOBS", "2")})
    session.run("python", "-m", "pip", "check")
    session.run("python", "-c", "import torch; v = torch.__version__.split('+')[0]; "
                f"assert v == {TORCH_OLDEST.split('==')[1]!r}, v; print('torch', torch.__version__)")
    session.run("lltm", "info")
    _pytest(session, "-q", "--pyargs", "lltm_core.testing", "--lltm-backend", "ref")
    _pytest(session, "-q", "--pyargs", "lltm_core.testing", "--lltm-backend", "cpu")
    session.env.update({**CUDA_EMULATION, "LLTM_CUDA_TEST_EMULATED": "1"})
    _pytest(session, "-q", "--pyargs", "lltm_core.testing", "--lltm-backend", "cuda_emulated")


# The lltm-cpu wheel's metadata asks for torch >= 2.10 and pins no torch.
_ASSERT_TORCH_REQUIREMENT = """
import sys, zipfile
from pathlib import Path
wheel = next(Path(sys.argv[1]).glob("lltm_cpu-*.whl"))
with zipfile.ZipFile(wheel) as z:
    metadata = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
torch = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: torch")]
assert torch == ["Requires-Dist: torch>=2.10"], (wheel.name, torch)
print(wheel.name, torch[0])
"""


@_session
def cuda(session):
    """lltm-cuda: compile with nvcc against the CUDA build of torch, then the GPU-free tests (ptxas's
    report on every kernel among them: no spills, a block within a multiprocessor's registers).

    CUDA_HOME and CUDA_PATH are unset for the build, as for a new user running the README's line:
    setup.py must find the toolkit itself (here the nvcc on PATH is a wrapper script).
    """
    env = {"CUDA_HOME": None, "CUDA_PATH": None, "MAX_JOBS": os.environ.get("MAX_JOBS", "2")}
    session.install(TORCH_CUDA, *BUILD_TOOLS, *TEST_TOOLS)
    session.install("--no-build-isolation", "--no-deps", ".", "./backends/lltm_ref")
    with _source_tree_build_info_untouched(session):
        session.install("--no-build-isolation", "--no-deps", "./backends/lltm_cuda", env=env)
    session.run("python", "-c", "from lltm_cuda import _build_info as b; "
                "print('lltm-cuda was built with the CUDA toolkit at', b.CUDA_HOME)")
    session.run("lltm", "info")
    _pytest(session, str(ROOT / "backends/lltm_cuda/tests"))


# The emulated GPU the cuda_emulated session runs on: 3 multiprocessors of one 8-thread block, so
# 24 threads share every launch and the grid-stride loops go round (rows cross strides at odd
# sizes too), and the threads run in a shuffled order, a new one each launch and after each
# barrier, so that a result depending on the order (a race on a GPU) differs.  The persistent
# kernel's clusters take their size from the sequence, not from these.  The seed is fresh each
# run, printed, and LLTM_CUDA_EMULATE_SEED=N repeats it.
CUDA_EMULATION = {
    "LLTM_CUDA_EMULATE_MULTIPROCESSORS": "3",
    "LLTM_CUDA_EMULATE_BLOCKS_PER_MULTIPROCESSOR": "1",
    "LLTM_CUDA_EMULATE_THREADS_PER_BLOCK": "8",
    "LLTM_CUDA_EMULATE_ORDER": "shuffle",
}


@_session
def cuda_emulated(session):
    """lltm-cuda's own kernels and host code on the CPU: its .cu sources compiled as C++ with every
    GPU thread a fiber (LLTM_CUDA_EMULATE=1, the test-only backend cuda_emulated), then the kit in
    every dtype lltm-cuda declares, the kit's sequence comparisons with each sequence path forced
    (the persistent kernel over clusters of 1, 2, 4 and 8 blocks, the cooperative grid, and per
    step), lltm-cuda's tests that need no device (the emulator's own, the launch count flat in T),
    the planted defects, and the kit again on a build with AddressSanitizer and UBSan (what
    compute-sanitizer's memcheck would find: an access outside a tensor or past a block's shared
    memory, a misaligned one).

    Then torch in the same venv becomes the newer TORCH_CUDA (2.14.1) and the library built on
    TORCH_CPU (2.13.0) runs again, not rebuilt: the stable ABI's promise (one build for every torch
    from 2.10 on), checked by its load, symbol and tracing tests and the kit's sequence comparisons.

    What this cannot see (the device, cuBLAS, real concurrency, streams) is the GPU check's:
    benchmarks/gpu_check.sh.
    """
    _setup(session, TORCH_CPU, ".", "./backends/lltm_ref")
    with _source_tree_build_info_untouched(session):
        session.install("--no-build-isolation", "--no-deps", "./backends/lltm_cuda",
                        env={"LLTM_CUDA_EMULATE": "1", "MAX_JOBS": os.environ.get("MAX_JOBS", "2")})
    session.run("python", "-m", "pip", "check")
    seed = os.environ.get("LLTM_CUDA_EMULATE_SEED") or str(random.SystemRandom().randrange(2**31))
    session.log(f"emulated thread order: shuffled with seed {seed} (LLTM_CUDA_EMULATE_SEED={seed} repeats it)")
    # LLTM_CUDA_TEST_AOTI: the AOTInductor packages of its operators too (half a minute here).
    # LLTM_CUDA_REQUIRE_ASAN: the kit under AddressSanitizer (test_emulation_asan.py) must run, not skip.
    session.env.update({**CUDA_EMULATION, "LLTM_CUDA_EMULATE_SEED": seed, "LLTM_CUDA_TEST_EMULATED": "1",
                        "LLTM_CUDA_TEST_AOTI": "1", "LLTM_CUDA_REQUIRE_ASAN": "1"})
    session.run("lltm", "info")
    # The default choice: the persistent kernel over a cluster of 8 where W_h fits, per step elsewhere.
    _pytest(session, "--pyargs", "lltm_core.testing", "--lltm-backend", "cuda_emulated")
    # Each path forced, over the kit's sequence comparisons (the cases whose W_h fits a block, in the
    # three dtypes the persistent kernels take): clusters of 1, 2, 4 and 8 blocks, the cooperative
    # grid (one block a multiprocessor), and per step.
    for path, cluster in (("persistent", "1"), ("persistent", "2"), ("persistent", "4"), ("persistent", "8"),
                          ("grid", "0"), ("per-step", "0")):
        session.log(f"the kit's sequence comparisons with LLTM_CUDA_SEQUENCE={path} LLTM_CUDA_CLUSTER={cluster}")
        session.env.update({"LLTM_CUDA_SEQUENCE": path, "LLTM_CUDA_CLUSTER": cluster})
        _pytest(session, "--pyargs", "lltm_core.testing.test_sequence", "--lltm-backend", "cuda_emulated",
                "--lltm-dtype", "float32", "--lltm-dtype", "bfloat16", "--lltm-dtype", "float16",
                "-k", "(lltm_sequence_matches or layer_matches or inference) and not S1031 and not float64")
    for name in ("LLTM_CUDA_SEQUENCE", "LLTM_CUDA_CLUSTER"):
        del session.env[name]
    # The emulator's own tests, the persistent path's (launch count flat in T) and the planted defects.
    _pytest(session, str(ROOT / "backends/lltm_cuda/tests"))
    # pip replaces torch only: lltm-cuda-emulated stays as built, against the older torch.
    session.install(TORCH_CUDA)
    session.run("python", "-m", "pip", "check")
    session.run("lltm", "info")
    # A selection, to keep CI's time: the library and tracing tests, and the kit's sequence
    # comparisons in a full-width and a half type (the opmath path).
    _pytest(session, str(ROOT / "backends/lltm_cuda/tests/test_library.py"),
            str(ROOT / "backends/lltm_cuda/tests/test_export.py"))
    _pytest(session, "--pyargs", "lltm_core.testing.test_sequence", "--lltm-backend", "cuda_emulated",
            "--lltm-dtype", "float32", "--lltm-dtype", "bfloat16", "-k", "lltm_sequence_matches or layer_matches")


@_session
def wheels(session):
    """Every distribution's wheel built into wheelhouse/ (with torch 2.13.0), then installed by name, as a
    user installs them, twice: into this venv, to run tests/installed/ and to uninstall and reinstall a
    backend; and into a second venv (deleted at the end) that holds torch 2.14.1 first.  lltm-cpu's
    library targets torch's stable ABI (>= 2.10), so there pip must leave that torch in place, and the
    kit and the deploy path (tests/test_deploy.py) must pass on it."""
    session.install(TORCH_CPU, *BUILD_TOOLS, *TEST_TOOLS)
    WHEELHOUSE.mkdir(exist_ok=True)
    for old in WHEELHOUSE.glob("lltm_*.whl"):
        old.unlink()
    with _source_tree_build_info_untouched(session):
        for dist in (".", "./backends/lltm_ref", "./backends/lltm_cpu"):
            session.run("python", "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(WHEELHOUSE), dist)
    session.run("python", "-c", _ASSERT_TORCH_REQUIREMENT, str(WHEELHOUSE))
    # What a user does: names, not paths, resolved from the wheel folder.
    session.install("--no-index", "--find-links", str(WHEELHOUSE), "lltm-core", "lltm-cpu")
    session.run("python", "-m", "pip", "check")
    session.run("lltm", "info")
    session.env["LLTM_TEST_INSTALLED"] = "1"
    _pytest(session, str(ROOT / "tests" / "installed"))
    del session.env["LLTM_TEST_INSTALLED"]
    # Uninstalling a backend leaves no stale entry point and no warning ...
    session.run("python", "-m", "pip", "uninstall", "-y", "lltm-cpu")
    session.run("python", "-W", "error", "-c", _ASSERT_BACKENDS.format(expect="['ref']"))
    # ... and reinstalling picks it up again.
    session.install("--no-index", "--find-links", str(WHEELHOUSE), "lltm-cpu")
    session.run("python", "-W", "error", "-c", _ASSERT_BACKENDS.format(expect="['cpu', 'ref']"))
    _wheels_on_a_newer_torch(session, WHEELHOUSE)


def _wheels_on_a_newer_torch(session, wheels: Path):
    """lltm-core, lltm-ref and lltm-cpu by name from ``wheels`` into a fresh venv that holds TORCH_CUDA."""
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        session.run("python", "-m", "venv", str(venv))
        python = str(venv / "bin" / "python")
        session.run(python, "-m", "pip", "install", "-q", TORCH_CUDA, "pytest", "numpy", external=True)
        session.run(python, "-m", "pip", "install", "-q", "--find-links", str(wheels), "lltm-core", "lltm-ref",
                    "lltm-cpu", external=True)
        wanted = TORCH_CUDA.split("==")[1]
        session.run(python, "-c", f"import torch; v = torch.__version__.split('+')[0]; "
                    f"assert v == {wanted!r}, f'pip replaced torch {wanted} with {{v}}'; print('torch', v)",
                    external=True)
        session.run(python, "-m", "pip", "check", external=True)
        session.run(str(venv / "bin" / "lltm"), "info", external=True)
        env = {"TORCHINDUCTOR_CACHE_DIR": str(Path(tmp) / "torchinductor")}
        with session.chdir(tmp):
            session.run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "lltm_core.testing",
                        "--lltm-backend", "cpu", *session.posargs, external=True, env=env)
            # The deploy path too: the C++ runner built against this torch's libtorch (C++20, and
            # a CUDA build's CMake package) runs a package of lltm-cpu's operators.
            session.run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests/test_deploy.py"),
                        *session.posargs, external=True, env={**env, "LLTM_REQUIRE_DEPLOY": "1"})


@_session
def triton(session):
    """lltm-triton under Triton's interpreter: the kit on CPU in every dtype it declares, and its own tests.

    TRITON_INTERPRET=1 must be set before Python starts (Triton reads it as each kernel is defined),
    so it is set for the session's commands, after `lltm info` has shown lltm-triton's reason for
    being unavailable without it.  The interpreter runs the kernels with numpy, a program at a time,
    so this is one of CI's slowest sessions (the kit's 701-step inference test and the float64
    gradchecks are most of it).  test_compiled.py, in a process without the interpreter, compiles every
    kernel variant for sm_90 with Triton's compiler (no GPU needed).  What neither can check is in
    backends/lltm_triton/tests/test_gpu.py, run on a GPU by benchmarks/gpu_check.sh.
    """
    session.install(TORCH_CPU, TRITON, *BUILD_TOOLS, *TEST_TOOLS)
    session.install("--no-build-isolation", "--no-deps", ".", "./backends/lltm_ref", "./backends/lltm_triton")
    session.run("python", "-m", "pip", "check")
    session.run("lltm", "info")
    session.env["TRITON_INTERPRET"] = "1"
    session.run("lltm", "info")
    _pytest(session, "--pyargs", "lltm_core.testing", "--lltm-backend", "triton")
    _pytest(session, str(ROOT / "backends/lltm_triton/tests"))


@_session
def device_torch(session):
    """Opt-in, about 5 GB: everything against the GPU machine's torch before spending device time on it.

    The GPU machine that runs benchmarks/gpu_check.sh (an H200) has torch 2.11.0+cu130 preinstalled and
    installs nothing, so the sources must build and pass against that torch as they are.  This runs the GPU
    check's dry run (lltm-cuda built with nvcc, its GPU-free tests) and the CPU tests under it.
    With LLTM_CUDA_WHEEL set (the wheel benchmarks/build_gpu_wheel.sh writes, built with a newer
    torch) the dry run installs that wheel instead, as the GPU check then does: its library
    must load (dlopen RTLD_NOW, test_library.py) on this older torch.
    """
    # numpy < 2.4: the interpreter of torch 2.11's Triton (3.6.0), which runs the dry run's
    # lltm-triton tests, calls int() on one-element arrays, and NumPy 2.4 refuses that.
    session.install(TORCH_DEVICE, *BUILD_TOOLS, *(tool for tool in TEST_TOOLS if tool != "numpy"), "numpy<2.4")
    python = str(Path(session.bin) / "python")
    with tempfile.TemporaryDirectory() as out:
        session.run("bash", str(ROOT / "benchmarks/gpu_check.sh"), external=True,
                    env={"PYTHON": python, "DRY_RUN": "1", "OUT": out, "MAX_JOBS": os.environ.get("MAX_JOBS", "2")})
    session.install("--no-build-isolation", "--no-deps", "./backends/lltm_cpu")
    _pytest(session, str(ROOT / "tests"), str(ROOT / "backends/lltm_cpu/tests"), "--ignore", str(CROSS_BUILD_TEST))
    _pytest(session, "--pyargs", "lltm_core.testing", "--lltm-backend", "cpu")


_ASSERT_BACKENDS = (
    "import lltm_core; names = sorted(r['name'] for r in lltm_core.backend_report()); "
    "assert names == {expect}, names; assert lltm_core.available_backends() == {expect}; print('backends:', names)"
)
