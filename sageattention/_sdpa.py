"""sageattn's hand-over to ``F.scaled_dot_product_attention`` (dispatch.goes_to_sdpa), cuDNN first.

torch's public way to pick SDPA's backends, ``sdpa_kernel(backends, set_priority=True)``, reads,
sets and restores each backend's flag and the priority order through Python loops over enum
objects: 15-65 µs more host time a call than this module's way on the H100 machine
(bench/results/2026-11-24-NVIDIA_H100_80GB_HBM3-fe56b1d-short-calls.md), as long as the
attention of the short calls the hand-over takes. This module sets the same state with the
``torch._C`` functions ``sdpa_kernel`` itself calls (precomputed, ~1 µs) and restores it exactly
afterwards; on a torch without those functions it uses ``sdpa_kernel``. Either way the state is
torch's process-wide one, as with sdpa_kernel. Under torch.compile each hand-over is one custom
op (``sageattention::sdpa``, ``sageattention::sdpa_lse``) whose body runs eagerly on real tensors.
"""

from __future__ import annotations

import inspect
from typing import Tuple

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

#: cuDNN first (torch's own order puts it last; on an H100 it is the fastest SDPA backend)
ORDER = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# set_priority where this torch has it (2.6 on; before, torch picks from the list in its own order)
_PRIORITY = {"set_priority": True} if "set_priority" in inspect.signature(sdpa_kernel).parameters else {}
# sdpa_kernel's flags (torch.nn.attention._backend_names): enabled when in ORDER
_FLAGS = (("cudnn", True), ("flash", True), ("mem_efficient", True), ("math", True), ("overrideable", False))


def _bind():
    """The torch._C getters and setters of SDPA's backend state, or None where this torch
    lacks one of them (its sdpa_kernel then serves every call)."""
    c = torch._C
    try:
        get = tuple(getattr(c, f"_get_{name}_sdp_enabled") for name, _ in _FLAGS)
        put = tuple(getattr(c, f"_set_sdp_use_{name}") for name, _ in _FLAGS)
        order = (c._get_sdp_priority_order, c._set_sdp_priority_order)
    except AttributeError:
        return None
    return get, put, order


_STATE = _bind() if _PRIORITY else None
_WANT = [int(b) for b in ORDER]


def _cudnn_first(call):
    """``call()`` with ORDER's backends enabled, cuDNN first; the caller's SDPA settings are as
    before afterwards."""
    if _STATE is None:
        with sdpa_kernel(ORDER, **_PRIORITY):
            return call()
    get, put, (get_order, put_order) = _STATE
    was = [g() for g in get]
    was_order = get_order()
    try:
        for setter, (_, on) in zip(put, _FLAGS):
            setter(on)
        put_order(_WANT + [b for b in was_order if b not in _WANT])
        return call()
    finally:
        for setter, on in zip(put, was):
            setter(on)
        put_order(was_order)


def cudnn_ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` (a 16-bit [B, H, N, D] view) as cuDNN's attention can read it: its start and every
    stride but the last (which is 1) non-zero multiples of 16 bytes; else a contiguous copy. torch's
    check lets other views through (rows of a wider tensor at an odd offset, say), and cuDNN
    then returns a wrong result without an error, fails, or faults with a misaligned address
    that poisons the CUDA context (found by tests/test_fuzz.py on an H100, torch 2.11). Eager
    tensors only: under torch.compile the hand-over runs inside a custom op (:func:`sdpa`), where
    the tensors are real."""
    size = t.element_size()
    # The usual case in one C call: a contiguous, non-empty tensor whose rows are 16-byte
    # multiples has every stride but the last a non-zero multiple of a row (dims of size 1 aside,
    # which the test below lets through too), so only its start is left to look at.
    if t.is_contiguous() and (t.shape[-1] * size) % 16 == 0 and t.numel() and t.data_ptr() % 16 == 0:
        return t
    # a stride of 0 (K or V expanded over the query heads) is copied too: not observed to fail,
    # but not a layout torch's check was seen to handle, and such calls are short
    ok = t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(
        (s != 0 and (s * size) % 16 == 0) or n == 1 for s, n in zip(t.stride()[:-1], t.shape[:-1]))
    return t if ok else t.clone(memory_format=torch.contiguous_format)


def sdpa(q, k, v, is_causal: bool, scale: float, enable_gqa: bool, nhd: bool = False):
    """``F.scaled_dot_product_attention`` on [B, H, N, D] views with ORDER's backends, cuDNN
    first; the caller's SDPA settings are as before afterwards. Views cuDNN cannot read are
    copied first (:func:`cudnn_ready`). Returns o contiguous in the caller's layout: [B, N, H, D]
    if ``nhd``, else [B, H, N, D].

    Under torch.compile the call is one custom op (``sageattention::sdpa``) whose body runs on
    real tensors: a traced tensor has neither an address nor a storage offset that dynamo can
    read, so :func:`cudnn_ready` could not see a view whose start is misaligned, and inductor
    passes such a start on to cuDNN (max error 4.98 on an H100 with inductor, aot_eager and eager:
    bench/results/2026-11-27-NVIDIA_H100_80GB_HBM3-e9588c1-compile-misaligned.md)."""
    if torch.compiler.is_compiling():
        return _sdpa_op(q, k, v, is_causal, scale, enable_gqa, nhd)
    return _sdpa_now(q, k, v, is_causal, scale, enable_gqa, nhd)


def _sdpa_now(q, k, v, is_causal, scale, enable_gqa, nhd):
    q, k, v = (cudnn_ready(t) for t in (q, k, v))
    kw = {"enable_gqa": True} if enable_gqa else {}
    o = _cudnn_first(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
                                                                              scale=scale, **kw))
    return _in_layout(o, nhd)


def _in_layout(o: torch.Tensor, nhd: bool) -> torch.Tensor:
    """A [B, H, N, D] result as a contiguous tensor of the caller's layout ([B, N, H, D] if nhd)."""
    return (o.transpose(1, 2) if nhd else o).contiguous()


def _layout_shape(q: torch.Tensor, v: torch.Tensor, nhd: bool):
    b, h, n = q.shape[:3]
    return (b, n, h, v.shape[-1]) if nhd else (b, h, n, v.shape[-1])


@torch.library.custom_op("sageattention::sdpa", mutates_args=())
def _sdpa_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float, enable_gqa: bool,
             nhd: bool) -> torch.Tensor:
    """:func:`sdpa`'s body as a custom op (torch.compile); o contiguous in the caller's layout."""
    return _sdpa_now(q, k, v, is_causal, scale, enable_gqa, nhd)


@_sdpa_op.register_fake
def _(q, k, v, is_causal, scale, enable_gqa, nhd):
    return q.new_empty(_layout_shape(q, v, nhd))


def _cudnn_can_run(q, k, v, is_causal: bool) -> bool:
    """torch's own test of whether its cuDNN attention takes these inputs (the check SDPA makes
    before choosing that backend), with the backend enabled as sdpa() enables it; K and V with
    fewer heads than q are asked about as GQA (enable_gqa)."""
    params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, is_causal, k.shape[1] != q.shape[1])
    return bool(_cudnn_first(lambda: torch.backends.cuda.can_use_cudnn_attention(params, False)))


def sdpa_lse(q, k, v, is_causal: bool, scale: float, nhd: bool = False):
    """Attention and its LSE from torch's cuDNN attention on [B, H, N, D] views: ``(o, lse)`` with
    ``lse [B, Hq, Nq]`` fp32, the natural log of each row's softmax sum (sageattn's return_lse).
    SDPA's public function returns no LSE; this calls the aten operator that SDPA's cuDNN backend
    runs, with ``compute_log_sumexp``. The shapes sageattn sends here (dispatch.lse_to_sdpa: head
    dims multiples of 8 up to 128, or 256 with cuDNN 9.10 or newer, two keys or more) are ones cuDNN
    runs on the GPUs it hands over on (tests/test_gpu.py checks them against torch's check); in
    eager mode that check comes first, and where it says no this returns None (sageattn then runs
    its kernel). Under torch.compile the check is skipped. GQA: K and V go with their own head
    count, which the operator takes as SDPA's cuDNN backend gives it them (repeating them for the
    query heads first took 1.1-1.9x the time on the H100:
    bench/results/2026-11-24-NVIDIA_H100_80GB_HBM3-3351e2c-gqa-lse.md). Views cuDNN cannot read are
    copied first (:func:`cudnn_ready`); o as in :func:`sdpa`. Under torch.compile the call is one
    custom op (``sageattention::sdpa_lse``), as in :func:`sdpa`."""
    if torch.compiler.is_compiling():
        return _sdpa_lse_op(q, k, v, is_causal, scale, nhd)
    q, k, v = (cudnn_ready(t) for t in (q, k, v))
    if not _cudnn_can_run(q, k, v, is_causal):
        return None
    o, lse = _cudnn_lse(q, k, v, is_causal, scale)
    return _in_layout(o, nhd), lse


# The aten operator SDPA's cuDNN backend runs, bound here so that the CPU tests can stand in for it
# without replacing torch's own attribute (torch's lazily imported modules read that one).
_CUDNN_OP = torch.ops.aten._scaled_dot_product_cudnn_attention


def _cudnn_lse(q, k, v, is_causal, scale):
    out = _CUDNN_OP(q, k, v, None, True, 0.0, is_causal, False, scale=scale)
    return out[0], out[1].reshape(q.shape[0], q.shape[1], q.shape[2]).contiguous()


@torch.library.custom_op("sageattention::sdpa_lse", mutates_args=())
def _sdpa_lse_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: float,
                 nhd: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`sdpa_lse`'s body as a custom op (torch.compile), without torch's check (an op
    cannot decline): o contiguous in the caller's layout, the LSE [B, Hq, Nq]."""
    o, lse = _cudnn_lse(*(cudnn_ready(t) for t in (q, k, v)), is_causal, scale)
    return _in_layout(o, nhd), lse


@_sdpa_lse_op.register_fake
def _(q, k, v, is_causal, scale, nhd):
    return q.new_empty(_layout_shape(q, v, nhd)), q.new_empty(q.shape[:3], dtype=torch.float32)
