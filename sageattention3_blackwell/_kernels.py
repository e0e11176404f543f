"""The compiled FP4 pipeline: smoothing means and the Q-smoothing correction (torch), FP4
quantization of Q, K and V (``_fp4_quant``, every arch), then the attention kernel of the GPU's
arch (``_fp4_sm100`` for B200-class sm_100, ``_fp4_sm120`` for RTX 50-class sm_120/121).

Each step is a torch custom op; their fake implementations are registered here so
torch.compile can trace the pipeline.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from sageattention._ops import ops, register_family, status

from .emulation import BLOCK_K, BLOCK_Q, GROUP, lse_correction, smoothing_delta, smoothing_means

QUANT = "sageattention3_blackwell._fp4_quant"
SM100 = "sageattention3_blackwell._fp4_sm100"
SM120 = "sageattention3_blackwell._fp4_sm120"
NAMESPACES = {QUANT: "sageattn3_fp4", SM100: "sageattn3_sm100", SM120: "sageattn3_sm120"}
#: compute capability -> the extension with its attention kernel
ATTENTION = {(10, 0): SM100, (12, 0): SM120, (12, 1): SM120}


def _ceil(a: int, b: int) -> int:
    return -(-a // b) * b


def padded_head_dim(d: int) -> int:
    return 64 if d <= 64 else 128


@torch.compiler.assume_constant_result
def available(module: str) -> Tuple[bool, str]:
    return status(module)


def _register_fakes(ns: str) -> None:
    lib = getattr(torch.ops, ns)
    if hasattr(lib, "quant_fp4"):

        def quant_fp4(x, mean, mean_rows, n_pad, d_pad, transpose):
            b, h = x.shape[:2]
            rows, cols = (d_pad, n_pad) if transpose else (n_pad, d_pad)
            return (x.new_empty((b, h, rows, cols // 2), dtype=torch.uint8),
                    x.new_empty((b, h, rows, cols // GROUP), dtype=torch.uint8),
                    x.new_empty((b, h, rows), dtype=torch.float32))

        torch.library.register_fake(f"{ns}::quant_fp4", quant_fp4)
    if hasattr(lib, "attn"):

        def attn(q, k, v, sq, sk, sv, gq, gk, gv, delta, nq, nk, d_out, causal, nhd, return_lse, sm_scale, out_dtype):
            b, h = q.shape[:2]
            o = q.new_empty((b, nq, h, d_out) if nhd else (b, h, nq, d_out), dtype=out_dtype)
            return o, q.new_empty((b, h, nq) if return_lse else (0, 0, 0), dtype=torch.float32)

        torch.library.register_fake(f"{ns}::attn", attn)


for _module, _ns in NAMESPACES.items():
    register_family(_module, _ns, _register_fakes)


def quantize_qkv(q, k, v, per_block_mean: bool):
    """HND q, k, v -> the kernel operands (q, sq, gq), (k, sk, gk), (v, sv, gv), the Q-smoothing
    correction delta and K's mean. Runs the ``_fp4_quant`` kernels (any GPU)."""
    op = ops(QUANT)
    nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
    dp = padded_head_dim(d)
    nq_pad, nk_pad = _ceil(nq, BLOCK_Q), _ceil(nk, BLOCK_K)
    q_mean, rows, k_mean = smoothing_means(q, k, per_block_mean)
    qq = op.quant_fp4(q, q_mean.contiguous(), rows or nq_pad, nq_pad, dp, False)
    kq = op.quant_fp4(k, k_mean.contiguous(), nk_pad, nk_pad, dp, False)
    vq = op.quant_fp4(v, None, 1, nk_pad, dp, True)
    delta = smoothing_delta(q_mean, k, k_mean, nk_pad)
    if not per_block_mean:  # one mean for all rows: the same correction for every block
        delta = delta.expand(-1, -1, nq_pad // BLOCK_Q, -1).contiguous()
    return qq, kq, vq, delta, k_mean


def forward(module: str, q, k, v, is_causal: bool, per_block_mean: bool, sm_scale: float, nhd: bool,
            return_lse: bool):
    """The FP4 pipeline on validated inputs (``nhd``: [B, N, H, D]); ``o`` or ``(o, lse)``."""
    qh, kh, vh = (t.transpose(1, 2) if nhd else t for t in (q, k, v))
    (qc, sq, gq), (kc, sk, gk), (vc, sv, gv), delta, k_mean = quantize_qkv(qh, kh, vh, per_block_mean)
    o, lse = ops(module).attn(qc, kc, vc, sq, sk, sv, gq, gk, gv, delta, qh.shape[2], kh.shape[2], q.shape[3],
                              is_causal, nhd, return_lse, sm_scale, q.dtype)
    return (o, lse + lse_correction(qh, k_mean, sm_scale)) if return_lse else o


def attention_module(capability: Tuple[int, int]) -> Optional[str]:
    return ATTENTION.get(tuple(capability))
