"""Argument validation shared by the public functions.

Every message names the function, the argument, what was given and what is allowed.
Type mistakes raise TypeError, bad values ValueError, device problems RuntimeError.
"""

from __future__ import annotations

import functools
import math
import numbers
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, NamedTuple, Optional, Sequence

import torch

MAX_HEAD_DIM = 256
DTYPES = (torch.float16, torch.bfloat16)
LAYOUTS = ("HND", "NHD")


def _fmt(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_bool(fn: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{fn}: {name} must be True or False, got {_fmt(value)} ({type(value).__name__})")
    return value


def check_choice(fn: str, name: str, value: Any, choices: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{fn}: {name} must be one of {allowed}, got {_fmt(value)}")
    return value


def check_layout(fn: str, tensor_layout: Any) -> str:
    if isinstance(tensor_layout, torch.Tensor) or tensor_layout is None:
        raise TypeError(
            f"{fn}: the 4th positional argument is tensor_layout ('HND' or 'NHD'), got {_fmt(tensor_layout)}. "
            "This looks like an SDPA-style call fn(q, k, v, attn_mask, dropout_p, is_causal): "
            "pass is_causal=..., scale=... as keywords (attn_mask is not supported here)."
        )
    return check_choice(fn, "tensor_layout", tensor_layout, LAYOUTS)


def check_scale(fn: str, name: str, value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{fn}: {name} must be a float or None, got {_fmt(value)} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{fn}: {name} must be finite, got {value}")
    return value


def refuse_read_in_capture(fn: str, name: str, t: torch.Tensor, instead: str = "a CPU tensor") -> None:
    """A GPU tensor read on the host needs a sync, which CUDA-graph capture forbids: torch would
    fail with a CUDA error and invalidate the capture. Say what to pass instead."""
    if t.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise ValueError(
            f"{fn}: {name} is a tensor on {t.device}, read on the host, which is not possible while a "
            f"CUDA graph is being captured; pass it as {instead} (the graph then replays the value it "
            "was captured with)"
        )


def check_int(fn: str, name: str, value: Any, minimum: int) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_floating_point:
        refuse_read_in_capture(fn, name, value, "a Python int or a CPU tensor")
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{fn}: {name} must be an int, got {_fmt(value)} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{fn}: {name} must be >= {minimum}, got {value}")
    return int(value)


@dataclass(frozen=True)
class SdpaKwargs:
    """What the SDPA-compatible keywords of a call amount to."""

    scale: Optional[float]
    enable_gqa: Optional[bool]
    attn_mask: Optional[torch.Tensor]


_NO_KWARGS = SdpaKwargs(scale=None, enable_gqa=None, attn_mask=None)


def parse_kwargs(fn: str, kwargs: Dict[str, Any], sm_scale: Optional[float], extra: Iterable[str] = ()) -> SdpaKwargs:
    """Accept SDPA's keywords (scale, enable_gqa, dropout_p, attn_mask) and nothing unknown.

    ``scale`` is SDPA's name for ``sm_scale``; ``dropout_p`` must be 0 (inference only);
    ``attn_mask`` is returned for the caller to refuse or use.
    """
    if not kwargs:  # the common call: nothing to check
        return _NO_KWARGS
    known = {"scale", "enable_gqa", "dropout_p", "attn_mask"} | set(extra)
    unknown = sorted(set(kwargs) - known)
    if unknown:
        names = ", ".join(repr(u) for u in unknown)
        raise TypeError(
            f"{fn}() got unexpected keyword argument(s) {names}; besides its own arguments it "
            "accepts SDPA's scale, enable_gqa, dropout_p (0 only) and attn_mask"
        )
    scale = check_scale(fn, "scale", kwargs.get("scale"))
    if scale is not None and sm_scale is not None and scale != sm_scale:
        raise ValueError(f"{fn}: sm_scale={sm_scale} and scale={scale} disagree; pass one of them")
    dropout = kwargs.get("dropout_p", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real):
        raise TypeError(f"{fn}: dropout_p must be a number, got {_fmt(dropout)}")
    if dropout != 0:
        raise ValueError(
            f"{fn}: dropout_p={dropout} is not supported: sageattention is for inference; pass dropout_p=0"
        )
    gqa = kwargs.get("enable_gqa")
    if gqa is not None:
        check_bool(fn, "enable_gqa", gqa)
    return SdpaKwargs(scale=scale, enable_gqa=gqa, attn_mask=kwargs.get("attn_mask"))


def refuse_mask(fn: str, attn_mask: Any) -> None:
    if attn_mask is not None:
        raise ValueError(
            f"{fn}: attn_mask is not supported (got {_fmt(attn_mask)}); only is_causal=True masking "
            "is available. For padding masks use sageattn_varlen with cu_seqlens; for other masks "
            "use torch.nn.functional.scaled_dot_product_attention"
        )


class Dims(NamedTuple):  # (a tuple: built on every call, cheaper than a frozen dataclass)
    batch: int
    heads_q: int
    heads_kv: int
    len_q: int
    len_k: int
    head_dim: int


def _check_tensor(fn: str, name: str, t: Any, ndim: int, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{fn}: {name} must be {ndim}-D {what}, got shape {tuple(t.shape)}")
    if t.dtype not in DTYPES:
        raise TypeError(
            f"{fn}: {name} has dtype {t.dtype}; allowed: torch.float16, torch.bfloat16 "
            f"(convert with {name}.to(torch.bfloat16))"
        )
    # (fp16/bf16 only: never complex) before the strides, which a sparse tensor does not have
    if t.layout != torch.strided:
        raise TypeError(f"{fn}: {name} must be a dense tensor, got layout {t.layout}; call {name}.to_dense() first")
    if t.size(-1) > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{fn}: {name} must be contiguous in its last (head) dimension, got strides "
            f"{tuple(t.stride())}; call {name}.contiguous() first"
        )
    return t


def _check_same(fn: str, q, k, v) -> None:
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{fn}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{fn}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def _check_heads(fn: str, hq: int, hk: int, enable_gqa: Optional[bool]) -> None:
    if hq == 0 or hk == 0:
        raise ValueError(f"{fn}: q and k need at least one head, got {hq} and {hk}")
    if hq % hk:
        raise ValueError(
            f"{fn}: the number of q heads ({hq}) must be a multiple of the number of k/v heads ({hk})"
        )
    if enable_gqa is False and hq != hk:
        raise ValueError(
            f"{fn}: enable_gqa=False but q has {hq} heads and k/v have {hk}; pass enable_gqa=True "
            "(or leave it out) for grouped-query attention"
        )


def _check_head_dim(fn: str, d: int, dv: int, dk: int) -> None:
    if not (d == dk == dv):
        raise ValueError(f"{fn}: q, k, v must have the same head dim, got {d}, {dk}, {dv}")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"{fn}: head dim must be between 1 and {MAX_HEAD_DIM}, got {d}")


def check_qkv(fn: str, q, k, v, tensor_layout: str, enable_gqa: Optional[bool] = None) -> Dims:
    """Validate 4-D q, k, v in ``tensor_layout``; returns their dimensions."""
    what = "[B, H, N, D] (HND)" if tensor_layout == "HND" else "[B, N, H, D] (NHD)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(fn, name, t, 4, what)
    _check_same(fn, q, k, v)
    h_ax, n_ax = (1, 2) if tensor_layout == "HND" else (2, 1)
    qs, ks, vs = q.shape, k.shape, v.shape  # (each .shape builds a new torch.Size: once per call)
    if ks != vs:
        raise ValueError(f"{fn}: k and v must have the same shape, got {tuple(ks)} and {tuple(vs)}")
    if qs[0] != ks[0]:
        raise ValueError(f"{fn}: q and k must have the same batch size, got {qs[0]} and {ks[0]}")
    _check_head_dim(fn, qs[3], vs[3], ks[3])
    _check_heads(fn, qs[h_ax], ks[h_ax], enable_gqa)
    dims = Dims(qs[0], qs[h_ax], ks[h_ax], qs[n_ax], ks[n_ax], qs[3])
    if dims.len_k == 0 and dims.len_q > 0 and dims.batch > 0:
        raise ValueError(f"{fn}: k and v have no tokens (N=0) but q has {dims.len_q}; attention over no keys is undefined")
    return dims


def check_packed(fn: str, q, k, v, enable_gqa: Optional[bool] = None) -> Dims:
    """Validate packed [total, H, D] q, k, v (batch and lengths come from cu_seqlens)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(fn, name, t, 3, "[total_tokens, H, D]")
    _check_same(fn, q, k, v)
    if k.shape != v.shape:
        raise ValueError(f"{fn}: k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    _check_head_dim(fn, q.shape[2], v.shape[2], k.shape[2])
    _check_heads(fn, q.shape[1], k.shape[1], enable_gqa)
    return Dims(0, q.shape[1], k.shape[1], q.shape[0], k.shape[0], q.shape[2])


def check_cu_tensor(fn: str, name: str, cu: Any, device: torch.device) -> None:
    """What can be checked of cumulative sequence offsets without reading them (so also while
    torch.compile traces): type, dtype, shape, device."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor of int32 or int64, got {type(cu).__name__}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{fn}: {name} must have dtype torch.int32 or torch.int64, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{fn}: {name} must be 1-D with batch+1 >= 2 entries, got shape {tuple(cu.shape)}")
    if cu.device != device and cu.device.type != "cpu":
        raise ValueError(f"{fn}: {name} is on {cu.device} but q is on {device}; pass it on q's device or on the CPU")


def check_cu_seqlens(fn: str, name: str, cu: Any, total: int, device: torch.device, max_name: str, max_len: int) -> list:
    """Validate cumulative sequence offsets; returns the lengths. Offsets on q's GPU are read
    back to the host (a device sync: the host waits for the GPU's queue); offsets on the CPU
    are read as they are, so a call with both on the CPU never waits for the GPU."""
    check_cu_tensor(fn, name, cu, device)
    refuse_read_in_capture(fn, name, cu)
    host = cu.tolist()
    lens = [b - a for a, b in zip(host[:-1], host[1:])]
    if host[0] != 0:
        raise ValueError(f"{fn}: {name}[0] must be 0, got {host[0]}")
    if lens and min(lens) < 0:
        i = next(i for i, n in enumerate(lens) if n < 0) + 1
        raise ValueError(f"{fn}: {name} must be non-decreasing, got {_fmt(host)}: "
                         f"{name}[{i}]={host[i]} after {name}[{i - 1}]={host[i - 1]}")
    if host[-1] != total:
        raise ValueError(
            f"{fn}: {name}[-1] must equal the number of packed tokens ({total}), got {host[-1]}"
        )
    if max(lens) > max_len:
        raise ValueError(
            f"{fn}: {max_name}={max_len} is smaller than the longest sequence in {name} ({max(lens)})"
        )
    return lens


#: Triton's CPU interpreter before this release turns a kernel's one-element scalars into Python
#: ints with int(array), which numpy refuses from NUMPY_STRICT on: a TypeError inside every kernel
#: with a loop bound computed at run time (triton-lang/triton#9171; seen with Triton 3.6.0 and
#: numpy 2.4.6 and 2.5.2, not with Triton 3.7.0-3.9.0, whose interpreter squeezes the array first).
INTERPRETER_FIXED = (3, 7)
NUMPY_STRICT = (2, 4)


def _release(version: str) -> Optional[tuple]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def interpreter_problem(triton_version: str, numpy_version: str) -> Optional[str]:
    """Why Triton ``triton_version``'s CPU interpreter cannot run sageattention's kernels beside
    numpy ``numpy_version`` (None: it can, as far as is known)."""
    t, n = _release(triton_version), _release(numpy_version)
    if t is None or n is None or t >= INTERPRETER_FIXED or n < NUMPY_STRICT:
        return None
    return (f"Triton {triton_version}'s CPU interpreter cannot run beside numpy {numpy_version}: it converts "
            f"one-element arrays to Python ints, which numpy refuses from {NUMPY_STRICT[0]}.{NUMPY_STRICT[1]} on "
            f"(triton-lang/triton#9171, fixed in Triton {INTERPRETER_FIXED[0]}.{INTERPRETER_FIXED[1]}); "
            f"install 'numpy<{NUMPY_STRICT[0]}.{NUMPY_STRICT[1]}' or Triton "
            f"{INTERPRETER_FIXED[0]}.{INTERPRETER_FIXED[1]} or newer")


@functools.lru_cache(maxsize=None)
def installed_interpreter_problem() -> Optional[str]:
    """:func:`interpreter_problem` for the Triton and numpy installed here (None where either is
    missing: the backend checks say so)."""
    try:
        import numpy
        import triton
    except Exception:
        return None
    return interpreter_problem(triton.__version__, numpy.__version__)


def check_interpreter(fn: str, t: torch.Tensor) -> None:
    """Before a Triton kernel runs on CPU tensors, i.e. in Triton's interpreter: an installed
    Triton and numpy that cannot run it (:func:`installed_interpreter_problem`) are named, instead
    of a TypeError from inside the kernel. Calls that never start a kernel (empty ones, those that
    go to SDPA or to a stand-in in the tests) are not refused for it."""
    if t.device.type != "cpu":
        return
    problem = installed_interpreter_problem()
    if problem:
        raise RuntimeError(f"{fn}: {problem}")


def check_device(fn: str, t: torch.Tensor, interpreter_ok: bool) -> None:
    """CUDA tensors only (CPU tensors are accepted under Triton's interpreter, for tests; whether
    that interpreter can run here is asked only where a call would start it: :func:`check_interpreter`)."""
    if t.device.type == "cuda":
        return
    if t.device.type == "cpu" and interpreter_ok:
        return
    raise RuntimeError(
        f"{fn}: q is on {t.device}; sageattention runs on NVIDIA GPUs (compute capability 8.0+). "
        "Move the tensors with .cuda(), or use torch.nn.functional.scaled_dot_product_attention on the CPU"
    )
