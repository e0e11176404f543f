"""sageattention: quantized attention (INT8 QK^T, FP16/FP8 PV) for PyTorch inference.

Replace ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=...)`` with
``sageattn(q, k, v, is_causal=...)``. See README.md.
"""

from . import _build

_build.check()  # a wheel built for another torch: say which wheel to get, before any kernel loads

from ._ops import KernelUnavailableError  # noqa: E402
from .core import (  # noqa: E402
    sageattn,
    sageattn_qk_int8_pv_fp16_cuda,
    sageattn_qk_int8_pv_fp16_triton,
    sageattn_qk_int8_pv_fp8_cuda,
    sageattn_qk_int8_pv_fp8_cuda_sm90,
    sageattn_varlen,
)
from .dispatch import UnsupportedGPUError, available_backends  # noqa: E402

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
