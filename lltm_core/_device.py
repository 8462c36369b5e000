"""Whether torch can reach a GPU here: one answer for `lltm info`, `lltm bench`, explain(), the kit and the benchmarks."""

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


def device_unavailable_reason(device: torch.device) -> str | None:
    """``None`` if this torch can make tensors on ``device`` here, else why not and what to do about it."""
    if device.type in ("cpu", "meta"):
        return None
    if device.type == "cuda":
        reason = cuda_unavailable_reason()
        if reason is None:
            count = torch.cuda.device_count()
            if device.index is not None and device.index >= count:
                return f"torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}; there is no {device}"
            return None
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return (f"{reason} (torch {torch.__version__}): install a CUDA build of torch "
                    f"(the command for your platform: https://pytorch.org/get-started/locally/)")
        return f"{reason}: check the driver (nvidia-smi, or rocm-smi) and CUDA_VISIBLE_DEVICES"
    is_available = getattr(getattr(torch, device.type, None), "is_available", None)  # torch.mps, torch.xpu, ...
    if callable(is_available) and not is_available():
        return f"torch {torch.__version__} sees no {device.type} device here"
    return None
