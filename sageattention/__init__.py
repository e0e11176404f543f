"""sageattention: quantized attention (INT8 QK^T, FP16/FP8 PV) for PyTorch inference.

Replace ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=...)`` with
``sageattn(q, k, v, is_causal=...)``. See README.md.
"""

from ._ops import KernelUnavailableError
from .core import (
    sageattn,
    sageattn_qk_int8_pv_fp16_cuda,
    sageattn_qk_int8_pv_fp16_triton,
    sageattn_qk_int8_pv_fp8_cuda,
    sageattn_qk_int8_pv_fp8_cuda_sm90,
    sageattn_varlen,
)
from .dispatch import UnsupportedGPUError, available_backends

__version__ = "2.2.0"

__all__ = [
    "sageattn",
    "sageattn_varlen",
    "sageattn_qk_int8_pv_fp16_triton",
    "sageattn_qk_int8_pv_fp16_cuda",
    "sageattn_qk_int8_pv_fp8_cuda",
    "sageattn_qk_int8_pv_fp8_cuda_sm90",
    "available_backends",
    "KernelUnavailableError",
    "UnsupportedGPUError",
]
