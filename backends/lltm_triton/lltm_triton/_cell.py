"""One LLTM step: one Triton launch forward, one backward, the GEMMs in tl.dot with the pointwise math fused.

Forward: each program computes a (BLOCK_B rows) x (BLOCK_S state columns) tile of all three gates,
looping over X = [old_h | input] in BLOCK_K chunks (read straight from old_h and input: no
torch.cat), then applies the cell to the tile.  The programs of the first column block also write X
itself, the one saved tensor the backward needs for grad_weights and that no other output holds.

Backward: one launch, two kinds of program told apart by their id.  The first kind owns a tile of
grad_weights (3 gates x BLOCK_S rows, BLOCK_N columns) and loops over the batch; those of the first
column block also sum grad_bias and write grad_old_cell.  The second kind (only when grad_X is
wanted) owns a tile of grad_X and loops over the state.  Both recompute d_gates from the saved
tensors in their loop instead of reading them back: that would need a second launch, and the
recomputation is a handful of multiplies per element.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _pointwise as pw
from ._config import LAUNCH_OPTIONS, accumulator, block, dot_dtype, dot_precision
from ._fit import first_that_fits, halvings


@triton.jit
def _forward_kernel(x_ptr, h_ptr, c_ptr, w_ptr, b_ptr,
                    new_h_ptr, new_c_ptr, X_ptr, gates_ptr, tanh_c_ptr,
                    B, I, S,
                    ACC: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                    BLOCK_B: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_b = tl.program_id(0)
    pid_s = tl.program_id(1)
    K = S + I
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    row_ok = rows < B
    col_ok = cols < S
    acc_i = tl.zeros((BLOCK_B, BLOCK_S), dtype=ACC)
    acc_o = tl.zeros((BLOCK_B, BLOCK_S), dtype=ACC)
    acc_z = tl.zeros((BLOCK_B, BLOCK_S), dtype=ACC)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        from_h = ks < S
        from_x = (ks >= S) & (ks < K)
        # X[:, ks] without materialising X: old_h's columns, then input's (masked loads give 0).
        x_tile = tl.where(from_h[None, :],
                          tl.load(h_ptr + rows[:, None] * S + ks[None, :], mask=row_ok[:, None] & from_h[None, :]),
                          tl.load(x_ptr + rows[:, None] * I + (ks - S)[None, :],
                                  mask=row_ok[:, None] & from_x[None, :], other=0.0))
        if pid_s == 0:
            tl.store(X_ptr + rows[:, None] * K + ks[None, :], x_tile, mask=row_ok[:, None] & (ks < K)[None, :])
        # W[g*S + cols, ks], loaded transposed: (BLOCK_K, BLOCK_S).
        w_tile = w_ptr + cols[None, :] * K + ks[:, None]
        w_mask = col_ok[None, :] & (ks < K)[:, None]
        x_dot = x_tile.to(DOT)
        acc_i = tl.dot(x_dot, tl.load(w_tile, mask=w_mask, other=0.0).to(DOT), acc=acc_i,
                       input_precision=PRECISION, out_dtype=ACC)
        acc_o = tl.dot(x_dot, tl.load(w_tile + S * K, mask=w_mask, other=0.0).to(DOT), acc=acc_o,
                       input_precision=PRECISION, out_dtype=ACC)
        acc_z = tl.dot(x_dot, tl.load(w_tile + 2 * S * K, mask=w_mask, other=0.0).to(DOT), acc=acc_z,
                       input_precision=PRECISION, out_dtype=ACC)
    pre_i = acc_i + tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(ACC)[None, :]
    pre_o = acc_o + tl.load(b_ptr + S + cols, mask=col_ok, other=0.0).to(ACC)[None, :]
    pre_z = acc_z + tl.load(b_ptr + 2 * S + cols, mask=col_ok, other=0.0).to(ACC)[None, :]
    tile = rows[:, None] * S + cols[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    old_c = tl.load(c_ptr + tile, mask=mask, other=0.0).to(ACC)
    i, o, z, new_c, tanh_c, new_h = pw.cell_forward(pre_i, pre_o, pre_z, old_c)
    tl.store(new_h_ptr + tile, pw.to_storage(new_h, new_h_ptr), mask=mask)
    tl.store(new_c_ptr + tile, pw.to_storage(new_c, new_c_ptr), mask=mask)
    tl.store(tanh_c_ptr + tile, pw.to_storage(tanh_c, tanh_c_ptr), mask=mask)
    gate = rows[:, None] * (3 * S) + cols[None, :]
    tl.store(gates_ptr + gate, pw.to_storage(i, gates_ptr), mask=mask)
    tl.store(gates_ptr + gate + S, pw.to_storage(o, gates_ptr), mask=mask)
    tl.store(gates_ptr + gate + 2 * S, pw.to_storage(z, gates_ptr), mask=mask)


@triton.jit
def _d_gates(gates_ptr, tanh_c_ptr, grad_h_ptr, grad_c_ptr, rows, cols, B, S, ACC: tl.constexpr):
    """d_i, d_o, d_z, d_old_c of a (rows x cols) tile, recomputed from what the forward saved."""
    mask = (rows < B)[:, None] & (cols < S)[None, :]
    tile = rows[:, None] * S + cols[None, :]
    gate = rows[:, None] * (3 * S) + cols[None, :]
    i = tl.load(gates_ptr + gate, mask=mask, other=0.0).to(ACC)
    o = tl.load(gates_ptr + gate + S, mask=mask, other=0.0).to(ACC)
    z = tl.load(gates_ptr + gate + 2 * S, mask=mask, other=0.0).to(ACC)
    tanh_c = tl.load(tanh_c_ptr + tile, mask=mask, other=0.0).to(ACC)
    grad_h = tl.load(grad_h_ptr + tile, mask=mask, other=0.0).to(ACC)
    grad_c = tl.load(grad_c_ptr + tile, mask=mask, other=0.0).to(ACC)
    return pw.cell_backward(i, o, z, tanh_c, grad_h, grad_c)


@triton.jit
def _backward_kernel(grad_h_ptr, grad_c_ptr, w_ptr, X_ptr, gates_ptr, tanh_c_ptr,
                     grad_X_ptr, grad_w_ptr, grad_b_ptr, grad_old_c_ptr,
                     B, I, S, weight_programs,
                     ACC: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                     BLOCK_B: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    K = S + I
    n_blocks = tl.cdiv(K, BLOCK_N)
    if pid < weight_programs:
        # grad_weights[g*S + s, n] = sum_b d_g[b, s] X[b, n]: this program's s and n blocks, all of b.
        pid_s = pid // n_blocks
        pid_n = pid % n_blocks
        s_cols = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
        n_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc_i = tl.zeros((BLOCK_S, BLOCK_N), dtype=ACC)
        acc_o = tl.zeros((BLOCK_S, BLOCK_N), dtype=ACC)
        acc_z = tl.zeros((BLOCK_S, BLOCK_N), dtype=ACC)
        sum_i = tl.zeros((BLOCK_S,), dtype=ACC)
        sum_o = tl.zeros((BLOCK_S,), dtype=ACC)
        sum_z = tl.zeros((BLOCK_S,), dtype=ACC)
        for b0 in range(0, B, BLOCK_B):
            rows = b0 + tl.arange(0, BLOCK_B)
            d_i, d_o, d_z, d_c = _d_gates(gates_ptr, tanh_c_ptr, grad_h_ptr, grad_c_ptr, rows, s_cols, B, S, ACC)
            X = tl.load(X_ptr + rows[:, None] * K + n_cols[None, :],
                        mask=(rows < B)[:, None] & (n_cols < K)[None, :], other=0.0)
            # d_gates rounded to the storage dtype, as a cuBLAS GEMM over stored d_gates would see them.
            X = X.to(DOT)
            acc_i = tl.dot(tl.trans(pw.to_storage(d_i, X_ptr).to(DOT)), X, acc=acc_i,
                           input_precision=PRECISION, out_dtype=ACC)
            acc_o = tl.dot(tl.trans(pw.to_storage(d_o, X_ptr).to(DOT)), X, acc=acc_o,
                           input_precision=PRECISION, out_dtype=ACC)
            acc_z = tl.dot(tl.trans(pw.to_storage(d_z, X_ptr).to(DOT)), X, acc=acc_z,
                           input_precision=PRECISION, out_dtype=ACC)
            if pid_n == 0:
                sum_i += tl.sum(d_i, axis=0)
                sum_o += tl.sum(d_o, axis=0)
                sum_z += tl.sum(d_z, axis=0)
                tl.store(grad_old_c_ptr + rows[:, None] * S + s_cols[None, :], pw.to_storage(d_c, grad_old_c_ptr),
                         mask=(rows < B)[:, None] & (s_cols < S)[None, :])
        w_tile = grad_w_ptr + s_cols[:, None] * K + n_cols[None, :]
        w_mask = (s_cols < S)[:, None] & (n_cols < K)[None, :]
        tl.store(w_tile, pw.to_storage(acc_i, grad_w_ptr), mask=w_mask)
        tl.store(w_tile + S * K, pw.to_storage(acc_o, grad_w_ptr), mask=w_mask)
        tl.store(w_tile + 2 * S * K, pw.to_storage(acc_z, grad_w_ptr), mask=w_mask)
        if pid_n == 0:
            s_ok = s_cols < S
            tl.store(grad_b_ptr + s_cols, pw.to_storage(sum_i, grad_b_ptr), mask=s_ok)
            tl.store(grad_b_ptr + S + s_cols, pw.to_storage(sum_o, grad_b_ptr), mask=s_ok)
            tl.store(grad_b_ptr + 2 * S + s_cols, pw.to_storage(sum_z, grad_b_ptr), mask=s_ok)
    else:
        # grad_X[b, n] = sum_g sum_s d_g[b, s] W[g*S + s, n]: this program's b and n blocks, all of s.
        pid_x = pid - weight_programs
        pid_b = pid_x // n_blocks
        pid_n = pid_x % n_blocks
        rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
        n_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_B, BLOCK_N), dtype=ACC)
        for s0 in range(0, S, BLOCK_S):
            s_cols = s0 + tl.arange(0, BLOCK_S)
            d_i, d_o, d_z, d_c = _d_gates(gates_ptr, tanh_c_ptr, grad_h_ptr, grad_c_ptr, rows, s_cols, B, S, ACC)
            w_tile = w_ptr + s_cols[:, None] * K + n_cols[None, :]
            w_mask = (s_cols < S)[:, None] & (n_cols < K)[None, :]
            w_i = tl.load(w_tile, mask=w_mask, other=0.0).to(DOT)
            w_o = tl.load(w_tile + S * K, mask=w_mask, other=0.0).to(DOT)
            w_z = tl.load(w_tile + 2 * S * K, mask=w_mask, other=0.0).to(DOT)
            acc = tl.dot(pw.to_storage(d_i, w_ptr).to(DOT), w_i, acc=acc, input_precision=PRECISION, out_dtype=ACC)
            acc = tl.dot(pw.to_storage(d_o, w_ptr).to(DOT), w_o, acc=acc, input_precision=PRECISION, out_dtype=ACC)
            acc = tl.dot(pw.to_storage(d_z, w_ptr).to(DOT), w_z, acc=acc, input_precision=PRECISION, out_dtype=ACC)
        tl.store(grad_X_ptr + rows[:, None] * K + n_cols[None, :], pw.to_storage(acc, grad_X_ptr),
                 mask=(rows < B)[:, None] & (n_cols < K)[None, :])


def forward(input, weights, bias, old_h, old_cell):
    B, I = input.shape
    S = old_h.shape[1]
    new_h, new_c, tanh_c = (torch.empty_like(old_h) for _ in range(3))
    X = input.new_empty(B, S + I)
    gates = input.new_empty(B, 3 * S)
    if B == 0:
        return new_h, new_c, X, gates, tanh_c

    def launch(kernel, tiles):
        grid = (triton.cdiv(B, tiles["BLOCK_B"]), triton.cdiv(S, tiles["BLOCK_S"]))
        kernel[grid](input, old_h, old_cell, weights, bias, new_h, new_c, X, gates, tanh_c, B, I, S,
                     ACC=accumulator(input.dtype), DOT=dot_dtype(input.dtype), PRECISION=dot_precision(input.dtype),
                     **tiles, **LAUNCH_OPTIONS)

    # Smaller tiles only where the GPU's shared memory refuses these (_fit.py).
    configs = [(_forward_kernel, dict(BLOCK_B=block(B, caps["B"]), BLOCK_S=block(S, caps["S"]),
                                      BLOCK_K=block(S + I, caps["K"])))
               for caps in halvings(dict(B=32, S=64, K=32))]
    first_that_fits(configs, launch, input.device, input.dtype, S)
    return new_h, new_c, X, gates, tanh_c


def backward(grad_h, grad_cell, weights, X, gates, tanh_cell, needs_grad_X):
    B = X.shape[0]
    S = tanh_cell.shape[1]
    I = X.shape[1] - S
    grad_h, grad_cell = grad_h.contiguous(), grad_cell.contiguous()  # may be expanded (stride 0)
    grad_w = torch.empty_like(weights)
    grad_b = weights.new_empty(3 * S)
    grad_old_c = torch.empty_like(tanh_cell)
    grad_X = X.new_empty(B, S + I) if needs_grad_X else weights.new_empty(0)

    def launch(kernel, tiles):
        n_blocks = triton.cdiv(S + I, tiles["BLOCK_N"])
        weight_programs = triton.cdiv(S, tiles["BLOCK_S"]) * n_blocks
        x_programs = triton.cdiv(B, tiles["BLOCK_B"]) * n_blocks if needs_grad_X else 0
        kernel[(weight_programs + x_programs,)](grad_h, grad_cell, weights, X, gates, tanh_cell,
               grad_X, grad_w, grad_b, grad_old_c, B, I, S, weight_programs,
               ACC=accumulator(X.dtype), DOT=dot_dtype(X.dtype), PRECISION=dot_precision(X.dtype), **tiles,
               **LAUNCH_OPTIONS)

    configs = [(_backward_kernel, dict(BLOCK_B=block(B, caps["B"]), BLOCK_S=block(S, caps["S"]),
                                       BLOCK_N=block(S + I, caps["N"])))
               for caps in halvings(dict(B=32, S=32, N=64))]
    first_that_fits(configs, launch, X.device, X.dtype, S)
    return grad_X, grad_w, grad_b, grad_old_c
