"""lltm-cpu: the LLTM as fused, vectorised C++ kernels for CPU tensors.

The kernels are the operators ``torch.ops.lltm_cpu.forward`` and
``torch.ops.lltm_cpu.backward`` (one step), and
``torch.ops.lltm_cpu.sequence_forward`` and ``.sequence_backward`` (one layer
over a whole sequence, the time loop in C++), in the compiled library
``lltm_cpu/_C.abi3.so``.  It is built against torch's stable ABI of 2.10, so
it loads on every torch from 2.10 on, and it has no Python in it: this module
loads it with ``torch.ops.load_library``, and a C++ program (an AOTInductor
runner, say) with ``dlopen``; ``library_path()`` or ``python -m lltm_cpu
--library`` says where it is.
lltm-core finds this backend through the ``lltm.backends`` entry point
``cpu = lltm_cpu:load_backend``.

With ``LLTM_CPU_JIT=1`` the library is instead compiled from this source tree
on first use (torch.utils.cpp_extension.load, with ninja), for working on the
C++ without reinstalling.
"""

from __future__ import annotations

from ._cpu_info import cpu_info
from ._factory import load_backend, saved_layout, sequence_saved_layout
from ._library import gemm_routes, kernels_left_out, library_path

__all__ = ["saved_layout", "sequence_saved_layout", "load_backend", "cpu_info", "gemm_routes", "kernels_left_out",
           "library_path"]
