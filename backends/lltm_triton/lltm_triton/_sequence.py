"""A whole sequence (one layer, one direction): the time loop inside ONE Triton launch each way.

Forward: the input projection x_t W_x^T + b of all T·B rows is one torch GEMM (cuBLAS on a GPU).
Then one launch runs every step: each program owns BLOCK_B batch rows for the whole sequence, so
the recurrence needs no synchronisation between programs.  A step is h W_h^T (tl.dot) added to that
step's projection, then the cell's pointwise math, with h and c kept on chip.  Backward: one launch
runs the steps in reverse, d_gates of each step and d_h_prev = d_gates W_h (tl.dot); then the weight
gradient, the input gradient and the bias gradient are GEMMs (and a sum) over all T·B rows at once.

Two variants of each kernel, the same math:

* resident (the fast one): W_h is loaded once, before the loop, as three (S_PAD, S_PAD) tiles that
  stay on chip (registers or shared memory, the compiler's choice) for all T steps; h and c (or
  their gradients) are loop-carried tiles.  The whole state must fit one tile: S_PAD = S rounded up
  to a power of two, at least 16.
* streaming (any S): W_h tiles are read from global memory (L2, after the first step) inside the
  step, the state is tiled too, and h (or d_h) goes through a small float32 workspace between steps,
  double-buffered, with a barrier after each step: other threads of the program read what one wrote.

``_policy.resident(S, dtype)`` chooses (W_h up to 96 KB; the arithmetic and the H200's measurements
are there), and should_run declines the shapes where streaming is not expected to beat lltm-cuda.
Should a variant not fit the GPU's shared memory after all, the next smaller one runs (``_fit.py``):
resident, then streaming, then streaming at smaller tiles.  Saved for the backward, as
lltm-ref does (``_layout.py``): the activated gates (T, B, 3S), written over the projection buffer,
which is this call's own, and tanh(c_t) (T, B, S).
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl
from lltm_ref import sequence_gemm_gradients  # lltm-ref comes with lltm-core

from . import _pointwise as pw
from ._config import LAUNCH_OPTIONS, accumulator, block, dot_dtype, dot_precision
from ._fit import first_that_fits, halvings
from ._policy import BLOCK_B, resident, state_pad, w_h_bytes

# --- forward ------------------------------------------------------------------


@triton.jit
def _forward_resident(gx_ptr, w_ptr, h_in_ptr, c_in_ptr, len_ptr,
                      out_ptr, h_out_ptr, c_out_ptr, tanh_c_ptr,
                      t_first, n_steps, step, t_base, B, I, S,
                      HAS_LENGTHS: tl.constexpr, SAVE: tl.constexpr,
                      ACC: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                      BLOCK_B: tl.constexpr, S_PAD: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, S_PAD)
    row_ok = rows < B
    col_ok = cols < S
    mask = row_ok[:, None] & col_ok[None, :]
    state = rows[:, None] * S + cols[None, :]
    # W_h^T per gate, (k, n) = W[g*S + n, k]: loaded once, kept on chip for every step.
    w = w_ptr + cols[None, :] * (S + I) + cols[:, None]
    w_mask = col_ok[None, :] & col_ok[:, None]
    w_i = tl.load(w, mask=w_mask, other=0.0).to(DOT)
    w_o = tl.load(w + S * (S + I), mask=w_mask, other=0.0).to(DOT)
    w_z = tl.load(w + 2 * S * (S + I), mask=w_mask, other=0.0).to(DOT)
    h = tl.load(h_in_ptr + state, mask=mask, other=0.0).to(ACC)
    c = tl.load(c_in_ptr + state, mask=mask, other=0.0).to(ACC)
    if HAS_LENGTHS:
        length = tl.load(len_ptr + rows, mask=row_ok, other=0)
    for n in range(n_steps):
        t = t_first + n * step
        gate = ((t - t_base) * B + rows[:, None]) * (3 * S) + cols[None, :]
        # h rounded to the storage dtype for the product, as the stored output (the next layer's
        # input, the backward's h_prev) is; c stays in the accumulator dtype.
        h_dot = pw.to_storage(h, out_ptr).to(DOT)
        pre_i = tl.dot(h_dot, w_i, acc=tl.load(gx_ptr + gate, mask=mask, other=0.0).to(ACC),
                       input_precision=PRECISION, out_dtype=ACC)
        pre_o = tl.dot(h_dot, w_o, acc=tl.load(gx_ptr + gate + S, mask=mask, other=0.0).to(ACC),
                       input_precision=PRECISION, out_dtype=ACC)
        pre_z = tl.dot(h_dot, w_z, acc=tl.load(gx_ptr + gate + 2 * S, mask=mask, other=0.0).to(ACC),
                       input_precision=PRECISION, out_dtype=ACC)
        i, o, z, new_c, tanh_c, new_h = pw.cell_forward(pre_i, pre_o, pre_z, c)
        out = t * B * S + state
        if HAS_LENGTHS:
            # Rows past their length keep their state and output zeros.
            valid = (t < length)[:, None]
            tl.store(out_ptr + out, pw.to_storage(tl.where(valid, new_h, 0.0), out_ptr), mask=mask)
            h = tl.where(valid, new_h, h)
            c = tl.where(valid, new_c, c)
        else:
            tl.store(out_ptr + out, pw.to_storage(new_h, out_ptr), mask=mask)
            h = new_h
            c = new_c
        if SAVE:
            tl.store(gx_ptr + gate, pw.to_storage(i, gx_ptr), mask=mask)
            tl.store(gx_ptr + gate + S, pw.to_storage(o, gx_ptr), mask=mask)
            tl.store(gx_ptr + gate + 2 * S, pw.to_storage(z, gx_ptr), mask=mask)
            tl.store(tanh_c_ptr + out, pw.to_storage(tanh_c, tanh_c_ptr), mask=mask)
    tl.store(h_out_ptr + state, pw.to_storage(h, h_out_ptr), mask=mask)
    tl.store(c_out_ptr + state, pw.to_storage(c, c_out_ptr), mask=mask)


@triton.jit
def _copy_rows(a_src, a_dst, b_src, b_dst, rows, B, S, BLOCK_S: tl.constexpr):
    """Copy this program's rows of two (B, S) tensors, tile by tile, converting to the destinations'
    dtypes: the streaming kernels' state into their float32 workspace before the loop, and out after."""
    for s0 in range(0, S, BLOCK_S):
        cols = s0 + tl.arange(0, BLOCK_S)
        mask = (rows < B)[:, None] & (cols < S)[None, :]
        state = rows[:, None] * S + cols[None, :]
        tl.store(a_dst + state, pw.to_storage(tl.load(a_src + state, mask=mask), a_dst), mask=mask)
        tl.store(b_dst + state, pw.to_storage(tl.load(b_src + state, mask=mask), b_dst), mask=mask)


@triton.jit
def _forward_streaming(gx_ptr, w_ptr, h_in_ptr, c_in_ptr, len_ptr,
                       out_ptr, h_out_ptr, c_out_ptr, tanh_c_ptr, h_buf_ptr, c_buf_ptr,
                       t_first, n_steps, step, t_base, B, I, S,
                       HAS_LENGTHS: tl.constexpr, SAVE: tl.constexpr,
                       ACC: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                       BLOCK_B: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr):
    # h_buf: (2, B, S) float32, step n reads half n % 2 and writes the other; c_buf: (B, S) float32,
    # each element read and written by the same thread.
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    _copy_rows(h_in_ptr, h_buf_ptr, c_in_ptr, c_buf_ptr, rows, B, S, BLOCK_S)
    tl.debug_barrier()
    if HAS_LENGTHS:
        length = tl.load(len_ptr + rows, mask=row_ok, other=0)
    for n in range(n_steps):
        t = t_first + n * step
        h_read = h_buf_ptr + (n % 2) * B * S
        h_write = h_buf_ptr + ((n + 1) % 2) * B * S
        for s0 in range(0, S, BLOCK_S):
            cols = s0 + tl.arange(0, BLOCK_S)
            col_ok = cols < S
            mask = row_ok[:, None] & col_ok[None, :]
            state = rows[:, None] * S + cols[None, :]
            gate = ((t - t_base) * B + rows[:, None]) * (3 * S) + cols[None, :]
            pre_i = tl.load(gx_ptr + gate, mask=mask, other=0.0).to(ACC)
            pre_o = tl.load(gx_ptr + gate + S, mask=mask, other=0.0).to(ACC)
            pre_z = tl.load(gx_ptr + gate + 2 * S, mask=mask, other=0.0).to(ACC)
            for k0 in range(0, S, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                k_ok = ks < S
                h_k = tl.load(h_read + rows[:, None] * S + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                              other=0.0)
                h_k = pw.to_storage(h_k, out_ptr).to(DOT)
                w = w_ptr + cols[None, :] * (S + I) + ks[:, None]
                w_mask = col_ok[None, :] & k_ok[:, None]
                pre_i = tl.dot(h_k, tl.load(w, mask=w_mask, other=0.0).to(DOT), acc=pre_i,
                               input_precision=PRECISION, out_dtype=ACC)
                pre_o = tl.dot(h_k, tl.load(w + S * (S + I), mask=w_mask, other=0.0).to(DOT), acc=pre_o,
                               input_precision=PRECISION, out_dtype=ACC)
                pre_z = tl.dot(h_k, tl.load(w + 2 * S * (S + I), mask=w_mask, other=0.0).to(DOT), acc=pre_z,
                               input_precision=PRECISION, out_dtype=ACC)
            c = tl.load(c_buf_ptr + state, mask=mask, other=0.0)
            i, o, z, new_c, tanh_c, new_h = pw.cell_forward(pre_i, pre_o, pre_z, c)
            out = t * B * S + state
            if HAS_LENGTHS:
                valid = (t < length)[:, None]
                tl.store(out_ptr + out, pw.to_storage(tl.where(valid, new_h, 0.0), out_ptr), mask=mask)
                new_h = tl.where(valid, new_h, tl.load(h_read + state, mask=mask, other=0.0))
                new_c = tl.where(valid, new_c, c)
            else:
                tl.store(out_ptr + out, pw.to_storage(new_h, out_ptr), mask=mask)
            tl.store(h_write + state, new_h, mask=mask)
            tl.store(c_buf_ptr + state, new_c, mask=mask)
            if SAVE:
                tl.store(gx_ptr + gate, pw.to_storage(i, gx_ptr), mask=mask)
                tl.store(gx_ptr + gate + S, pw.to_storage(o, gx_ptr), mask=mask)
                tl.store(gx_ptr + gate + 2 * S, pw.to_storage(z, gx_ptr), mask=mask)
                tl.store(tanh_c_ptr + out, pw.to_storage(tanh_c, tanh_c_ptr), mask=mask)
        tl.debug_barrier()  # this step's h, written by some threads, is read by others next step
    _copy_rows(h_buf_ptr + (n_steps % 2) * B * S, h_out_ptr, c_buf_ptr, c_out_ptr, rows, B, S, BLOCK_S)


# --- backward -----------------------------------------------------------------


@triton.jit
def _load_step(gates_ptr, tanh_c_ptr, grad_out_ptr, t, rows, cols, mask, B, S, ACC: tl.constexpr):
    gate = (t * B + rows[:, None]) * (3 * S) + cols[None, :]
    out = t * B * S + rows[:, None] * S + cols[None, :]
    i = tl.load(gates_ptr + gate, mask=mask, other=0.0).to(ACC)
    o = tl.load(gates_ptr + gate + S, mask=mask, other=0.0).to(ACC)
    z = tl.load(gates_ptr + gate + 2 * S, mask=mask, other=0.0).to(ACC)
    tanh_c = tl.load(tanh_c_ptr + out, mask=mask, other=0.0).to(ACC)
    grad_out = tl.load(grad_out_ptr + out, mask=mask, other=0.0).to(ACC)
    return i, o, z, tanh_c, grad_out, gate


@triton.jit
def _backward_resident(grad_out_ptr, grad_h_n_ptr, grad_c_n_ptr, w_ptr, gates_ptr, tanh_c_ptr, len_ptr,
                       d_gates_ptr, grad_h0_ptr, grad_c0_ptr,
                       t_first, n_steps, step, B, I, S,
                       HAS_LENGTHS: tl.constexpr,
                       ACC: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                       BLOCK_B: tl.constexpr, S_PAD: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, S_PAD)
    row_ok = rows < B
    col_ok = cols < S
    mask = row_ok[:, None] & col_ok[None, :]
    state = rows[:, None] * S + cols[None, :]
    # W_h per gate, (n, k) = W[g*S + n, k]: d_h_prev = sum_g d_g W_g, on chip for every step.
    w = w_ptr + cols[:, None] * (S + I) + cols[None, :]
    w_mask = col_ok[:, None] & col_ok[None, :]
    w_i = tl.load(w, mask=w_mask, other=0.0).to(DOT)
    w_o = tl.load(w + S * (S + I), mask=w_mask, other=0.0).to(DOT)
    w_z = tl.load(w + 2 * S * (S + I), mask=w_mask, other=0.0).to(DOT)
    grad_h = tl.load(grad_h_n_ptr + state, mask=mask, other=0.0).to(ACC)
    grad_c = tl.load(grad_c_n_ptr + state, mask=mask, other=0.0).to(ACC)
    if HAS_LENGTHS:
        length = tl.load(len_ptr + rows, mask=row_ok, other=0)
    for n in range(n_steps):
        t = t_first + n * step
        i, o, z, tanh_c, grad_out, gate = _load_step(gates_ptr, tanh_c_ptr, grad_out_ptr, t, rows, cols, mask,
                                                     B, S, ACC)
        d_i, d_o, d_z, grad_new_c = pw.cell_backward(i, o, z, tanh_c, grad_h + grad_out, grad_c)
        if HAS_LENGTHS:
            valid = (t < length)[:, None]  # a row past its length took no part in this step
            d_i = tl.where(valid, d_i, 0.0)
            d_o = tl.where(valid, d_o, 0.0)
            d_z = tl.where(valid, d_z, 0.0)
        # d_gates rounded to the storage dtype once: what is stored for the weight GEMMs is also
        # what flows back through W_h.
        d_i = pw.to_storage(d_i, d_gates_ptr)
        d_o = pw.to_storage(d_o, d_gates_ptr)
        d_z = pw.to_storage(d_z, d_gates_ptr)
        tl.store(d_gates_ptr + gate, d_i, mask=mask)
        tl.store(d_gates_ptr + gate + S, d_o, mask=mask)
        tl.store(d_gates_ptr + gate + 2 * S, d_z, mask=mask)
        new_grad_h = tl.dot(d_i.to(DOT), w_i, input_precision=PRECISION, out_dtype=ACC)
        new_grad_h = tl.dot(d_o.to(DOT), w_o, acc=new_grad_h, input_precision=PRECISION, out_dtype=ACC)
        new_grad_h = tl.dot(d_z.to(DOT), w_z, acc=new_grad_h, input_precision=PRECISION, out_dtype=ACC)
        if HAS_LENGTHS:
            grad_h = tl.where(valid, new_grad_h, grad_h)
            grad_c = tl.where(valid, grad_new_c, grad_c)
        else:
            grad_h = new_grad_h
            grad_c = grad_new_c
    tl.store(grad_h0_ptr + state, pw.to_storage(grad_h, grad_h0_ptr), mask=mask)
    tl.store(grad_c0_ptr + state, pw.to_storage(grad_c, grad_c0_ptr), mask=mask)


@triton.jit
def _backward_streaming(grad_out_ptr, grad_h_n_ptr, grad_c_n_ptr, w_ptr, gates_ptr, tanh_c_ptr, len_ptr,
                        d_gates_ptr, grad_h0_ptr, grad_c0_ptr, g_buf_ptr, gc_buf_ptr,
                        t_first, n_steps, step, B, I, S,
                        HAS_LENGTHS: tl.constexpr,
                        ACC: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                        BLOCK_B: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr):
    # g_buf: (2, B, S) float32 d_h, double-buffered; gc_buf: (B, S) float32 d_c.  Each step first
    # writes d_gates (pass 1), then, after a barrier, reads all of them back for d_h_prev (pass 2).
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < B
    _copy_rows(grad_h_n_ptr, g_buf_ptr, grad_c_n_ptr, gc_buf_ptr, rows, B, S, BLOCK_S)
    tl.debug_barrier()
    if HAS_LENGTHS:
        length = tl.load(len_ptr + rows, mask=row_ok, other=0)
    for n in range(n_steps):
        t = t_first + n * step
        g_read = g_buf_ptr + (n % 2) * B * S
        g_write = g_buf_ptr + ((n + 1) % 2) * B * S
        if HAS_LENGTHS:
            valid = (t < length)[:, None]
        for s0 in range(0, S, BLOCK_S):
            cols = s0 + tl.arange(0, BLOCK_S)
            mask = row_ok[:, None] & (cols < S)[None, :]
            state = rows[:, None] * S + cols[None, :]
            i, o, z, tanh_c, grad_out, gate = _load_step(gates_ptr, tanh_c_ptr, grad_out_ptr, t, rows, cols, mask,
                                                         B, S, ACC)
            grad_c = tl.load(gc_buf_ptr + state, mask=mask, other=0.0)
            d_i, d_o, d_z, grad_new_c = pw.cell_backward(
                i, o, z, tanh_c, tl.load(g_read + state, mask=mask, other=0.0) + grad_out, grad_c)
            if HAS_LENGTHS:
                d_i = tl.where(valid, d_i, 0.0)
                d_o = tl.where(valid, d_o, 0.0)
                d_z = tl.where(valid, d_z, 0.0)
                grad_new_c = tl.where(valid, grad_new_c, grad_c)
            tl.store(d_gates_ptr + gate, pw.to_storage(d_i, d_gates_ptr), mask=mask)
            tl.store(d_gates_ptr + gate + S, pw.to_storage(d_o, d_gates_ptr), mask=mask)
            tl.store(d_gates_ptr + gate + 2 * S, pw.to_storage(d_z, d_gates_ptr), mask=mask)
            tl.store(gc_buf_ptr + state, grad_new_c, mask=mask)
        tl.debug_barrier()  # pass 2 reads d_gates other threads wrote
        for k0 in range(0, S, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < S
            k_mask = row_ok[:, None] & k_ok[None, :]
            acc = tl.zeros((BLOCK_B, BLOCK_K), dtype=ACC)
            for s0 in range(0, S, BLOCK_S):
                cols = s0 + tl.arange(0, BLOCK_S)
                col_ok = cols < S
                d_mask = row_ok[:, None] & col_ok[None, :]
                gate = (t * B + rows[:, None]) * (3 * S) + cols[None, :]
                w = w_ptr + cols[:, None] * (S + I) + ks[None, :]
                w_mask = col_ok[:, None] & k_ok[None, :]
                acc = tl.dot(tl.load(d_gates_ptr + gate, mask=d_mask, other=0.0).to(DOT),
                             tl.load(w, mask=w_mask, other=0.0).to(DOT), acc=acc,
                             input_precision=PRECISION, out_dtype=ACC)
                acc = tl.dot(tl.load(d_gates_ptr + gate + S, mask=d_mask, other=0.0).to(DOT),
                             tl.load(w + S * (S + I), mask=w_mask, other=0.0).to(DOT), acc=acc,
                             input_precision=PRECISION, out_dtype=ACC)
                acc = tl.dot(tl.load(d_gates_ptr + gate + 2 * S, mask=d_mask, other=0.0).to(DOT),
                             tl.load(w + 2 * S * (S + I), mask=w_mask, other=0.0).to(DOT), acc=acc,
                             input_precision=PRECISION, out_dtype=ACC)
            k_state = rows[:, None] * S + ks[None, :]
            if HAS_LENGTHS:
                acc = tl.where(valid, acc, tl.load(g_read + k_state, mask=k_mask, other=0.0))
            tl.store(g_write + k_state, acc, mask=k_mask)
        tl.debug_barrier()  # the next step reads this d_h from other threads
    _copy_rows(g_buf_ptr + (n_steps % 2) * B * S, grad_h0_ptr, gc_buf_ptr, grad_c0_ptr, rows, B, S, BLOCK_S)


# --- wrappers -----------------------------------------------------------------

FORWARD = (_forward_resident, _forward_streaming)
BACKWARD = (_backward_resident, _backward_streaming)

#: Streaming tiles' edge (BLOCK_S = BLOCK_K) by element size.  float64 at 64 needed 245760 bytes of shared
#: memory in the backward on an H200, over the 232448 a block may have: 2 · 3 · (16·64 + 64·64) · 8, two
#: pipeline stages of pass 2's three d_gates and three W_h tiles, it seems.  At 32 that arithmetic gives
#: 73728, and float64 at 32 passed there; float32 and 16-bit at 64 (122880 and 61440) passed too.
STREAM_TILE = {8: 32, 4: 64, 2: 64}


def _common(dtype: torch.dtype) -> dict:
    return dict(ACC=accumulator(dtype), DOT=dot_dtype(dtype), PRECISION=dot_precision(dtype), BLOCK_B=BLOCK_B,
                **LAUNCH_OPTIONS)


def _tiles(dtype: torch.dtype, S: int) -> list[dict]:
    """The variants to try, largest first (_fit.py): W_h resident where _policy says it fits, then
    streaming at STREAM_TILE and at each smaller power of two down to 16."""
    ladder = []
    if resident(S, dtype):
        # Enough warps that W_h takes at most 64 registers (256 bytes) a thread: 4 for 24 KB, 16 for
        # 96 KB (16-bit S128, float64 S64).  A default from that arithmetic, not yet tuned on a GPU.
        warps = min(16, max(4, triton.next_power_of_2(-(-w_h_bytes(S, dtype) // (32 * 256)))))
        ladder.append(dict(S_PAD=state_pad(S), num_warps=warps))
    for caps in halvings(dict(BLOCK_S=STREAM_TILE[dtype.itemsize], BLOCK_K=STREAM_TILE[dtype.itemsize])):
        ladder.append(dict(BLOCK_S=block(S, caps["BLOCK_S"]), BLOCK_K=block(S, caps["BLOCK_K"]), num_warps=4))
    return ladder


def _launch(kernels: tuple, like: torch.Tensor, S: int, workspace: list, launch):
    """launch(kernel, work, meta) with the largest variant of kernels (resident, streaming) that fits the
    GPU (_fit.py).  work: () for a resident kernel; for a streaming one, workspace, filled at its first use."""
    B = like.shape[1]

    def run(kernel, tiles):
        meta = {**_common(like.dtype), **tiles}
        if "S_PAD" in tiles:
            return launch(kernel, (), meta)
        if not workspace:
            workspace.extend(_workspace(B, S, like))
        return launch(kernel, tuple(workspace), meta)

    resident_kernel, streaming_kernel = kernels
    configs = [(resident_kernel if "S_PAD" in tiles else streaming_kernel, tiles) for tiles in _tiles(like.dtype, S)]
    return first_that_fits(configs, run, like.device, like.dtype, S)


def _state_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _workspace(B: int, S: int, like: torch.Tensor) -> tuple:
    """The streaming kernels' state between steps: (2, B, S) h or d_h, double-buffered, and (B, S) c or d_c."""
    dtype = _state_dtype(like.dtype)
    return torch.empty(2, B, S, device=like.device, dtype=dtype), torch.empty(B, S, device=like.device, dtype=dtype)


#: Without a backward the input is projected this many rows (steps x batch) at a time, as lltm-ref
#: does (its INFERENCE_CHUNK_ROWS): a GEMM as efficient as one over all steps, and at T512 B64 S512
#: float32 a 12.6 MB buffer beside the 67 MB output.
INFERENCE_CHUNK_ROWS = 2048


def _no_saved(like: torch.Tensor) -> tuple:
    """The saved slots of an inference call: empty, and two tensors, since custom-op outputs may not alias."""
    return like.new_empty(0), like.new_empty(0)


def _projection_chunk(T: int, B: int) -> int:
    """Steps per input-projection chunk without a backward: INFERENCE_CHUNK_ROWS rows a GEMM, at most T."""
    return max(1, min(T, INFERENCE_CHUNK_ROWS // max(B, 1)))


def sequence_forward(input, weights, bias, h0, c0, lengths, reverse, needs_backward=True):
    T, B, I = input.shape
    S = h0.shape[1]
    w_x = weights[:, S:]
    output = input.new_empty(T, B, S)
    h_n, c_n = torch.empty_like(h0), torch.empty_like(c0)
    if B == 0:
        saved = (input.new_empty(T, 0, 3 * S), input.new_empty(T, 0, S)) if needs_backward else _no_saved(input)
        return output, h_n, c_n, *saved
    grid = (triton.cdiv(B, BLOCK_B),)
    has_lengths = lengths is not None
    # Pointers a kernel never touches still need a real allocation (an empty tensor's may be null).
    lengths_arg = lengths if has_lengths else h0  # never read without HAS_LENGTHS
    x2d = input.view(T * B, I)
    if needs_backward:
        gates = torch.addmm(bias, x2d, w_x.t()).view(T, B, 3 * S)
        tanh_c = input.new_empty(T, B, S)

        def launch(kernel, work, meta):
            kernel[grid](gates, weights, h0, c0, lengths_arg, output, h_n, c_n, tanh_c, *work,
                         T - 1 if reverse else 0, T, -1 if reverse else 1, 0, B, I, S,
                         HAS_LENGTHS=has_lengths, SAVE=True, **meta)

        _launch(FORWARD, input, S, [], launch)
        return output, h_n, c_n, gates, tanh_c
    # No backward: nothing saved, and the projection runs in chunks of steps through one reused
    # buffer, so the workspace is bounded whatever T is.  Between chunks the state waits in float32
    # (float64 for float64), as it would on chip.
    # One (B, S) pair serves as both a chunk's end state and the next one's start: a program reads its
    # rows' state before its loop and writes it after, touching no other rows.
    chunk = _projection_chunk(T, B)
    buffer = input.new_empty(chunk, B, 3 * S)
    starts = list(range(0, T, chunk))
    state = (h0, c0)
    between = [torch.empty(B, S, device=input.device, dtype=_state_dtype(input.dtype)) for _ in range(2)]
    workspace = []
    for index, start in enumerate(reversed(starts) if reverse else starts):
        stop = min(T, start + chunk)
        n = stop - start
        gates = buffer[:n]
        torch.addmm(bias, x2d[start * B: stop * B], w_x.t(), out=gates.view(n * B, 3 * S))
        end = (h_n, c_n) if index == len(starts) - 1 else between

        def launch(kernel, work, meta):
            kernel[grid](gates, weights, *state, lengths_arg, output, *end, output, *work,  # tanh_c: not written
                         stop - 1 if reverse else start, n, -1 if reverse else 1, start, B, I, S,
                         HAS_LENGTHS=has_lengths, SAVE=False, **meta)

        _launch(FORWARD, input, S, workspace, launch)
        state = end
    return output, h_n, c_n, *_no_saved(input)


def sequence_backward(grad_output, grad_h_n, grad_c_n, weights, input, h0, output, lengths, gates, tanh_cell,
                      reverse, needs_grad_input):
    T, B, I = input.shape
    S = h0.shape[1]
    grad_output, grad_h_n, grad_c_n = (g.contiguous() for g in (grad_output, grad_h_n, grad_c_n))
    d_gates = input.new_empty(T, B, 3 * S)
    grad_h0, grad_c0 = torch.empty_like(h0), torch.empty_like(h0)
    if B > 0:
        has_lengths = lengths is not None

        def launch(kernel, work, meta):  # the steps in the opposite order to the forward's
            kernel[(triton.cdiv(B, BLOCK_B),)](
                grad_output, grad_h_n, grad_c_n, weights, gates, tanh_cell, lengths if has_lengths else h0,
                d_gates, grad_h0, grad_c0, *work, 0 if reverse else T - 1, T, 1 if reverse else -1, B, I, S,
                HAS_LENGTHS=has_lengths, **meta)

        _launch(BACKWARD, input, S, [], launch)
    # Then the weight, input and bias gradients over all T*B rows at once, as lltm-ref ends its backward.
    return (*sequence_gemm_gradients(d_gates, weights, input, h0, output, lengths, reverse, needs_grad_input),
            grad_h0, grad_c0)
