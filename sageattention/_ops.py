"""Loading of the compiled CUDA kernel modules (built by setup.py; optional).

A module that is absent means "not in this build"; one that exists but fails to load is
reported with the loader's message, which usually means it was built for another torch.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Tuple

import torch


@torch.compiler.assume_constant_result
def status(module: str) -> Tuple[bool, str]:
    """``(True, "")`` if ``module`` imports, else ``(False, reason)``. A constant for
    torch.compile (dynamo cannot trace the import machinery behind it)."""
    return _status(module)


@functools.lru_cache(maxsize=None)
def _status(module: str) -> Tuple[bool, str]:
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return False, f"{module} is not in this build (the CUDA kernels were not compiled)"
    try:
        importlib.import_module(module)
    except (ImportError, OSError) as exc:
        return False, (
            f"{module} is present but failed to load: {exc}. It was probably built for another "
            f"torch than the installed {torch.__version__}; reinstall the wheel that matches it"
        )
    return True, ""


class KernelUnavailableError(RuntimeError):
    """A kernel function was called whose compiled module is not in this build."""


def require(function: str, module: str) -> None:
    ok, why = status(module)
    if not ok:
        raise KernelUnavailableError(
            f"{function} is not available: {why}. Use sageattn(q, k, v, ...), which picks the "
            "fastest kernel present on this GPU (the Triton kernel in this build), or "
            "sageattn_qk_int8_pv_fp16_triton(...) directly"
        )
