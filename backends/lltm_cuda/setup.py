"""Build lltm-cuda: the LLTM's pointwise math as fused CUDA kernels, GEMMs through cuBLAS.

The library uses only torch's stable ABI (STABLE_TORCH_LIBRARY, torch::stable::Tensor, the C
shim), compiled with TORCH_TARGET_VERSION set to torch 2.10 (lltm_build.TARGET_TORCH): so one build loads on
every torch from 2.10 on that has the CUDA major version it was built with, and the wheel asks
for torch>=2.10, never for the torch that built it.  It holds no Python module: lltm_cuda loads it
with torch.ops.load_library, and a C++ program can dlopen it without libpython.

What decides whether it builds is the toolchain: the CUDA toolkit and a CUDA
build of torch with the same CUDA major version.  A visible GPU plays no part,
so wheels build on GPU-less machines and CI.

The toolkit is CUDA_HOME (or CUDA_PATH) when set.  Otherwise torch guesses the
grandparent of the nvcc on PATH, which is wrong when that nvcc is a wrapper
script or a symbolic link (/usr/local/bin/nvcc gives /usr/local); then
this looks at the nvcc the wrapper runs, and at CUDA's usual install
folders, before it gives up.  The root used is printed (`pip install -v` shows
it) and recorded in lltm_cuda/_build_info.py.

TORCH_CUDA_ARCH_LIST picks the GPU architectures (default: Ampere and Hopper,
plus PTX that newer GPUs compile at load time).

LLTM_CUDA_EMULATE=1 builds instead the test-only emulated library: the same csrc/ sources
compiled as C++ for the CPU (csrc/cuda/lltm_runtime.cuh runs each launch as a serial loop over
the grid), as the distribution lltm-cuda-emulated, package lltm_cuda_emulated (this lltm_cuda
package's own files), backend cuda_emulated on CPU tensors.  It needs only a CPU build of torch
and a C++ compiler; lltm-cuda's tests and the conformance kit run on it (`nox -s cuda_emulated`).
It is never part of a user's install.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# lltm_build.py: a link to ../lltm_build.py here, a file in an sdist.
sys.path.insert(0, str(HERE))
import lltm_build  # noqa: E402

DEFAULT_ARCH_LIST = "8.0;9.0+PTX"
# Release builds: no debug sections (Python's own CFLAGS carry -g), and only the registrations
# (static initialisers) are needed from outside, so nothing else is exported.
CXX_FLAGS = [lltm_build.TARGET_MACRO, "-fvisibility=hidden", "-g0"]
LINK_FLAGS = ["-Wl,--strip-debug"]


# Where CUDA's installers put toolkits, looked at in this order (newest release first within a glob).
CONVENTIONAL_ROOTS = ("/usr/local/cuda", "/usr/local/cuda-*", "/opt/cuda")


def nvcc_release(cuda_home: str) -> str | None:
    """The CUDA release of ``cuda_home/bin/nvcc`` ("13.0"), or None if it does not run."""
    try:
        out = subprocess.run(
            [str(Path(cuda_home, "bin", "nvcc")), "--version"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else None


def is_toolkit_root(path: str | None) -> bool:
    """Whether ``path`` is a CUDA toolkit's root: an executable bin/nvcc and include/cuda_runtime.h."""
    if not path:
        return False
    nvcc = Path(path, "bin", "nvcc")
    return nvcc.is_file() and os.access(nvcc, os.X_OK) and Path(path, "include", "cuda_runtime.h").is_file()


def nvccs_behind(nvcc: str) -> list[tuple[str, str]]:
    """[(path, how)] of the real nvcc that the nvcc on PATH stands for: itself, symbolic links
    resolved, and, for a shell script that runs another nvcc (``exec /usr/local/cuda-13.0/bin/nvcc
    "$@"``), each absolute .../bin/nvcc path the script names."""
    real = os.path.realpath(nvcc)
    found = [(real, f"the nvcc on PATH, {nvcc}" + (f" (a link to {real})" if real != nvcc else ""))]
    try:
        with open(nvcc, "rb") as f:
            head = f.read(64 * 1024)
    except OSError:
        return found
    if head.startswith(b"#!"):
        for match in re.finditer(rb"(/[^\s'\"`;|&<>()$]*/bin/nvcc)(?![\w.-])", head):
            named = match.group(1).decode(errors="replace")
            found.append((os.path.realpath(named), f"the nvcc that the wrapper script {nvcc} runs, {named}"))
    return found


def _release_key(path: str) -> tuple[int, ...]:
    """(13, 0) for /usr/local/cuda-13.0: sorts the globbed toolkits newest first."""
    numbers = re.findall(r"\d+", Path(path).name)
    return tuple(int(n) for n in numbers) or (-1,)


def find_cuda_home(explicit: tuple[str, str] | None, torch_guess: str | None, nvcc_on_path: str | None,
                   torch_cuda: str | None = None, release=None,
                   conventional=CONVENTIONAL_ROOTS) -> tuple[str | None, str]:
    """(the toolkit root to build with, why that one): what lltm-cuda builds against.

    ``explicit`` is ("CUDA_HOME", value) when the user set one: used as it is (a wrong one is
    reported, never overridden).  ``torch_guess`` is torch's CUDA_HOME, ``nvcc_on_path`` what
    ``shutil.which("nvcc")`` gives.  The candidates are torch's guess, the nvcc the one on PATH
    stands for, then ``conventional`` (globs allowed, newest release first); of the toolkit roots
    among them the first whose nvcc ``release(root)`` has torch's CUDA major version wins, else
    the first (toolchain_problems then reports the mismatch).  So torch's guess is kept when it
    is a toolkit of the right major, and passed over, saying so, for one that is.  If there is
    no toolkit at all, torch's guess stays (the build then stops with its problem) and the
    reason names every place looked at.
    """
    if explicit is not None:
        return explicit[1], f"{explicit[0]} is set"
    candidates = []  # (root, how it was found), in order of preference
    if torch_guess:
        candidates.append((torch_guess, "torch's guess" + (f" from the nvcc on PATH, {nvcc_on_path}" if nvcc_on_path else "")))
    if nvcc_on_path:
        candidates += [(os.path.dirname(os.path.dirname(path)), how) for path, how in nvccs_behind(nvcc_on_path)]
    empty_patterns = []
    for pattern in conventional:
        roots = sorted(glob.glob(pattern), key=_release_key, reverse=True)
        candidates += [(root, "a usual place for CUDA") for root in roots]
        if not roots:
            empty_patterns.append(pattern)
    toolkits, looked = {}, []
    for root, how in candidates:
        if root in toolkits or root in looked:
            continue
        if is_toolkit_root(root):
            toolkits[root] = how
        else:
            looked.append(root)
    if not toolkits:
        guessed = f"torch guessed {torch_guess}, which is no toolkit root" if torch_guess else "torch found no toolkit"
        return torch_guess, f"{guessed}, and none is in {', '.join(looked + empty_patterns)}"
    roots = list(toolkits)
    passed_over = ""
    if torch_cuda and release is not None:
        major = torch_cuda.split(".")[0]
        releases = {r: release(r) for r in roots}
        matching = [r for r in roots if (releases[r] or "").split(".")[0] == major]
        if matching and matching[0] != roots[0]:
            passed_over = "; ".join(f"{r} has nvcc {releases[r] or '(none that runs)'}" for r in roots[:roots.index(matching[0])])
            passed_over = f"; passed over for torch's CUDA {torch_cuda}: {passed_over}"
        roots = matching or roots
    chosen = roots[0]
    if torch_guess == chosen:
        return chosen, toolkits[chosen] + passed_over
    guessed = (f"torch guessed {torch_guess}" + (", which is no toolkit root" if torch_guess not in toolkits else "")
               if torch_guess else "torch found no toolkit")
    return chosen, f"{toolkits[chosen]}; {guessed}{passed_over}"


def toolchain_problems(torch_version: str, torch_cuda: str | None, cuda_home: str | None, nvcc: str | None) -> list[str]:
    """Why lltm-cuda cannot be built with this torch and CUDA toolkit; empty if it can.

    ``torch_cuda`` is ``torch.version.cuda`` (None for a CPU-only torch),
    ``cuda_home`` the toolkit root torch found (None if none), ``nvcc`` the
    release its bin/nvcc reports (None if it did not run).
    """
    torch_public = torch_version.split("+")[0]
    # The torch build to suggest: one for the CUDA that nvcc provides.
    cu_tag = "cu" + (nvcc or "13.0").replace(".", "")
    problems = []
    if torch_cuda is None:
        problems.append(
            f"torch {torch_version} is a CPU-only build (torch.version.cuda is None): install a CUDA build "
            f"of torch whose CUDA major version matches nvcc's, e.g. torch=={torch_public}+{cu_tag}, "
            f"then build with --no-build-isolation so that torch is used"
        )
    if cuda_home is None:
        problems.append(
            "no CUDA toolkit found: set CUDA_HOME to the toolkit's root (the folder holding bin/nvcc, "
            "e.g. CUDA_HOME=/usr/local/cuda) or put nvcc on PATH"
        )
    elif nvcc is None:
        problems.append(
            f"CUDA_HOME={cuda_home} has no working bin/nvcc: point CUDA_HOME at a CUDA toolkit's root"
        )
    elif not Path(cuda_home, "include", "cuda_runtime.h").is_file():
        # e.g. an nvcc wrapper script in /usr/local/bin made torch guess CUDA_HOME=/usr/local
        problems.append(
            f"CUDA_HOME={cuda_home} is not a CUDA toolkit's root (no include/cuda_runtime.h): set CUDA_HOME "
            f"to the folder holding bin/nvcc, include/ and lib64/, e.g. CUDA_HOME=/usr/local/cuda"
        )
    if torch_cuda is not None and nvcc is not None and torch_cuda.split(".")[0] != nvcc.split(".")[0]:
        problems.append(
            f"nvcc is CUDA {nvcc} but torch {torch_version} was built with CUDA {torch_cuda}; the major "
            f"versions must match: install torch=={torch_public}+{cu_tag}, or set CUDA_HOME to a CUDA "
            f"{torch_cuda.split('.')[0]}.x toolkit"
        )
    return problems


def build_info(arch_list: str, cuda_home: str = "", emulated: bool = False, cuda_version: str | None = None) -> str:
    # lltm_cuda's own lines of _build_info.py, read before it loads the library: another CUDA
    # major or no code for the GPU must be reported, not loaded.
    return (
        f"CUDA_VERSION = {cuda_version!r}  # the building torch's CUDA; its major must be the running torch's\n"
        f"ARCH_LIST = {arch_list!r}\n"
        f"CUDA_HOME = {cuda_home!r}\n"
        + ("EMULATED = True  # LLTM_CUDA_EMULATE=1: the kernels compiled for the CPU, test-only\n" if emulated else "")
    )


# The sources of both builds: the emulated one reaches the same .cu files through csrc/emulation/*.cpp.
KERNEL_HEADERS = ["csrc/cuda/lltm_common.cuh", "csrc/cuda/lltm_runtime.cuh"]
KERNEL_SOURCES = ["csrc/cuda/lltm_kernels.cu", "csrc/cuda/lltm_sequence.cu"]
EMULATED_SOURCES = ["csrc/emulation/lltm_kernels.cpp", "csrc/emulation/lltm_sequence.cpp",
                    "csrc/emulation/emulation_ops.cpp"]


def main_emulated() -> None:
    """LLTM_CUDA_EMULATE=1: the test-only emulated library (see the module's docstring)."""
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    if any(command in sys.argv for command in ("develop", "editable_wheel")):
        # An editable install would write its _build_info.py into lltm_cuda/, this package's folder.
        raise SystemExit("lltm-cuda's emulated build is for tests: install it without -e (pip install "
                         "--no-build-isolation ./backends/lltm_cuda with LLTM_CUDA_EMULATE=1)")
    lltm_build.require_build_torch("lltm-cuda-emulated")
    info = build_info("emulated", emulated=True)
    print("lltm-cuda: building the EMULATED library (the CUDA sources compiled for the CPU, test-only)",
          file=sys.stderr, flush=True)
    setup(
        name="lltm-cuda-emulated",
        description="lltm-cuda's kernels compiled for the CPU under an emulated launch: for lltm-cuda's tests only",
        # This very lltm_cuda package, under its own name: the emulated build never shadows a real one.
        packages=["lltm_cuda_emulated"],
        package_dir={"lltm_cuda_emulated": "lltm_cuda"},
        ext_modules=[
            CppExtension(
                "lltm_cuda_emulated._C",
                ["csrc/lltm.cpp", *EMULATED_SOURCES],
                depends=KERNEL_HEADERS + KERNEL_SOURCES,
                define_macros=[("LLTM_CUDA_EMULATE", None)],
                # -O1: the kit runs in seconds either way, and the build is what CI waits for.
                extra_compile_args={"cxx": ["-O1", "-Wno-unknown-pragmas", *CXX_FLAGS]},
                extra_link_args=LINK_FLAGS,
                py_limited_api=True,
            )
        ],
        cmdclass={"build_ext": lltm_build.build_ext(BuildExtension, info)},
        entry_points={"lltm.backends": ["cuda_emulated = lltm_cuda_emulated:load_backend"]},
        # pip builds in this folder: a build/ of its own, or each build's wheel would also take in
        # what the other left in build/lib (the real lltm_cuda in the emulated wheel, and back).
        **lltm_build.setup_kwargs(build={"build_base": "build/emulated"}),
    )


def main() -> None:
    import torch
    from setuptools import setup
    from torch.utils import cpp_extension
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension

    lltm_build.require_build_torch("lltm-cuda")
    # A CPU-only torch leaves CUDA_HOME unset even where a toolkit is installed;
    # look for it by torch's own rules so the error names the real problem.
    explicit = next(((name, os.environ[name]) for name in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(name)), None)
    cuda_home, how = find_cuda_home(explicit, CUDA_HOME or cpp_extension._find_cuda_home(), shutil.which("nvcc"),
                                    torch.version.cuda, nvcc_release)
    problems = toolchain_problems(
        torch.__version__, torch.version.cuda, cuda_home, nvcc_release(cuda_home) if cuda_home else None
    )
    if problems:
        raise SystemExit(
            "lltm-cuda cannot be built here:\n"
            + "".join(f"  - {p}\n" for p in problems)
            + (f"  (toolkit root: {how})\n" if explicit is None else "")
            + "(Building needs the CUDA toolkit and a CUDA build of torch, not a GPU.)"
        )
    # torch read CUDA_HOME into a module global when it was imported: the root found here must
    # be what it compiles and links with, and what any subprocess (ninja, nvcc) inherits.
    os.environ["CUDA_HOME"] = cuda_home
    cpp_extension.CUDA_HOME = cuda_home
    print(f"lltm-cuda: building with the CUDA toolkit at {cuda_home} ({how})", file=sys.stderr, flush=True)
    # An empty TORCH_CUDA_ARCH_LIST counts as unset here, as it does for torch (which would then
    # build for the visible GPU and leave the record saying '').
    if not os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip():
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCH_LIST
    info = build_info(os.environ["TORCH_CUDA_ARCH_LIST"], cuda_home, cuda_version=torch.version.cuda)

    setup(
        name="lltm-cuda",
        description="Fused CUDA backend for lltm-core",
        packages=["lltm_cuda"],
        ext_modules=[
            CUDAExtension(
                "lltm_cuda._C",
                ["csrc/lltm.cpp", *KERNEL_SOURCES],
                depends=KERNEL_HEADERS,
                # USE_CUDA: the C shim declares its CUDA functions (the current stream) only under it.
                define_macros=[("USE_CUDA", None)],
                extra_compile_args={"cxx": ["-O3", *CXX_FLAGS],
                                    "nvcc": ["-O3", lltm_build.TARGET_MACRO, "-Xcompiler", "-fvisibility=hidden"]},
                extra_link_args=LINK_FLAGS,
                # No Python at all in the library (it is loaded with torch.ops.load_library), and
                # py_limited_api keeps torch from linking libtorch_python: one abi3 wheel.
                py_limited_api=True,
            )
        ],
        cmdclass={"build_ext": lltm_build.build_ext(BuildExtension, info)},
        entry_points={"lltm.backends": ["cuda = lltm_cuda:load_backend"]},
        **lltm_build.setup_kwargs(build={"build_base": "build"}),
    )


if __name__ == "__main__":  # tests import this file for toolchain_problems() and CXX_FLAGS
    main_emulated() if os.environ.get("LLTM_CUDA_EMULATE") == "1" else main()
