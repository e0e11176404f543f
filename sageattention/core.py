"""Public attention functions (upstream SageAttention 2.x names and arguments).

``sageattn`` validates its arguments, asks :mod:`.dispatch` which kernel suits the GPU and
calls it. The kernel functions validate their own arguments the same way, so a bad input
gets the same message whichever entry point it comes through.
"""

from __future__ import annotations

import inspect
import math
from itertools import accumulate
from typing import Optional, Tuple

import torch

from . import _checks as C
from . import _sdpa, dispatch
from ._inference import inference_only
from ._ops import require

_PV_FP16 = ("fp32", "fp16+fp32")
_PV_FP8 = ("fp32", "fp32+fp32", "fp32+fp16")
_PV_SM90 = ("fp32+fp32",)
_GRANS = ("per_warp", "per_thread")


def _interpreting() -> bool:
    return dispatch._interpreting()


def _common(fn, q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs, extra=()):
    """Checks every entry point shares; returns (dims, scale, sdpa kwargs)."""
    C.check_layout(fn, tensor_layout)
    C.check_bool(fn, "is_causal", is_causal)
    C.check_bool(fn, "return_lse", return_lse)
    sm_scale = C.check_scale(fn, "sm_scale", sm_scale)
    kw = C.parse_kwargs(fn, kwargs, sm_scale, extra)
    dims = C.check_qkv(fn, q, k, v, tensor_layout, kw.enable_gqa)
    scale = sm_scale if sm_scale is not None else kw.scale
    if scale is None:
        scale = 1.0 / math.sqrt(dims.head_dim)
    if q.device.type != "cuda":  # (the environment is read only then)
        C.check_device(fn, q, _interpreting())
    return dims, scale, kw


#: CUDA caps a grid's y and z sizes at 65535, and the kernels put query heads and batch entries
#: (packed calls: sequences) there: larger batches run in slices of this many entries, each
#: entry's attention being its own (the same bits as one call); more query heads are refused
MAX_GRID_YZ = 65535


def _by_batch(run, q, k, v, dims, return_lse):
    """``run(q, k, v, dims)`` on consecutive slices of at most :data:`MAX_GRID_YZ` batch entries
    (dim 0 in both layouts), the outputs (and LSEs) concatenated."""
    step = MAX_GRID_YZ
    parts = [run(q[b:b + step], k[b:b + step], v[b:b + step], dims._replace(batch=min(step, dims.batch - b)))
             for b in range(0, dims.batch, step)]
    if return_lse:
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    return torch.cat(parts)


def _check_grid_heads(fn, heads_q):
    if heads_q > MAX_GRID_YZ:
        raise ValueError(f"{fn}: q has {heads_q} heads; the kernels take at most {MAX_GRID_YZ} (CUDA's limit on a "
                         "grid dimension they put heads in): split the heads over calls")


def _empty_result(q, dims, return_lse):
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    if not return_lse:
        return o
    return o, torch.empty((dims.batch, dims.heads_q, dims.len_q), dtype=torch.float32, device=q.device)


def _hnd(t: torch.Tensor, tensor_layout: str) -> torch.Tensor:
    return t if tensor_layout == "HND" else t.transpose(1, 2)


def _run_triton(fn, q, k, v, tensor_layout, dims, is_causal, scale, smooth_k, return_lse):
    if dims.batch == 0 or dims.len_q == 0:
        return _empty_result(q, dims, return_lse)
    _check_grid_heads(fn, dims.heads_q)
    if dims.batch > MAX_GRID_YZ:
        return _by_batch(lambda qc, kc, vc, dc: _run_triton(fn, qc, kc, vc, tensor_layout, dc, is_causal, scale,
                                                            smooth_k, return_lse), q, k, v, dims, return_lse)
    C.check_interpreter(fn, q)
    o, lse = _triton_attn(q, k, v, tensor_layout == "NHD", is_causal, float(scale), smooth_k, return_lse)
    return (o, lse) if return_lse else o


@torch.library.custom_op("sageattention::triton_attn", mutates_args=())
def _triton_attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, nhd: bool, is_causal: bool, sm_scale: float,
                 smooth_k: bool, return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """The Triton pipeline as one custom op, so torch.compile traces sageattn without a break."""
    from . import triton as st  # imported on first use: the package imports without triton

    layout = "NHD" if nhd else "HND"
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    with torch.cuda.device(q.device) if q.device.type == "cuda" else _nullctx():
        lse = st.forward(
            _hnd(q, layout), _hnd(k, layout), _hnd(v, layout), _hnd(o, layout),
            is_causal=is_causal, sm_scale=sm_scale, smooth_k=smooth_k, return_lse=return_lse,
        )
    if lse is None:
        lse = q.new_empty((0, 0, 0), dtype=torch.float32)
    return o, lse


@_triton_attn.register_fake
def _(q, k, v, nhd, is_causal, sm_scale, smooth_k, return_lse):
    b, hq, nq = (q.shape[0], q.shape[2], q.shape[1]) if nhd else q.shape[:3]
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    return o, q.new_empty((b, hq, nq) if return_lse else (0, 0, 0), dtype=torch.float32)


def _run_sdpa(q, k, v, tensor_layout, dims, is_causal, scale, return_lse):
    """sageattn's call handed to F.scaled_dot_product_attention (dispatch.goes_to_sdpa; cuDNN
    first, _sdpa.py): same arguments, output contiguous in q's layout like our kernels'. With
    return_lse, torch's cuDNN attention with its LSE (_sdpa.sdpa_lse), or None where torch's
    check finds that cuDNN cannot run the call (sageattn then runs its kernel)."""
    if dims.batch == 0 or dims.len_q == 0 or dims.heads_q == 0:
        return _empty_result(q, dims, return_lse)
    qh, kh, vh = (_hnd(t, tensor_layout) for t in (q, k, v))
    nhd = tensor_layout == "NHD"
    if not return_lse:
        return _sdpa.sdpa(qh, kh, vh, is_causal, scale, dims.heads_kv != dims.heads_q, nhd)
    return _sdpa.sdpa_lse(qh, kh, vh, is_causal, scale, nhd)


def _visible_keys(k, v, tensor_layout, dims, is_causal):
    """Top-left causal with more keys than queries: query i sees keys 0..i, so keys from Nq on
    are never attended. Every entry point drops them (views, no copy) before quantizing: the
    result is the same attention, the K mean for smoothing is taken over the keys that are used,
    and the call is then as long as a square causal call of Nq (sageattn's hand-over rule and
    the kernel's work; bench/results/…-8b3577e-crossover-causal-rect.md: with every key
    quantized, 2x24 heads x 256 queries x 16384 keys took 18x cuDNN's time). Other calls are
    returned as they are."""
    n = dims.len_q
    if not is_causal or dims.len_k <= n:
        return k, v, dims
    if tensor_layout == "HND":
        k, v = k[:, :, :n], v[:, :, :n]
    else:
        k, v = k[:, :n], v[:, :n]
    return k, v, dims._replace(len_k=n)


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --------------------------------------------------------------------------------------
# public functions


@inference_only
def sageattn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    sm_scale: Optional[float] = None,
    return_lse: bool = False,
    **kwargs,
):
    """Quantized attention with the fastest kernel available for the GPU.

    On H100-class GPUs (H100, H800, H200, GH200), calls go to SDPA (cuDNN first, exact) where
    cuDNN is faster: calls too short for the quantization to pay (``dispatch.HAND_OVER``: about
    N < 2048, causal N < 3072, decode-like Nq; longer for head dims the kernel pads while cuDNN
    runs them at their width; none at head dims that are not multiples of 8, which cuDNN refuses
    and SDPA runs on a slower flash), and head dims above 128 when the sm90 kernel is missing (the other
    kernels are 2-4x slower than cuDNN there). With ``return_lse`` only head dims that are
    multiples of 8 up to 128 (256 with cuDNN 9.10 or newer) with two keys or more go
    (``dispatch.lse_to_sdpa``: o and the LSE come from torch's cuDNN attention). Causal calls
    with more keys than queries run on the first Nq keys, the only ones a query sees. README,
    "Supported GPUs"; the kernel functions always run ours.

    Drop-in for ``F.scaled_dot_product_attention(q, k, v, is_causal=..., scale=...)`` on
    inference: fp16/bf16 ``q [B, Hq, Nq, D]``, ``k, v [B, Hkv, Nk, D]`` (``"HND"``) or
    ``[B, N, H, D]`` (``"NHD"``); ``Hq`` a multiple of ``Hkv`` (GQA/MQA); D from 1 to 256;
    ``is_causal`` masks key j for query i when j > i (top-left aligned, as SDPA).

    SDPA keywords: ``scale`` (same as ``sm_scale``), ``enable_gqa``, ``dropout_p`` (0 only);
    ``attn_mask`` is refused. Returns ``o`` in q's layout and dtype, and with
    ``return_lse=True`` also ``lse [B, Hq, Nq]`` (fp32, natural log of the softmax sum).
    """
    fn = "sageattn"
    dims, scale, kw = _common(fn, q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs)
    C.refuse_mask(fn, kw.attn_mask)
    k, v, dims = _visible_keys(k, v, tensor_layout, dims, is_causal)
    backend, options, hand_over = dispatch.chosen(q.device)
    if dispatch.goes_to_sdpa(hand_over, dims, is_causal, return_lse):
        res = _run_sdpa(q, k, v, tensor_layout, dims, is_causal, scale, return_lse)
        if res is not None:
            return res
    if backend == "triton":
        return _run_triton(fn, q, k, v, tensor_layout, dims, is_causal, scale, True, return_lse)
    # the chosen kernel function's pipeline with that function's defaults and dispatch's options,
    # without validating again what _common just did (the options are dispatch's constants, which
    # tests/test_dispatch.py holds to each function's choices)
    opts = {**_CUDA_DEFAULTS[backend], **dict(options)}
    return _cuda_run(fn, dispatch.BACKENDS[backend].extension, q, k, v, tensor_layout, dims, is_causal, scale,
                     opts["qk_quant_gran"], opts["pv_accum_dtype"], opts["smooth_k"], opts.get("smooth_v", False),
                     return_lse, 1)  # V as one e4m3 term: v_fp8_terms is the sm90 function's opt-in


@inference_only
def sageattn_qk_int8_pv_fp16_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    quantization_backend: str = "triton",
    is_causal: bool = False,
    attn_mask: Optional[torch.Tensor] = None,
    sm_scale: Optional[float] = None,
    smooth_k: bool = True,
    return_lse: bool = False,
    **kwargs,
):
    """Triton kernel: INT8 QK^T (per-token Q scales, per-block K scales, K smoothed),
    P x V in V's dtype (fp16 or bf16) with fp32 accumulation. Runs on any sm80+ GPU.

    ``quantization_backend="cuda"`` needs the compiled quantization kernels.
    """
    fn = "sageattn_qk_int8_pv_fp16_triton"
    C.check_choice(fn, "quantization_backend", quantization_backend, ("triton", "cuda"))
    C.check_bool(fn, "smooth_k", smooth_k)
    if attn_mask is not None and "attn_mask" in kwargs:
        raise TypeError(f"{fn}() got attn_mask twice")
    dims, scale, kw = _common(fn, q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs)
    C.refuse_mask(fn, attn_mask if attn_mask is not None else kw.attn_mask)
    k, v, dims = _visible_keys(k, v, tensor_layout, dims, is_causal)
    if quantization_backend == "cuda":
        require(fn + "(quantization_backend='cuda')", "sageattention._fused")
    return _run_triton(fn, q, k, v, tensor_layout, dims, is_causal, scale, smooth_k, return_lse)


def _cuda_entry(fn, module, q, k, v, tensor_layout, is_causal, qk_quant_gran, sm_scale,
                pv_accum_dtype, pv_choices, smooth_k, smooth_v, return_lse, kwargs, smooth_v_modes, v_fp8_terms=1):
    """Validation shared by the CUDA kernel functions, then the compiled pipeline (_cuda.py).
    ``v_fp8_terms`` is the sm90 function's keyword (the others pass 1)."""
    if type(v_fp8_terms) is not int or v_fp8_terms not in (1, 2):
        raise ValueError(f"{fn}: v_fp8_terms must be 1 or 2, got {v_fp8_terms!r}")
    C.check_choice(fn, "qk_quant_gran", qk_quant_gran, _GRANS)
    if pv_accum_dtype == "fp16" and "fp16" not in pv_choices:
        raise ValueError(
            f"{fn}: pv_accum_dtype='fp16' (fp16 accumulation over a whole row) is not offered: it "
            "overflows to inf/NaN on real models; use 'fp16+fp32' (fp16 per block, fp32 across blocks)"
        )
    C.check_choice(fn, "pv_accum_dtype", pv_accum_dtype, pv_choices)
    C.check_bool(fn, "smooth_k", smooth_k)
    C.check_bool(fn, "smooth_v", smooth_v)
    if smooth_v and pv_accum_dtype not in smooth_v_modes:
        modes = " or ".join(repr(m) for m in smooth_v_modes) or "no mode of this function"
        raise ValueError(f"{fn}: smooth_v=True works with pv_accum_dtype {modes}, got {pv_accum_dtype!r}")
    dims, scale, _ = _common(fn, q, k, v, tensor_layout, is_causal, sm_scale, return_lse, kwargs)
    if v_fp8_terms == 2 and dims.head_dim > 128:
        raise ValueError(
            f"{fn}: v_fp8_terms=2 needs a head dim of at most 128, got {dims.head_dim}: "
            "the Hopper kernel for head dims 129-256 keeps V as one e4m3 term (two do not fit its shared memory)"
        )
    k, v, dims = _visible_keys(k, v, tensor_layout, dims, is_causal)
    return _cuda_run(fn, module, q, k, v, tensor_layout, dims, is_causal, scale, qk_quant_gran, pv_accum_dtype,
                     smooth_k, smooth_v, return_lse, v_fp8_terms)


def _cuda_run(fn, module, q, k, v, tensor_layout, dims, is_causal, scale, qk_quant_gran, pv_accum_dtype,
              smooth_k, smooth_v, return_lse, v_fp8_terms=1):
    """The compiled pipeline (_cuda.py) on validated arguments."""
    require(fn, module)
    if q.device.type != "cuda":
        # (_common lets CPU tensors through under Triton's interpreter, which only the Triton
        # kernel can use; the compiled ops have CUDA implementations only)
        raise RuntimeError(
            f"{fn}: q is on {q.device}; this function runs a compiled CUDA kernel and takes tensors on an "
            "NVIDIA GPU only. Move them with .cuda(), or use torch.nn.functional.scaled_dot_product_attention "
            "on the CPU"
        )
    if dims.batch == 0 or dims.len_q == 0 or dims.heads_q == 0:
        return _empty_result(q, dims, return_lse)
    _check_grid_heads(fn, dims.heads_q)
    if dims.batch > MAX_GRID_YZ:
        return _by_batch(lambda qc, kc, vc, dc: _cuda_run(fn, module, qc, kc, vc, tensor_layout, dc, is_causal, scale,
                                                          qk_quant_gran, pv_accum_dtype, smooth_k, smooth_v,
                                                          return_lse, v_fp8_terms), q, k, v, dims, return_lse)
    from . import _cuda

    return _cuda.forward(fn, module, q, k, v, tensor_layout, is_causal, scale, qk_quant_gran,
                         pv_accum_dtype, smooth_k, smooth_v, return_lse, v_fp8_terms)


@inference_only
def sageattn_qk_int8_pv_fp16_cuda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    qk_quant_gran: str = "per_thread",
    sm_scale: Optional[float] = None,
    pv_accum_dtype: str = "fp32",
    smooth_k: bool = True,
    smooth_v: bool = False,
    return_lse: bool = False,
    **kwargs,
):
    """CUDA mma.sync kernel (sm80+): INT8 QK^T, FP16 PV. Needs the compiled extension."""
    return _cuda_entry("sageattn_qk_int8_pv_fp16_cuda", dispatch.BACKENDS["cuda_fp16"].extension,
                       q, k, v, tensor_layout, is_causal, qk_quant_gran, sm_scale, pv_accum_dtype,
                       _PV_FP16, smooth_k, smooth_v, return_lse, kwargs, ())


@inference_only
def sageattn_qk_int8_pv_fp8_cuda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    qk_quant_gran: str = "per_thread",
    sm_scale: Optional[float] = None,
    pv_accum_dtype: str = "fp32+fp16",
    smooth_k: bool = True,
    smooth_v: bool = False,
    return_lse: bool = False,
    **kwargs,
):
    """CUDA mma.sync kernel (sm89+): INT8 QK^T, FP8 e4m3 PV. Needs the compiled extension."""
    return _cuda_entry("sageattn_qk_int8_pv_fp8_cuda", dispatch.BACKENDS["cuda_fp8"].extension,
                       q, k, v, tensor_layout, is_causal, qk_quant_gran, sm_scale, pv_accum_dtype,
                       _PV_FP8, smooth_k, smooth_v, return_lse, kwargs, ("fp32",))


@inference_only
def sageattn_qk_int8_pv_fp8_cuda_sm90(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tensor_layout: str = "HND",
    is_causal: bool = False,
    qk_quant_gran: str = "per_thread",
    sm_scale: Optional[float] = None,
    pv_accum_dtype: str = "fp32+fp32",
    smooth_k: bool = True,
    return_lse: bool = False,
    v_fp8_terms: int = 1,
    **kwargs,
):
    """Hopper kernel (sm90a: wgmma, TMA): INT8 QK^T, FP8 PV. Needs the compiled extension.

    ``v_fp8_terms=2`` (not in upstream) stores each value of V as the sum of two e4m3 numbers
    (its rounding, then the rounding of the remainder) and runs the PV product on both: V to
    about bf16's precision, for more accuracy at some speed (README). Head dims up to 128.
    """
    return _cuda_entry("sageattn_qk_int8_pv_fp8_cuda_sm90", dispatch.BACKENDS["cuda_sm90"].extension,
                       q, k, v, tensor_layout, is_causal, qk_quant_gran, sm_scale, pv_accum_dtype,
                       _PV_SM90, smooth_k, False, return_lse, kwargs, (), v_fp8_terms)


@inference_only
def sageattn_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    is_causal: bool = False,
    sm_scale: Optional[float] = None,
    smooth_k: bool = True,
    return_lse: bool = False,
    **kwargs,
):
    """Attention over packed variable-length sequences.

    ``q [total_q, Hq, D]``, ``k, v [total_k, Hkv, D]``; sequence b is rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` of q (likewise for k, v), and gets what ``sageattn``'s
    kernel gives it alone: K is smoothed with its own mean per sequence; ``is_causal`` masks
    key j for query i of a sequence when j > i (top-left; keys past a sequence's Nq, which no
    query sees, are left out of its K mean and quantization). A sequence with queries but no keys
    gets zeros (LSE -inf). ``return_lse=True`` also returns ``lse [Hq, total_q]``.
    The offsets are checked on the host: offsets on the GPU are read back on every call (a
    sync: the host waits until the GPU has caught up); int32/int64 offsets on the CPU are read as
    they are, and the call then never waits for the GPU (build them once per batch and pass the
    same CPU tensors to every layer).

    Kernel: where ``sageattn`` runs the Hopper kernel (H100-class GPUs), that kernel, one launch
    per group of sequences of similar length (``dispatch.varlen_groups``); on every other GPU the
    Triton kernel. Short sequences are not handed to SDPA. Under ``torch.compile`` the call is
    one custom op (``sageattention::varlen``): the lengths it reads are data, so the op is
    traced as a whole (``fullgraph=True`` works) and runs as in eager.
    """
    fn = "sageattn_varlen"
    C.check_bool(fn, "is_causal", is_causal)
    C.check_bool(fn, "smooth_k", smooth_k)
    C.check_bool(fn, "return_lse", return_lse)
    sm_scale = C.check_scale(fn, "sm_scale", sm_scale)
    kw = C.parse_kwargs(fn, kwargs, sm_scale)
    C.refuse_mask(fn, kw.attn_mask)
    dims = C.check_packed(fn, q, k, v, kw.enable_gqa)
    max_q = C.check_int(fn, "max_seqlen_q", max_seqlen_q, 0)
    max_k = C.check_int(fn, "max_seqlen_k", max_seqlen_k, 0)
    C.check_cu_tensor(fn, "cu_seqlens_q", cu_seqlens_q, q.device)
    C.check_cu_tensor(fn, "cu_seqlens_k", cu_seqlens_k, q.device)
    C.check_device(fn, q, _interpreting())
    scale = sm_scale if sm_scale is not None else kw.scale
    if scale is None:
        scale = 1.0 / math.sqrt(dims.head_dim)
    o, lse = _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, is_causal, float(scale), smooth_k, return_lse)
    return (o, lse) if return_lse else o


# inductor's CUDA graphs (mode="reduce-overhead") must leave the op out: with offsets on the GPU
# it reads them back, a sync that a capture forbids (older torch has no such tag)
_VARLEN_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


@torch.library.custom_op("sageattention::varlen", mutates_args=(), tags=_VARLEN_TAGS)
def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
            cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, is_causal: bool, scale: float,
            smooth_k: bool, return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """sageattn_varlen after its argument checks, as one custom op: it reads the offsets on the
    host (their values are checked here) and picks kernels and launch groups from them, which
    torch.compile cannot trace. Returns o and the LSE (an empty tensor unless return_lse)."""
    fn = "sageattn_varlen"
    dims = C.check_packed(fn, q, k, v, True)
    lens_q = C.check_cu_seqlens(fn, "cu_seqlens_q", cu_seqlens_q, dims.len_q, q.device, "max_seqlen_q", max_seqlen_q)
    lens_k = C.check_cu_seqlens(fn, "cu_seqlens_k", cu_seqlens_k, dims.len_k, q.device, "max_seqlen_k", max_seqlen_k)
    if len(lens_q) != len(lens_k):
        raise ValueError(
            f"{fn}: cu_seqlens_q and cu_seqlens_k must describe the same number of sequences, "
            f"got {len(lens_q)} and {len(lens_k)}"
        )
    o, lse = _varlen_run(fn, q, k, v, dims, lens_q, lens_k, is_causal, scale, smooth_k, return_lse)
    return o, (lse if return_lse else q.new_empty((0, 0), dtype=torch.float32))


@_varlen.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale, smooth_k, return_lse):
    lse = (q.shape[1], q.shape[0]) if return_lse else (0, 0)
    return torch.empty(q.shape, dtype=q.dtype, device=q.device), q.new_empty(lse, dtype=torch.float32)


def _varlen_slices(fn, q, k, v, dims, lens_q, lens_k, is_causal, scale, smooth_k, return_lse):
    """_varlen_run on consecutive slices of at most :data:`MAX_GRID_YZ` sequences (each sequence's
    attention is its own), the packed outputs and LSEs concatenated."""
    sq, sk = list(accumulate(lens_q, initial=0)), list(accumulate(lens_k, initial=0))
    outs, lses = [], []
    for i in range(0, len(lens_q), MAX_GRID_YZ):
        j = min(i + MAX_GRID_YZ, len(lens_q))
        part = dims._replace(len_q=sq[j] - sq[i], len_k=sk[j] - sk[i])
        o, lse = _varlen_run(fn, q[sq[i]:sq[j]], k[sk[i]:sk[j]], v[sk[i]:sk[j]], part, lens_q[i:j], lens_k[i:j],
                             is_causal, scale, smooth_k, return_lse)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), (torch.cat(lses, dim=1) if return_lse else None)


def _seen_rows(k, v, lens_q, lens_k, is_causal):
    """Packed K and V with only the rows each sequence's queries see (causal, top-left: its first
    Nq keys, dispatch.seen_keys), and their lengths: as the Hopper path and sageattn do, so that
    the Triton kernel neither quantizes nor smooths K with keys no query sees (which gave a
    sequence other bits than its own sageattn call: tests/test_fuzz.py). The rows kept are copied
    once; nothing is copied when every key is seen."""
    seen = dispatch.seen_keys(lens_q, lens_k, is_causal)
    if seen == list(lens_k):
        return k, v, lens_k
    from ._staging import rows_index

    idx = rows_index(list(accumulate(lens_k, initial=0))[:-1], seen, k.device)
    return k.index_select(0, idx), v.index_select(0, idx), seen


def _varlen_run(fn, q, k, v, dims, lens_q, lens_k, is_causal, scale, smooth_k, return_lse):
    _check_grid_heads(fn, dims.heads_q)
    if len(lens_q) > MAX_GRID_YZ:  # slices of sequences: the kernels put them in a grid dimension
        return _varlen_slices(fn, q, k, v, dims, lens_q, lens_k, is_causal, scale, smooth_k, return_lse)
    backend, options, _ = dispatch.chosen(q.device)
    groups = dispatch.varlen_groups(backend, lens_q, lens_k, is_causal) if dims.len_q > 0 else None
    if groups:
        from . import _cuda

        opts = {**_CUDA_DEFAULTS[backend], **dict(options)}
        return _cuda.forward_varlen(fn, q, k, v, lens_q, lens_k, groups, is_causal, float(scale),
                                    opts["qk_quant_gran"], smooth_k, return_lse)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((dims.heads_q, dims.len_q), dtype=torch.float32, device=q.device) if return_lse else None
    if dims.len_q > 0:
        from . import triton as st

        C.check_interpreter(fn, q)
        k, v, lens_k = _seen_rows(k, v, lens_q, lens_k, is_causal)

        with torch.cuda.device(q.device) if q.device.type == "cuda" else _nullctx():
            lse = st.forward_varlen(q, k, v, o, lens_q, lens_k, is_causal=is_causal, sm_scale=scale,
                                    smooth_k=smooth_k, return_lse=return_lse)
    return o, lse


# what each CUDA kernel function accepts as pv_accum_dtype (sageattn's options must be among them)
_PV_CHOICES = {"cuda_fp16": _PV_FP16, "cuda_fp8": _PV_FP8, "cuda_sm90": _PV_SM90}
# each CUDA kernel function's keyword defaults: what sageattn runs unless dispatch's options say otherwise
_CUDA_DEFAULTS = {
    name: {p.name: p.default for p in inspect.signature(f).parameters.values() if p.default is not p.empty}
    for name, f in (("cuda_fp16", sageattn_qk_int8_pv_fp16_cuda), ("cuda_fp8", sageattn_qk_int8_pv_fp8_cuda),
                    ("cuda_sm90", sageattn_qk_int8_pv_fp8_cuda_sm90))
}
