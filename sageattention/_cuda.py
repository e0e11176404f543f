"""The compiled mma.sync kernels: quantize Q, K (and V for fp8 PV), then attend.

Each step is a torch custom op registered by the extension (``torch.ops.<ns>.quant_int8``,
``quant_v_fp8``, ``attn``; the fp8 families quantize Q, K and V with one ``quant_qkv``); a call
(and each group of packed sequences) runs them as one op, ``quant_attn`` (quant_qkv then attn)
or ``quant_attn_fp16`` (the fp16-PV family's K mean, quant_int8 of Q and K, attn:
csrc/binding/ops.cpp), for the host time of one op call instead of several. Their fake
implementations are registered here, so ``torch.compile(sageattn, fullgraph=True)`` traces the
whole pipeline without a graph break.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from ._ops import ops, register_family, require
from ._staging import rows_index, to_device
from .dispatch import seen_keys

LOG2E = 1.4426950408889634
BLOCK_Q, WARP_Q, BLOCK_K = 128, 16, 64  # csrc/kernels/launch.h
SM90_BLOCK_K = 128  # keys per tile of the Hopper kernel (kSm90BlockK): its online-softmax block
# bits kept below the leading one when wgmma's e4m3 PV product-sum adds 32 products to its
# accumulator (measured on an H100: reference.mma_truncated, bench/NOTES.md)
SM90_MMA_BITS = 13
FP8_MAX = 448.0
# the fp8 families' quant_qkv smooths K by the mean of this many evenly spaced keys
# (kKSampleRows in quant_qkv.cu; reference.k_sample_index)
K_SAMPLE_ROWS = 128
# ... summed (that sample, and all of V when smoothing V) in this many token chains, in a fixed
# order that the reference repeats (kStatChains in quant_qkv.cu; reference.chain_mean)
K_STAT_CHAINS = 64
# ... and, unless V is smoothed, scale V's fp8 channels by the largest |v| of the same keys
# times this (kVAmaxMargin in quant_qkv.cu; channels that overflow it get the exact scale)
V_AMAX_MARGIN = 8.0
# fp32+fp16: 448 (|P|) * 2.25 (|V|) * 64 (keys per block) = 64512 < 65504, the fp16 maximum
V_MAX_FP16_ACCUM = 2.25
ACCUM = {"fp32": 0, "fp16+fp32": 1, "fp32+fp32": 2, "fp32+fp16": 3}

FAMILIES = {  # extension module -> op namespace
    "sageattention._qattn_sm80": "sageattention_sm80",
    "sageattention._qattn_sm89": "sageattention_sm89",
    "sageattention._qattn_sm90": "sageattention_sm90",
}
SM90 = "sageattention._qattn_sm90"


def _fp8(module: str) -> bool:
    return module.endswith(("sm89", "sm90"))


def kv_block(module: str) -> int:
    """Keys per tile of the module's attention kernel: the padding of K/V and the block of
    its online softmax."""
    return SM90_BLOCK_K if module == SM90 else BLOCK_K


def _ceil(a: int, b: int) -> int:
    return -(-a // b) * b


def padded_head_dim(d: int) -> int:
    return 64 if d <= 64 else 128 if d <= 128 else 256


def _register_fakes(ns: str) -> None:
    def quant_int8(x, mean, dot_mean, prescale, block_rows, groups, n_pad, d_pad):
        b, h, n, _ = x.shape
        out = x.new_empty((b, h, n_pad, d_pad), dtype=torch.int8)
        scale = x.new_empty((b, h, n_pad // block_rows * groups), dtype=torch.float32)
        rowdot = x.new_empty((b, h, n) if dot_mean is not None else (0, 0, 0), dtype=torch.float32)
        return out, scale, rowdot

    torch.library.register_fake(f"{ns}::quant_int8", quant_int8)

    if hasattr(getattr(torch.ops, ns), "quant_v_fp8"):

        def quant_v_fp8(v, scale_max, smooth, n_pad, d_pad):
            b, h = v.shape[:2]
            out = v.new_empty((b, h, d_pad, n_pad), dtype=torch.float8_e4m3fn)
            scale = v.new_empty((b, h, d_pad), dtype=torch.float32)
            mean = v.new_empty((b, h, d_pad) if smooth else (0, 0, 0), dtype=torch.float32)
            return out, scale, mean

        torch.library.register_fake(f"{ns}::quant_v_fp8", quant_v_fp8)

    if hasattr(getattr(torch.ops, ns), "quant_qkv"):

        def quant_qkv(q, k, v, q_prescale, q_groups, k_groups, smooth_k, smooth_v, rowdot, v_scale_max,
                      nq_pad, nk_pad, d_pad, v_full_stats=False, v_terms=1, seq_q=None, seq_k=None):
            b, hq, nq, d = q.shape
            hk = k.shape[1]
            f32 = torch.float32
            return (
                q.new_empty((b, hq, nq_pad, d_pad), dtype=torch.int8),
                q.new_empty((b, hq, nq_pad // WARP_Q * q_groups), dtype=f32),
                q.new_empty((b, hq, nq) if rowdot else (0, 0, 0), dtype=f32),
                q.new_empty((b, hk, nk_pad, d_pad), dtype=torch.int8),
                q.new_empty((b, hk, nk_pad // BLOCK_K * k_groups), dtype=f32),
                q.new_empty((b, hk, d) if smooth_k else (0, 0, 0), dtype=f32),
                q.new_empty((b, hk, v_terms * d_pad, nk_pad), dtype=torch.float8_e4m3fn),
                q.new_empty((b, hk, d_pad), dtype=f32),
                q.new_empty((b, hk, d_pad) if smooth_v else (0, 0, 0), dtype=f32),
            )

        torch.library.register_fake(f"{ns}::quant_qkv", quant_qkv)

    if hasattr(getattr(torch.ops, ns), "quant_attn"):

        def quant_attn(q, k, v, sm_scale, q_groups, k_groups, smooth_k, smooth_v, v_scale_max, v_terms, causal, accum,
                       nhd, return_lse, seq_q=None, seq_k=None, total_q=0):
            b, hq, nq, d = q.shape
            if seq_q is not None:  # packed sequences: o [total_q, Hq, D], lse [Hq, total_q]
                return q.new_empty((total_q, hq, d)), q.new_empty((hq, total_q) if return_lse else (0, 0),
                                                                  dtype=torch.float32)
            o = q.new_empty((b, nq, hq, d) if nhd else (b, hq, nq, d))
            return o, q.new_empty((b, hq, nq) if return_lse else (0, 0, 0), dtype=torch.float32)

        torch.library.register_fake(f"{ns}::quant_attn", quant_attn)

    def attn(q8, k8, v, q_scale, k_scale, v_scale, v_mean, lse_add, q_groups, k_groups, nq, nk, d_out,
             causal, accum, nhd, return_lse, lse_add_scale, out_dtype, seq_q=None, seq_k=None, total_q=0):
        b, hq = q8.shape[:2]
        if seq_q is not None:  # packed sequences: o [total_q, Hq, d_out], lse [Hq, total_q]
            o = q8.new_empty((total_q, hq, d_out), dtype=out_dtype)
            return o, q8.new_empty((hq, total_q) if return_lse else (0, 0), dtype=torch.float32)
        shape = (b, nq, hq, d_out) if nhd else (b, hq, nq, d_out)
        o = q8.new_empty(shape, dtype=out_dtype)
        lse = q8.new_empty((b, hq, nq) if return_lse else (0, 0, 0), dtype=torch.float32)
        return o, lse

    torch.library.register_fake(f"{ns}::attn", attn)

    if hasattr(getattr(torch.ops, ns), "quant_attn_fp16"):

        def quant_attn_fp16(q, k, v, sm_scale, q_groups, k_groups, smooth_k, causal, accum, nhd, return_lse):
            b, hq, nq, d = q.shape
            o = q.new_empty((b, nq, hq, d) if nhd else (b, hq, nq, d))
            return o, q.new_empty((b, hq, nq) if return_lse else (0, 0, 0), dtype=torch.float32)

        torch.library.register_fake(f"{ns}::quant_attn_fp16", quant_attn_fp16)


for _module, _ns in FAMILIES.items():
    register_family(_module, _ns, _register_fakes)


def forward(fn: str, module: str, q, k, v, tensor_layout: str, is_causal: bool, sm_scale: float,
            qk_quant_gran: str, pv_accum_dtype: str, smooth_k: bool, smooth_v: bool, return_lse: bool,
            v_fp8_terms: int = 1):
    """Run the CUDA pipeline on validated inputs; returns ``o`` or ``(o, lse)``. ``v_fp8_terms=2``
    (the Hopper kernel only) stores V as two e4m3 terms."""
    require(fn, module)
    op = ops(module)
    nhd = tensor_layout == "NHD"
    qh, kh, vh = (t.transpose(1, 2) if nhd else t for t in (q, k, v))
    q_groups, k_groups = (8, 4) if qk_quant_gran == "per_thread" else (1, 1)
    if _fp8(module):
        # quant_qkv then attn in one op (quant_attn: the same bits, half the host time of the two
        # op calls). Its K mean is a fixed-order sum over a sample of K_SAMPLE_ROWS keys
        # (reference.chain_mean); with return_lse and smooth_k the LSE gets q . (K mean) back.
        vmax = V_MAX_FP16_ACCUM if pv_accum_dtype == "fp32+fp16" else FP8_MAX
        o, lse = op.quant_attn(qh, kh, vh, sm_scale, q_groups, k_groups, smooth_k, smooth_v, vmax, v_fp8_terms,
                               is_causal, ACCUM[pv_accum_dtype], nhd, return_lse)
        return (o, lse) if return_lse else o
    # fp16 PV: K's mean over all keys (torch's), quant_int8 of Q and K, V as fp16 for the
    # fp16-accumulating mode, attn, in one op (quant_attn_fp16)
    o, lse = op.quant_attn_fp16(qh, kh, vh, sm_scale, q_groups, k_groups, smooth_k, is_causal, ACCUM[pv_accum_dtype],
                                nhd, return_lse)
    return (o, lse) if return_lse else o


def packed_view(t: torch.Tensor, batch: int, rows: int) -> torch.Tensor:
    """A packed ``[total, H, D]`` tensor as the ``[batch, H, rows, D]`` input the ops take with
    packed sequences: every entry is the first ``rows`` rows (batch stride 0); the kernels
    move entry b to its sequence's first row (``Input4D::seqs`` in csrc/kernels/launch.h).
    ``rows`` is at most ``total``, so the view stays inside the tensor."""
    t = t if t.stride(2) == 1 or t.shape[2] == 1 else t.contiguous()
    return t.as_strided((batch, t.shape[1], rows, t.shape[2]), (0, t.stride(1), t.stride(0), t.stride(2)))


def packed_seqs(lens_q, lens_k, group, causal: bool):
    """The ops' ``seq_q`` and ``seq_k`` for the sequences ``group`` (indices) of a packed call
    with these lengths, as nested lists (``[2, len(group)]`` each: row starts, then row
    counts); keys counted as the queries see them (dispatch.seen_keys)."""
    starts_q, starts_k = list(accumulate(lens_q, initial=0)), list(accumulate(lens_k, initial=0))
    seen = seen_keys(lens_q, lens_k, causal)
    return ([[starts_q[i] for i in group], [lens_q[i] for i in group]],
            [[starts_k[i] for i in group], [seen[i] for i in group]])


def forward_varlen(fn: str, q3, k3, v3, lens_q, lens_k, groups, is_causal: bool, sm_scale: float,
                   qk_quant_gran: str, smooth_k: bool, return_lse: bool):
    """Packed sequences (``q3 [total_q, Hq, D]``, ``k3, v3 [total_k, Hkv, D]``, their lengths
    ``lens_q``/``lens_k`` on the host) on the Hopper kernel (fp8 PV, fp32+fp32); returns ``o``
    and the LSE ``[Hq, total_q]`` (or None).

    ``groups`` (dispatch.varlen_groups): lists of sequence indices, each run as one batch whose
    entry b is sequence groups[g][b]: quant_qkv reads its rows from the packed tensors (a
    [B, H, max_len, D] view whose entries start at each sequence's offset) into buffers of
    B x max_len rows, and the kernel writes its output rows and LSE straight into packed
    results, skipping the work tiles past each sequence's end (both in one op, quant_attn).
    Each sequence gets what a call on it alone gets (its own K mean, scales and tiles; causal:
    only its first Nq keys).
    Sequences in no group (no queries, or no key their queries see) get zeros and an LSE of
    -inf, as from the Triton kernel."""
    require(fn, SM90)
    op = ops(SM90)
    total_q = q3.shape[0]
    q_groups, k_groups = (8, 4) if qk_quant_gran == "per_thread" else (1, 1)
    starts = list(accumulate(lens_q, initial=0))

    def rows_of(seqs):  # packed query rows of these sequences, as an index on the device
        return rows_index([starts[i] for i in seqs], [lens_q[i] for i in seqs], q3.device) if seqs else None

    o = lse = None
    for g in groups:
        sq, sk = packed_seqs(lens_q, lens_k, g, is_causal)
        nb, max_q, max_k = len(g), max(sq[1]), max(sk[1])
        seq = to_device(torch.tensor([sq, sk], dtype=torch.int32), q3.device)  # one copy
        og, lg = op.quant_attn(packed_view(q3, nb, max_q), packed_view(k3, nb, max_k), packed_view(v3, nb, max_k),
                               sm_scale, q_groups, k_groups, smooth_k, False, FP8_MAX, 1, is_causal,
                               ACCUM["fp32+fp32"], True, return_lse, seq[0], seq[1], total_q)
        if o is None:  # the first group's results hold the others' rows too
            o, lse = og, lg
        else:
            rows = rows_of(g)
            o.index_copy_(0, rows, og.index_select(0, rows))
            if return_lse:
                lse.index_copy_(1, rows, lg.index_select(1, rows))
    placed = {i for g in groups for i in g}
    rows = rows_of([i for i, n in enumerate(lens_q) if n and i not in placed])
    # Sequences with queries but no key to attend: no tile ran. (index_fill_, since `o[rows] = 0`
    # would copy its 0 to the GPU with a sync.)
    if rows is not None:
        o.index_fill_(0, rows, 0)
        if return_lse:
            lse.index_fill_(1, rows, float("-inf"))
    return o, (lse if return_lse else None)


def reference_config(module: str, qk_quant_gran: str, pv_accum_dtype: str, dtype: torch.dtype,
                     smooth_k: bool = True, smooth_v: bool = False, v_fp8_terms: int = 1):
    """The :class:`~sageattention.reference.QuantConfig` of what these kernels compute."""
    from .reference import FP8_E4M3_MAX, QuantConfig

    fp8 = _fp8(module)
    if fp8:
        pv = "fp8"
    elif pv_accum_dtype == "fp16+fp32":
        pv = "fp16"
    else:
        pv = "bf16" if dtype == torch.bfloat16 else "fp16"
    return QuantConfig(
        qk_gran=qk_quant_gran, blk_q=BLOCK_Q, warp_q=WARP_Q, blk_k=BLOCK_K, warp_k=BLOCK_K,
        block_n=kv_block(module),
        pv=pv, pv_accum=pv_accum_dtype, smooth_k=smooth_k, smooth_v=smooth_v,
        k_mean_rows=K_SAMPLE_ROWS if fp8 else None, mean_chains=K_STAT_CHAINS if fp8 else None,
        v_amax_rows=K_SAMPLE_ROWS if fp8 else None, v_amax_margin=V_AMAX_MARGIN,
        v_scale_max=V_MAX_FP16_ACCUM if pv_accum_dtype == "fp32+fp16" else FP8_E4M3_MAX,
        l_from_pv=module == SM90,
        kernel_exponent=module == SM90,
        mma_bits=SM90_MMA_BITS if module == SM90 else None,
        v_terms=v_fp8_terms,
    )
