"""Builds floor_nodes.cpp (beside this file): lltm-cpu's operators in C++ autograd nodes, the floor
that autograd_floor.py (the cell) and core_overhead.py (the sequence) measure lltm-core against."""

from __future__ import annotations

from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "floor_nodes.cpp"


def build_floor_nodes():
    """The compiled module (functions ``lltm``, ``no_kernels``, ``sequence``), or a str saying why it could not
    be built.  lltm-cpu's library must be loaded first (lltm_core.get_backend("cpu")): the nodes find its
    operators through the dispatcher when first called."""
    from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        return "ninja is not installed (pip install ninja)"
    try:
        return cpp_extension.load("lltm_floor_nodes", sources=[str(SOURCE)], extra_cflags=["-O2"])
    except Exception as error:  # noqa: BLE001 - no compiler, or headers that do not match: the caller says so
        return f"the C++ nodes did not build ({type(error).__name__}: {str(error).strip().splitlines()[-1][:200]})"
