"""``sageattn3_blackwell``: the public entry point, with upstream SageAttention3's name and
arguments (``sageattn3_blackwell(q, k, v, attn_mask=None, is_causal=False,
per_block_mean=True)``) and stricter behaviour:

- the caller's tensors are never modified (upstream subtracts K's mean from ``k`` in place);
- every keyword is honoured or refused: ``attn_mask`` (which upstream ignores) raises, and
  unknown keywords raise ``TypeError``; SDPA's ``scale``/``enable_gqa``/``dropout_p=0`` and our
  ``sm_scale``, ``tensor_layout`` and ``return_lse`` are accepted;
- GQA (fewer K/V heads) and any head dim up to 128 (zero-padded to 64 or 128) work;
- a GPU that is not Blackwell (sm_100, sm_120, sm_121), a CPU tensor or a build without the
  kernels gets an error saying so and what to use instead.
"""

from __future__ import annotations

import math

import torch

from sageattention import _checks
from sageattention._inference import inference_only

from . import _kernels

FN = "sageattn3_blackwell"
MAX_HEAD_DIM = 128
SUPPORTED = "sm_100 (B200/GB200) and sm_120/sm_121 (RTX 50-series, RTX PRO 6000 Blackwell, DGX Spark)"


class UnsupportedDeviceError(RuntimeError):
    """The FP4 kernels need a Blackwell GPU."""


@inference_only
def sageattn3_blackwell(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask=None, is_causal: bool = False,
                        per_block_mean: bool = True, **kwargs):
    """FP4 microscaling attention on Blackwell GPUs.

    Args:
        q, k, v: ``[B, H, N, D]`` (or ``[B, N, H, D]`` with ``tensor_layout="NHD"``), float16 or
            bfloat16, on one CUDA device; K/V may have fewer heads than Q (GQA); D <= 128.
        attn_mask: must be None (no arbitrary masks; use ``is_causal``).
        is_causal: top-left aligned causal mask, as in SDPA.
        per_block_mean: smooth Q by the mean of each 128-row block (True) or by one mean over
            all rows (False); the smoothing is corrected exactly either way.
        sm_scale (or SDPA's ``scale``): softmax scale, default ``D ** -0.5``.
        tensor_layout: ``"HND"`` (default) or ``"NHD"``.
        return_lse: also return the natural-log LSE ``[B, H, Nq]`` (fp32).

    Returns ``o`` in q's dtype and layout, or ``(o, lse)``.
    """
    sm_scale = kwargs.pop("sm_scale", None)
    tensor_layout = kwargs.pop("tensor_layout", "HND")
    return_lse = kwargs.pop("return_lse", False)
    sdpa = _checks.parse_kwargs(FN, kwargs, _checks.check_scale(FN, "sm_scale", sm_scale))
    _checks.refuse_mask(FN, attn_mask)
    _checks.refuse_mask(FN, sdpa.attn_mask)
    _checks.check_bool(FN, "is_causal", is_causal)
    _checks.check_bool(FN, "per_block_mean", per_block_mean)
    _checks.check_bool(FN, "return_lse", return_lse)
    layout = _checks.check_layout(FN, tensor_layout)
    dims = _checks.check_qkv(FN, q, k, v, layout, sdpa.enable_gqa)
    if dims.head_dim > MAX_HEAD_DIM:
        raise ValueError(
            f"{FN}: head dim must be at most {MAX_HEAD_DIM} (the FP4 kernels handle 64 and 128, smaller "
            f"ones zero-padded), got {dims.head_dim}; use sageattention.sageattn for head dims up to 256"
        )
    scale = sm_scale if sm_scale is not None else sdpa.scale
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(dims.head_dim)
    module = _attention_module(q)
    if dims.batch == 0 or dims.heads_q == 0 or dims.len_q == 0:
        o = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        lse_shape = (dims.batch, dims.heads_q, dims.len_q)
        return (o, q.new_empty(lse_shape, dtype=torch.float32)) if return_lse else o
    return _kernels.forward(module, q, k, v, is_causal, per_block_mean, scale, layout == "NHD", return_lse)


def _attention_module(q: torch.Tensor) -> str:
    """The extension holding the attention kernel for q's GPU, or a clear error."""
    if q.device.type != "cuda":
        raise UnsupportedDeviceError(
            f"{FN}: q is on {q.device}; the FP4 kernels run on Blackwell GPUs ({SUPPORTED}). "
            "sageattention3_blackwell.emulation.attention(q, k, v, ...) computes the same FP4 scheme "
            "in plain torch (slow, any device)"
        )
    cap = torch.cuda.get_device_capability(q.device)
    module = _kernels.attention_module(cap)
    if module is None:
        raise UnsupportedDeviceError(
            f"{FN}: {torch.cuda.get_device_name(q.device)} has compute capability {cap[0]}.{cap[1]}; "
            f"the FP4 kernels need Blackwell: {SUPPORTED}. On this GPU use sageattention.sageattn "
            "(INT8/FP8 kernels), or sageattention3_blackwell.emulation.attention for the FP4 scheme in plain torch"
        )
    for m in (_kernels.QUANT, module):
        ok, why = _kernels.available(m)
        if not ok:
            from sageattention import KernelUnavailableError

            raise KernelUnavailableError(
                f"{FN} is not available: {why}. The FP4 kernels are built into the wheel when its CUDA is "
                "12.8 or newer and its archs include 10.0 or 12.0 (README: which wheel)"
            )
    return module
