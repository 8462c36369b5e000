"""lltm-cpu's backend for lltm-core: the operators the library registers, their saved-tensor layouts
and their shapes for FakeTensorMode (the entry point ``cpu = lltm_cpu:load_backend``)."""

from __future__ import annotations

import functools

import torch
# lltm-core's standard saved layouts; what the gates hold (after activation) is csrc/cpu/lltm_kernels.cpp's choice.
from lltm_core.extension import saved_layout, sequence_saved_layout

from ._cpu_info import cpu_info
from ._library import _load_library, library_path, variant


@functools.cache
def _register_fakes() -> None:
    # The operators' shapes for FakeTensorMode, torch.compile and torch.export (see lltm_core.extension).
    from lltm_core.extension import register_fake_kernels

    register_fake_kernels("lltm_cpu", saved_layout, sequence_saved_layout)


def load_backend():
    from lltm_core.backend import Backend

    from lltm_core.extension import operator_kernels

    unavailable = _load_library()
    # The registered operators themselves: no Python frame per call (its cost at the tutorial's size:
    # benchmarks/results/cpu.md).
    forward, backward, sequence_forward, sequence_backward = operator_kernels("lltm_cpu", "cpu", unavailable)
    if unavailable is None:
        _register_fakes()
    return Backend(
        name="cpu",
        forward=forward,
        backward=backward,
        saved_layout=saved_layout,
        devices=frozenset({"cpu"}),
        dtypes=frozenset({torch.float32, torch.float64, torch.bfloat16}),
        priority=100,
        interface_versions=(1, 2, 3),
        availability=lambda: unavailable,
        # Its GEMM routes are chosen per shape at the first call: lltm_cpu.gemm_routes() lists them.
        description=(f"fused C++ kernels, vectorised per CPU instruction set; this CPU: {cpu_info()}; "
                     f"library: {variant()}"),
        sequence_forward=sequence_forward,
        sequence_backward=sequence_backward,
        sequence_saved_layout=sequence_saved_layout,
        operator_library=library_path() if unavailable is None else None,
    )
