"""Launch at the largest tiles that fit the GPU's shared memory, falling back to smaller ones.

Triton checks a compiled kernel's shared memory (and threads) against the GPU's per-block limit as
it loads the kernel, before the kernel runs, and raises OutOfResources.  The wrappers' tiles are
sized for an H100/H200 (232448 bytes a block, as Triton reported on an H200); an A100 allows
166912, a consumer card about 101376.  So each wrapper lists its configurations, largest first:
for the sequence, W_h resident, then streaming at the default tiles, then at each smaller power of
two down to 16; for the cell, its tiles, then halved down to 16.  The first that loads runs; one
that did not is remembered, per kernel, device, dtype, S and tiles, so later calls go straight to
the one that fitted.  Past the smallest, an error says to use lltm-cuda.  The interpreter compiles
nothing and never raises it: tests/test_kernels.py raises OutOfResources by hand, tests/test_gpu.py
meets a real one, and tests/test_compiled.py compiles every variant for sm_90 without a GPU and
checks its bytes against these limits.
"""

from __future__ import annotations

import os
import warnings
from typing import Callable

from lltm_core.extension import user_stacklevel
from triton.runtime.errors import OutOfResources

#: (kernel name, device, dtype, S, tiles) -> Triton's message, for each configuration that did not load.
too_large: dict[tuple, str] = {}


def halvings(caps: dict[str, int]) -> list[dict[str, int]]:
    """caps, then every cap halved, and again, until all are 16 (tl.dot's smallest operand edge)."""
    ladder = [dict(caps)]
    while any(cap > 16 for cap in ladder[-1].values()):
        ladder.append({name: max(16, cap // 2) for name, cap in ladder[-1].items()})
    return ladder


def _key(kernel, device, dtype, S: int, tiles: dict[str, int]) -> tuple:
    return (kernel.__name__, str(device), dtype, S, tuple(sorted(tiles.items())))


def first_that_fits(configs: list, launch: Callable, device, dtype, S: int):
    """launch(kernel, tiles) for the first (kernel, tiles) of configs, largest first, that the GPU can load.

    OutOfResources comes before the kernel runs, so nothing has been written when the next is tried.
    Until a configuration has failed somewhere, no key is built: the common call launches the first.
    A small S gives several caps the same tiles; the first to fail is in too_large for the others.
    """
    key = None
    for kernel, tiles in configs:
        key = _key(kernel, device, dtype, S, tiles) if too_large else None
        if key in too_large:
            continue
        try:
            return launch(kernel, tiles)
        except OutOfResources as error:
            key = key or _key(kernel, device, dtype, S, tiles)
            too_large[key] = str(error)
            warnings.warn(f"lltm-triton: {kernel.__name__} with {tiles} at S={S} in {dtype} does not fit this "
                          f"GPU ({error}); trying smaller tiles, slower than should_run assumed",
                          stacklevel=user_stacklevel(os.path.dirname(__file__)))
    raise RuntimeError(f"lltm-triton: {kernel.__name__} at S={S} in {dtype} does not fit this GPU even at its "
                       f"smallest tiles {tiles} ({too_large[key]}): use lltm-cuda instead (backend=\"cuda\")")
