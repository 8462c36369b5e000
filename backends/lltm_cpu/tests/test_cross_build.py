"""lltm-cpu's library built for 64-bit Arm Linux from these sources, as `pip install lltm-cpu` builds
its sdist there: the build config of a non-x86 machine (no x86 kernel, their stand-ins instead),
compiled and linked by zig's clang (the `ziglang` wheel) against this torch's headers.

It shows that the portable code compiles for another architecture and that the library takes
nothing from torch but its stable C API.  Nothing runs: that needs an Arm machine.  Without
ziglang the test skips, unless LLTM_REQUIRE_CROSS_BUILD=1 (the cpu_aarch64 nox session sets it),
where that fails.  It needs no installed lltm_cpu.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.cpp_extension import include_paths

from library_symbols import torch_cpp_symbols, undefined_symbols

DIST = Path(__file__).resolve().parents[1]
BUILD_CONFIG = DIST / "lltm_cpu" / "_build_config.py"
TARGET = "aarch64-linux-gnu"

# _build_config.py as it runs on an Arm machine: only platform.machine() differs.
_CONFIG_ON_AARCH64 = """
import json, platform, runpy, sys
platform.machine = lambda: "aarch64"
config = runpy.run_path(sys.argv[1])
print(json.dumps({k: config[k] for k in ("SOURCES", "ISA_SOURCES", "KERNELS_LEFT_OUT", "COMPILE_FLAGS")}))
"""


def require(found, what: str):
    if not found:
        if os.environ.get("LLTM_REQUIRE_CROSS_BUILD") == "1":
            pytest.fail(f"LLTM_REQUIRE_CROSS_BUILD=1, but {what}")
        pytest.skip(what)
    return found


def test_library_builds_for_aarch64_on_the_stable_c_api_alone(tmp_path):
    try:
        import ziglang  # noqa: F401  (the package is zig's toolchain; `python -m ziglang` runs it)
    except ImportError:
        require(False, "ziglang is not installed (pip install ziglang, or nox -s cpu_aarch64)")
    nm = require(shutil.which("nm"), "nm (binutils) is not installed, so the library's symbols cannot be listed")
    probe = subprocess.run([sys.executable, "-c", _CONFIG_ON_AARCH64, str(BUILD_CONFIG)], capture_output=True,
                           text=True, check=True)
    config = json.loads(probe.stdout)
    # Every kernel of lltm-cpu's own is x86 code: each is left out, saying why, and none is compiled.
    assert set(config["KERNELS_LEFT_OUT"]) == {"avx2-fma", "avx512-fma", "avx512-bf16", "amx-bf16"}, config
    assert config["ISA_SOURCES"] == {} and "csrc/cpu/gemm_kernels_absent.cpp" in config["SOURCES"], config
    assert not [flag for flag in config["COMPILE_FLAGS"] if flag.startswith("-DLLTM_CPU_")], config

    zig_cxx = [sys.executable, "-m", "ziglang", "c++", "-target", TARGET]
    # torch's own flags for an extension (torch.utils.cpp_extension), then lltm-cpu's.
    flags = ["-std=c++20", "-fPIC", "-Wall", "-Werror", "-DTORCH_API_INCLUDE_EXTENSION_H",
             "-DTORCH_EXTENSION_NAME=_C", *config["COMPILE_FLAGS"], *(f"-I{path}" for path in include_paths())]
    objects = []
    for source in config["SOURCES"]:
        obj = tmp_path / (Path(source).stem + ".o")
        compiled = subprocess.run([*zig_cxx, *flags, "-c", str(DIST / source), "-o", str(obj)],
                                  capture_output=True, text=True)
        assert compiled.returncode == 0, f"{source} for {TARGET}:\n{compiled.stderr[-4000:]}"
        objects.append(str(obj))
    library = tmp_path / "_C.abi3.so"
    linked = subprocess.run([*zig_cxx, "-shared", "-o", str(library), *objects], capture_output=True, text=True)
    assert linked.returncode == 0, linked.stderr[-4000:]
    assert int.from_bytes(library.read_bytes()[18:20], "little") == 183, "not an AArch64 ELF file (e_machine)"

    # Not the C library's (name@GLIBC_2.17), nor weak (may be absent).
    needed = {name for kind, name in undefined_symbols(nm, library, demangle=False) if kind == "U" and "@" not in name}
    cpp = torch_cpp_symbols(name for _, name in undefined_symbols(nm, library, demangle=True))
    assert not cpp, f"C++ symbols of torch's own ABI in the {TARGET} library: {cpp}"
    # The rest must come from torch: C functions (the C shim, the stable C API), the same on every
    # architecture, so this torch's libraries must export each.  A stand-in missing from
    # gemm_kernels_absent.cpp shows up here, as an lltm_cpu symbol nobody defines.
    assert "torch_library_impl" in needed, sorted(needed)
    exported = set()
    for lib in (Path(torch.__file__).parent / "lib").glob("libtorch*.so*"):
        exported.update(subprocess.run([nm, "-D", "--defined-only", "--format=just-symbols", str(lib)],
                                       capture_output=True, text=True, check=True).stdout.split())
    missing = sorted(needed - exported)
    assert not missing, f"defined neither in the library nor by torch {torch.__version__}: {missing}"
