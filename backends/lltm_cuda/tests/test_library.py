"""The built operator library as a file: stable ABI only, no Python, checked before it is loaded.

Runs on whichever build is installed: the emulated one under `nox -s cuda_emulated`
(LLTM_CUDA_TEST_EMULATED=1, where its absence is an error), the real nvcc one under `nox -s cuda`.
None of it needs a GPU.  Needs binutils (readelf, nm) and a C++ compiler, as building does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

from _emulated import EMULATED, setup_py, the_build_under_test

lltm_cuda = the_build_under_test()
from lltm_core.extension import library_fingerprint  # noqa: E402

_build_info = lltm_cuda._build_info
PACKAGE = lltm_cuda.__name__
LIBRARY = Path(lltm_cuda.library_path())
TORCH_LIB = Path(torch.__file__).parent / "lib"


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not on PATH: install binutils (it ships with the compiler that builds lltm-cuda)"
    return path


def test_library_path_is_the_recorded_library():
    assert LIBRARY.is_file() and LIBRARY.name == _build_info.LIBRARY_NAME
    out = subprocess.run([sys.executable, "-m", PACKAGE, "--library"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(LIBRARY)


def test_the_record_is_the_file():
    """The build's fingerprint (lltm_build.py, recorded at build time) and lltm-core's (checked at
    load) agree."""
    lltm_build = setup_py().lltm_build
    recorded = (_build_info.LIBRARY_SIZE, _build_info.LIBRARY_SHA256)
    assert library_fingerprint(LIBRARY) == recorded
    assert lltm_build.library_fingerprint(LIBRARY) == recorded


def test_requires_torch_from_the_target_on():
    dist = "lltm-cuda-emulated" if EMULATED else "lltm-cuda"
    torch_reqs = [r for r in metadata.requires(dist) if re.match(r"torch\b", r)]
    assert torch_reqs == [f"torch>={'.'.join(map(str, _build_info.TARGET_TORCH))}"], torch_reqs


def test_no_python_and_no_debug_sections():
    dynamic = subprocess.run([_tool("readelf"), "-d", str(LIBRARY)], capture_output=True, text=True,
                             check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
    assert needed, dynamic
    assert not [n for n in needed if "python" in n], needed  # neither libpython nor libtorch_python
    sections = subprocess.run([_tool("readelf"), "-S", "-W", str(LIBRARY)], capture_output=True, text=True,
                              check=True).stdout
    assert not re.findall(r"\.debug_\w+", sections), "a release build carries no debug sections"


# What the library may take from outside: torch's C shim and stable C API (aoti_torch_*, torch_*),
# the C and C++ runtimes, and (the real build) the CUDA runtime.  No C++ symbol of torch, c10 or
# ATen: those change with every torch release.
_CXX_RUNTIME = re.compile(r"^(std::|__cxxabiv1::|__gnu_cxx::|operator (new|delete)|(vtable|typeinfo|typeinfo name|VTT) "
                          r"for (std::|__cxxabiv1::|__gnu_cxx::))")
_TORCH_CXX = re.compile(r"(^|[^\w])(c10|at|torch|caffe2|aten)::")


def _undefined_symbols(path: Path) -> list[str]:
    out = subprocess.run([_tool("nm"), "-D", "--undefined-only", "--demangle", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return [line.split(None, 1)[1].split("@")[0] for line in out.splitlines() if line.strip()]


def non_stable_symbols(symbols: list[str]) -> list[str]:
    """The symbols a stable-ABI library must not need (demangled, as nm prints them)."""
    bad = []
    for symbol in symbols:
        if _TORCH_CXX.search(symbol) or symbol.startswith(("Py", "_Py", "THP")):
            bad.append(symbol)
        elif ("::" in symbol or "(" in symbol) and not _CXX_RUNTIME.match(symbol):
            bad.append(symbol)  # some other C++ library's ABI
    return bad


def test_the_symbol_check_catches_torch_cxx():
    """The rule itself, on names as nm demangles them (so that an empty list means something)."""
    assert non_stable_symbols([
        "c10::detail::torchCheckFail(char const*, char const*, unsigned int, char const*)",
        "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)",
        "torch::Library::_def(c10::FunctionSchema&&, c10::OperatorName*, std::vector<at::Tag> const&)",
        "std::vector<c10::IValue, std::allocator<c10::IValue> >::reserve(unsigned long)",
        "PyModule_Create2",
    ]) == [
        "c10::detail::torchCheckFail(char const*, char const*, unsigned int, char const*)",
        "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)",
        "torch::Library::_def(c10::FunctionSchema&&, c10::OperatorName*, std::vector<at::Tag> const&)",
        "std::vector<c10::IValue, std::allocator<c10::IValue> >::reserve(unsigned long)",
        "PyModule_Create2",
    ]
    assert non_stable_symbols(["aoti_torch_cpu_mm_out", "torch_call_dispatcher", "cudaLaunchKernel", "memcpy",
                               "std::__throw_bad_array_new_length()", "operator delete(void*, unsigned long)",
                               "vtable for __cxxabiv1::__class_type_info", "__cxa_throw"]) == []


def test_only_stable_symbols_are_undefined():
    symbols = _undefined_symbols(LIBRARY)
    assert any(s.startswith("aoti_torch_") for s in symbols), symbols  # the check reads the right table
    bad = non_stable_symbols(symbols)
    assert not bad, "the library needs torch's C++ ABI, not only its stable C API:\n" + "\n".join(bad)


def test_any_aten_header_is_an_error_under_the_build_flags(tmp_path):
    """TORCH_TARGET_VERSION (setup.py's CXX_FLAGS) turns an ordinary ATen header into a compile error."""
    setup = setup_py()
    from torch.utils.cpp_extension import include_paths

    source = tmp_path / "uses_aten.cpp"
    source.write_text("#include <ATen/core/Tensor.h>\n")
    compiler = os.environ.get("CXX", "c++")
    run = subprocess.run([compiler, "-std=c++17", "-fsyntax-only", *setup.CXX_FLAGS,
                          *[f"-I{p}" for p in include_paths()], str(source)], capture_output=True, text=True)
    assert run.returncode != 0 and "should not be included" in run.stderr, run.stderr[-2000:]


_LOADER = r"""
// Loads libtorch, then an operator library, as a C++ program that deploys a model does: no Python.
#include <dlfcn.h>
#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    // libtorch RTLD_GLOBAL first: the operator library resolves the shim's symbols against it.
    if (dlopen(argv[i], RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      std::fprintf(stderr, "dlopen failed: %s\n", dlerror());
      return 1;
    }
  }
  std::FILE* maps = std::fopen("/proc/self/maps", "r");
  char line[4096];
  while (maps != nullptr && std::fgets(line, sizeof line, maps) != nullptr) {
    if (std::strstr(line, "libpython") != nullptr || std::strstr(line, "libtorch_python") != nullptr) {
      std::fprintf(stderr, "Python is mapped: %s", line);
      return 2;
    }
  }
  std::printf("loaded %d libraries without Python\n", argc - 1);
  return 0;
}
"""


def test_loads_with_rtld_now_in_a_process_without_python(tmp_path):
    source = tmp_path / "loader.cpp"
    source.write_text(_LOADER)
    loader = tmp_path / "loader"
    compiler = os.environ.get("CXX", "c++")
    subprocess.run([compiler, "-o", str(loader), str(source), "-ldl"], check=True)
    run = subprocess.run([str(loader), str(TORCH_LIB / "libtorch.so"), str(LIBRARY)], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    assert run.returncode == 0, run.stderr
    assert "loaded 2 libraries without Python" in run.stdout
    # And the loader would have said so had the library needed Python: it is not linked against it.
    assert "libpython" not in subprocess.run(["ldd", str(loader)], capture_output=True, text=True).stdout


_PROBE = """
import sys, lltm_core
sys.path.insert(0, {where!r})
import {package} as m
assert m.__file__.startswith({where!r}), m.__file__
print("REASON:", m.unavailable_reason())
print("AVAILABLE:", lltm_core.available_backends())
"""


@pytest.mark.parametrize("damage", ["truncated", "replaced"])
def test_a_damaged_library_is_reported_not_loaded(tmp_path, damage):
    """What an interrupted install or a full disk leaves: a truncated (or otherwise changed)
    library.  Loading it may kill the process (SIGBUS); it must be reported and passed over."""
    copy = tmp_path / PACKAGE
    shutil.copytree(Path(lltm_cuda.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / _build_info.LIBRARY_NAME
    data = target.read_bytes()
    if damage == "truncated":
        target.write_bytes(data[:4096])
    else:
        middle = len(data) // 2
        target.write_bytes(data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:])
    env = {k: v for k, v in os.environ.items() if k != "LLTM_CUDA_EMULATED_LIBRARY"}
    run = subprocess.run([sys.executable, "-c", _PROBE.format(where=str(tmp_path), package=PACKAGE)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    distribution = "lltm-cuda-emulated" if EMULATED else "lltm-cuda"
    if damage == "truncated":
        want = f"the library is damaged (expected {len(data)} bytes, found 4096): reinstall {distribution}"
    else:
        want = f"the library is damaged (its content differs from the build's record): reinstall {distribution}"
    assert f"REASON: {want}" in run.stdout, run.stdout
    name = "cuda_emulated" if EMULATED else "cuda"
    available = re.search(r"AVAILABLE: (.*)", run.stdout).group(1)
    assert f"'{name}'" not in available, available
