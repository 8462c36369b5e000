"""Build lltm-cuda: the LLTM's pointwise math as fused CUDA kernels, GEMMs through cuBLAS.

What decides whether it builds is the toolchain: the CUDA toolkit (CUDA_HOME or
nvcc on PATH) and a CUDA build of torch with the same CUDA major version.  A
visible GPU plays no part, so wheels build on GPU-less machines and CI.

TORCH_CUDA_ARCH_LIST picks the GPU architectures (default: Ampere and Hopper,
plus PTX that newer GPUs compile at load time).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
# One version for every lltm distribution: the repository's VERSION file.
VERSION = (HERE.parents[1] / "VERSION").read_text().strip()
DEFAULT_ARCH_LIST = "8.0;9.0+PTX"


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


def build_info(torch_version: str, arch_list: str) -> str:
    # Read by lltm_cuda at import, before it loads the compiled library: an
    # extension built for another torch must be reported, not loaded.
    return (
        "# Written by setup.py beside the library it built: what lltm_cuda._C was compiled against.\n"
        f"TORCH_VERSION = {torch_version!r}\n"
        f"ARCH_LIST = {arch_list!r}\n"
    )


def main() -> None:
    import torch
    from setuptools import setup
    from torch.utils import cpp_extension
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension

    # A CPU-only torch leaves CUDA_HOME unset even where a toolkit is installed;
    # look for it by torch's own rules so the error names the real problem.
    cuda_home = CUDA_HOME or cpp_extension._find_cuda_home()
    problems = toolchain_problems(
        torch.__version__, torch.version.cuda, cuda_home, nvcc_release(cuda_home) if cuda_home else None
    )
    if problems:
        raise SystemExit(
            "lltm-cuda cannot be built here:\n"
            + "".join(f"  - {p}\n" for p in problems)
            + "(Building needs the CUDA toolkit and a CUDA build of torch, not a GPU.)"
        )
    # An empty TORCH_CUDA_ARCH_LIST counts as unset here, as it does for torch (which would then
    # build for the visible GPU and leave the record saying '').
    if not os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip():
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCH_LIST
    info = build_info(torch.__version__, os.environ["TORCH_CUDA_ARCH_LIST"])

    class BuildExtensionWithInfo(BuildExtension):
        """Writes _build_info.py beside the library it has just linked (build/lib for a wheel, the
        source tree for an editable install), never elsewhere: a wheel built from this tree with
        another torch must not relabel an editable install's library."""

        def finalize_options(self):
            super().finalize_options()
            # Without ninja, setuptools skips a library newer than its sources, even one built
            # against another torch; with ninja, BuildExtension already forces and ninja decides.
            self.force = True

        def run(self):
            super().run()
            # Now that setuptools has copied the library into the source tree if
            # this is an editable install, get_ext_fullpath names where it lies.
            for ext in self.extensions:
                Path(self.get_ext_fullpath(ext.name)).with_name("_build_info.py").write_text(info)

    # BuildExtension compiles against the limited API of torch's oldest
    # supported Python (0x030A0000 -> 3.10); the wheel's abi3 tag must say so.
    limited_api = int(cpp_extension.min_supported_cpython, 16)
    oldest_python = f"{limited_api >> 24}.{(limited_api >> 16) & 0xFF}"

    setup(
        name="lltm-cuda",
        version=VERSION,
        description="Fused CUDA backend for lltm-core",
        packages=["lltm_cuda"],
        python_requires=f">={oldest_python}",
        # The compiled library links against this exact torch's C++ ABI.
        install_requires=[f"lltm-core=={VERSION}", f"torch=={torch.__version__.split('+')[0]}"],
        ext_modules=[
            CUDAExtension(
                "lltm_cuda._C",
                ["csrc/lltm.cpp", "csrc/cuda/lltm_kernels.cu"],
                extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3"]},
                # No pybind11 (ops register through TORCH_LIBRARY), so the
                # library needs only the stable Python ABI: one abi3 wheel.
                # BuildExtension defines Py_LIMITED_API to match.
                py_limited_api=True,
            )
        ],
        cmdclass={"build_ext": BuildExtensionWithInfo},
        options={"bdist_wheel": {"py_limited_api": "cp" + oldest_python.replace(".", "")}},
        entry_points={"lltm.backends": ["cuda = lltm_cuda:load_backend"]},
    )


if __name__ == "__main__":  # tests import this file for toolchain_problems()
    main()
