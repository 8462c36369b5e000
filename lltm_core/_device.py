"""Whether torch can reach a GPU here: one answer for `lltm info`, the kit and the benchmarks."""

from __future__ import annotations

import torch


def cuda_unavailable_reason() -> str | None:
    """``None`` if torch sees a CUDA (or ROCm) device, else why it does not."""
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return "this torch is a CPU-only build"
    built_with = f"CUDA {torch.version.cuda}" if torch.version.cuda else f"ROCm {torch.version.hip}"
    return f"torch {torch.__version__} has {built_with}, but no GPU is visible"
