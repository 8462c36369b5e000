"""What the test modules share: the device the kernels run on here, and the float64 oracle."""

from __future__ import annotations

import os

import torch

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETER else "cuda"
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
#: Largest error relative to max(1, largest magnitude) against the float64 oracle (the kit's).
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 4e-2}


def rel_error(got, want) -> float:
    want = want.double()
    if want.numel() == 0:
        return 0.0
    return ((got.double() - want).abs().nan_to_num(nan=float("inf")).max() / max(1.0, want.abs().max().item())).item()
