"""lltm-ref: the LLTM in plain PyTorch operators, with a hand-written backward.

It runs wherever PyTorch runs (any device, any floating dtype) and is the
fallback lltm-core chooses when no fused backend can take a call.  This module
must not import lltm_core at import time: lltm-core depends on lltm-ref, so the
import happens inside :func:`load_backend`, which only lltm-core calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "forward", "backward", "sequence_forward", "sequence_backward", "sequence_gemm_gradients",
    "load_backend",
]

# The derivative kernels autograd itself uses, bound once: resolving
# torch.ops.aten.<name> on every call costs more than the arithmetic here.
_tanh_backward = torch.ops.aten.tanh_backward.default
_sigmoid_backward = torch.ops.aten.sigmoid_backward.default
_elu_backward = torch.ops.aten.elu_backward.default
_elu_ = torch._C._nn.elu_  # F.elu(inplace=True) without its Python wrapper (0.3 us a call)


# What forward saves: lltm_core.extension.saved_layout's X = cat([old_h, input]), gates =
# [sigmoid(input gate) | sigmoid(output gate) | elu(candidate gate)] (elu' is recovered from the
# last), tanh_cell = tanh(new_cell); sequence_forward saves the same per step, less X.


def forward(input, weights, bias, old_h, old_cell):
    # Few operators, each as large as it can be: at the seed's size (B16 S128)
    # per-operator dispatch, not arithmetic, is what the time is made of.  The
    # gates are activated in place, in the projection's own buffer, which is
    # then saved whole: one tensor for the backward, not three.
    S = old_h.shape[1]
    X = torch.cat([old_h, input], dim=1)
    gates = F.linear(X, weights, bias)
    sig_gates, candidate = gates.split_with_sizes([2 * S, S], 1)  # views are ~1 us each here: few of them
    input_gate, output_gate = sig_gates.sigmoid_().split_with_sizes([S, S], 1)
    _elu_(candidate)
    new_cell = torch.addcmul(old_cell, candidate, input_gate)
    tanh_cell = torch.tanh(new_cell)
    new_h = tanh_cell * output_gate
    return new_h, new_cell, X, gates, tanh_cell


def backward(grad_h, grad_cell, weights, X, gates, tanh_cell, needs_grad_X):
    S = tanh_cell.shape[1]
    # split_with_sizes: the cheapest way to views here (Tensor.split and chunk add Python or a size computation)
    sig_gates, candidate = gates.split_with_sizes([2 * S, S], 1)
    input_gate, output_gate = sig_gates.split_with_sizes([S, S], 1)
    # d new_cell: through new_h = tanh(new_cell) * o, plus the direct gradient.
    grad_new_cell = _tanh_backward(grad_h * output_gate, tanh_cell).add_(grad_cell)
    grad_sig = _sigmoid_backward(
        torch.cat([candidate * grad_new_cell, tanh_cell * grad_h], dim=1), sig_gates
    )
    # elu'(u) from the result: 1 where elu(u) > 0, elu(u) + 1 elsewhere.
    grad_candidate = _elu_backward(input_gate * grad_new_cell, 1.0, 1.0, 1.0, True, candidate)
    grad_gates = torch.cat([grad_sig, grad_candidate], dim=1)
    return (
        grad_gates.mm(weights) if needs_grad_X else weights.new_empty(0),
        grad_gates.t().mm(X),
        grad_gates.sum(0),
        grad_new_cell,
    )


# --- the sequence: the algorithm the fused backends follow -----------------
#
# Forward: one GEMM projects the input of all T*B rows at once (X_x W_x^T + b,
# the bias folded in), then each step adds one recurrent GEMM h W_h^T into its
# slice of that buffer and does the pointwise work.  Backward: each step does
# the pointwise work and one GEMM d_gates W_h for the gradient of the previous
# h; after the loop, one GEMM over all T*B rows gives d_W = d_gates^T [h_prev | x],
# one gives d_input = d_gates W_x, and one sum d_bias.
#
# Saved (besides the input, output and h0, which lltm-core holds anyway): the
# activated gates (T, B, 3S) and tanh(c_t) (T, B, S).  That is (5S + I)·T·B
# elements with the input and output, under the (6S + I)·T·B the contract
# allows.  No c_t is kept: with no forget gate, d c_{t-1} = d c_t, so the
# backward never needs the cell itself.


def _steps(T: int, reverse: bool) -> range:
    return range(T - 1, -1, -1) if reverse else range(T)


#: Inference (needs_backward=False) projects the input this many rows (steps x batch) at a time:
#: the (chunk, B, 3S) gates buffer is all it keeps besides the output.  2048 rows make a GEMM
#: as efficient as one over all steps (benchmarks/core_overhead.py's inference rows measure it), and
#: at T512 B64 S512 float32 a 12.6 MB buffer beside a 67 MB output.
INFERENCE_CHUNK_ROWS = 2048


def sequence_forward(input, weights, bias, h0, c0, lengths, reverse, needs_backward=True):
    # No out= variants (each step's output is copied into place): a program exported from this
    # under torch.no_grad() must also run with grad mode on, where out= refuses inputs that
    # require grad, and torch.vmap batches no out= op.
    T, B, I = input.shape
    S = h0.shape[1]
    w_h, w_x = weights.split([S, I], dim=1)
    # Training projects every step at once and keeps all gates; inference a chunk of steps at a time.
    chunk = T if needs_backward else max(1, min(T, INFERENCE_CHUNK_ROWS // max(B, 1)))
    h, c = h0, c0
    order = _steps(T, reverse)
    output = input.new_empty(T, B, S)
    gates = input.new_empty(chunk, B, 3 * S)  # training: every step's; inference: one chunk's at a time
    tanh_cells = []
    for first in range(0, T, chunk):
        chunk_steps = order[first : first + chunk]
        n, lo = len(chunk_steps), min(chunk_steps[0], chunk_steps[-1])
        block = gates[:n]
        block.copy_(bias.view(3 * S))  # then the input's projection added in place: x W_x^T + b
        block.view(n * B, 3 * S).addmm_(input[lo : lo + n].reshape(n * B, I), w_x.t())
        for t in chunk_steps:
            # In place in the block (no allocation a step), activated through narrow's views: autograd
            # allows in-place ops on those, not on split's (which serves the views only read).
            step = block.select(0, t - lo).addmm_(h, w_h.t())
            sig_gates, candidate = step.narrow(1, 0, 2 * S).sigmoid_(), _elu_(step.narrow(1, 2 * S, S))
            input_gate, output_gate = sig_gates.split_with_sizes([S, S], 1)
            new_c = torch.addcmul(c, candidate, input_gate)
            tanh_c = torch.tanh(new_c)
            new_h = tanh_c * output_gate
            if needs_backward:
                tanh_cells.append(tanh_c)
            if lengths is None:
                output.select(0, t).copy_(new_h)
                h, c = new_h, new_c
            else:
                # Rows past their length keep their state and output zero.
                valid = (lengths > t).unsqueeze(1)
                output.select(0, t).copy_(torch.where(valid, new_h, 0))
                h, c = torch.where(valid, new_h, h), torch.where(valid, new_c, c)
    if reverse:  # the list holds the steps in the order they ran
        tanh_cells.reverse()
    if not needs_backward:
        return output, h, c, input.new_empty(0), input.new_empty(0)
    tanh_cell = torch.stack(tanh_cells) if T else input.new_empty(0, B, S)
    return output, h, c, gates, tanh_cell


def sequence_backward(grad_output, grad_h_n, grad_c_n, weights, input, h0, output, lengths, gates, tanh_cell,
                      reverse, needs_grad_input):
    T, B, I = input.shape
    S = h0.shape[1]
    w_h = weights[:, :S]
    d_gates = torch.empty_like(gates)
    grad_h, grad_c = grad_h_n, grad_c_n  # of the state after the step being undone
    for t in reversed(_steps(T, reverse)):
        sig_gates, candidate = gates[t].split_with_sizes([2 * S, S], 1)
        input_gate, output_gate = sig_gates.split_with_sizes([S, S], 1)
        grad_new_h = grad_h + grad_output[t]
        grad_new_c = _tanh_backward(grad_new_h * output_gate, tanh_cell[t]).add_(grad_c)
        step = d_gates[t]
        step[:, : 2 * S] = _sigmoid_backward(
            torch.cat([candidate * grad_new_c, tanh_cell[t] * grad_new_h], dim=1), sig_gates)
        step[:, 2 * S :] = _elu_backward(input_gate * grad_new_c, 1.0, 1.0, 1.0, True, candidate)
        if lengths is None:
            grad_h, grad_c = step.mm(w_h), grad_new_c
        else:
            valid = (lengths > t).unsqueeze(1)
            step.masked_fill_(~valid, 0)  # a row past its length did not take part in this step
            grad_h, grad_c = torch.where(valid, step.mm(w_h), grad_h), torch.where(valid, grad_new_c, grad_c)
    return (*sequence_gemm_gradients(d_gates, weights, input, h0, output, lengths, reverse, needs_grad_input),
            grad_h, grad_c)


def sequence_gemm_gradients(d_gates, weights, input, h0, output, lengths, reverse, needs_grad_input):
    """After the time loop, from every step's d_gates (T, B, 3S): (grad_input, grad_weights, grad_bias).

    One GEMM over all T*B rows for the weights, one for the input, one sum for the bias.  lltm-triton's
    backward, whose time loop is one Triton launch, ends the same way.
    """
    T, B, I = input.shape
    S = h0.shape[1]
    # The state each step started from: the previous step's output, or h0 for the first.
    if reverse:
        h_prev = torch.cat([output[1:], h0.unsqueeze(0)])
        if lengths is not None:  # a reversed row starts at its own last step, from h0
            starts_later = lengths.unsqueeze(0) > torch.arange(1, T + 1, device=lengths.device).unsqueeze(1)
            h_prev = torch.where(starts_later.unsqueeze(2), h_prev, h0)
    else:
        h_prev = torch.cat([h0.unsqueeze(0), output[:-1]])
    d_gates_2d = d_gates.view(T * B, 3 * S)
    grad_weights = d_gates_2d.t().mm(torch.cat([h_prev, input], dim=2).view(T * B, S + I))
    grad_input = d_gates_2d.mm(weights[:, S:]).view(T, B, I) if needs_grad_input else weights.new_empty(0)
    return grad_input, grad_weights, d_gates_2d.sum(0)


def load_backend():
    from lltm_core.backend import Backend
    from lltm_core.extension import saved_layout, sequence_saved_layout

    return Backend(
        name="ref",
        forward=forward,
        backward=backward,
        saved_layout=saved_layout,
        devices=frozenset({"cpu", "cuda", "mps", "xpu"}),
        dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64}),
        priority=0,
        interface_versions=(1, 2, 3),
        description="plain PyTorch operators (the fallback; runs anywhere)",
        sequence_forward=sequence_forward,
        sequence_backward=sequence_backward,
        sequence_saved_layout=sequence_saved_layout,
        composite=True,  # ATen operators only: torch.export traces through them
    )
