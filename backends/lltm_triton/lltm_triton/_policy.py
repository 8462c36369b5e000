"""can_run and should_run: which calls the Triton kernels can compute, and where they are expected to win.

Cheap and deterministic, as lltm-core asks (it memoizes the answers): arithmetic on the Call and on
the current CUDA device's properties (read once per device: :func:`gpu`), no triton import.  The
on-chip limit below was measured on an H200; the others are defaults from the arithmetic, not yet
timed (benchmarks/bench_triton.py is there for that).

The persistent sequence kernel wins by not launching two kernels a step (lltm-cuda's design:
cuBLAS h W_h^T, then a pointwise kernel) and by keeping W_h on chip.  One SM of an H100 or H200
has 228 KB of shared memory (227 KB, 232448 bytes, usable by one block: the limit Triton reports)
and a 256 KB register file (64 K 32-bit registers, at most 255 a thread).  The resident kernels
hold W_h as three (S_PAD, S_PAD) tiles, S_PAD = S rounded up to a power of two (at least 16),
i.e. 3 · S_PAD² · element-size bytes:

    S_PAD   bfloat16/float16   float32    float64
      64          24 KB          48 KB      96 KB
     128          96 KB         192 KB     384 KB
     256         384 KB         768 KB    1536 KB

Measured on an NVIDIA H200 (torch 2.11.0+cu130, triton 3.6.0, 2026-12-04; benchmarks/results/
triton_shared_memory.md): in float32 at S_PAD = 128 (192 KB of W_h) the resident forward ran but
the backward needed 311296 bytes of shared memory, over the 232448 a block may have.  So W_h stays
resident up to RESIDENT_BYTES = 96 KB: S <= 128 in 16-bit, S <= 64 in float32 and float64.  At those
limits the backward took 155648 bytes (bfloat16), 102400 (float32) and 212992 (float64, the
closest; its forward spilled 6 registers), as tests/test_gpu.py's compile-at-the-limit test prints.
Past that the streaming kernels still compute the call (each program reads W_h from L2 every step)
but should_run declines: lltm-cuda's per-step cuBLAS GEMM is then expected to be faster.  On a GPU
with less shared memory a block (an A100 163 KB, consumer cards 99 KB) a variant that does not fit
falls back at launch to the next smaller one (_fit.py, with a warning).

Each program owns 16 batch rows (BLOCK_B, tl.dot's smallest M) and, W_h filling its SM's memory,
one SM: as many programs as the GPU has SMs run at once (132 on an H100/H200 SXM, the figure used
where no CUDA device is visible).  More rows than 16 per SM would run in waves, each the whole
sequence long, so should_run declines those too.  The messages give the current device's name,
SM count and shared memory per block, from torch.cuda.get_device_properties.

For the cell, a single step, the Triton kernel is one launch against lltm-cuda's two, with untuned
tiles against cuBLAS's tuned GEMM: it is expected to win while the step is launch-bound, which is
taken to be up to CELL_MACS = 2^26 multiply-adds (B · 3S · (S + I): B16 I32 S128 is 2^20).  The
least certain default here: Triton launches from Python, whose launcher costs more host time than
lltm-cuda's C++ operator call, so at that size the two may be close; bench_triton.py's cell rows
are there to settle it.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

RESIDENT_BYTES = 96 * 1024
#: Shared memory the resident backward needed with 192 KB of W_h (float32, S_PAD 128), on an H200.
RESIDENT_BACKWARD_OVER_LIMIT_BYTES = 311296
#: Where no CUDA device is visible: an H100/H200 SXM's SMs and shared memory per block (232448 bytes).
SMS = 132
SHARED_BYTES = 227 * 1024
BLOCK_B = 16
CELL_MACS = 1 << 26
#: The kernels index with 32-bit offsets (Triton's default integer type).
MAX_ELEMENTS = 2**31 - 1

_ELEMENT_SIZE = {torch.float16: 2, torch.bfloat16: 2, torch.float32: 4, torch.float64: 8}


class GPU(NamedTuple):
    """The facts about a GPU that the policy and its messages use."""

    name: str
    sms: int
    shared_bytes_per_block: int


def gpu() -> GPU:
    """The current CUDA device's facts; an H100/H200's, so named, where no CUDA device is visible."""
    if not torch.cuda.is_available():
        return GPU("an H100/H200 (assumed: no CUDA device is visible)", SMS, SHARED_BYTES)
    return _device_facts(torch.cuda.current_device())


@functools.cache
def _device_facts(index: int) -> GPU:
    props = torch.cuda.get_device_properties(index)
    # The opt-in limit is what a kernel may ask for (Triton's); a build without it has only the default.
    return GPU(props.name, props.multi_processor_count,
               getattr(props, "shared_memory_per_block_optin", props.shared_memory_per_block))


def state_pad(S: int) -> int:
    pad = 16
    while pad < S:
        pad *= 2
    return pad


def w_h_bytes(S: int, dtype: torch.dtype) -> int:
    """Bytes of W_h as the resident kernels hold it: three (S_PAD, S_PAD) tiles."""
    return 3 * state_pad(S) ** 2 * _ELEMENT_SIZE[dtype]


def resident(S: int, dtype: torch.dtype) -> bool:
    """Whether the sequence kernels keep W_h on chip (else they stream it from L2 each step)."""
    return w_h_bytes(S, dtype) <= RESIDENT_BYTES


def _largest_tensor(call) -> tuple[str, int]:
    B, I, S = call.batch, call.input_features, call.state_size
    T = call.steps or 1
    sizes = {"the weights (3S, S+I)": 3 * S * (S + I)}
    if call.op == "sequence":
        sizes.update({"the gates (T, B, 3S)": T * B * 3 * S, "the input (T, B, I)": T * B * I})
    else:
        sizes.update({"X (B, S+I)": B * (S + I), "the gates (B, 3S)": B * 3 * S})
    name = max(sizes, key=sizes.get)
    return name, sizes[name]


def can_run(call) -> bool | str:
    name, elements = _largest_tensor(call)
    if elements > MAX_ELEMENTS:
        return (f"{name} would have {elements} elements, and the Triton kernels index with 32-bit offsets "
                f"(at most {MAX_ELEMENTS}): use lltm-cuda or lltm-ref for this size")
    return True


def should_run(call) -> bool | str:
    if call.device_type == "cpu":
        return ("on the CPU it runs under Triton's interpreter (TRITON_INTERPRET=1): a correctness check, "
                "not a fast path")
    B, I, S = call.batch, call.input_features, call.state_size
    if call.op == "cell":
        macs = B * 3 * S * (S + I)
        if macs > CELL_MACS:
            return (f"the step's GEMM is {macs} multiply-adds (> {CELL_MACS}): not launch-bound, where cuBLAS's "
                    f"tuned GEMM (lltm-cuda) is expected to beat these untuned tl.dot tiles")
        return True
    dtype_name = str(call.dtype).removeprefix("torch.")
    device = gpu()
    if not resident(S, call.dtype):
        return (f"W_h at S={S} in {dtype_name} is {w_h_bytes(S, call.dtype) // 1024} KB as 3 tiles of "
                f"{state_pad(S)}x{state_pad(S)}, over the {RESIDENT_BYTES // 1024} KB kept on chip (the resident "
                f"backward with 192 KB of W_h needs {RESIDENT_BACKWARD_OVER_LIMIT_BYTES // 1024} KB of shared "
                f"memory; a block may have {device.shared_bytes_per_block // 1024} KB on {device.name}): streamed "
                f"from L2 every step, the persistent kernel is not expected to beat lltm-cuda's per-step cuBLAS GEMM")
    programs = -(-B // BLOCK_B)
    if programs > device.sms:
        return (f"B={B} needs {programs} programs of {BLOCK_B} rows, each holding W_h on one SM: more than the "
                f"{device.sms} SMs of {device.name} run in waves of the whole sequence, where lltm-cuda's "
                f"per-step GEMMs over all rows are expected to win")
    return True
