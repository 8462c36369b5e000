"""lltm-triton's kernels compiled for an NVIDIA GPU by Triton on a machine without one: every variant
each wrapper may launch, with its shared memory, registers and spills.

Triton's interpreter (nox -s triton) runs the kernels' arithmetic but compiles nothing, so whether a
variant compiles, and how much shared memory it asks for (what Triton's loader refuses with
OutOfResources: _fit.py), is otherwise only seen on a GPU.  Here each wrapper (_sequence, _cell)
runs on small CPU tensors with first_that_fits replaced by a recorder: a launch site yields every
variant of its ladder, largest first, with the very arguments the wrapper passes, and nothing runs.
Each variant is then compiled by triton.compile for a GPUTarget: Triton's compiler and its bundled
ptxas, as a launch on that GPU would, and cuobjdump (bundled too) reads the cubin's registers and
local memory (spills).

    python backends/lltm_triton/tests/compile_for_gpu.py              # a Markdown table, sm_90
    python backends/lltm_triton/tests/compile_for_gpu.py --arch 80 --json

TRITON_INTERPRET must be unset: the kernels must be Triton's JIT functions, and the tiles the GPU's
(under the interpreter they are _config.tile_scale times larger).  test_compiled.py runs this in a
process of its own and checks the figures against _policy's limits.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("compile_for_gpu.py: unset TRITON_INTERPRET: the interpreter's kernels compile nothing")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

import lltm_triton._cell as cell_module  # noqa: E402
import lltm_triton._sequence as sequence_module  # noqa: E402
from _helpers import DTYPES  # noqa: E402 - the test modules' dtypes (this file runs from their folder)
from lltm_core.testing import make_inputs, make_sequence_inputs  # noqa: E402

#: (T, B, I, S) of the sequence.  Triton compiles integers divisible by 16 differently from others
#: (and pointers alike), so both kinds: B16 I8 as test_gpu.py's compile-at-the-limit test runs them, at
#: the largest W_h kept on chip (S64 in float32 and float64, S128 in 16-bit); B20 I24 with S37, whose
#: W_h pads to a resident S_PAD of 64 in every dtype, and S200, which streams in every dtype.
SEQUENCE_SIZES = ((4, 16, 8, 64), (4, 16, 8, 128), (5, 20, 24, 37), (5, 20, 24, 200))
#: (B, I, S) of the cell: the tutorial's size, and one where every tile is at its cap.
CELL_SIZES = ((16, 32, 128), (256, 256, 1024))
_OPTIONS = ("num_warps", "num_stages")


@dataclasses.dataclass
class Variant:
    """One variant of one launch site's ladder, as compiled for ``arch``."""

    kernel: str
    dtype: str
    state_size: int
    call: str  # what the wrapper was asked for
    rank: int  # its place in the ladder: 0 is what _fit.first_that_fits launches first
    ladder: int  # how many variants the ladder has
    tiles: dict
    arch: int
    shared: int | None = None  # bytes a block, as Triton's loader checks them
    registers: int | None = None
    local_bytes: int | None = None  # spills: local memory a thread (cuobjdump's LOCAL + STACK)
    error: str | None = None


class _Recorder:
    """Stands in for a kernel: ``kernel[grid](*args, **meta)`` records the launch instead of making it."""

    def __init__(self, kernel, launches: list):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        return lambda *args, **meta: self.launches.append((self.kernel, args, meta))


def record_launches(run) -> list[tuple]:
    """Call ``run()`` with _fit.first_that_fits replaced in the wrappers: [(dtype, S, [(kernel, args, meta),
    ...] in ladder order)] for each launch site it reached."""
    sites = []

    def every_variant(configs, launch, device, dtype, S):
        launches = []
        for kernel, tiles in configs:
            launch(_Recorder(kernel, launches), tiles)
        sites.append((dtype, S, launches))

    saved = sequence_module.first_that_fits, cell_module.first_that_fits
    sequence_module.first_that_fits = cell_module.first_that_fits = every_variant
    try:
        run()
    finally:
        sequence_module.first_that_fits, cell_module.first_that_fits = saved
    return sites


def _calls():
    """(description, function) for each wrapper call whose launches are compiled."""
    def sequence(dtype, T, B, I, S, lengths=False, needs_backward=True, tf32=False):
        def run():
            allowed = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32  # read by _config.dot_precision as the wrapper launches
            try:
                x, w, b, h0, c0 = (t.detach() for t in make_sequence_inputs(T, B, I, S, dtype=dtype))
                lens = torch.randint(1, T + 1, (B,)) if lengths else None
                out = sequence_module.sequence_forward(x, w, b, h0, c0, lens, False, needs_backward)
                if needs_backward:
                    sequence_module.sequence_backward(out[0], out[1], out[2], w, x, h0, out[0], lens, out[3], out[4],
                                                      False, True)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = allowed
        return run

    def cell(dtype, B, I, S):
        def run():
            x, w, b, h, c = (t.detach() for t in make_inputs(B, I, S, dtype=dtype, requires_grad=False))
            new_h, new_c, X, gates, tanh_c = cell_module.forward(x, w, b, h, c)
            cell_module.backward(new_h, new_c, w, X, gates, tanh_c, True)
        return run

    for dtype in DTYPES:
        for T, B, I, S in SEQUENCE_SIZES:
            yield f"sequence T{T} B{B} I{I} S{S}", sequence(dtype, T, B, I, S)
        yield "sequence T5 B20 I24 S37, lengths, no backward", sequence(dtype, 5, 20, 24, 37, True, False)
        yield "sequence T5 B20 I24 S37, lengths", sequence(dtype, 5, 20, 24, 37, True)
        if dtype == torch.float32:
            for T, B, I, S in SEQUENCE_SIZES[::2]:
                yield f"sequence T{T} B{B} I{I} S{S}, TF32", sequence(dtype, T, B, I, S, tf32=True)
        for B, I, S in CELL_SIZES:
            yield f"cell B{B} I{I} S{S}", cell(dtype, B, I, S)


def _compile(kernel, args, meta: dict, target: GPUTarget):
    """``kernel[grid](*args, **meta)``'s compilation on a GPU of ``target``, without one.

    The specialization is Triton's own, from the same arguments: its binder marks 16-byte aligned
    pointers and integers divisible by 16 (or equal to 1) as JITFunction.run does, which changes the
    code, its registers and its shared memory.  The binder and _pack_args are Triton internals, the
    same from 3.6 (torch 2.11's) to 3.9 (nox -s triton's).
    """
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound_args, specialization, options = binder(*args, **meta)
    options, signature, constexprs, attrs = kernel._pack_args(backend, meta, bound_args, specialization, options)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def _resources(cubin: bytes) -> dict:
    """Registers and local bytes a thread from the cubin, by Triton's bundled cuobjdump ({} if it has none)."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(cuobjdump):
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        text = subprocess.run([cuobjdump, "--dump-resource-usage", file.name], capture_output=True, text=True,
                              check=True).stdout
    usage = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", text.split("Function", 1)[-1]))
    return {"registers": int(usage["REG"]), "local_bytes": int(usage["STACK"]) + int(usage["LOCAL"])}


def compile_variants(arch: int = 90) -> list[Variant]:
    """Every variant of every launch site of _calls(), compiled for sm_<arch> (an error is recorded, not raised)."""
    variants, compiled = [], {}
    target = GPUTarget("cuda", arch, 32)
    for call, run in _calls():
        for dtype, S, launches in record_launches(run):
            for rank, (kernel, args, meta) in enumerate(launches):
                tiles = {k: v for k, v in meta.items() if k.startswith(("BLOCK_", "S_PAD")) or k in _OPTIONS}
                variant = Variant(kernel.__name__, str(dtype).removeprefix("torch."), S, call, rank, len(launches),
                                  tiles, arch)
                # Equal keys compile alike: the same kernel, argument dtypes, scalars and constants.
                key = (kernel.__name__, repr(meta), tuple((a.dtype, a.data_ptr() % 16) if isinstance(a, torch.Tensor)
                                                          else a for a in args))
                if key not in compiled:
                    try:
                        binary = _compile(kernel, args, meta, target)
                        compiled[key] = dict(shared=binary.metadata.shared, **_resources(binary.asm["cubin"]))
                    except Exception as error:  # noqa: BLE001 - reported with the variant that raised it
                        compiled[key] = dict(error=f"{type(error).__name__}: {error}"[:2000])
                variants.append(dataclasses.replace(variant, **compiled[key]))
    return variants


def markdown(variants: list[Variant]) -> str:
    rows = ["| kernel | dtype | call | variant | tiles | shared memory (bytes) | registers | local bytes (spills) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    seen = set()
    for v in variants:
        line = (f"| {v.kernel} | {v.dtype} | {v.call} | {v.rank + 1} of {v.ladder} | "
                f"{', '.join(f'{k} {n}' for k, n in v.tiles.items())} | "
                f"{v.error or v.shared} | {v.registers if v.registers is not None else '-'} | "
                f"{v.local_bytes if v.local_bytes is not None else '-'} |")
        if line not in seen:
            seen.add(line)
            rows.append(line)
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="the compute capability, 90 for an H100/H200")
    parser.add_argument("--json", action="store_true", help="one JSON list of the variants instead of a table")
    options = parser.parse_args(argv)
    variants = compile_variants(options.arch)
    if options.json:
        print(json.dumps([dataclasses.asdict(v) for v in variants]))
    else:
        print(f"sm_{options.arch}, triton {triton.__version__}, torch {torch.__version__}\n")
        print(markdown(variants))
    return 1 if any(v.error for v in variants) else 0


if __name__ == "__main__":
    sys.exit(main())
