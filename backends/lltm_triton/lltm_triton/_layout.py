"""What the forward kernels save for their backward: lltm-core's standard layouts (no triton import:
lltm-core's fake kernels use these).

The same choice as lltm-ref's: the activated gates, from which the backward needs no exp, and
tanh of the new cell.  For the sequence that is (5S + I)·T·B elements with the input and output
lltm-core holds, under the contract's (6S + I)·T·B; no c_t is kept (with no forget gate
d c_{t-1} = d c_t, so the backward never needs the cell itself).
"""

from __future__ import annotations

from lltm_core.extension import saved_layout, sequence_saved_layout

__all__ = ["saved_layout", "sequence_saved_layout"]
