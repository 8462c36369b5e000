"""The LLTM cell's per-element math, forward and backward, shared by the cell and sequence kernels.

Everything here runs in the accumulator dtype (float32, or float64 for float64 inputs) whatever
the storage dtype: float16/bfloat16 values are widened on load and rounded once on store.
Only ``tl.exp`` is used, no libdevice call: tanh and sigmoid written through exp are in Triton's
core language on every backend (NVIDIA and AMD alike), and accurate to a few ulps, far inside the
kit's tolerances.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._config import INTERPRETER


@triton.jit
def cell_forward(pre_i, pre_o, pre_z, c):
    """Pre-activations and the old cell -> (sigmoid(i), sigmoid(o), elu(z), new_c, tanh(new_c), new_h).

    Written out in one function, not one per activation: under the interpreter each call of a
    @triton.jit function costs about as much as ten operations, and this runs once per time step.
    """
    # sigmoid through e^{-|x|}, which never overflows: 1 / (1 + e) for x >= 0, e / (1 + e) below.
    e_i = tl.exp(-tl.abs(pre_i))
    i = tl.where(pre_i >= 0, 1.0, e_i) / (1.0 + e_i)
    e_o = tl.exp(-tl.abs(pre_o))
    o = tl.where(pre_o >= 0, 1.0, e_o) / (1.0 + e_o)
    # elu; the exponent is clamped to <= 0 by a where, not tl.minimum, whose default returns the
    # other operand for a NaN: that made elu(NaN) 0, a finite cell where the reference has NaN.
    z = tl.where(pre_z > 0, pre_z, tl.exp(tl.where(pre_z > 0, 0.0, pre_z)) - 1.0)
    new_c = c + z * i
    # tanh as sign(x) (1 - e) / (1 + e) with e = e^{-2|x|} in (0, 1]: no overflow, no NaN, exact 0 at 0.
    e_c = tl.exp(-2.0 * tl.abs(new_c))
    tanh_abs = (1.0 - e_c) / (1.0 + e_c)
    tanh_c = tl.where(new_c >= 0, tanh_abs, -tanh_abs)
    return i, o, z, new_c, tanh_c, tanh_c * o


@triton.jit
def cell_backward(i, o, z, tanh_c, grad_h, grad_c):
    """Activated gates, tanh(new_c) and the gradients of new_h and new_c -> (d_i, d_o, d_z, d_old_c).

    elu'(u) is recovered from elu(u): 1 where it is positive, elu(u) + 1 elsewhere.  With no
    forget gate d old_c = d new_c.  Zero gradients in (masked padding) give zeros out.
    """
    grad_new_c = grad_h * o * (1.0 - tanh_c * tanh_c) + grad_c
    d_i = grad_new_c * z * i * (1.0 - i)
    d_o = grad_h * tanh_c * o * (1.0 - o)
    d_z = grad_new_c * i * tl.where(z > 0, 1.0, z + 1.0)
    return d_i, d_o, d_z, grad_new_c


def _to_storage(x, ptr):
    """x converted to the element type of ``ptr``, rounded to nearest, ties to even, as a GPU converts.

    Triton's interpreter truncates float32 -> bfloat16 instead (and its explicit "rtne" mode mishandles
    the carry into the exponent), which would bias every stored bfloat16 towards zero.  There the
    rounding is done on the float32 bits first, leaving the conversion exact.  Values stored or fed
    to tl.dot in a storage dtype go through here.
    """
    if _INTERPRETER:
        if ptr.dtype.element_ty == tl.bfloat16:
            bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
            bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
            x = bits.to(tl.float32, bitcast=True)
    return x.to(ptr.dtype.element_ty)


#: A constexpr, so that a GPU build compiles the interpreter's branch away.
_INTERPRETER = tl.constexpr(INTERPRETER)
#: On a GPU a device function.  Under the interpreter the same code as a plain Python function, which
#: the interpreted kernels call like any other: a @triton.jit call there costs about ten operations'
#: time, and this runs several times a step.
to_storage = _to_storage if INTERPRETER else triton.jit(_to_storage)
