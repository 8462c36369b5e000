"""Fake (meta) kernels of torch.ops.lltm_cuda.*: the output shapes and dtypes, no computation.

With them the library's own operators run under FakeTensorMode, torch.compile and torch.export
(dynamic batch and time too), so a traced graph calls lltm_cuda's operators themselves and an
AOTInductor package runs them from C++ after loading the library.  They mirror what the C++
returns (csrc/cuda/lltm_kernels.cu and lltm_sequence.cu), empty (0,) tensors included.
"""

from __future__ import annotations

import torch

_registered = False


def _forward(input, weights, bias, old_h, old_cell):
    batch, state_size = old_h.shape
    return (
        old_cell.new_empty((batch, state_size)),  # new_h
        old_cell.new_empty((batch, state_size)),  # new_cell
        input.new_empty((batch, state_size + input.shape[1])),  # X
        input.new_empty((batch, 3 * state_size)),  # gates
        old_cell.new_empty((batch, state_size)),  # tanh_cell
    )


def _backward(grad_h, grad_cell, weights, X, gates, tanh_cell, needs_grad_X):
    batch, state_size = grad_h.shape
    return (
        weights.new_empty((batch, weights.shape[1]) if needs_grad_X else (0,)),  # grad_X
        weights.new_empty(weights.shape),  # grad_weights
        weights.new_empty((3 * state_size,)),  # grad_bias
        tanh_cell.new_empty((batch, state_size)),  # grad_old_cell
    )


def _sequence_forward(input, weights, bias, h0, c0, lengths, reverse, needs_backward=True):
    steps, batch, _ = input.shape
    state_size = h0.shape[1]
    kept = needs_backward  # without a backward nothing is kept: empty gates and tanh_cell
    return (
        input.new_empty((steps, batch, state_size)),  # output
        input.new_empty((batch, state_size)),  # h_n
        input.new_empty((batch, state_size)),  # c_n
        input.new_empty((steps, batch, 3 * state_size) if kept else (0,)),  # gates
        input.new_empty((steps, batch, state_size) if kept else (0,)),  # tanh_cell
    )


def _sequence_backward(grad_output, grad_h_n, grad_c_n, weights, input, h0, output, lengths, gates, tanh_cell,
                       reverse, needs_grad_input):
    steps, batch, features = input.shape
    state_size = h0.shape[1]
    return (
        weights.new_empty((steps, batch, features) if needs_grad_input else (0,)),  # grad_input
        weights.new_empty(weights.shape),  # grad_weights
        weights.new_empty((3 * state_size,)),  # grad_bias
        input.new_empty((batch, state_size)),  # grad_h0
        input.new_empty((batch, state_size)),  # grad_c0
    )


FAKES = {
    "lltm_cuda::forward": _forward,
    "lltm_cuda::backward": _backward,
    "lltm_cuda::sequence_forward": _sequence_forward,
    "lltm_cuda::sequence_backward": _sequence_backward,
}


def register() -> None:
    """Register the fakes once, after the library has defined the operators."""
    global _registered
    if _registered:
        return
    for name, fake in FAKES.items():
        torch.library.register_fake(name, fake)
    _registered = True
