"""Fused INT8 quantization of Q and K (one launch for both tensors).

Input: Q and K as [B, H, N, D] views (any strides, last dim contiguous) or, for varlen,
packed [1, H, total, D] views with per-sequence offsets. Output: INT8 tensors in the layout
the attention kernel reads, ``[B, H, N_pad, BLOCK_D]`` contiguous (N padded to the
quantization block, D padded to a power of two with zeros), and fp32 scales.

Per program: one block of tokens of one head. K has its per-(batch, head) channel mean
subtracted first (smoothing); Q is multiplied by ``sm_scale * log2(e)`` first, and when the
caller wants the LSE, the same program writes ``sm_scale * log2(e) * q . km`` per token (the
LSE correction for smoothing, in log2 units).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Optional

import torch
import triton
import triton.language as tl

from .._staging import to_device
from ..reference import AMAX_EPS

_EPS = tl.constexpr(AMAX_EPS)  # kernels may only read constexpr globals


@triton.jit
def _quant_block(
    X, x_sb, x_sh, x_sn,
    XO, xo_sb, xo_sh,
    XS, xs_sb, xs_sh,
    KM, km_sb, km_sh,
    QKM, qkm_sb, qkm_sh,
    b, h, hm, blk, seq_len, x_row0, o_row0, pre_scale,
    D: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, PER_TOKEN: tl.constexpr,
    SUB_MEAN: tl.constexpr, DOT_MEAN: tl.constexpr,
):
    offs_r = blk * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    valid_r = offs_r < seq_len
    valid_d = offs_d < D
    x_ptrs = (X + b.to(tl.int64) * x_sb + h.to(tl.int64) * x_sh
              + (x_row0 + offs_r).to(tl.int64)[:, None] * x_sn + offs_d[None, :])
    x = tl.load(x_ptrs, mask=valid_r[:, None] & valid_d[None, :], other=0.0).to(tl.float32)
    if SUB_MEAN or DOT_MEAN:
        km = tl.load(KM + b.to(tl.int64) * km_sb + hm.to(tl.int64) * km_sh + offs_d,
                     mask=valid_d, other=0.0)
    if SUB_MEAN:
        x = tl.where(valid_r[:, None], x - km[None, :], 0.0)
    x = x * pre_scale
    if DOT_MEAN:
        qkm = tl.sum(x * km[None, :], axis=1)
        tl.store(QKM + b.to(tl.int64) * qkm_sb + h.to(tl.int64) * qkm_sh + o_row0 + offs_r, qkm)
    # IEEE divisions (div_rn), as the CUDA kernels (__fdiv_rn) and the reference: Triton's `/` on
    # fp32 is approximate, and bf16 inputs often land on exact ties of x * 127 / amax, which it
    # then rounded the other way on ~4 % of rows (bench/results/2026-11-27-*-f091bf2-fuzz.md)
    if PER_TOKEN:
        amax = tl.maximum(tl.max(tl.abs(x), axis=1), _EPS)
        xs = x * tl.div_rn(tl.full(amax.shape, 127.0, tl.float32), amax)[:, None]
    else:
        amax = tl.maximum(tl.max(tl.max(tl.abs(x), axis=1), axis=0), _EPS)
        xs = x * tl.div_rn(127.0, amax)
    xq = tl.where(xs >= 0, xs + 0.5, xs - 0.5).to(tl.int8)
    o_ptrs = (XO + b.to(tl.int64) * xo_sb + h.to(tl.int64) * xo_sh
              + (o_row0 + offs_r).to(tl.int64)[:, None] * BLOCK_D + offs_d[None, :])
    tl.store(o_ptrs, xq)
    s_base = XS + b.to(tl.int64) * xs_sb + h.to(tl.int64) * xs_sh
    if PER_TOKEN:
        tl.store(s_base + o_row0 + offs_r, tl.div_rn(amax, tl.full(amax.shape, 127.0, tl.float32)))
    else:
        tl.store(s_base + o_row0 // BLOCK + blk, tl.div_rn(amax, 127.0))


@triton.jit
def seq_rows(CU, CU_PAD, b, n, VARLEN: tl.constexpr):
    """(first row, length, first row in the padded INT8 buffers) of sequence ``b``: from the
    offsets for a packed batch, else ``(0, n, 0)``."""
    if VARLEN:
        row0 = tl.load(CU + b)
        return row0, tl.load(CU + b + 1) - row0, tl.load(CU_PAD + b)
    else:
        return 0, n, 0


@triton.jit(do_not_specialize=["n_q", "n_k"])
def _quant_qk_kernel(
    Q, q_sb, q_sh, q_sn, K, k_sb, k_sh, k_sn,
    QO, qo_sb, qo_sh, KO, ko_sb, ko_sh,
    QS, qs_sb, qs_sh, KS, ks_sb, ks_sh,
    KM, km_sb, km_sh, QKM, qkm_sb, qkm_sh,
    CU_Q, CU_K, CU_PAD_Q, CU_PAD_K,
    n_q, n_k, h_q, h_k, n_qblk, n_kblk, q_pre_scale,
    D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    Q_PER_TOKEN: tl.constexpr, K_PER_TOKEN: tl.constexpr,
    SMOOTH_K: tl.constexpr, LSE_CORR: tl.constexpr, VARLEN: tl.constexpr,
):
    pid = tl.program_id(0)
    b = tl.program_id(1)
    n_qprog = n_qblk * h_q
    if pid < n_qprog:
        h = pid // n_qblk
        blk = pid % n_qblk
        row0, seq_len, o_row0 = seq_rows(CU_Q, CU_PAD_Q, b, n_q, VARLEN)
        if blk * BLOCK_Q < seq_len:
            _quant_block(Q, q_sb, q_sh, q_sn, QO, qo_sb, qo_sh, QS, qs_sb, qs_sh,
                         KM, km_sb, km_sh, QKM, qkm_sb, qkm_sh,
                         b, h, h // (h_q // h_k), blk, seq_len, row0, o_row0, q_pre_scale, D,
                         BLOCK_Q, BLOCK_D, Q_PER_TOKEN, False, LSE_CORR)
    else:
        pid = pid - n_qprog
        h = pid // n_kblk
        blk = pid % n_kblk
        row0, seq_len, o_row0 = seq_rows(CU_K, CU_PAD_K, b, n_k, VARLEN)
        if blk * BLOCK_K < seq_len:
            _quant_block(K, k_sb, k_sh, k_sn, KO, ko_sb, ko_sh, KS, ks_sb, ks_sh,
                         KM, km_sb, km_sh, QKM, qkm_sb, qkm_sh,
                         b, h, h, blk, seq_len, row0, o_row0, 1.0, D,
                         BLOCK_K, BLOCK_D, K_PER_TOKEN, SMOOTH_K, False)


@triton.jit
def _packed_k_sum_kernel(
    K, k_sn, k_sh, CU, PART, n_chunks,
    D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr, STEPS: tl.constexpr,
):
    """Sum of ROWS * STEPS rows (chunk c) of one head of one packed sequence, in fp32, into
    PART[b, h, c, :D]; chunks past the sequence's end write zeros."""
    c = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    row0 = tl.load(CU + b)
    n = tl.load(CU + b + 1) - row0
    offs_r = tl.arange(0, ROWS)
    offs_d = tl.arange(0, BLOCK_D)
    lo = c * (ROWS * STEPS)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    # only the steps with rows: a short sequence leaves most of the grid's chunks empty
    for i in range(0, tl.minimum(tl.maximum(n - lo, 0) + ROWS - 1, ROWS * STEPS) // ROWS):
        r = lo + i * ROWS + offs_r
        x = tl.load(K + h.to(tl.int64) * k_sh + (row0 + r).to(tl.int64)[:, None] * k_sn + offs_d[None, :],
                    mask=(r < n)[:, None] & (offs_d < D)[None, :], other=0.0)
        acc += tl.sum(x.to(tl.float32), axis=0)
    out = PART + ((b.to(tl.int64) * tl.num_programs(1) + h) * n_chunks + c) * D
    tl.store(out + offs_d, acc, mask=offs_d < D)


@triton.jit
def _packed_k_mean_kernel(PART, CU, KM, n_chunks, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """KM[b, h, :D]: the chunk sums of one head of sequence b, in chunk order, over its length
    (zeros for an empty sequence)."""
    h = tl.program_id(0)
    b = tl.program_id(1)
    n = tl.load(CU + b + 1) - tl.load(CU + b)
    offs_d = tl.arange(0, BLOCK_D)
    row = (b.to(tl.int64) * tl.num_programs(0) + h) * n_chunks
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for c in range(0, n_chunks):
        acc += tl.load(PART + (row + c) * D + offs_d, mask=offs_d < D, other=0.0)
    tl.store(KM + (b.to(tl.int64) * tl.num_programs(0) + h) * D + offs_d, acc / tl.maximum(n, 1).to(tl.float32),
             mask=offs_d < D)


def packed_k_mean(k3: torch.Tensor, cu_k: torch.Tensor, max_k: int) -> torch.Tensor:
    """Per-sequence channel mean of packed K ``[total_k, H, D]`` (int32 offsets ``cu_k`` on
    the device, ``max_k`` the longest sequence): fp32 ``[batch, H, D]``, zeros for an empty
    sequence. Two launches: chunk sums in one pass over K in its own dtype, then their sum in
    chunk order (deterministic)."""
    _, h, d = k3.shape
    nb = cu_k.numel() - 1
    rows, steps = 64, 8
    n_chunks = max(1, triton.cdiv(max_k, rows * steps))
    part = torch.empty((nb, h, n_chunks, d), dtype=torch.float32, device=k3.device)
    km = torch.empty((nb, h, d), dtype=torch.float32, device=k3.device)
    block_d = triton.next_power_of_2(d)
    _packed_k_sum_kernel[(n_chunks, h, nb)](
        k3, k3.stride(0), k3.stride(1), cu_k, part, n_chunks,
        D=d, BLOCK_D=block_d, ROWS=rows, STEPS=steps, num_warps=4)
    _packed_k_mean_kernel[(h, nb)](part, cu_k, km, n_chunks, D=d, BLOCK_D=block_d, num_warps=1)
    return km


@dataclass
class Varlen:
    """Offsets of a packed (varlen) batch: int32 rows of one device tensor, and host counts."""

    cu_q: torch.Tensor  # int32 [B+1]: first row of each sequence in the packed tensors
    cu_k: torch.Tensor
    cu_pad_q: torch.Tensor  # int32 [B+1]: first row of each sequence in the padded INT8 buffers
    cu_pad_k: torch.Tensor
    max_q: int
    max_k: int
    rows_q: int  # rows of the padded buffers
    rows_k: int

    @property
    def batch(self) -> int:
        return self.cu_q.numel() - 1


def packed_offsets(lens_q, lens_k, block_q: int, block_k: int, device) -> Varlen:
    """The offsets of packed sequences with these lengths (host lists), each sequence padded
    to whole quantization blocks in the INT8 buffers: built on the host, one copy to ``device``."""

    def starts(lens, block=1):  # first row of each sequence, every one padded to whole blocks
        return list(accumulate(((n + block - 1) // block * block for n in lens), initial=0))

    table = [starts(lens_q), starts(lens_k), starts(lens_q, block_q), starts(lens_k, block_k)]
    cu = to_device(torch.tensor(table, dtype=torch.int32), torch.device(device))
    return Varlen(cu[0], cu[1], cu[2], cu[3], max(lens_q), max(lens_k), table[2][-1], table[3][-1])


@dataclass
class QuantQK:
    q: torch.Tensor  # int8 [B, Hq, rows_q, BLOCK_D]
    q_scale: torch.Tensor  # fp32 [B, Hq, rows_q / BLOCK_Q] or [B, Hq, rows_q]
    k: torch.Tensor
    k_scale: torch.Tensor
    qkm: Optional[torch.Tensor]  # fp32 [B, Hq, rows_q] (log2 units) or None


def quant_qk_int8(
    q4: torch.Tensor,
    k4: torch.Tensor,
    km: Optional[torch.Tensor],
    sm_scale: float,
    *,
    block_q: int,
    block_k: int,
    block_d: int,
    q_per_token: bool,
    k_per_token: bool,
    lse_corr: bool,
    varlen: Optional[Varlen] = None,
) -> QuantQK:
    """Quantize [B, H, N, D] views of Q and K (see the module docstring)."""
    from ..reference import LOG2E

    B, h_q, n_q, D = q4.shape
    h_k, n_k = k4.shape[1], k4.shape[2]
    dev = q4.device
    if varlen is None:
        rows_q = triton.cdiv(n_q, block_q) * block_q
        rows_k = triton.cdiv(n_k, block_k) * block_k
        n_qblk, n_kblk = rows_q // block_q, rows_k // block_k
        nb = B
        cu_q = cu_k = cu_pq = cu_pk = q4  # never read
    else:
        rows_q, rows_k = varlen.rows_q, varlen.rows_k
        n_qblk = triton.cdiv(varlen.max_q, block_q)
        n_kblk = triton.cdiv(varlen.max_k, block_k)
        nb = varlen.batch
        cu_q, cu_k, cu_pq, cu_pk = varlen.cu_q, varlen.cu_k, varlen.cu_pad_q, varlen.cu_pad_k
    if lse_corr and km is None:
        raise ValueError("lse_corr needs the K mean km")
    ob = 1 if varlen is not None else B
    qo = torch.empty((ob, h_q, rows_q, block_d), dtype=torch.int8, device=dev)
    ko = torch.empty((ob, h_k, rows_k, block_d), dtype=torch.int8, device=dev)
    qs = torch.empty((ob, h_q, rows_q if q_per_token else rows_q // block_q), dtype=torch.float32, device=dev)
    ks = torch.empty((ob, h_k, rows_k if k_per_token else rows_k // block_k), dtype=torch.float32, device=dev)
    qkm = torch.empty((ob, h_q, rows_q), dtype=torch.float32, device=dev) if lse_corr else None
    # Rows of the padded buffers that lie between two packed sequences are never written and
    # never read: the attention kernel reads exactly the blocks written here.

    def bstride(t):  # batch stride; packed (varlen) tensors take their offsets from CU_*
        return 0 if varlen is not None else t.stride(0)

    kmt = km if km is not None else qs  # placeholder pointer, never read
    qkmt = qkm if qkm is not None else qs
    grid = (n_qblk * h_q + n_kblk * h_k, nb)
    _quant_qk_kernel[grid](
        q4, bstride(q4), q4.stride(1), q4.stride(2),
        k4, bstride(k4), k4.stride(1), k4.stride(2),
        qo, bstride(qo), qo.stride(1),
        ko, bstride(ko), ko.stride(1),
        qs, bstride(qs), qs.stride(1),
        ks, bstride(ks), ks.stride(1),
        kmt, kmt.stride(0), kmt.stride(1),
        qkmt, bstride(qkmt), qkmt.stride(1),
        cu_q, cu_k, cu_pq, cu_pk,
        n_q, n_k, h_q, h_k, n_qblk, n_kblk, float(sm_scale * LOG2E),
        D=D, BLOCK_Q=block_q, BLOCK_K=block_k, BLOCK_D=block_d,
        Q_PER_TOKEN=q_per_token, K_PER_TOKEN=k_per_token,
        SMOOTH_K=km is not None, LSE_CORR=lse_corr, VARLEN=varlen is not None,
        num_warps=4,
    )
    return QuantQK(qo, qs, ko, ks, qkm)
