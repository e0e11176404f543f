"""Pure-torch model of the quantized attention pipeline: the test oracle.

Everything here runs on the CPU as well as on a GPU, and mirrors step by step what the
kernels compute, so a kernel can be checked *tightly* against it (same quantization groups,
same rounding, same online-softmax block order), and the reference itself can be checked
against exact float64 attention.

Pipeline (SageAttention 2 style):

1. K smoothing: ``k - km`` per (batch, kv-head, channel), ``km`` the mean over all tokens or
   (``k_mean_rows``) over an evenly spaced sample of them, summed in torch's order or
   (``mean_chains``) in the fp8 kernels' fixed one (:func:`chain_mean`). Exact for the output
   whatever ``km`` is, because ``q . km`` is constant along a softmax row; only the LSE needs
   ``sm_scale * q . km`` added back.
2. Q is multiplied by ``sm_scale * log2(e)`` (softmax in base 2), then Q and K are quantized
   to symmetric INT8 with one fp32 scale per group of tokens (see :func:`int8_groups`).
3. ``S = (Qi8 Ki8^T) * q_scale * k_scale`` (exact integer products).
4. Online softmax over KV blocks of ``block_n`` tokens: running max ``m`` and denominator
   ``l`` in fp32; ``P = exp2(S - m)``; ``l`` sums the unrounded ``P`` (the Hopper kernel's
   rounded one, ``l_from_pv``, whose exponent is also modelled in its fp32 steps,
   ``kernel_exponent``).
5. PV: ``P`` rounded to the PV operand type (fp16, bf16, or fp8 e4m3 after scaling into
   [0, 448]); V in fp16/bf16 or fp8 e4m3 per channel; the per-block product is accumulated
   either straight into fp32 or first in a per-block fp16 accumulator that is then added to
   the fp32 one ("two-level accumulation"). The Hopper kernel's FP8 block products are summed
   as its tensor cores sum them, dropping low bits (``mma_bits``, :func:`mma_truncated`).
6. ``O = acc / l`` (times the per-channel V scale for fp8 V, plus the V mean if V was
   smoothed); ``lse = (m + log2 l) * ln 2 + sm_scale * q . km``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional, Tuple

import torch

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
FP8_E4M3_MAX = 448.0
# Smallest amax used to derive a scale: an all-zero group gets a finite scale and
# quantizes to zeros instead of 0/0.
AMAX_EPS = 1e-12

GRANULARITIES = ("per_block", "per_warp", "per_thread", "per_token")
PV_TYPES = ("fp16", "bf16", "fp8")
PV_ACCUMS = ("fp32", "fp16+fp32", "fp32+fp32", "fp32+fp16")


@dataclass(frozen=True)
class QuantConfig:
    """How the quantized pipeline is parameterised.

    ``blk_q``/``blk_k`` are the Q/K block sizes of per-block quantization (and the chunk
    sizes that per-warp/per-thread groups live in), ``warp_q``/``warp_k`` the per-warp
    chunk sizes, ``block_n`` the KV block of the online softmax (the kernel's tile).
    """

    qk_gran: str = "per_block"
    q_gran: Optional[str] = None  # overrides qk_gran for Q
    k_gran: Optional[str] = None  # overrides qk_gran for K
    blk_q: int = 128
    blk_k: int = 64
    warp_q: int = 32
    warp_k: int = 64
    block_n: int = 64
    pv: str = "fp16"
    pv_accum: str = "fp32"
    smooth_k: bool = True
    # K smoothed by the mean of k_mean_rows evenly spaced keys (k_sample_index), not of all
    # of them, when not None (the fp8 kernels' quant_qkv)
    k_mean_rows: Optional[int] = None
    # the K mean (and the V mean when smoothing fp8 V) summed as the fp8 kernels' quant_qkv
    # sums it, in this many token chains (chain_mean), when not None: the same bits as the
    # kernel on any device; None: torch's mean, whose order differs between devices
    mean_chains: Optional[int] = None
    smooth_v: bool = False
    v_scale_max: float = FP8_E4M3_MAX
    # fp8 V without smoothing: each channel's scale from the largest |v| of v_amax_rows evenly
    # spaced keys (k_sample_index) times v_amax_margin, not of all of them, when not None (the
    # fp8 kernels' quant_qkv); a channel that would overflow that scale anywhere gets the
    # exact one (see quantize_v_fp8)
    v_amax_rows: Optional[int] = None
    v_amax_margin: float = 8.0
    # fp8 V as the sum of v_terms e4m3 numbers: 1, or 2 (the rounding of v, then the rounding of
    # what it left; the sm90 kernel's v_fp8_terms=2, about bf16's precision)
    v_terms: int = 1
    p_scale: float = FP8_E4M3_MAX
    # row sums l of the rounded P that the PV product multiplies (the sm90 kernel reads them
    # off its tensor cores, a column of ones next to V) instead of the unrounded P
    l_from_pv: bool = False
    # P's exponent as the sm90 kernel computes it, in fp32 with one rounding per step (pv="fp8"):
    # f = q scale * k scale, the score s * f and the running maximum m of those, then
    # x = fma(1.5*2^23 + s, f, -fma(1.5*2^23, f, m - log2(p_scale))) and P * p_scale = 2^x. The
    # constant term's rounding is ~0.75 f (under one unit of the INT8 product, far under its
    # quantization error), but it is the same for a row's keys and can move a P value next to
    # an e4m3 step to the other side: modelled, so that the oracle rounds P as the kernel does
    kernel_exponent: bool = False
    # the tensor cores' FP8 product-sum, when not None: each instruction adds ``mma_k``
    # products to its accumulator keeping ``mma_bits`` bits below the leading bit of the
    # largest of them (see :func:`mma_truncated`); None sums the products exactly
    mma_bits: Optional[int] = None
    mma_k: int = 32

    def __post_init__(self):
        for name in ("qk_gran", "q_gran", "k_gran"):
            g = getattr(self, name)
            if g is not None and g not in GRANULARITIES:
                raise ValueError(f"{name} must be one of {GRANULARITIES}, got {g!r}")
        if self.pv not in PV_TYPES:
            raise ValueError(f"pv must be one of {PV_TYPES}, got {self.pv!r}")
        if self.pv_accum not in PV_ACCUMS:
            raise ValueError(f"pv_accum must be one of {PV_ACCUMS}, got {self.pv_accum!r}")
        if self.mma_bits is not None and self.pv != "fp8":
            raise ValueError("mma_bits models the FP8 tensor-core product-sum; it needs pv='fp8'")
        if self.k_mean_rows is not None and self.k_mean_rows < 1:
            raise ValueError(f"k_mean_rows must be None or >= 1, got {self.k_mean_rows}")
        if self.mean_chains is not None and (self.mean_chains < 8 or self.mean_chains & (self.mean_chains - 1)):
            raise ValueError(f"mean_chains must be None or a power of two >= 8, got {self.mean_chains}")
        if self.v_amax_rows is not None and self.v_amax_rows < 1:
            raise ValueError(f"v_amax_rows must be None or >= 1, got {self.v_amax_rows}")
        if self.kernel_exponent and self.pv != "fp8":
            raise ValueError(f"kernel_exponent models P scaled into e4m3's range; it needs pv='fp8', got {self.pv!r}")
        if self.v_terms not in (1, 2) or (self.v_terms == 2 and self.pv != "fp8"):
            raise ValueError(f"v_terms must be 1, or 2 with pv='fp8', got {self.v_terms} with pv={self.pv!r}")
        if not self.v_amax_margin >= 1.0:
            raise ValueError(f"v_amax_margin must be >= 1, got {self.v_amax_margin}")
        for name in ("blk_q", "blk_k", "warp_q", "warp_k", "block_n", "mma_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.blk_q % self.warp_q or self.blk_k % self.warp_k:
            raise ValueError("blk_q/blk_k must be multiples of warp_q/warp_k")

    def with_(self, **kw) -> "QuantConfig":
        return replace(self, **kw)

    def gran(self, role: str) -> str:
        """Granularity used for ``role`` ("q" or "k")."""
        own = self.q_gran if role == "q" else self.k_gran
        return own or self.qk_gran


# --------------------------------------------------------------------------------------
# layouts


def to_hnd(x: torch.Tensor, tensor_layout: str) -> torch.Tensor:
    """[B, H, N, D] view of a 4-D tensor given in ``tensor_layout``."""
    if tensor_layout == "HND":
        return x
    if tensor_layout == "NHD":
        return x.transpose(1, 2)
    raise ValueError(f"tensor_layout must be 'HND' or 'NHD', got {tensor_layout!r}")


def from_hnd(x: torch.Tensor, tensor_layout: str) -> torch.Tensor:
    return x if tensor_layout == "HND" else x.transpose(1, 2)


# --------------------------------------------------------------------------------------
# INT8 quantization


def int8_groups(n: int, role: str, cfg: QuantConfig, device=None) -> Tuple[torch.Tensor, int]:
    """Scale-group index of each of ``n`` tokens, and the number of groups.

    ``role`` is ``"q"`` or ``"k"``. Granularities (upstream's definitions, plus per-token):

    - per_block: ``blk_q`` (Q) / ``blk_k`` (K) consecutive tokens share a scale;
    - per_warp: Q in chunks of ``warp_q`` tokens; K per block (as upstream: a K "warp" chunk
      is the whole block);
    - per_thread: inside each ``warp_q`` chunk, Q token t shares a scale with t+8, t+16, ...
      (8 groups per chunk); inside each ``warp_k`` chunk, K tokens whose index mod 8 is in
      {2g, 2g+1} share a scale (4 groups per chunk) — the rows/columns one thread of an
      m16n8k32 MMA fragment holds;
    - per_token: one scale per token.
    """
    if role not in ("q", "k"):
        raise ValueError(f"role must be 'q' or 'k', got {role!r}")
    t = torch.arange(n, device=device)
    g = cfg.gran(role)
    blk = cfg.blk_q if role == "q" else cfg.blk_k
    if g == "per_token":
        return t, n
    if g == "per_block" or (g == "per_warp" and role == "k"):
        return t // blk, -(-n // blk)
    if g == "per_warp":
        return t // cfg.warp_q, -(-n // cfg.warp_q)
    # per_thread
    if role == "q":
        chunk, per_chunk, sub = cfg.warp_q, 8, t % 8
    else:
        chunk, per_chunk, sub = cfg.warp_k, 4, (t % 8) // 2
    return (t // chunk) * per_chunk + sub, -(-n // chunk) * per_chunk


def chain_mean(x: torch.Tensor, chains: Optional[int] = None) -> torch.Tensor:
    """Mean over dim -2 of ``x [..., S, D]`` in fp32, ``chains=None``: torch's (whose summation
    order is the device's); otherwise summed in the fixed order of the fp8 kernels' statistics
    (quant_qkv.cu, common.cuh's reduce_token_chains and warps_in_order), one fp32 rounding per
    step, so that it is the kernel's bits on any device:

    - ``chains`` token chains; chain ``r`` adds rows ``r, r + chains, r + 2 chains, ...`` in
      this order to a sum that starts at zero (one chain per group of threads);
    - the chains of each run of 8 (one warp's) added as a tree of neighbours: ``2i + (2i + 1)``,
      then pairs of those, then the two halves;
    - those totals added from zero, first run upwards; the sum divided by ``S`` (correctly
      rounded). ``S = 0`` gives zeros.

    (A chain padded with zero rows sums to the same bits: its sum is never -0.)
    """
    x = x.float()
    if chains is None:
        return x.mean(dim=-2)
    n = x.shape[-2]
    if n == 0:
        return x.new_zeros(x.shape[:-2] + x.shape[-1:])
    rows = torch.nn.functional.pad(x, (0, 0, 0, -n % chains)).unflatten(-2, (-1, chains))  # [..., U, chains, D]
    acc = torch.zeros_like(rows[..., 0, :, :])
    for u in range(rows.shape[-3]):
        acc = acc + rows[..., u, :, :]
    tree = acc.unflatten(-2, (chains // 8, 8))  # [..., warps, 8, D]
    while tree.shape[-2] > 1:
        tree = tree[..., 0::2, :] + tree[..., 1::2, :]
    total = torch.zeros_like(tree[..., 0, 0, :])
    for w in range(tree.shape[-3]):
        total = total + tree[..., w, 0, :]
    return _div(total, float(n))


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """Round to nearest, ties away from zero (what the kernels do before the int cast)."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def quantize_int8(
    x: torch.Tensor, groups: torch.Tensor, n_groups: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 of ``x [..., N, D]`` (fp32) with one scale per token group.

    Returns ``(xq, scale)``: ``xq`` holds the integer values (as fp32, in [-127, 127]) and
    ``scale [..., n_groups]`` the fp32 scales; ``xq * scale[groups]`` approximates ``x``.
    The kernels compute ``x * (127 / amax)`` and round half away from zero; so does this.
    """
    x = x.float()
    row_amax = x.abs().amax(dim=-1)  # [..., N]
    shape = row_amax.shape[:-1] + (n_groups,)
    amax = torch.zeros(shape, dtype=torch.float32, device=x.device)
    amax = amax.scatter_reduce(-1, groups.expand_as(row_amax), row_amax, reduce="amax")
    amax = amax.clamp_min(AMAX_EPS)
    inv = _fdiv(127.0, amax)[..., groups]  # [..., N]
    xq = round_half_away(x * inv.unsqueeze(-1)).clamp_(-127, 127)
    return xq, _div(amax, 127.0)


# --------------------------------------------------------------------------------------
# V and P for the PV product


def round_to(x: torch.Tensor, kind: str) -> torch.Tensor:
    """Round fp32/fp64 values to the PV operand type and back (fp8: e4m3, saturating)."""
    if kind == "fp16":
        return x.to(torch.float16).to(x.dtype)
    if kind == "bf16":
        return x.to(torch.bfloat16).to(x.dtype)
    if kind == "fp8":
        xc = x.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
        return xc.to(torch.float8_e4m3fn).to(x.dtype)
    raise ValueError(kind)


def quantize_v_fp8(
    v: torch.Tensor,
    scale_max: float = FP8_E4M3_MAX,
    smooth: bool = False,
    amax_rows: Optional[int] = None,
    margin: float = 8.0,
    terms: int = 1,
    mean_chains: Optional[int] = None,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Per-channel FP8 e4m3 of ``v [..., N, D]``.

    Returns ``(vq, v_scale [..., D], vm [..., D] or None)`` with
    ``v ~= vq * v_scale (+ vm)``; a constant or all-zero channel gets a finite scale.
    With ``terms=2``, ``vq`` is ``[..., N, 2 * D]``: the e4m3 rounding ``hi`` of each scaled
    value, then the e4m3 rounding of ``scaled - hi`` (exact in fp32), and
    ``v ~= (hi + lo) * v_scale (+ vm)`` to about bf16's precision.

    The scale is ``amax / scale_max`` with ``amax`` the channel's largest ``|v|`` (after the
    mean's subtraction when smoothing). With ``amax_rows`` (and no smoothing) it is that of the
    ``amax_rows`` keys of :func:`k_sample_index` times ``margin`` instead, so that the
    quantization need not read every key first; a channel where some ``|v|`` times the inverse
    scale (fp32) would exceed ``scale_max`` falls back to the exact ``amax``. No value is
    ever clipped. ``mean_chains``: the V mean's summation order when smoothing (:func:`chain_mean`).
    """
    v = v.float()
    vm = None
    if smooth:
        vm = chain_mean(v, mean_chains)
        v = v - vm.unsqueeze(-2)
    amax = v.abs().amax(dim=-2).clamp_min(AMAX_EPS)  # [..., D]
    if amax_rows is not None and not smooth and v.shape[-2] > 0:
        rows = v[..., k_sample_index(v.shape[-2], amax_rows, v.device), :]
        est = (rows.abs().amax(dim=-2) * torch.tensor(margin, dtype=torch.float32, device=rows.device)).clamp_min(AMAX_EPS)
        over = (v * _fdiv(scale_max, est).unsqueeze(-2)).abs().gt(scale_max).any(dim=-2)
        amax = torch.where(over, amax, est)
    y = v * _fdiv(scale_max, amax).unsqueeze(-2)
    vq = round_to(y, "fp8")
    if terms == 2:
        vq = torch.cat([vq, round_to(y - vq, "fp8")], dim=-1)
    elif terms != 1:
        raise ValueError(f"terms must be 1 or 2, got {terms}")
    return vq, _div(amax, scale_max), vm


def _fdiv(num: float, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` per element, correctly rounded as the kernels' ``__fdiv_rn`` (torch's
    ``float / tensor`` is a reciprocal and a multiply, which can differ in the last bit)."""
    return torch.full_like(den, num) / den


def _div(num: torch.Tensor, den: float) -> torch.Tensor:
    """``num / den`` per element, correctly rounded on every device: on CUDA torch computes
    ``tensor / float`` as a multiply by the float's reciprocal (one bit off now and then; on
    the CPU it divides), which put the oracle's INT8 scales, and through them P, off the
    kernels' when the tests ran it on the GPU (fuzz seed 95, case 261)."""
    return num / torch.full_like(num, den)


def mma_truncated(a: torch.Tensor, b: torch.Tensor, bits: int, k: int = 32) -> torch.Tensor:
    """``a @ b`` (``a [..., R, K]``, ``b [..., K, C]``, FP8 values) summed the way Hopper's FP8
    tensor cores (wgmma e4m3) were measured to sum it: K is taken ``k`` at a time, one
    instruction each, into an accumulator that starts at zero; an instruction aligns the
    accumulator and its ``k`` products to the exponent of the largest of them, drops every
    bit more than ``bits`` below that leading bit (toward zero) and adds the rest exactly.

    On an H100, ``bits=13`` predicted how far the sm90 kernel's LSE falls below exact sums on
    attention-sink rows (a P of 448 in a block of P values near 1: up to 0.004, on the same
    rows), and with it the kernel follows the reference to 1e-3 on every row; 12, 14 or
    dropping bits toward -inf fit worse (bench/NOTES.md, "FP8 tensor-core sums").
    DeepSeek-V3's report gives "around 14 bits" for the same hardware. Returns float64.

    Runs in fp32, exactly: the operands must be fp32-exact (FP8 values and their products
    are), and every kept term is a multiple of the unit 2**(E - bits) below 2**(E + 1), so a
    sum of ``k + 1`` of them needs ``bits + 1 + ceil(log2(k + 1))`` bits (20 for 13 and 32),
    within fp32's 24.
    """
    if bits + 1 + k.bit_length() > 24:
        raise ValueError(f"bits={bits} with k={k} would not sum exactly in fp32")
    a32, b32 = a.float(), b.float()
    acc = torch.zeros(a.shape[:-1] + (b.shape[-1],), dtype=torch.float32, device=a.device)
    # rows at a time, so that the [rows, k, C] products stay near 2**24 elements
    step = max(1, (1 << 24) // max(1, k * b.shape[-1]))
    for r0 in range(0, a.shape[-2], step):
        ar, accr = a32[..., r0 : r0 + step, :], acc[..., r0 : r0 + step, :]
        for j0 in range(0, a.shape[-1], k):
            prod = ar[..., :, j0 : j0 + k, None] * b32[..., None, j0 : j0 + k, :]  # [..., R, k, C]
            top = torch.maximum(prod.abs().amax(dim=-2), accr.abs())
            # unit of the last kept bit; fmod is exact and keeps the sign: x - fmod truncates
            unit = torch.exp2((torch.frexp(top).exponent - 1 - bits).clamp_min(-149).float())
            accr = (accr - torch.fmod(accr, unit)) + (prod - torch.fmod(prod, unit.unsqueeze(-2))).sum(dim=-2)
        acc[..., r0 : r0 + step, :] = accr
    return acc.double()


# --------------------------------------------------------------------------------------
# exact attention


def _expand_kv(x: torch.Tensor, hq: int) -> torch.Tensor:
    hk = x.shape[1]
    return x if hk == hq else x.repeat_interleave(hq // hk, dim=1)


def _row_chunks(nq: int, nk: int, heads: int, budget: int = 1 << 26):
    """Query-row ranges whose [heads, rows, nk] score block holds at most ``budget`` elements
    (rows are independent, so chunking changes nothing but peak memory)."""
    step = max(1, budget // max(1, heads * nk))
    return [(i, min(nq, i + step)) for i in range(0, nq, step)] or [(0, 0)]


def causal_mask(nq: int, nk: int, device=None) -> torch.Tensor:
    """True where query i may see key j: j <= i (top-left aligned, as torch's SDPA)."""
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return j <= i


def attention_exact(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    sm_scale: Optional[float] = None,
    return_lse: bool = False,
    dtype: torch.dtype = torch.float64,
):
    """Plain softmax attention in ``dtype`` (float64 by default). GQA, Nq != Nk, top-left causal.

    Returns the output in ``dtype`` and the given layout, and with ``return_lse`` the
    natural-log softmax denominator ``[B, Hq, Nq]``.
    """
    qh, kh, vh = (to_hnd(t, tensor_layout).to(dtype) for t in (q, k, v))
    hq = qh.shape[1]
    kh, vh = _expand_kv(kh, hq), _expand_kv(vh, hq)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    nq, nk = qh.shape[-2], kh.shape[-2]
    o = torch.empty(qh.shape[:-1] + (vh.shape[-1],), dtype=dtype, device=q.device)
    lse = torch.empty(qh.shape[:-1], dtype=dtype, device=q.device)
    for i0, i1 in _row_chunks(nq, nk, qh.shape[0] * hq):
        s = torch.matmul(qh[..., i0:i1, :], kh.transpose(-1, -2)) * scale
        if is_causal:
            s = s.masked_fill(~causal_mask(nq, nk, s.device)[i0:i1], float("-inf"))
        lse[..., i0:i1] = torch.logsumexp(s, dim=-1)
        o[..., i0:i1, :] = torch.matmul(torch.exp(s - lse[..., i0:i1].unsqueeze(-1)), vh)
    o = from_hnd(o, tensor_layout)
    return (o, lse) if return_lse else o


# --------------------------------------------------------------------------------------
# the quantized pipeline


def k_sample_index(n: int, rows: int, device=None) -> torch.Tensor:
    """The keys whose mean smooths K when ``k_mean_rows=rows``: ``min(n, rows)`` of them, key
    ``(2i + 1) n // (2 S)`` for ``i < S = min(n, rows)`` (the middle of each of S equal
    stretches), i.e. every key when ``n <= rows``."""
    s = min(n, rows)
    return ((2 * torch.arange(s, device=device) + 1) * n) // (2 * s)


_MAGIC = 12582912.0  # 1.5 * 2^23: the sm90 kernel's int32 -> fp32 offset (exact for |s| < 2^22)


def _fma32(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 fused multiply-add of fp32 values, rounded once: the product of two fp32 numbers is
    exact in float64, the sum is rounded there and then to fp32 (a second rounding that differs
    from one only when the float64 sum lies within 2^-29 of an fp32 tie)."""
    return (a.double() * b.double() + c.double()).float()


def _kernel_exponent(s_int: torch.Tensor, f: torch.Tensor, m: torch.Tensor, p_scale: float) -> torch.Tensor:
    """x with 2^x = P * p_scale as the sm90 kernel computes it (QuantConfig.kernel_exponent), as
    float64: ``s_int`` the int32 scores (float64), ``f`` the fp32 scale products of the same
    elements, ``m`` the row maxima (float64 holding fp32 values; 0 where a row has none yet)."""
    off = torch.tensor(math.log2(p_scale), dtype=torch.float32, device=f.device)
    mo = (m.float() - off).unsqueeze(-1)
    magic = torch.tensor(_MAGIC, dtype=torch.float32, device=f.device)
    e = -_fma32(magic.expand_as(f), f, mo.expand_as(f))
    b = (s_int + _MAGIC).float()  # exact
    x = _fma32(b, f, e).double()
    return torch.where(torch.isinf(s_int), torch.full_like(x, float("-inf")), x)


def quantize_qk(q_hnd, k_hnd, sm_scale: float, cfg: QuantConfig):
    """Steps 1-2 on [B, H, N, D] tensors. Returns (qq, qs, qg, kq, ks, kg, km)."""
    k32 = k_hnd.float()
    km = None
    if cfg.smooth_k:
        rows = k32 if cfg.k_mean_rows is None else k32[..., k_sample_index(k32.shape[-2], cfg.k_mean_rows, k32.device), :]
        km = chain_mean(rows, cfg.mean_chains)  # [B, Hkv, D]
        k32 = k32 - km.unsqueeze(-2)
    # the kernels receive sm_scale * log2(e) as an fp32 scalar: round it the same way
    q32 = q_hnd.float() * torch.tensor(sm_scale * LOG2E, dtype=torch.float32, device=q_hnd.device)
    qg, nqg = int8_groups(q_hnd.shape[-2], "q", cfg, q_hnd.device)
    kg, nkg = int8_groups(k_hnd.shape[-2], "k", cfg, k_hnd.device)
    qq, qs = quantize_int8(q32, qg, nqg)
    kq, ks = quantize_int8(k32, kg, nkg)
    return qq, qs, qg, kq, ks, kg, km


def attention_quantized(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    sm_scale: Optional[float] = None,
    return_lse: bool = False,
    cfg: QuantConfig = QuantConfig(),
):
    """The quantized attention of the kernels, in torch. Output in q's dtype and layout.

    fp16/bf16/fp8 rounding is modelled exactly; everything else runs in float64 so that
    the only differences from exact attention are the quantization steps.
    """
    qh, kh, vh = (to_hnd(t, tensor_layout) for t in (q, k, v))
    B, hq, nq, d = qh.shape
    nk = kh.shape[2]
    scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    f64 = torch.float64

    qq, qs, qg, kq, ks, kg, km = quantize_qk(qh, kh, scale, cfg)
    # dequantization factors per token (fp32 as in the kernels)
    q_tok = qs[..., qg]  # [B, hq, nq]
    k_tok = ks[..., kg]  # [B, hk, nk]

    # V operand
    vm = v_scale = None
    if cfg.pv == "fp8":
        vop, v_scale, vm = quantize_v_fp8(vh, cfg.v_scale_max, cfg.smooth_v, cfg.v_amax_rows, cfg.v_amax_margin,
                                          cfg.v_terms, cfg.mean_chains)
    else:
        v32 = vh.float()
        if cfg.smooth_v:
            vm = v32.mean(dim=-2)
            v32 = v32 - vm.unsqueeze(-2)
        vop = round_to(v32, cfg.pv)
    # broadcast KV heads to Q heads (GQA) after quantization: groups are per KV head
    kq, k_tok, vop = (_expand_kv(t, hq) for t in (kq, k_tok, vop))
    if v_scale is not None:
        v_scale = _expand_kv(v_scale, hq)
    if vm is not None:
        vm = _expand_kv(vm, hq)

    m = torch.full((B, hq, nq), float("-inf"), dtype=f64, device=q.device)
    l = torch.zeros((B, hq, nq), dtype=f64, device=q.device)
    acc = torch.zeros((B, hq, nq, d), dtype=f64, device=q.device)
    block_acc = {"fp16+fp32": "fp16", "fp32+fp16": "fp16"}.get(cfg.pv_accum)
    for i0, i1 in _row_chunks(nq, nk, B * hq):
        s_int = torch.matmul(qq[..., i0:i1, :].to(f64), kq.to(f64).transpose(-1, -2))  # exact integers
        if cfg.kernel_exponent:  # s * (q scale * k scale), each product rounded to fp32
            f = q_tok[..., i0:i1].unsqueeze(-1) * k_tok.unsqueeze(-2)
            s = (s_int.float() * f).to(f64)
        else:  # scaling in fp32, as the kernels do (int32 -> fp32, times fp32 scales)
            s = (s_int.float() * q_tok[..., i0:i1].unsqueeze(-1) * k_tok.unsqueeze(-2)).to(f64)
            del s_int
        if is_causal:
            hidden = ~causal_mask(nq, nk, s.device)[i0:i1]
            s = s.masked_fill(hidden, float("-inf"))
            if cfg.kernel_exponent:
                s_int = s_int.masked_fill(hidden, float("-inf"))
        mc, lc, ac = m[..., i0:i1], l[..., i0:i1], acc[..., i0:i1, :]
        for j0 in range(0, nk, cfg.block_n):
            sb = s[..., j0 : j0 + cfg.block_n]
            m_new = torch.maximum(mc, sb.amax(dim=-1))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp2(mc - m_safe)
            if cfg.kernel_exponent:
                p = _div(_kernel_exponent(s_int[..., j0:j0 + cfg.block_n], f[..., j0:j0 + cfg.block_n], m_safe,
                                          cfg.p_scale).exp2(), cfg.p_scale)
            else:
                p = torch.exp2(sb - m_safe.unsqueeze(-1))  # in [0, 1]
            if cfg.pv == "fp8":
                ps = round_to(p * cfg.p_scale, "fp8")  # the e4m3 operand, P scaled into range
                pr = _div(ps, cfg.p_scale)
            else:
                pr = round_to(p, cfg.pv)
            vb = vop[..., j0 : j0 + cfg.block_n, :].to(f64)
            if cfg.mma_bits is None:
                blk = torch.matmul(pr, vb if cfg.v_terms == 1 else vb[..., :d] + vb[..., d:])
                lb = (pr if cfg.l_from_pv else p).sum(dim=-1)
            else:
                # the product-sum of the e4m3 operands themselves (P scaled by p_scale): the
                # truncation depends on their exponents; the l column multiplies P by ones.
                # Two V terms: P times the first (with the ones), then times the second (with a
                # zero column), as further steps of the same accumulator
                ones = torch.ones(vb.shape[:-1] + (1,), dtype=f64, device=vb.device)
                if cfg.v_terms == 1:
                    a_op, b_op = ps, torch.cat([vb, ones], dim=-1)
                else:
                    # (a partial last block padded with zero keys to whole instructions, as the
                    # kernel's zero-filled tile, so that no instruction mixes the two terms)
                    pad = -ps.shape[-1] % cfg.mma_k
                    psp = torch.nn.functional.pad(ps, (0, pad))
                    hi = torch.nn.functional.pad(torch.cat([vb[..., :d], ones], dim=-1), (0, 0, 0, pad))
                    lo = torch.nn.functional.pad(torch.cat([vb[..., d:], torch.zeros_like(ones)], dim=-1), (0, 0, 0, pad))
                    a_op, b_op = torch.cat([psp, psp], dim=-1), torch.cat([hi, lo], dim=-2)
                both = mma_truncated(a_op, b_op, cfg.mma_bits, cfg.mma_k)
                blk, lpv = _div(both[..., :-1], cfg.p_scale), _div(both[..., -1], cfg.p_scale)
                lb = lpv if cfg.l_from_pv else p.sum(dim=-1)
            lc = lc * alpha + lb
            if block_acc is not None:
                # per-block accumulator of limited range: the kernel sums p_scaled * v there
                scaled = blk * (cfg.p_scale if cfg.pv == "fp8" else 1.0)
                blk = _div(round_to(scaled, block_acc), cfg.p_scale if cfg.pv == "fp8" else 1.0)
            ac = ac * alpha.unsqueeze(-1) + blk
            mc = m_new
        m[..., i0:i1], l[..., i0:i1], acc[..., i0:i1, :] = mc, lc, ac
    l_safe = torch.where(l == 0, torch.ones_like(l), l)
    o = acc / l_safe.unsqueeze(-1)
    if v_scale is not None:
        o = o * v_scale.unsqueeze(-2).to(f64)
    if vm is not None:
        o = o + vm.unsqueeze(-2).to(f64)
    o = from_hnd(o.to(q.dtype), tensor_layout)
    if not return_lse:
        return o
    lse = (m + torch.log2(l)) * LN2  # natural log of sum exp(S * sm_scale) w.r.t. smoothed K
    if km is not None:
        qkm = torch.matmul(qh.to(f64), _expand_kv(km, hq).to(f64).unsqueeze(-1)).squeeze(-1)
        lse = lse + scale * qkm
    return o, lse.float()


# --------------------------------------------------------------------------------------
# metrics


def error_metrics(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """cosine similarity, relative L1 and RMSE of ``out`` against ``ref`` (flattened, fp64)."""
    a = out.detach().to(torch.float64).flatten()
    b = ref.detach().to(torch.float64).flatten()
    denom = torch.sqrt((a * a).sum() * (b * b).sum())
    cos = float((a * b).sum() / denom) if float(denom) > 0 else float(torch.equal(a, b))
    l1 = float((a - b).abs().sum())
    ref_l1 = float(b.abs().sum())
    return {
        "cos": cos,
        "rel_l1": l1 / ref_l1 if ref_l1 > 0 else (0.0 if l1 == 0 else math.inf),
        "rmse": float(torch.sqrt(((a - b) ** 2).mean())) if a.numel() else 0.0,
        "max_abs": float((a - b).abs().max()) if a.numel() else 0.0,
        "finite": bool(torch.isfinite(a).all()),
    }
