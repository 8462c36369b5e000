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
cuda_toolkit.py looks at the nvcc the wrapper runs, and at CUDA's usual install
folders, before it gives up.  The root used is printed (`pip install -v` shows
it) and recorded in lltm_cuda/_build_info.py.

TORCH_CUDA_ARCH_LIST picks the GPU architectures (default: Ampere and Hopper,
plus PTX that newer GPUs compile at load time).

LLTM_CUDA_EMULATE=1 builds instead the test-only emulated library: the same csrc/ sources
compiled as C++ for the CPU (csrc/emulation/lltm_emulator.h runs each GPU thread of a launch as a
fiber, barriers and clusters included), as the distribution lltm-cuda-emulated, package
lltm_cuda_emulated (this lltm_cuda package's own files), backend cuda_emulated on CPU tensors.  It needs only a CPU build of torch
and a C++ compiler; lltm-cuda's tests and the conformance kit run on it (`nox -s cuda_emulated`).
It is never part of a user's install.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Both beside this file (lltm_build.py a link to ../lltm_build.py here, a file in an sdist).
sys.path.insert(0, str(HERE))
import lltm_build  # noqa: E402
from cuda_toolkit import find_cuda_home, nvcc_release, toolchain_problems  # noqa: E402

DEFAULT_ARCH_LIST = "8.0;9.0+PTX"
# Release builds: no debug sections (Python's own CFLAGS carry -g), and only the registrations
# (static initialisers) are needed from outside, so nothing else is exported.
CXX_FLAGS = [lltm_build.TARGET_MACRO, "-fvisibility=hidden", "-g0"]
LINK_FLAGS = ["-Wl,--strip-debug"]
# The C++ standard is named, not left to torch's build (c++20 from torch 2.13 on, whether it runs
# ninja or not), so that every torch builds the kernels alike and tests/test_device_code.py
# compiles them again with exactly these flags.
NVCC_FLAGS = ["-O3", "-std=c++20", lltm_build.TARGET_MACRO, "-Xcompiler", "-fvisibility=hidden"]


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
KERNEL_HEADERS = ["csrc/cuda/lltm_common.cuh", "csrc/cuda/lltm_runtime.cuh", "csrc/cuda/lltm_persistent.cuh",
                  "csrc/emulation/lltm_emulator.h"]
KERNEL_SOURCES = ["csrc/cuda/lltm_kernels.cu", "csrc/cuda/lltm_sequence.cu", "csrc/cuda/lltm_persistent.cu"]
EMULATED_SOURCES = ["csrc/emulation/lltm_kernels.cpp", "csrc/emulation/lltm_sequence.cpp",
                    "csrc/emulation/lltm_persistent.cpp",
                    "csrc/emulation/emulation_ops.cpp", "csrc/emulation/emulator_probes.cpp"]


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
                                    "nvcc": NVCC_FLAGS},
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


if __name__ == "__main__":  # tests import this file for its flags and sources
    main_emulated() if os.environ.get("LLTM_CUDA_EMULATE") == "1" else main()
