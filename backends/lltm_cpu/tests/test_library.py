"""lltm-cpu's operator library as a file: stable ABI only, no Python, no debug sections, and
checked before it is loaded (a damaged copy makes the backend unavailable, never the process die)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import lltm_cpu
from library_symbols import torch_cpp_symbols, undefined_symbols

LIBRARY = Path(lltm_cpu.library_path())


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (binutils), so the library's symbols cannot be listed")
    return path


def test_library_path_is_the_loaded_library():
    assert LIBRARY.is_file() and LIBRARY.parent == Path(lltm_cpu.__file__).parent, LIBRARY
    run = subprocess.run([sys.executable, "-m", "lltm_cpu", "--library"], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == str(LIBRARY)


def test_the_build_record_is_the_file():
    """setup.py's record of the library (written at build time) and lltm-core's check (at load) agree."""
    from lltm_core.extension import library_fingerprint
    from lltm_cpu import _build_info

    assert LIBRARY.name == _build_info.LIBRARY_NAME
    assert library_fingerprint(LIBRARY) == (_build_info.LIBRARY_SIZE, _build_info.LIBRARY_SHA256)


def test_no_torch_cpp_symbols():
    names = [name for _, name in undefined_symbols(tool("nm"), LIBRARY, demangle=True)]
    cpp = torch_cpp_symbols(names)
    assert not cpp, f"C++ symbols of torch's own ABI in {LIBRARY.name}: {cpp}"
    # What it does take from torch: the C shim and the stable C API.
    assert any(name.startswith("aoti_torch_") for name in names) and "torch_library_impl" in names, names


def test_needs_no_python_and_has_no_debug_sections():
    dynamic = subprocess.run([tool("readelf"), "-d", str(LIBRARY)], capture_output=True, text=True,
                             check=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in dynamic.splitlines() if "(NEEDED)" in line]
    assert not any("python" in library for library in needed), needed
    sections = subprocess.run([tool("readelf"), "-S", "-W", str(LIBRARY)], capture_output=True, text=True,
                              check=True).stdout
    assert ".debug_" not in sections, f"{LIBRARY.name} carries debug sections"
    assert LIBRARY.stat().st_size < 4 * 2**20, LIBRARY.stat().st_size


LOADER = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char** argv) {
  if (!dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL)) { fprintf(stderr, "%s\n", dlerror()); return 1; }
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[4096];
  while (fgets(line, sizeof line, maps)) {
    if (strstr(line, "libpython") || strstr(line, "libtorch_python")) { fprintf(stderr, "mapped: %s", line); return 2; }
  }
  puts("loaded");
  return 0;
}
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="dlopen and /proc/self/maps: Linux")
def test_loads_with_dlopen_now_in_a_program_without_python(tmp_path):
    """A C program (no libpython at all) loads the library with RTLD_NOW: every symbol it needs
    comes from torch's C++ libraries, and its operators register as it loads."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the loader program")
    source = tmp_path / "loader.c"
    source.write_text(LOADER)
    program = tmp_path / "loader"
    subprocess.run([compiler, str(source), "-o", str(program), "-ldl"], check=True)
    torch_lib = Path(torch.__file__).parent / "lib"
    env = {**os.environ, "LD_LIBRARY_PATH": f"{torch_lib}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    run = subprocess.run([str(program), str(LIBRARY)], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and run.stdout.strip() == "loaded", run.stderr


_DAMAGED_PROBE = textwrap.dedent("""
    import json, torch, lltm_core, lltm_cpu
    report = {r["name"]: r for r in lltm_core.backend_report()}
    available = lltm_core.available_backends()
    inputs = [torch.randn(2, 3), torch.randn(12, 7), torch.randn(12), torch.randn(2, 4), torch.randn(2, 4)]
    h, c = lltm_core.lltm(*inputs)
    print(json.dumps({"module": lltm_cpu.__file__, "status": report["cpu"]["status"],
                      "reason": report["cpu"]["reason"], "available": available,
                      "answered_by": lltm_core.get_backend(dtype=torch.float32).name, "finite": bool(h.isfinite().all())}))
""")


@pytest.mark.parametrize("cut", ["4KiB", "half", "one-byte-short", "same-size-other-bytes"])
def test_damaged_library_is_unavailable_not_fatal_in_subprocess(tmp_path, cut):
    """A truncated or overwritten library, as an interrupted install leaves it: the process survives,
    lltm-cpu is unavailable with the reason, backend_report() and available_backends() work, and a
    call is answered by lltm-ref."""
    copy = tmp_path / "lltm_cpu"
    shutil.copytree(LIBRARY.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    library = copy / LIBRARY.name
    data = library.read_bytes()
    size = len(data)
    if cut == "same-size-other-bytes":
        library.write_bytes(data[: size // 2] + bytes(size - size // 2))
    else:
        keep = {"4KiB": 4096, "half": size // 2, "one-byte-short": size - 1}[cut]
        library.write_bytes(data[:keep])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    env.pop("LLTM_CPU_JIT", None)
    run = subprocess.run([sys.executable, "-c", _DAMAGED_PROBE], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, f"exit {run.returncode}:\n{run.stderr[-3000:]}"
    import json

    result = json.loads(run.stdout.splitlines()[-1])
    assert result["module"].startswith(str(copy)), result  # the damaged copy was the one imported
    assert result["status"] == "unavailable" and "cpu" not in result["available"], result
    if cut == "same-size-other-bytes":
        assert "the library is damaged" in result["reason"] and "reinstall lltm-cpu" in result["reason"], result
    else:
        assert f"the library is damaged (expected {size} bytes, found {library.stat().st_size}): reinstall lltm-cpu" \
            in result["reason"], result
    assert result["answered_by"] == "ref" and result["finite"], result


def installed_copy(tmp_path: Path) -> tuple[Path, dict]:
    """A copy of the installed package under tmp_path, and an environment that imports it."""
    copy = tmp_path / "lltm_cpu"
    shutil.copytree(LIBRARY.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    env.pop("LLTM_CPU_JIT", None)
    return copy, env


def test_main_refuses_a_damaged_library(tmp_path):
    """``python -m lltm_cpu --library`` runs the checks lltm-cpu's Python side runs before loading:
    for a truncated library it prints no path (a C++ runner would die loading it) and says to
    reinstall, with a non-zero exit."""
    copy, env = installed_copy(tmp_path)
    library = copy / LIBRARY.name
    library.write_bytes(library.read_bytes()[:4096])
    run = subprocess.run([sys.executable, "-m", "lltm_cpu", "--library"], capture_output=True, text=True, env=env)
    assert run.returncode != 0 and not run.stdout.strip(), (run.returncode, run.stdout, run.stderr)
    assert "the library is damaged" in run.stderr and "reinstall lltm-cpu" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr


@pytest.mark.parametrize("record", ["LIBRARY_NAME = (\n", "TARGET_TORCH = (2, 10)\n"], ids=["syntax error", "truncated"])
def test_broken_build_record_says_reinstall_in_subprocess(tmp_path, record):
    """A _build_info.py an interrupted install or an edit broke: lltm-cpu is unavailable with a
    "reinstall lltm-cpu" reason (no raw SyntaxError), and ``--library`` says the same, exit 1."""
    copy, env = installed_copy(tmp_path)
    (copy / "_build_info.py").write_text(record)
    run = subprocess.run([sys.executable, "-c", _DAMAGED_PROBE], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, f"exit {run.returncode}:\n{run.stderr[-3000:]}"
    import json

    result = json.loads(run.stdout.splitlines()[-1])
    assert result["module"].startswith(str(copy)), result
    assert result["status"] == "unavailable" and "cpu" not in result["available"], result
    assert "_build_info.py is broken" in result["reason"] and "reinstall lltm-cpu" in result["reason"], result
    assert result["answered_by"] == "ref", result
    run = subprocess.run([sys.executable, "-m", "lltm_cpu", "--library"], capture_output=True, text=True, env=env)
    assert run.returncode == 1 and not run.stdout.strip(), (run.returncode, run.stdout, run.stderr)
    assert "reinstall lltm-cpu" in run.stderr and "Traceback" not in run.stderr, run.stderr


BUILD_CONFIG = Path(__file__).resolve().parents[1] / "lltm_cpu" / "_build_config.py"


@pytest.mark.skipif(not BUILD_CONFIG.is_file(), reason="needs lltm-cpu's source tree (lltm_cpu/_build_config.py)")
@pytest.mark.parametrize("rejected, lacking, left_out", [
    ("-mamx-tile", "amx-bf16", {"amx-bf16"}),  # GCC 10 or clang 11: no AMX
    # GCC 9: neither (the AMX kernel reads the AVX512_BF16 kernel's packing)
    ("-mavx512bf16", "avx512-bf16", {"avx512-bf16", "amx-bf16"}),
])
def test_build_leaves_out_the_kernels_its_compiler_lacks(tmp_path, rejected, lacking, left_out):
    """A compiler without some kernel's instructions builds the library without that kernel (and its
    route), says which and why, and keeps every other kernel; it does not fail the build."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"lltm-cpu's own GEMM kernels are x86-64 code, and this is {platform.machine()}")
    real = shutil.which(os.environ.get("CXX", "c++"))
    if real is None:
        pytest.skip("no C++ compiler ($CXX or c++) to stand behind the old one")
    old_compiler = tmp_path / "old-c++"
    old_compiler.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        for arg in "$@"; do
          if [ "$arg" = "{rejected}" ]; then echo "c++: error: unrecognized command-line option '{rejected}'" >&2; exit 1; fi
        done
        exec {real} "$@"
        """))
    old_compiler.chmod(0o755)
    probe = subprocess.run(
        [sys.executable, "-c", "import json, runpy, sys; c = runpy.run_path(sys.argv[1]); "
                               "print(json.dumps({k: c[k] for k in ('ISA_SOURCES', 'KERNELS_LEFT_OUT', 'COMPILE_FLAGS')}))",
         str(BUILD_CONFIG)],
        env={**os.environ, "CXX": str(old_compiler)}, capture_output=True, text=True, check=True)
    import json

    config = json.loads(probe.stdout)
    kernels = {"avx2-fma": ("csrc/cpu/gemm_f32_avx2.cpp", "-DLLTM_CPU_AVX2_FMA"),
               "avx512-fma": ("csrc/cpu/gemm_f32_avx512.cpp", "-DLLTM_CPU_AVX512_FMA"),
               "avx512-bf16": ("csrc/cpu/gemm_bf16_avx512.cpp", "-DLLTM_CPU_AVX512_BF16"),
               "amx-bf16": ("csrc/cpu/gemm_bf16_amx.cpp", "-DLLTM_CPU_AMX_BF16")}
    assert set(config["KERNELS_LEFT_OUT"]) == left_out, config
    for route, (source, macro) in kernels.items():
        assert (source in config["ISA_SOURCES"]) == (route not in left_out), (route, config)
        assert (macro in config["COMPILE_FLAGS"]) == (route not in left_out), (route, config)
    assert rejected in config["KERNELS_LEFT_OUT"][lacking], config
    for route in left_out:
        assert f"building without its {route} GEMM kernel" in probe.stderr, probe.stderr
    # The pointwise passes are not optional: every x86-64 compiler lltm-cpu supports has AVX-512F.
    assert {"csrc/cpu/pointwise_avx2.cpp", "csrc/cpu/pointwise_avx512.cpp"} <= set(config["ISA_SOURCES"])
