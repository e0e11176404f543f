"""Pure-torch model of the FP4 attention scheme: the oracle of the Blackwell kernels and a slow
fallback that runs anywhere (CPU included).

The number format and the math are specified in csrc/kernels/fp4.h; this module follows it
step by step, with the same tiles (128 query rows, 128-key softmax tiles), so the kernels can
be compared against it closely:

- every operand element is ``e2m1 * e4m3 * gscale``: an E2M1 value, one E4M3 scale per 16
  elements along the GEMM's reduction axis (the head dim for Q and K, the tokens for V) and
  an fp32 scale per row (Q, K) or per channel (V);
- K is smoothed by its mean over tokens (softmax ignores a per-row constant, so this is
  exact), Q by the mean of each 128-row block, whose contribution ``mean_q . k`` is added back
  exactly (``delta``);
- P is quantized in two levels: the running row maximum maps to 6 * 448, then one E4M3 scale
  per 16 keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

BLOCK_Q = 128  # kFp4BlockQ
BLOCK_K = 128  # kFp4BlockK
GROUP = 16  # elements per E4M3 scale
E2M1_MAX = 6.0
E4M3_MAX = 448.0
P_MAX = E2M1_MAX * E4M3_MAX  # 2688
LOG2E = 1.4426950408889634
# fp32 constants of the format; they multiply (fp4.h): torch's CUDA division by a Python
# scalar is a multiplication by its reciprocal, so a division here would not match the kernels
INV_P_MAX = torch.tensor(1.0 / P_MAX, dtype=torch.float32).item()
INV_E2M1_MAX = torch.tensor(1.0 / E2M1_MAX, dtype=torch.float32).item()

# E2M1 magnitudes by code; the tie points between neighbours and which side each tie takes
# (round to nearest even code): 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_TIES = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_code(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, sign in bit 3) of fp32 ``x``: round to nearest even, saturating at 6."""
    a = x.abs()
    code = torch.zeros_like(x, dtype=torch.uint8)
    for tie, tie_goes_up in _TIES:
        code += (a >= tie if tie_goes_up else a > tie).to(torch.uint8)
    return code | ((x < 0).to(torch.uint8) << 3)


def e2m1_value(code: torch.Tensor) -> torch.Tensor:
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=code.device)
    mag = table[(code & 7).long()]
    return torch.where((code & 8) != 0, -mag, mag)


def e4m3_round_up(t: torch.Tensor) -> torch.Tensor:
    """The smallest E4M3 (fn) value >= min(t, 448), for t >= 0 (fp32, exact)."""
    t = t.clamp(max=E4M3_MAX)
    _, e = torch.frexp(t)  # t = f * 2^e, f in [0.5, 1)
    step = torch.ldexp(torch.ones_like(t), (e - 4).clamp(min=-9).to(torch.int32))
    out = (torch.ceil(t / step) * step).clamp(max=E4M3_MAX)
    return torch.where(t > 0, out, torch.zeros_like(t))


@dataclass
class Fp4Tensor:
    """An operand quantized along its last dim: codes [..., n], scales [..., n/16], gscale [...]."""

    codes: torch.Tensor  # uint8, one code per element
    scale: torch.Tensor  # fp32 holding E4M3 values
    gscale: torch.Tensor  # fp32

    def dequantize(self) -> torch.Tensor:
        vals = e2m1_value(self.codes)
        sc = self.scale.repeat_interleave(GROUP, dim=-1)
        return vals * sc * self.gscale.unsqueeze(-1)

    def packed(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """The kernels' bytes: two codes per byte (even element low), E4M3 scale bytes."""
        c = self.codes
        return (c[..., 0::2] | (c[..., 1::2] << 4)).contiguous(), \
            self.scale.to(torch.float8_e4m3fn).view(torch.uint8).contiguous()


def _f32(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def quantize(x: torch.Tensor, gscale: Optional[torch.Tensor] = None) -> Fp4Tensor:
    """Quantize fp32 ``x`` along its last dim (a multiple of 16). ``gscale`` (one per row) is
    amax(row) * (1/2688) unless given (P uses 1)."""
    if x.shape[-1] % GROUP:
        raise ValueError(f"quantize: last dim must be a multiple of {GROUP}, got {x.shape[-1]}")
    x = x.float()
    if gscale is None:
        amax = x.abs().amax(dim=-1)
        gscale = torch.where(amax > 0, amax * _f32(INV_P_MAX, x), torch.ones_like(amax))
    groups = x.unflatten(-1, (-1, GROUP))
    t = (groups.abs().amax(dim=-1) / gscale.unsqueeze(-1)) * _f32(INV_E2M1_MAX, x)
    scale = e4m3_round_up(t)
    denom = (scale * gscale.unsqueeze(-1)).unsqueeze(-1)
    r = torch.where(denom > 0, groups / denom, torch.zeros_like(groups))
    return Fp4Tensor(e2m1_code(r).flatten(-2), scale, gscale)


def smoothing_means(q: torch.Tensor, k: torch.Tensor, per_block_mean: bool):
    """fp32 (q_mean [B, H, nblocks, D], rows per mean, k_mean [B, Hkv, 1, D]) of [B, H, N, D]
    inputs: Q's mean per 128-row block (or over all rows), K's over all tokens."""
    nq = q.shape[2]
    k_mean = k.float().mean(dim=2, keepdim=True)
    if not per_block_mean:
        return q.float().mean(dim=2, keepdim=True), None, k_mean
    nb = -(-nq // BLOCK_Q)
    qf = torch.nn.functional.pad(q.float(), (0, 0, 0, nb * BLOCK_Q - nq)).unflatten(2, (nb, BLOCK_Q))
    counts = torch.full((nb,), float(BLOCK_Q), device=q.device)
    counts[-1] = nq - (nb - 1) * BLOCK_Q
    return qf.sum(dim=3) / counts.view(1, 1, nb, 1), BLOCK_Q, k_mean


def smoothing_delta(q_mean: torch.Tensor, k: torch.Tensor, k_mean: torch.Tensor, n_pad: int,
                    chunk: int = 8192) -> torch.Tensor:
    """The exact correction of Q smoothing, fp32 ``q_mean . (k_j - k_mean)`` for every block mean
    and key: ``[B, H, nblocks, n_pad]`` (zero for keys >= N). Keys go in chunks, so no fp32 copy
    of all of K is made."""
    b, h, nb, d = q_mean.shape
    hkv, nk = k.shape[1], k.shape[2]
    qm = q_mean.reshape(b, hkv, (h // hkv) * nb, d)  # GQA: the query heads of one K head together
    out = q_mean.new_zeros((b, hkv, (h // hkv) * nb, n_pad))
    for j0 in range(0, nk, chunk):
        j1 = min(j0 + chunk, nk)
        out[..., j0:j1] = qm @ (k[:, :, j0:j1].float() - k_mean).transpose(2, 3)
    return out.view(b, h, nb, n_pad)


def lse_correction(q: torch.Tensor, k_mean: torch.Tensor, sm_scale: float) -> torch.Tensor:
    """What K smoothing removed from each row's LSE: ``sm_scale * q_i . k_mean`` (fp32,
    ``[B, H, Nq]``). Softmax ignores it, the LSE does not."""
    b, h, nq, d = q.shape
    hkv = k_mean.shape[1]
    qg = q.float().reshape(b, hkv, (h // hkv) * nq, d)
    return (qg @ k_mean.transpose(2, 3)).view(b, h, nq) * sm_scale


def _expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    return t.repeat_interleave(heads // t.shape[1], dim=1) if t.shape[1] != heads else t


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
              per_block_mean: bool = True, sm_scale: Optional[float] = None,
              tensor_layout: str = "HND", return_lse: bool = False):
    """FP4 attention computed as the kernels do, in plain torch on any device (slow: fp32, one
    128-key tile at a time). ``[B, H, N, D]`` tensors, or ``[B, N, H, D]`` with
    ``tensor_layout="NHD"``; K/V may have fewer heads (GQA). Returns the output in q's dtype
    and layout, and the natural-log LSE ``[B, H, Nq]`` (fp32) if ``return_lse``."""
    if tensor_layout not in ("HND", "NHD"):
        raise ValueError(f"attention: tensor_layout must be 'HND' or 'NHD', got {tensor_layout!r}")
    if tensor_layout == "NHD":
        res = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal, per_block_mean,
                        sm_scale, "HND", return_lse)
        return (res[0].transpose(1, 2), res[1]) if return_lse else res.transpose(1, 2)
    B, H, nq, D = q.shape
    nk = k.shape[2]
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D)
    c = scale * LOG2E
    d_pad = -(-D // 64) * 64
    pad_d = (0, d_pad - D)

    q_mean, rows, k_mean = smoothing_means(q, k, per_block_mean)
    ks = k.float() - k_mean
    row_block = torch.arange(nq, device=q.device) // rows if rows else torch.zeros(nq, dtype=torch.long, device=q.device)
    qs = q.float() - q_mean[:, :, row_block]
    qhat = quantize(torch.nn.functional.pad(qs, pad_d)).dequantize()
    khat = _expand_kv(quantize(torch.nn.functional.pad(ks, pad_d)).dequantize(), H)
    # V: quantized along tokens (the PV reduction axis), one fp32 scale per channel
    nk_pad = -(-nk // BLOCK_K) * BLOCK_K
    vt = torch.nn.functional.pad(v.float(), pad_d + (0, nk_pad - nk)).transpose(2, 3)
    vq = quantize(vt)  # rows of V^T are channels: one fp32 scale per channel over all tokens
    gv = _expand_kv(vq.gscale, H)
    vhat = _expand_kv(Fp4Tensor(vq.codes, vq.scale, torch.ones_like(vq.gscale)).dequantize().transpose(2, 3), H)
    delta = smoothing_delta(q_mean, k, k_mean, nk)  # [B, H, nblocks, nk]

    o = torch.zeros(B, H, nq, d_pad, dtype=torch.float32, device=q.device)
    m = torch.full((B, H, nq, 1), -math.inf, device=q.device)
    l = torch.zeros(B, H, nq, 1, device=q.device)
    rows_i = torch.arange(nq, device=q.device).view(nq, 1)
    for j0 in range(0, nk, BLOCK_K):
        j1 = min(j0 + BLOCK_K, nk)
        s = qhat @ khat[:, :, j0:j1].transpose(2, 3)
        t = (s + delta[:, :, row_block, j0:j1]) * c
        if is_causal:
            t = t.masked_fill(torch.arange(j0, j1, device=q.device).view(1, -1) > rows_i, -math.inf)
        m_new = torch.maximum(m, t.amax(dim=-1, keepdim=True))
        m_use = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp2(m - m_use)  # 0 while m is still -inf
        p = torch.exp2(t - m_use)
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        width = j1 - j0
        p_pad = torch.nn.functional.pad(p * P_MAX, (0, -(-width // GROUP) * GROUP - width))
        phat = quantize(p_pad, gscale=torch.ones(p_pad.shape[:-1], device=q.device)).dequantize()[..., :width]
        o = o * alpha + phat @ vhat[:, :, j0:j1]
        m = m_new
    out = torch.where(l > 0, o * gv.unsqueeze(2) / (P_MAX * l), torch.zeros_like(o))[..., :D].to(q.dtype)
    if not return_lse:
        return out
    m_fin = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    lse = torch.where(l > 0, (m_fin + torch.log2(l)) * math.log(2.0), torch.full_like(l, -math.inf))
    return out, lse.squeeze(-1) + lse_correction(q, k_mean, scale)
