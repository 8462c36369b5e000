"""Fake (meta) kernels of the contract's four kernels, built from a backend's saved layouts.

One definition of the output shapes, used twice: by the fake kernels of
lltm-core's own wrapper operators ``lltm::<name>_*`` (``_ops``) and by those a compiled backend registers on its own operators
(``lltm_core.extension.register_fake_kernels``).  The layouts only do
arithmetic on their arguments, so the shapes may be symbolic.
"""

from __future__ import annotations


def cell_forward(saved_layout, input, old_h):
    """``(new_h, new_cell, *saved)`` of the step's forward."""
    B, I = input.shape
    S = old_h.shape[1]
    return [input.new_empty(shape) for shape in ((B, S), (B, S), *saved_layout(B, I, S).values())]


def cell_backward(grad_new_h, weights, needs_grad_X):
    """``(grad_X, grad_weights, grad_bias, grad_old_cell)`` of the step's backward."""
    B = grad_new_h.shape[0]
    return [
        grad_new_h.new_empty((B, weights.shape[1]) if needs_grad_X else (0,)),
        weights.new_empty(weights.shape),
        weights.new_empty((weights.shape[0],)),
        grad_new_h.new_empty(grad_new_h.shape),
    ]


def sequence_forward(sequence_saved_layout, input, h0, needs_backward):
    """``(output, h_n, c_n, *saved)``; a version-3 backend saves empty tensors when ``needs_backward`` is false."""
    T, B, I = input.shape
    S = h0.shape[1]
    saved = list(sequence_saved_layout(T, B, I, S).values())
    if not needs_backward:
        saved = [(0,)] * len(saved)
    return [input.new_empty(shape) for shape in ((T, B, S), (B, S), (B, S), *saved)]


def sequence_backward(input, weights, h0, needs_grad_input):
    """``(grad_input, grad_weights, grad_bias, grad_h0, grad_c0)`` of the sequence's backward."""
    return [
        input.new_empty(input.shape if needs_grad_input else (0,)),
        weights.new_empty(weights.shape),
        weights.new_empty((weights.shape[0],)),
        h0.new_empty(h0.shape),
        h0.new_empty(h0.shape),
    ]
