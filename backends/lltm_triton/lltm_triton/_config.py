"""Choices every kernel wrapper makes the same way: tile sizes, accumulator dtype, tl.dot precision."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

#: Triton's numpy interpreter (TRITON_INTERPRET=1, read when the kernels are defined): CPU tensors,
#: one program after another.
INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
#: The interpreter costs about 0.1 ms per operation per program whatever the tile's size, so
#: there tiles may be this many times larger than on a GPU: few programs, big numpy arrays.
#: lltm-triton's own tests set it to 1 for some shapes, so that the GPU's tiling (several blocks in
#: every loop, partial last blocks) runs under the interpreter too.
tile_scale = 16 if INTERPRETER else 1


#: Options every launch names.  Multiply-adds contract to FMAs, as Triton has done by default so far
#: and as benchmarks/results/ measured; Triton 3.9 warns that 3.10 turns that default off, so the
#: choice is named here and the kernels round alike on every version.  The interpreter ignores it.
LAUNCH_OPTIONS = dict(enable_fp_fusion=True)


def block(n: int, cap: int) -> int:
    """A power-of-two tile edge covering n, at least 16 (tl.dot's smallest operand edge), at most cap
    (times tile_scale).  Sizes that are not a multiple of it are padded with masked loads and stores.
    """
    return min(cap * tile_scale, max(16, triton.next_power_of_2(max(n, 1))))


def dot_dtype(dtype: torch.dtype):
    """What tl.dot's operands are cast to: the storage dtype, except bfloat16 under the interpreter.

    The interpreter keeps bfloat16 as raw uint16 bits and its tl.dot multiplies those integers; so
    there operands are widened to float32 first.  The values are the same (every bfloat16 is a
    float32), only the product's rounding differs from a GPU's bfloat16 MMA: tests/test_gpu.py
    checks bfloat16 on a GPU.
    """
    if dtype == torch.bfloat16 and INTERPRETER:
        return tl.float32
    return {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32,
            torch.float64: tl.float64}[dtype]


def accumulator(dtype: torch.dtype):
    """float64 inputs accumulate in float64; float32, float16 and bfloat16 in float32."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision: TF32 for float32 only where torch lets cuBLAS use it, else IEEE.

    The same flag, torch.backends.cuda.matmul.allow_tf32, governs the torch GEMMs these kernels sit
    beside (the input projection, the weight gradients), so a call is TF32 throughout or nowhere.
    For float16, bfloat16 and float64 the inputs are used as they are.
    """
    if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "ieee"
