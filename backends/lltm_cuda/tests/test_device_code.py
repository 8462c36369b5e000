"""What nvcc makes of lltm-cuda's kernels, read without a GPU (ptxas's report, `-Xptxas -v`).

For each architecture the installed build was compiled for, every kernel of each source:
- spills no register and keeps no stack frame: the persistent kernels hold a step's operands in
  registers, and local memory there would cost each step a round trip (the register tiling's
  predictions in benchmarks/results/h200.md assume none);
- fits a block of the launches' threads in one multiprocessor's registers, or the launch fails on
  the device ("too many resources requested"): the sources give no __launch_bounds__, so nothing
  else holds ptxas to it;
- has no static shared memory, which the planner's count of a block's shared memory (all dynamic,
  held to the device's opt-in limit) would miss.

Runs on the real build (`nox -s cuda`), compiling each source again with the toolkit that built
it, the build's flags and its architectures (about 10 s a source and architecture); the emulated
build has no device code and skips.  `pytest -s` prints each kernel's registers.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from torch.utils import cpp_extension

from _emulated import EMULATED, setup_py, the_build_under_test

if EMULATED:
    pytest.skip("the emulated build has no device code: nox -s cuda compiles and reads it", allow_module_level=True)
lltm_cuda = the_build_under_test()

ROOT = Path(__file__).resolve().parents[1]
# An sm_80's and an sm_90's multiprocessor hold 64K 32-bit registers; a warp's are allocated in
# units of 256, so a thread's count rounds up to a multiple of 8.
REGISTERS_PER_MULTIPROCESSOR = 65536
REGISTER_UNIT = 8
# The threads of every launch (rt::threads_per_block in the real build's runtime).
THREADS_PER_BLOCK = int(re.search(r"constexpr int threads_per_block\(\) \{ return (\d+); \}",
                                  (ROOT / "csrc/cuda/lltm_runtime.cuh").read_text()).group(1))
# Kernels each source must define: a file that compiled none would otherwise pass.
KERNELS = {
    "csrc/cuda/lltm_kernels.cu": ["lltm_forward_kernel", "lltm_backward_kernel"],
    "csrc/cuda/lltm_sequence.cu": ["sequence_forward_step_kernel", "sequence_backward_step_kernel"],
    "csrc/cuda/lltm_persistent.cu": ["persistent_forward_kernel", "persistent_backward_kernel",
                                     "persistent_grid_forward_kernel", "persistent_grid_backward_kernel",
                                     "persistent_grid_forward_mma_kernel", "persistent_grid_backward_mma_kernel"],
}


def _architectures() -> list[str]:
    """The build's TORCH_CUDA_ARCH_LIST as nvcc's names: '8.0;9.0+PTX' gives sm_80 and sm_90, '9.0a' sm_90a."""
    names = []
    for entry in re.split(r"[;\s]+", lltm_cuda._build_info.ARCH_LIST.strip()):
        if entry:
            m = re.fullmatch(r"(\d+)\.(\d+)([af]?)(\+PTX)?", entry)
            assert m, f"TORCH_CUDA_ARCH_LIST entry {entry!r}: this test reads only numbered architectures (9.0, 8.6+PTX)"
            names.append(f"sm_{m.group(1)}{m.group(2)}{m.group(3)}")
    return names


def _ptxas_report(source: str, arch: str) -> str:
    setup = setup_py()
    nvcc = Path(lltm_cuda._build_info.CUDA_HOME) / "bin" / "nvcc"
    if not nvcc.is_file():  # a wheel built on another machine
        pytest.skip(f"the CUDA toolkit that built lltm-cuda ({lltm_cuda._build_info.CUDA_HOME}) is not on this "
                    f"machine: nox -s cuda builds and reads the kernels")
    includes = [f"-I{p}" for p in cpp_extension.include_paths("cuda")]
    command = [str(nvcc), "-cubin", f"-arch={arch}", "-Xptxas", "-v",
               "-DUSE_CUDA",  # as setup.py's define_macros
               *cpp_extension.COMMON_NVCC_FLAGS, *setup.NVCC_FLAGS, *includes,
               str(ROOT / source), "-o", "/dev/null"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"nvcc failed on {source} for {arch}:\n{run.stderr[-4000:]}"
    return run.stderr + run.stdout


def _functions(report: str) -> dict[str, dict[str, int]]:
    """Each function ptxas compiled: its stack frame, spill stores and loads, and (entry functions)
    its registers."""
    functions: dict[str, dict[str, int]] = {}
    entry = described = None
    for line in report.splitlines():
        if m := re.search(r"Compiling entry function '(\S+)'", line):
            entry = m.group(1)
            functions.setdefault(entry, {})["entry"] = 1
        elif m := re.search(r"Function properties for (\S+)", line):
            described = m.group(1)
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            functions.setdefault(described, {}).update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                                                       spill_loads=int(m.group(3)))
        elif m := re.search(r"Used (\d+) registers", line):
            functions.setdefault(entry, {})["registers"] = int(m.group(1))
            if s := re.search(r"(\d+) bytes smem", line):
                functions[entry]["static_shared"] = int(s.group(1))
    return functions


@pytest.mark.parametrize("arch", _architectures())
@pytest.mark.parametrize("source", list(KERNELS))
def test_no_kernel_spills_or_keeps_a_stack_frame_and_a_block_fits_a_multiprocessor(source, arch):
    functions = _functions(_ptxas_report(source, arch))
    entries = {name: f for name, f in functions.items() if f.get("entry")}
    assert entries, f"ptxas compiled no kernel of {source} for {arch}"
    for kernel in KERNELS[source]:
        assert any(kernel in name for name in entries), f"{kernel} is not among {source}'s kernels for {arch}"
    for name, f in sorted(entries.items()):
        print(f"{arch} {f.get('registers', '?'):>3} registers  {name}")
    spilling = {name: f for name, f in functions.items() if f.get("stack", 0) or f.get("spill_stores", 0)
                or f.get("spill_loads", 0)}
    assert not spilling, f"{source} for {arch}: spills or a stack frame in {spilling}"
    # plan_sequence holds a block's dynamic shared memory to the device's opt-in limit: static
    # shared memory would come on top, unplanned.
    static = {name: f["static_shared"] for name, f in entries.items() if f.get("static_shared")}
    assert not static, f"{source} for {arch}: static shared memory the planner does not count: {static}"
    budget = REGISTERS_PER_MULTIPROCESSOR // THREADS_PER_BLOCK
    over = {name: f["registers"] for name, f in entries.items()
            if -(-f["registers"] // REGISTER_UNIT) * REGISTER_UNIT > budget}
    assert not over, (f"{source} for {arch}: a block of {THREADS_PER_BLOCK} threads needs more than a "
                      f"multiprocessor's {REGISTERS_PER_MULTIPROCESSOR} registers: {over}")
