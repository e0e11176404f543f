"""INT8 QK^T / FP16-or-BF16 PV attention kernel (FlashAttention-style online softmax).

Reads the INT8 Q/K written by :mod:`.quant` and the caller's V (any strides, last dim
contiguous); writes O in the caller's layout and dtype, and optionally the LSE.

Per program: BLOCK_M query rows of one head; the KV loop runs in BLOCK_N steps, first over
blocks that need no mask (fully inside the keys and, when causal, fully below the
diagonal), then over the few that do. Softmax is in base 2: Q was pre-multiplied by
``sm_scale * log2(e)``, so ``S = (Qi8 Ki8^T) * q_scale * k_scale`` is already in log2 units.
Because the dequantization factor c is positive, the row max is taken on the raw integer
products and ``exp2(s * c - m)`` is one FMA per element.

P is rounded to V's dtype (fp16 or bf16; bf16 keeps |V| > 65504 finite). The PV product is
accumulated in fp32, or for fp16 optionally per KV block in fp16 and then added to fp32
(two-level accumulation; faster on GPUs whose fp16-accumulate MMA runs at twice the rate).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from ..reference import LN2, QuantConfig
from .quant import QuantQK, Varlen, seq_rows

LN2_C = tl.constexpr(LN2)


@triton.jit
def _attn_step(
    acc, l_i, m_i, q, q_scale, k_ptrs, ks_ptrs, v_ptrs, start_n, k_len, offs_m, offs_n, offs_d,
    D: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, Q_PER_TOKEN: tl.constexpr,
    K_PER_TOKEN: tl.constexpr, PV_FP16_ACC: tl.constexpr, BLOCK_D: tl.constexpr,
    UPCAST_PV: tl.constexpr,
):
    k = tl.load(k_ptrs)
    s = tl.dot(q, tl.trans(k)).to(tl.float32)
    if K_PER_TOKEN:
        s = s * tl.load(ks_ptrs)[None, :]
        c = q_scale
    else:
        c = q_scale * tl.load(ks_ptrs)
    if MASK:
        cols = start_n + offs_n
        keep = cols[None, :] < k_len
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None])
        s = tl.where(keep, s, float("-inf"))
    # c > 0, so max(s * c) = max(s) * c row by row
    m_new = tl.maximum(m_i, tl.max(s, 1) * c)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key seen yet
    if Q_PER_TOKEN:
        p = tl.math.exp2(s * c[:, None] - m_use[:, None])
    else:
        p = tl.math.exp2(s * c - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if MASK:
        v_mask = (start_n + offs_n)[:, None] < k_len
        if BLOCK_D != D:
            v_mask = v_mask & (offs_d[None, :] < D)
        v = tl.load(v_ptrs, mask=v_mask, other=0.0)
    elif BLOCK_D != D:
        v = tl.load(v_ptrs, mask=offs_d[None, :] < D, other=0.0)
    else:
        v = tl.load(v_ptrs)
    p = p.to(v.dtype)
    if UPCAST_PV:  # Triton interpreter: its bf16 dot is wrong; same products in fp32
        acc = tl.dot(p.to(tl.float32), v.to(tl.float32), acc)
    elif PV_FP16_ACC:
        acc += tl.dot(p, v, out_dtype=tl.float16).to(tl.float32)
    else:
        acc = tl.dot(p, v, acc)
    return acc, l_i, m_new


@triton.jit(do_not_specialize=["n_q", "n_k"])
def _attn_fwd_kernel(
    QI, qi_sb, qi_sh, KI, ki_sb, ki_sh,
    QS, qs_sb, qs_sh, KS, ks_sb, ks_sh,
    V, v_sb, v_sh, v_sn,
    O, o_sb, o_sh, o_sn,
    LSE, lse_sb, lse_sh, QKM, qkm_sb, qkm_sh,
    CU_Q, CU_K, CU_PAD_Q, CU_PAD_K,
    n_q, n_k, group,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, VARLEN: tl.constexpr,
    Q_PER_TOKEN: tl.constexpr, K_PER_TOKEN: tl.constexpr, PV_FP16_ACC: tl.constexpr,
    RETURN_LSE: tl.constexpr, LSE_CORR: tl.constexpr, UPCAST_PV: tl.constexpr,
):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    hk = h // group
    q_row0, q_len, qi_row0 = seq_rows(CU_Q, CU_PAD_Q, b, n_q, VARLEN)
    k_row0, k_len, ki_row0 = seq_rows(CU_K, CU_PAD_K, b, n_k, VARLEN)
    q_lo = pid_m * BLOCK_M
    if q_lo >= q_len:
        return
    b64 = b.to(tl.int64)
    offs_m = q_lo + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q = tl.load(QI + b64 * qi_sb + h.to(tl.int64) * qi_sh
                + (qi_row0 + offs_m).to(tl.int64)[:, None] * BLOCK_D + offs_d[None, :])
    qs_base = QS + b64 * qs_sb + h.to(tl.int64) * qs_sh
    if Q_PER_TOKEN:
        q_scale = tl.load(qs_base + qi_row0 + offs_m)
    else:
        q_scale = tl.load(qs_base + qi_row0 // BLOCK_M + pid_m)

    k_ptrs = (KI + b64 * ki_sb + hk.to(tl.int64) * ki_sh
              + (ki_row0 + offs_n).to(tl.int64)[:, None] * BLOCK_D + offs_d[None, :])
    ks_base = KS + b64 * ks_sb + hk.to(tl.int64) * ks_sh
    if K_PER_TOKEN:
        ks_ptrs = ks_base + ki_row0 + offs_n
    else:
        ks_ptrs = ks_base + ki_row0 // BLOCK_N
    v_ptrs = (V + b64 * v_sb + hk.to(tl.int64) * v_sh
              + (k_row0 + offs_n).to(tl.int64)[:, None] * v_sn + offs_d[None, :])

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    if CAUSAL:
        hi = tl.minimum(k_len, q_lo + BLOCK_M)
        full_end = tl.minimum(k_len // BLOCK_N, (q_lo + 1) // BLOCK_N) * BLOCK_N
    else:
        hi = k_len
        full_end = (k_len // BLOCK_N) * BLOCK_N
    ks_step = BLOCK_N if K_PER_TOKEN else 1
    for start_n in range(0, full_end, BLOCK_N):
        acc, l_i, m_i = _attn_step(
            acc, l_i, m_i, q, q_scale, k_ptrs, ks_ptrs, v_ptrs, start_n, k_len, offs_m, offs_n,
            offs_d, D, False, CAUSAL, Q_PER_TOKEN, K_PER_TOKEN, PV_FP16_ACC, BLOCK_D, UPCAST_PV)
        k_ptrs += BLOCK_N * BLOCK_D
        ks_ptrs += ks_step
        v_ptrs += BLOCK_N * v_sn
    for start_n in range(full_end, hi, BLOCK_N):
        acc, l_i, m_i = _attn_step(
            acc, l_i, m_i, q, q_scale, k_ptrs, ks_ptrs, v_ptrs, start_n, k_len, offs_m, offs_n,
            offs_d, D, True, CAUSAL, Q_PER_TOKEN, K_PER_TOKEN, PV_FP16_ACC, BLOCK_D, UPCAST_PV)
        k_ptrs += BLOCK_N * BLOCK_D
        ks_ptrs += ks_step
        v_ptrs += BLOCK_N * v_sn

    l_use = tl.where(l_i == 0.0, 1.0, l_i)  # a row that saw no key (empty varlen sequence)
    o = acc / l_use[:, None]
    row_ok = offs_m < q_len
    o_ptrs = (O + b64 * o_sb + h.to(tl.int64) * o_sh
              + (q_row0 + offs_m).to(tl.int64)[:, None] * o_sn + offs_d[None, :])
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))
    if RETURN_LSE:
        lse2 = m_i + tl.math.log2(l_i)
        if LSE_CORR:
            lse2 += tl.load(QKM + b64 * qkm_sb + h.to(tl.int64) * qkm_sh + qi_row0 + offs_m)
        tl.store(LSE + b64 * lse_sb + h.to(tl.int64) * lse_sh + q_row0 + offs_m, lse2 * LN2_C,
                 mask=row_ok)


# --------------------------------------------------------------------------------------
# configuration and launch


@dataclass(frozen=True)
class AttnConfig:
    """Tile sizes and variants of one launch. ``block_m``/``block_n`` are also the Q/K
    quantization block sizes (per-block scales line up with the tiles)."""

    block_m: int
    block_n: int
    block_d: int
    num_warps: int
    num_stages: int
    q_per_token: bool
    k_per_token: bool
    pv_fp16_acc: bool

    def reference(self, dtype: torch.dtype, smooth_k: bool = True) -> QuantConfig:
        """The :class:`QuantConfig` under which the reference computes what this launch does."""
        return QuantConfig(
            qk_gran="per_block",
            q_gran="per_token" if self.q_per_token else "per_block",
            k_gran="per_token" if self.k_per_token else "per_block",
            blk_q=self.block_m,
            blk_k=self.block_n,
            warp_q=self.block_m,
            warp_k=self.block_n,
            block_n=self.block_n,
            pv="bf16" if dtype == torch.bfloat16 else "fp16",
            pv_accum="fp16+fp32" if self.pv_fp16_acc else "fp32",
            smooth_k=smooth_k,
        )


def interpreting() -> bool:
    """True when kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, used by tests)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def block_d_for(head_dim: int) -> int:
    """Head dim the kernels compute with: a power of two, at least 32 (the INT8 MMA depth)."""
    return max(32, triton.next_power_of_2(head_dim))


def choose_config(
    head_dim: int,
    dtype: torch.dtype,
    capability: tuple = (9, 0),
    smem_bytes: Optional[int] = None,
    n_k: Optional[int] = None,
    packed: bool = False,
) -> AttnConfig:
    """Tiles for a launch. Measured on an H100 (bench/results/, bench/sweep_triton.py):
    BLOCK_N=128 wins from about 8k keys on (D=128, N=16k: 567 vs 517 TOPS end to end),
    BLOCK_N=64 below (N=1k: 274 vs 196; N=4k: 446 vs 424); 4 warps for D<=64, 8 above;
    D>128: 128x64 tiles, one stage (D=256, N=4k: 155 vs 129 TOPS for 64x64, two stages).
    ``packed`` (varlen) launches keep BLOCK_N=64 at any length: with 128 the varlen kernel
    ran 4.5x slower than the dense one on the same 8k sequence (9.8 ms against 2.2; 2.3 with
    64, which spills nothing; with 128 both spill, 258 and 224 bytes, Triton 3.6)."""
    block_d = block_d_for(head_dim)
    long_kv = n_k is not None and n_k >= 8192 and not packed
    if block_d <= 128:
        block_m, block_n = 128, (128 if long_kv else 64)
        num_warps = 4 if block_d <= 64 else 8
        max_stages = 3
    else:
        block_m, block_n, num_warps, max_stages = 128, 64, 8, 1
    if smem_bytes is None:
        smem_bytes = 227 * 1024 if tuple(capability) in {(8, 0), (9, 0)} else 99 * 1024
    # per stage: a K tile (int8) and a V tile (16-bit); plus the Q tile and some slack
    per_stage = block_n * block_d * 3
    fixed = block_m * block_d + 8 * 1024
    num_stages = max(1, min(max_stages, (smem_bytes - fixed) // per_stage))
    return AttnConfig(
        block_m=block_m,
        block_n=block_n,
        block_d=block_d,
        num_warps=num_warps,
        num_stages=int(num_stages),
        q_per_token=True,
        k_per_token=False,
        # fp16 per-block accumulation runs at twice the rate on GeForce/RTX parts (same
        # rate on A100/H100) but a 64-key block sum overflows fp16 once |V| > ~1024, so it
        # is never the default; bench/sweep_triton.py can still time it.
        pv_fp16_acc=False,
    )


def attn_int8(
    qq: QuantQK,
    v4: torch.Tensor,
    o4: torch.Tensor,
    lse: Optional[torch.Tensor],
    cfg: AttnConfig,
    *,
    n_q: int,
    n_k: int,
    is_causal: bool,
    varlen: Optional[Varlen] = None,
) -> None:
    """Launch the attention kernel: O (and LSE) from quantized Q/K and V ([B, H, N, D] views).

    Dense LSE is [B, Hq, Nq]; varlen LSE is [Hq, total_q].
    """
    B, h_q, _, D = o4.shape
    h_k = v4.shape[1]
    if varlen is None:
        grid = (triton.cdiv(n_q, cfg.block_m), h_q, B)
        cu = (qq.q,) * 4  # never read
        bs = {"qi": qq.q.stride(0), "ki": qq.k.stride(0), "qs": qq.q_scale.stride(0),
              "ks": qq.k_scale.stride(0), "v": v4.stride(0), "o": o4.stride(0)}
    else:
        grid = (triton.cdiv(varlen.max_q, cfg.block_m), h_q, varlen.batch)
        cu = (varlen.cu_q, varlen.cu_k, varlen.cu_pad_q, varlen.cu_pad_k)
        bs = dict.fromkeys(("qi", "ki", "qs", "ks", "v", "o"), 0)
    if lse is not None:
        lse_sb, lse_sh = (0, lse.stride(0)) if varlen is not None else (lse.stride(0), lse.stride(1))
    else:
        lse, lse_sb, lse_sh = qq.q_scale, 0, 0  # never written
    corr = qq.qkm is not None and lse is not qq.q_scale
    qkm = qq.qkm if corr else qq.q_scale
    qkm_sb = 0 if (varlen is not None or not corr) else qkm.stride(0)
    _attn_fwd_kernel[grid](
        qq.q, bs["qi"], qq.q.stride(1), qq.k, bs["ki"], qq.k.stride(1),
        qq.q_scale, bs["qs"], qq.q_scale.stride(1), qq.k_scale, bs["ks"], qq.k_scale.stride(1),
        v4, bs["v"], v4.stride(1), v4.stride(2),
        o4, bs["o"], o4.stride(1), o4.stride(2),
        lse, lse_sb, lse_sh, qkm, qkm_sb, qkm.stride(1),
        *cu,
        n_q, n_k, h_q // h_k,
        D=D, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d,
        CAUSAL=is_causal, VARLEN=varlen is not None,
        Q_PER_TOKEN=cfg.q_per_token, K_PER_TOKEN=cfg.k_per_token,
        PV_FP16_ACC=cfg.pv_fp16_acc and v4.dtype == torch.float16,
        RETURN_LSE=lse is not qq.q_scale, LSE_CORR=corr,
        UPCAST_PV=interpreting() and v4.dtype == torch.bfloat16,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
