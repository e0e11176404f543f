"""Triton backend: K mean, fused INT8 quantization of Q and K, then the attention kernel.

Three launches per call: the K mean (torch), one quantization kernel for Q and K, one
attention kernel. Arguments are validated by the caller (:mod:`sageattention.core`).
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch

from .attn import AttnConfig, attn_int8, block_d_for, choose_config
from .quant import QuantQK, Varlen, packed_k_mean, packed_offsets, quant_qk_int8

__all__ = ["AttnConfig", "choose_config", "block_d_for", "quantize", "forward", "forward_varlen", "config_for"]


@functools.lru_cache(maxsize=None)
def _device_limits(index: int):
    cap = torch.cuda.get_device_capability(index)
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", None)
    return cap, smem


def config_for(head_dim: int, dtype: torch.dtype, device: torch.device, n_k: Optional[int] = None,
               packed: bool = False) -> AttnConfig:
    """The configuration :func:`forward` (``packed``: :func:`forward_varlen`) uses for these
    inputs on ``device`` (``n_k``: keys per sequence, the longest one for varlen)."""
    if device.type == "cuda":
        cap, smem = _device_limits(device.index if device.index is not None else torch.cuda.current_device())
        return choose_config(head_dim, dtype, cap, smem, n_k, packed)
    return choose_config(head_dim, dtype, n_k=n_k, packed=packed)  # Triton interpreter (tests on the CPU)


def quantize(q4, k4, km, sm_scale: float, cfg: AttnConfig, lse_corr: bool = False,
             varlen: Optional[Varlen] = None) -> QuantQK:
    """INT8 Q/K with the block sizes and scale granularity of the launch ``cfg``."""
    return quant_qk_int8(
        q4, k4, km, sm_scale,
        block_q=cfg.block_m, block_k=cfg.block_n, block_d=cfg.block_d,
        q_per_token=cfg.q_per_token, k_per_token=cfg.k_per_token,
        lse_corr=lse_corr, varlen=varlen,
    )


def forward(
    q4: torch.Tensor,
    k4: torch.Tensor,
    v4: torch.Tensor,
    o4: torch.Tensor,
    *,
    is_causal: bool,
    sm_scale: float,
    smooth_k: bool,
    return_lse: bool,
    config: Optional[AttnConfig] = None,
) -> Optional[torch.Tensor]:
    """Attention of [B, H, N, D] views into ``o4`` (a [B, Hq, Nq, D] view of the output).

    Returns the LSE [B, Hq, Nq] (fp32, natural log) when ``return_lse``.
    """
    B, h_q, n_q, D = q4.shape
    n_k = k4.shape[2]
    cfg = config or config_for(D, q4.dtype, q4.device, n_k)
    km = k4.mean(dim=2, dtype=torch.float32) if smooth_k else None
    qq = quantize(q4, k4, km, sm_scale, cfg, lse_corr=return_lse and smooth_k)
    lse = torch.empty((B, h_q, n_q), dtype=torch.float32, device=q4.device) if return_lse else None
    attn_int8(qq, v4, o4, lse, cfg, n_q=n_q, n_k=n_k, is_causal=is_causal)
    return lse


def forward_varlen(
    q3: torch.Tensor,
    k3: torch.Tensor,
    v3: torch.Tensor,
    o3: torch.Tensor,
    lens_q: Sequence[int],
    lens_k: Sequence[int],
    *,
    is_causal: bool,
    sm_scale: float,
    smooth_k: bool,
    return_lse: bool,
    config: Optional[AttnConfig] = None,
) -> Optional[torch.Tensor]:
    """Attention of packed [total, H, D] sequences of lengths ``lens_q``/``lens_k`` (host
    lists, validated by the caller); K is smoothed per sequence.

    Returns the LSE [Hq, total_q] when ``return_lse``.
    """
    total_q, h_q, D = q3.shape
    cfg = config or config_for(D, q3.dtype, q3.device, max(lens_k), packed=True)
    vl = packed_offsets(lens_q, lens_k, cfg.block_m, cfg.block_n, q3.device)
    q4, k4, v4, o4 = (t.unsqueeze(0).transpose(1, 2) for t in (q3, k3, v3, o3))
    km = packed_k_mean(k3, vl.cu_k, vl.max_k) if smooth_k else None
    qq = quantize(q4, k4, km, sm_scale, cfg, lse_corr=return_lse and smooth_k, varlen=vl)
    lse = torch.empty((h_q, total_q), dtype=torch.float32, device=q3.device) if return_lse else None
    attn_int8(qq, v4, o4, lse, cfg, n_q=vl.max_q, n_k=vl.max_k, is_causal=is_causal, varlen=vl)
    return lse


__all__ += ["QuantQK", "Varlen"]
