"""The build's toolchain check (cuda_toolkit.py, which setup.py imports): which CUDA toolkit it builds
with, and what a machine that cannot build lltm-cuda is told.

GPU-free, with fake toolkits in temporary folders (no real nvcc), and independent of whether
lltm-cuda is installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SETUP_PY = Path(__file__).resolve().parents[1] / "setup.py"
CUDA_TOOLKIT_PY = SETUP_PY.with_name("cuda_toolkit.py")


@pytest.fixture(scope="module")
def cuda_toolkit():
    # From its file, not sys.path: it lies beside setup.py, in no installed package.
    spec = importlib.util.spec_from_file_location("lltm_cuda_toolkit", CUDA_TOOLKIT_PY)
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
def test_matching_toolchain_has_no_problems(cuda_toolkit, toolkit, nvcc):
    assert cuda_toolkit.toolchain_problems("2.14.1+cu130", "13.0", toolkit, nvcc) == []


def test_cpu_only_torch(cuda_toolkit, toolkit):
    (problem,) = cuda_toolkit.toolchain_problems("2.13.0+cpu", None, toolkit, "13.0")
    assert "torch 2.13.0+cpu is a CPU-only build" in problem
    assert "torch==2.13.0+cu130" in problem  # the build to install, for the nvcc that is there


def test_no_toolkit(cuda_toolkit):
    (problem,) = cuda_toolkit.toolchain_problems("2.14.1+cu130", "13.0", None, None)
    assert "no CUDA toolkit found" in problem and "set CUDA_HOME" in problem


def test_cuda_home_without_nvcc(cuda_toolkit):
    (problem,) = cuda_toolkit.toolchain_problems("2.14.1+cu130", "13.0", "/opt/not-cuda", None)
    assert "CUDA_HOME=/opt/not-cuda has no working bin/nvcc" in problem


def test_not_a_toolkit_root(cuda_toolkit, tmp_path):
    # What torch guesses when nvcc on PATH is a wrapper script in /usr/local/bin.
    (problem,) = cuda_toolkit.toolchain_problems("2.14.1+cu130", "13.0", str(tmp_path), "13.0")
    assert f"CUDA_HOME={tmp_path} is not a CUDA toolkit's root" in problem


def test_major_version_mismatch(cuda_toolkit, toolkit):
    (problem,) = cuda_toolkit.toolchain_problems("2.14.1+cu126", "12.6", toolkit, "13.0")
    assert "nvcc is CUDA 13.0 but torch 2.14.1+cu126 was built with CUDA 12.6" in problem
    assert "torch==2.14.1+cu130" in problem and "CUDA 12.x toolkit" in problem


def test_every_problem_is_reported(cuda_toolkit):
    problems = cuda_toolkit.toolchain_problems("2.13.0+cpu", None, None, None)
    assert len(problems) == 2
    assert "CPU-only" in problems[0] and "no CUDA toolkit" in problems[1]


def test_nvcc_release_reads_nvcc_version(cuda_toolkit, tmp_path):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    assert cuda_toolkit.nvcc_release(str(tmp_path)) == "13.0"
    assert cuda_toolkit.nvcc_release(str(tmp_path / "missing")) is None


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


# --- finding the toolkit when CUDA_HOME is unset ------------------------------


def _fake_toolkit(root: Path, release: str = "13.0") -> str:
    """A folder laid out like a CUDA toolkit's root, whose bin/nvcc prints ``release``."""
    (root / "include").mkdir(parents=True)
    (root / "include" / "cuda_runtime.h").touch()
    (root / "bin").mkdir()
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.88'\n")
    nvcc.chmod(0o755)
    return str(root)


def _wrapper(folder: Path, script: str) -> str:
    """An nvcc on PATH that is a shell script, as /usr/local/bin/nvcc is on this project's machines."""
    (folder / "bin").mkdir(parents=True)
    nvcc = folder / "bin" / "nvcc"
    nvcc.write_text(script)
    nvcc.chmod(0o755)
    return str(nvcc)


def test_an_explicit_cuda_home_is_used_as_given(cuda_toolkit, tmp_path):
    # Even a wrong one: the user chose it, and toolchain_problems says what is wrong with it.
    root, how = cuda_toolkit.find_cuda_home(("CUDA_HOME", str(tmp_path)), "/usr/local", None)
    assert (root, how) == (str(tmp_path), "CUDA_HOME is set")


def test_torchs_guess_is_kept_when_it_is_a_toolkit(cuda_toolkit, tmp_path):
    toolkit = _fake_toolkit(tmp_path / "cuda-13.0")
    root, how = cuda_toolkit.find_cuda_home(None, toolkit, f"{toolkit}/bin/nvcc", conventional=())
    assert root == toolkit and how.startswith("torch's guess")


def test_a_guess_of_another_major_is_passed_over_for_a_toolkit_of_torchs(cuda_toolkit, tmp_path):
    """torch guesses a real toolkit, but of CUDA 12 for a CUDA 13 torch: a 13.x toolkit elsewhere wins,
    and the reason says which was used and why the guess was not (it used to keep the guess and stop
    with the mismatch)."""
    guess = _fake_toolkit(tmp_path / "cuda-12.4", "12.4")
    other = _fake_toolkit(tmp_path / "opt" / "cuda-13.0", "13.0")
    root, how = cuda_toolkit.find_cuda_home(None, guess, f"{guess}/bin/nvcc", "13.0", cuda_toolkit.nvcc_release,
                                        conventional=(other,))
    assert root == other
    assert how.startswith("a usual place for CUDA; torch guessed " + guess)
    assert f"passed over for torch's CUDA 13.0: {guess} has nvcc 12.4" in how
    assert cuda_toolkit.toolchain_problems("2.14.1+cu130", "13.0", root, cuda_toolkit.nvcc_release(root)) == []


def test_a_guess_of_another_major_stays_when_nothing_matches(cuda_toolkit, tmp_path):
    """No toolkit of torch's major anywhere: the guess stays, and the build stops saying what to install."""
    guess = _fake_toolkit(tmp_path / "cuda-12.4", "12.4")
    other = _fake_toolkit(tmp_path / "opt" / "cuda-11.8", "11.8")
    root, how = cuda_toolkit.find_cuda_home(None, guess, f"{guess}/bin/nvcc", "13.0", cuda_toolkit.nvcc_release,
                                        conventional=(other,))
    assert root == guess and how.startswith("torch's guess") and "passed over" not in how
    (problem,) = cuda_toolkit.toolchain_problems("2.14.1+cu130", "13.0", root, cuda_toolkit.nvcc_release(root))
    assert "nvcc is CUDA 12.4 but torch 2.14.1+cu130 was built with CUDA 13.0" in problem


def test_the_nvcc_a_wrapper_script_runs(cuda_toolkit, tmp_path):
    """/usr/local/bin/nvcc = `exec /usr/local/cuda-13.0/bin/nvcc "$@"`: torch guesses /usr/local."""
    toolkit = _fake_toolkit(tmp_path / "cuda-13.0")
    wrapper = _wrapper(tmp_path / "local", f'#!/bin/sh\nexec {toolkit}/bin/nvcc "$@"\n')
    root, how = cuda_toolkit.find_cuda_home(None, str(tmp_path / "local"), wrapper, conventional=())
    assert root == toolkit
    assert f"the wrapper script {wrapper} runs" in how and f"torch guessed {tmp_path / 'local'}" in how


def test_a_wrapper_naming_other_paths_too(cuda_toolkit, tmp_path):
    # Only a path ending in /bin/nvcc that is a toolkit's counts; the rest of the script is ignored.
    toolkit = _fake_toolkit(tmp_path / "cuda")
    script = (f'#!/bin/bash\n# see /etc/nvcc.conf\nLOG=/tmp/nvcc.log\nexport PATH=/opt/bin:$PATH\n'
              f'exec "{toolkit}/bin/nvcc" "$@" 2>>"$LOG"\n')
    wrapper = _wrapper(tmp_path / "local", script)
    assert cuda_toolkit.find_cuda_home(None, str(tmp_path / "local"), wrapper, conventional=())[0] == toolkit


def test_a_symbolic_link_to_nvcc(cuda_toolkit, tmp_path):
    toolkit = _fake_toolkit(tmp_path / "cuda-13.0")
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    link = tmp_path / "usr" / "bin" / "nvcc"
    link.symlink_to(Path(toolkit, "bin", "nvcc"))
    root, how = cuda_toolkit.find_cuda_home(None, str(tmp_path / "usr"), str(link), conventional=())
    assert root == toolkit and "a link to" in how


def test_the_usual_install_locations(cuda_toolkit, tmp_path):
    """No nvcc on PATH at all: the newest of the globbed toolkits, unless torch wants another major."""
    old = _fake_toolkit(tmp_path / "cuda-12.4", "12.4")
    new = _fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    (tmp_path / "cuda-11.8").mkdir()  # an empty leftover folder is no toolkit
    conventional = (str(tmp_path / "cuda"), str(tmp_path / "cuda-*"))
    root, how = cuda_toolkit.find_cuda_home(None, None, None, conventional=conventional)
    assert root == new and "a usual place for CUDA" in how and "torch found no toolkit" in how
    root, _ = cuda_toolkit.find_cuda_home(None, None, None, "12.6", cuda_toolkit.nvcc_release, conventional=conventional)
    assert root == old  # torch built with CUDA 12: the 12.x toolkit, not the newest
    root, _ = cuda_toolkit.find_cuda_home(None, None, None, "11.8", cuda_toolkit.nvcc_release, conventional=conventional)
    assert root == new  # none matches: the first found, and toolchain_problems reports the mismatch


def test_the_wrapper_comes_before_the_usual_locations(cuda_toolkit, tmp_path):
    usual = _fake_toolkit(tmp_path / "cuda")
    chosen = _fake_toolkit(tmp_path / "opt" / "cuda-13.1", "13.1")
    wrapper = _wrapper(tmp_path / "local", f"#!/bin/sh\nexec {chosen}/bin/nvcc \"$@\"\n")
    root, _ = cuda_toolkit.find_cuda_home(None, str(tmp_path / "local"), wrapper, "13.0", cuda_toolkit.nvcc_release,
                                      conventional=(usual,))
    assert root == chosen


def test_no_toolkit_anywhere(cuda_toolkit, tmp_path):
    """Nothing found: torch's guess stays, so the build stops with its problem, naming where it looked."""
    wrapper = _wrapper(tmp_path / "local", "#!/bin/sh\nexec /nonexistent/cuda/bin/nvcc \"$@\"\n")
    conventional = (str(tmp_path / "cuda"), str(tmp_path / "cuda-*"))
    root, how = cuda_toolkit.find_cuda_home(None, str(tmp_path / "local"), wrapper, conventional=conventional)
    assert root == str(tmp_path / "local")
    assert str(tmp_path / "cuda-*") in how and "/nonexistent/cuda" in how
    (problem,) = cuda_toolkit.toolchain_problems("2.14.1+cu130", "13.0", root, "13.0")
    assert "is not a CUDA toolkit's root" in problem
    assert cuda_toolkit.find_cuda_home(None, None, None, conventional=conventional)[0] is None


def test_setup_py_builds_with_the_toolkit_behind_a_wrapper(tmp_path):
    """The whole of setup.py with CUDA_HOME unset and a wrapper nvcc first on PATH: it reports
    the toolkit the wrapper runs as the one it builds with (`--version` stops before compiling)."""
    torch = pytest.importorskip("torch")
    if torch.version.cuda is None:
        pytest.skip("needs a CUDA build of torch (a CPU-only one stops setup.py before the toolkit matters)")
    toolkit = _fake_toolkit(tmp_path / "cuda-x", torch.version.cuda)
    _wrapper(tmp_path / "local", f'#!/bin/sh\nexec {toolkit}/bin/nvcc "$@"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = f"{tmp_path / 'local' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        [sys.executable, str(SETUP_PY), "--version"], cwd=SETUP_PY.parent, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert f"lltm-cuda: building with the CUDA toolkit at {toolkit} (the nvcc that the wrapper script" in result.stderr
