"""What the forward kernels save for their backward (no triton import: lltm-core's fake kernels use these).

The same choice as lltm-ref's: the activated gates, from which the backward needs no exp, and
tanh of the new cell.  For the sequence that is (5S + I)·T·B elements with the input and output
lltm-core holds, under the contract's (6S + I)·T·B; no c_t is kept (with no forget gate
d c_{t-1} = d c_t, so the backward never needs the cell itself).
"""

from __future__ import annotations


def saved_layout(batch: int, input_features: int, state_size: int) -> dict:
    return {
        "X": (batch, state_size + input_features),  # cat([old_h, input]), written by the forward kernel
        "gates": (batch, 3 * state_size),  # activated [sigmoid(i) | sigmoid(o) | elu(z)]
        "tanh_cell": (batch, state_size),  # tanh(new_cell)
    }


def sequence_saved_layout(steps: int, batch: int, input_features: int, state_size: int) -> dict:
    return {
        "gates": (steps, batch, 3 * state_size),  # per step, activated [sigmoid(i) | sigmoid(o) | elu(z)]
        "tanh_cell": (steps, batch, state_size),  # per step tanh(c_t)
    }
