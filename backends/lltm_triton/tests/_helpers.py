"""What the test modules share: the device the kernels run on here, and the float64 oracle."""

from __future__ import annotations

import os

import torch

from lltm_core.testing import tolerance

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETER else "cuda"
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
#: Largest error relative to max(1, largest magnitude) against the float64 oracle: the kit's.
TOLERANCE = {dtype: tolerance(dtype) for dtype in DTYPES}


def rel_error(got, want) -> float:
    want = want.double()
    if want.numel() == 0:
        return 0.0
    return ((got.double() - want).abs().nan_to_num(nan=float("inf")).max() / max(1.0, want.abs().max().item())).item()
