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
def sigmoid(x):
    # Through e^{-|x|}, which never overflows: 1 / (1 + e) for x >= 0, e / (1 + e) below.
    e = tl.exp(-tl.abs(x))
    return tl.where(x >= 0, 1.0, e) / (1.0 + e)


@triton.jit
def tanh(x):
    # sign(x) (1 - e) / (1 + e) with e = e^{-2|x|} in (0, 1]: no overflow, no NaN, exact 0 at 0.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x >= 0, t, -t)


@triton.jit
def elu(x):
    return tl.where(x > 0, x, tl.exp(tl.minimum(x, 0.0)) - 1.0)


@triton.jit
def cell_forward(pre_i, pre_o, pre_z, c):
    """Pre-activations and the old cell -> (sigmoid(i), sigmoid(o), elu(z), new_c, tanh(new_c), new_h)."""
    i = sigmoid(pre_i)
    o = sigmoid(pre_o)
    z = elu(pre_z)
    new_c = c + z * i
    tanh_c = tanh(new_c)
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


#: Under the interpreter (see to_storage).  A constexpr, so a GPU build compiles the branch away.
_INTERPRETER = tl.constexpr(INTERPRETER)


@triton.jit
def to_storage(x, ptr):
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
