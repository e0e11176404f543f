"""Loading of the compiled CUDA kernel modules (built by setup.py; optional).

A module that is absent means "not in this build"; one that exists but fails to load is
reported with the loader's message, which usually means it was built for another torch.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Callable, Dict, Tuple

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


# module -> (its torch op namespace, the function registering that namespace's fake impls)
_FAMILIES: Dict[str, Tuple[str, Callable[[str], None]]] = {}


def register_family(module: str, namespace: str, register_fakes: Callable[[str], None]) -> None:
    """Declare a compiled module, the op namespace it registers and its fake implementations."""
    _FAMILIES[module] = (namespace, register_fakes)


@torch.compiler.assume_constant_result
def load(module: str) -> bool:
    """Import ``module`` (registering its ops) and the ops' fake implementations, once; a
    constant for torch.compile."""
    return _load(module)


@functools.lru_cache(maxsize=None)
def _load(module: str) -> bool:
    importlib.import_module(module)
    namespace, register_fakes = _FAMILIES[module]
    register_fakes(namespace)
    return True


def ops(module: str):
    """The op namespace (``torch.ops.<ns>``) of the registered compiled ``module``, loaded."""
    load(module)
    return getattr(torch.ops, _FAMILIES[module][0])
