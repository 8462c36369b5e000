"""This CPU as lltm-cpu's kernels see it: vendor, model, the instruction sets that choose their code,
and the L1 data cache that sizes the float32 kernel's blocks (for ``lltm info`` and the benchmarks)."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch


@functools.cache
def cpu_info() -> str:
    """This CPU as the kernels see it: vendor and model, and the instruction sets that choose
    their code (AVX2, AVX-512, AVX512_BF16, AMX) and the L1 data cache that sizes the float32 kernel's
    blocks, e.g. "AuthenticAMD AMD EPYC: AVX2, AVX-512, AVX512_BF16, no AMX, L1d 48K (ATen's kernels: AVX512)"."""
    vendor = model = ""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:  # not Linux: torch's own view of the instruction sets only
        pass
    model = model or platform.processor() or platform.machine()
    capability = torch.backends.cpu.get_cpu_capability()
    if flags:
        isa = [name for flag, name in (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("avx512_bf16", "AVX512_BF16"))
               if flag in flags]
        isa.append("AMX-BF16" if "amx_bf16" in flags else "no AMX")
    else:
        isa = [capability]
    l1 = _l1_data_cache()  # sizes the float32 kernel's slices of B (csrc/cpu/gemm_f32_kernel.h)
    isa += [f"L1d {l1}"] if l1 else []
    return f"{vendor + ' ' if vendor else ''}{model}: {', '.join(isa)} (ATen's kernels: {capability})"


def _l1_data_cache() -> str | None:
    """The first CPU's L1 data cache size as Linux reports it ("48K"), or None."""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "level").read_text().strip() == "1" and (index / "type").read_text().strip() == "Data":
                return (index / "size").read_text().strip()
        except OSError:
            return None
    return None
