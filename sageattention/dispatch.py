"""Which kernel ``sageattn`` runs on which GPU.

A backend is one of the public kernel functions. :data:`PREFERENCE` lists, per compute
capability, the backends to try in order with the options ``sageattn`` passes; the first
one present in this build wins. A missing compiled kernel falls back to the next entry
(Triton last) with a one-time warning. GPUs below sm80 are refused.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from ._checks import MAX_HEAD_DIM

MIN_CAPABILITY = (8, 0)


@dataclass(frozen=True)
class Backend:
    name: str
    function: str  # public function in sageattention
    extension: Optional[str]  # compiled module it needs (None: Triton)
    min_capability: Tuple[int, int]
    only_capability: Optional[Tuple[int, int]] = None  # arch-specific code (sm90a)


BACKENDS: Dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("cuda_sm90", "sageattn_qk_int8_pv_fp8_cuda_sm90", "sageattention._qattn_sm90", (9, 0), (9, 0)),
        Backend("cuda_fp8", "sageattn_qk_int8_pv_fp8_cuda", "sageattention._qattn_sm89", (8, 9)),
        Backend("cuda_fp16", "sageattn_qk_int8_pv_fp16_cuda", "sageattention._qattn_sm80", (8, 0)),
        Backend("triton", "sageattn_qk_int8_pv_fp16_triton", None, (8, 0)),
    )
}


@dataclass(frozen=True)
class Choice:
    backend: str
    options: Dict[str, str] = field(default_factory=dict)
    #: which calls go to SDPA instead (goes_to_sdpa); set by select from HAND_OVER
    #: (None: none)
    hand_over: Optional["HandOver"] = None


_FP16 = Choice("cuda_fp16", {"pv_accum_dtype": "fp32", "qk_quant_gran": "per_thread"})
_FP8_SM89 = Choice("cuda_fp8", {"pv_accum_dtype": "fp32+fp16", "qk_quant_gran": "per_thread"})
_FP8_SM120 = Choice("cuda_fp8", {"pv_accum_dtype": "fp32+fp16", "qk_quant_gran": "per_warp"})
_SM90 = Choice("cuda_sm90", {"pv_accum_dtype": "fp32+fp32", "qk_quant_gran": "per_thread"})
_TRITON = Choice("triton")

class HandOver(NamedTuple):
    """Which calls ``sageattn`` hands to SDPA, cuDNN first (core._run_sdpa) (:func:`goes_to_sdpa`):
    head dims above ``head_dim_above``, and calls too small for the quantized kernel to beat
    SDPA (:func:`short_call`).

    A call's length is ``L = 2·Nq·Nk / (Nq + Nk)``, the harmonic mean of its query and key counts:
    ``N`` when ``Nq == Nk``, and in general the attention's work (``Nq·Nk``) over the tokens it
    reads, queries and keys weighed alike (why, and the length before it: bench/HANDOVER.md,
    "Decode, cross-attention and Nq ≠ Nk"). Below ``length`` (non-causal calls at head dims up to
    128: ``length_unaligned`` where Nq or Nk is not a multiple of :data:`CUDNN_TILE`, which cuDNN runs slower per pair; with
    :data:`GQA_GROUP` or more query heads per K/V head ``length_gqa`` (``length_gqa_d64`` at
    head dim 64), at least ``length_gqa_aligned`` where both are multiples; ``length_causal`` for causal calls,
    ``length_causal_d64`` for causal calls with head dim <= 64, ``length_padded`` for head dims
    between 192 and 256, which the kernel runs zero-padded to 256 while SDPA runs them at their
    width, ``length_192`` and ``length_causal_192`` for head dims 129-192, which it runs on 192 of
    those columns; for causal calls at the head dims it pads to 128 or 64,
    ``length_causal_padded`` and ``length_causal_padded_d64``) the quantization costs more than
    the kernel saves; below ``pairs`` (``pairs_unaligned`` for non-causal calls off the tile
    at head dims up to 128, not GQA; ``pairs_causal``; ``pairs_192`` for head dims 129-192, at
    least the causal pair limit for causal calls there) of ``B·Hq·Nq·Nk`` the call is too small
    to fill the GPU; causal calls of ``length_causal_long`` keys or more
    at head dims up to 128 are short only below ``pairs_causal_long`` if that is lower (the
    kernel gains on cuDNN with the length, so long causal calls on few heads still beat it).
    Causal GQA calls with at least
    :data:`GQA_GROUP` query heads per K/V head take ``pairs_causal_gqa`` instead, and non-causal
    ones at head dims up to 128 ``pairs_gqa``: the quantization reads K and V of fewer heads. At
    head dims 129-192 GQA calls with that many
    query heads per K/V head take ``pairs_192_gqa`` instead of ``pairs_192``, and
    ``length_192_gqa`` and ``length_causal_192_gqa`` instead of ``length_192`` and
    ``length_causal_192``. Non-causal calls at head dims 129-192 take ``length_192`` (``_gqa``)
    and ``pairs_192`` (``_gqa``) as they are, which may be below ``length`` and ``pairs`` (the
    H200's GQA calls there, where its kernel passes cuDNN from shorter calls than at D=128);
    non-causal GQA calls there whose query and key lengths are both multiples of
    :data:`CUDNN_TILE` take at least ``length_192_gqa_aligned`` (cuDNN runs those lengths
    best, so the kernel passes it later there); causal calls there take the larger of those and
    the causal limits.
    Non-causal calls off the tile at head dims up to 128, not GQA, from ``pairs_unaligned`` up to
    ``pairs`` go by how full each side's rounds of work tiles are where ``grid_base`` is set
    (:func:`grid_slower`; 0: by the pair limit alone): at so few pairs the kernel's 192-row tiles
    and cuDNN's 128-row ones leave different shares of ``sms`` idle in their last round.
    Where ``long_q`` is set (0: nowhere), non-causal calls (not causal ones with fewer keys) at
    head dims 65-128 with :data:`SM90_NC3_ROUNDS_KEYS` up to :data:`SM90_NC3_KEYS` keys and at
    least ``long_q`` times as many queries (:func:`long_q_call`) are short only below the pair
    limit of their kind (``pairs``, ``pairs_gqa`` with GQA, ``pairs_unaligned`` off the tile),
    whatever their length: the kernel runs most such calls on three consumers
    (:func:`sm90_rows`) and passes cuDNN at shorter lengths there (bench/HANDOVER.md, "Decode,
    cross-attention and Nq ≠ Nk"; the H200's 2, chosen on the rect-long-q sets and checked on
    ``rect-long-q-edges-check``).
    Calls at head dims that are not multiples of 8 are never short: SDPA runs them on flash only,
    padded, slower than the kernel at every measured size (:func:`goes_to_sdpa`).
    Calls with ``return_lse`` go by the same limits where their head dim is a multiple of 8 up to
    ``lse_head_dim`` (:func:`lse_to_sdpa`; :func:`select` lowers it to what the cuDNN present
    runs, :data:`CUDNN_LSE_HEAD_DIMS`)."""

    head_dim_above: int
    length: int
    length_unaligned: int
    length_gqa: int
    length_gqa_d64: int
    length_gqa_aligned: int
    length_causal: int
    length_causal_d64: int
    length_padded: int
    length_causal_padded: int
    length_causal_padded_d64: int
    length_192: int
    length_causal_192: int
    pairs_192: int
    length_192_gqa: int
    length_causal_192_gqa: int
    pairs_192_gqa: int
    length_192_gqa_aligned: int
    pairs: int
    pairs_unaligned: int
    pairs_gqa: int
    pairs_causal: int
    pairs_causal_gqa: int
    length_causal_long: int
    pairs_causal_long: int
    grid_base: int
    grid_base_long: int
    grid_long: int
    long_q: int
    sms: int
    lse_head_dim: int


#: The query and key tile of cuDNN's attention: lengths that are multiples of it run at its best
#: rate (4 x 16 / 2 at D=192 on the H100: 407.5 µs at 2112, 393.8 at 2176, 442.0 at 2240;
#: …-f8ee2e6-crossover-wide-gqa-edge-check.md), others up to ~20 % slower per pair
#: (HandOver.length_192_gqa_aligned).
CUDNN_TILE = 128

#: Query heads per K/V head from which causal calls take HandOver.pairs_causal_gqa (4 until the
#: ``gqa-small`` set measured 2 and 3, …-8e86603-crossover-padded-gqa-small.md).
GQA_GROUP = 2


#: The wgmma kernel (cuda_sm90) on sm90 parts with the H100's tensor rate per SM (H100, H800,
#: GH200; the H200 takes H200_SM90 below: these but for non-causal limits), measured on an H100 beside SDPA
#: with bench/crossover.py: short square and rectangular calls, head dims above 128 (on 192 of
#: 256 columns at 129-192), padded head dims, GQA, causal pair counts, lengths off cuDNN's tile,
#: each with and without the LSE. Which run set each value, and the checks after it:
#: bench/HANDOVER.md ("Each limit's derivation"); tests/test_dispatch.py holds the recorded runs
#: against these values.
GH100_SM90 = HandOver(head_dim_above=MAX_HEAD_DIM,  # no head dim handed over
                      length=2048, length_unaligned=1792, length_gqa=1472, length_gqa_d64=1472,
                      length_gqa_aligned=1664,
                      length_causal=3072, length_causal_d64=4096, length_padded=8192,
                      length_causal_padded=3072, length_causal_padded_d64=5120,
                      length_192=3072, length_causal_192=5120, pairs_192=1 << 29,
                      length_192_gqa=2080, length_causal_192_gqa=4096, pairs_192_gqa=1 << 28,
                      length_192_gqa_aligned=2080,
                      pairs=1 << 28, pairs_unaligned=1 << 28, pairs_gqa=1 << 28, pairs_causal=3 << 28,
                      pairs_causal_gqa=1 << 29,
                      length_causal_long=6144, pairs_causal_long=1 << 29,
                      grid_base=0, grid_base_long=0, grid_long=0, long_q=0, sms=132, lse_head_dim=256)
#: The other kernels on those GPUs (Triton, the mma.sync ones: the sm90 extension missing) take
#: the same short-call limits, and hand every head dim above 128 to SDPA: they reach 78-259
#: TOPS at D=256 against cuDNN's 438-691 (N 1k-16k, …-15c809f-d256.md).
#: The causal limits (a length, two pair limits) as they were before the H100's three-consumer
#: switch-over moved (23bd5da), kept where they were not measured again: the other kernels.
_CAUSAL_BEFORE_NC3 = dict(length_causal_padded=3584, pairs_causal=1 << 30, pairs_causal_long=1 << 30)
#: Likewise the non-causal length before lengths off cuDNN's tile and GQA calls were measured apart
#: (the ``unaligned`` set): one length for every call at head dims up to 128.
_NON_CAUSAL_ONE_LENGTH = dict(length_unaligned=2048, length_gqa=2048, length_gqa_d64=2048, length_gqa_aligned=2048)
GH100_OTHERS = GH100_SM90._replace(head_dim_above=128, **_CAUSAL_BEFORE_NC3, **_NON_CAUSAL_ONE_LENGTH)
#: The wgmma kernel on the H200: the H100's limits, checked there on the same sets, but for
#: non-causal calls off cuDNN's tile or with GQA, which it keeps from shorter calls (its faster
#: memory makes the quantization cheaper: at head dims up to 128 set on the ``unaligned`` and
#: ``unaligned-check`` sets at b55e7ac and 6329c6b, GQA off the tile moved to 1216 on
#: ``short-h200-check`` (b4ae6b0), at D=64 to 896 and off the tile on few heads a pair limit of
#: 2^27 on ``short-gqa-d64`` and ``unaligned-pairs`` (a974ba0), since 11 x 2^23 with the round
#: fill model (grid_slower) above it, fitted on its runs and ``fill-check`` (56400b3) and checked on
#: ``grid-check``; at 129-192 on the wide GQA sets; bench/HANDOVER.md, "The H200's row"; and many
#: queries on 512-1535 keys by the pair limits alone, long_q, on the rect-long-q sets, ibid.,
#: "Decode, cross-attention and Nq ≠ Nk"). The GH200 keeps the H100's row: not measured.
H200_SM90 = GH100_SM90._replace(length_unaligned=1472, length_gqa=1216, length_gqa_d64=896, length_gqa_aligned=1536,
                                pairs_unaligned=11 << 23, pairs_gqa=1 << 27,
                                grid_base=900, grid_base_long=770, grid_long=4096, long_q=2,
                                length_192_gqa=1344, length_192_gqa_aligned=1664, pairs_192_gqa=3 << 26)

_GH100 = r"\b(H100|H800|H200|GH200)\b"
_H200 = r"\bH200\b"  # not GH200: no word boundary between G and H

#: Per compute capability, which calls ``sageattn`` hands to SDPA: rows of (GPU name pattern,
#: backend, limits); the first row whose pattern is found (``re.search``) in the GPU's name and
#: whose backend is the chosen one (None: any) wins; no row, or none that matches: no hand-over
#: (the chosen kernel runs every call, as upstream's sageattn). Where the limits come from
#: depends on the tensor rate and the memory bandwidth, so a row names the parts it was measured
#: on or that share their chip and rates: the H20, an sm90 part with a fraction of the H100's
#: tensor rate, is not one of them (not measured: the quantized kernels' advantage there is
#: larger, and the limits would hand over calls they win).
HAND_OVER: Dict[Tuple[int, int], Tuple[Tuple[str, Optional[str], HandOver], ...]] = {
    (9, 0): ((_H200, "cuda_sm90", H200_SM90), (_GH100, "cuda_sm90", GH100_SM90), (_GH100, None, GH100_OTHERS)),
}


def hand_over_for(capability: Tuple[int, int], gpu_name: str, backend: str) -> Optional[HandOver]:
    """The :data:`HAND_OVER` limits for ``backend`` on a GPU of ``capability`` named ``gpu_name``
    (None: none)."""
    for pattern, for_backend, limits in HAND_OVER.get(tuple(capability), ()):
        if for_backend in (None, backend) and re.search(pattern, gpu_name):
            return limits
    return None

#: Backends to try, best first, per compute capability. Capabilities not listed (>= sm80)
#: get :data:`DEFAULT_PREFERENCE`. Why each row is what it is: README.md, "Supported GPUs and known limits".
#: sm90: the wgmma kernel (cuda_sm90); without it Triton, which an H100 runs 2x faster than
#: the mma.sync kernels (bench/NOTES.md).
PREFERENCE: Dict[Tuple[int, int], Tuple[Choice, ...]] = {
    (8, 0): (_FP16, _TRITON),
    (8, 6): (_FP16, _TRITON),
    (8, 7): (_FP16, _TRITON),
    (8, 9): (_FP8_SM89, _TRITON),
    (9, 0): (_SM90, _TRITON, _FP16),
    (12, 0): (_FP8_SM120, _TRITON),
    (12, 1): (_FP8_SM120, _TRITON),
}
DEFAULT_PREFERENCE: Tuple[Choice, ...] = (_TRITON,)


class UnsupportedGPUError(RuntimeError):
    """The GPU is older than sm80 (Ampere)."""


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_status() -> Tuple[bool, str]:
    """Whether Triton imports here, and why not."""
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed (pip install triton; on Windows: triton-windows)"
    try:
        importlib.import_module("triton")
    except Exception as exc:  # a broken install should read as "not available", with the cause
        return False, f"triton failed to import: {exc}"
    return True, ""


def extension_status(module: str) -> Tuple[bool, str]:
    """Whether a compiled kernel module is in this build, and why not."""
    from . import _ops

    return _ops.status(module)


def backend_status(name: str, capability: Optional[Tuple[int, int]]) -> Tuple[bool, str]:
    """Whether backend ``name`` can run on a GPU of ``capability`` (None: the interpreter)."""
    b = BACKENDS[name]
    if capability is not None:
        if capability < b.min_capability:
            return False, f"needs sm{b.min_capability[0]}{b.min_capability[1]} or newer"
        if b.only_capability is not None and capability != b.only_capability:
            return False, f"built for sm{b.only_capability[0]}{b.only_capability[1]} only"
    elif b.extension is not None:
        return False, "compiled kernels need a GPU"
    if b.extension is None:
        return triton_status()
    return extension_status(b.extension)


def capability_of(device: Optional[torch.device] = None) -> Optional[Tuple[int, int]]:
    """Compute capability of a CUDA device; None for a CPU device under Triton's interpreter."""
    if device is not None and torch.device(device).type == "cpu":
        return None
    return tuple(torch.cuda.get_device_capability(device))


def _gpu_name(device) -> str:
    try:
        return torch.cuda.get_device_name(device)
    except Exception:
        return "this GPU"


def select(capability: Optional[Tuple[int, int]], available: Sequence[str], gpu_name: str = "this GPU",
           cudnn_version: Optional[int] = None, sm_count: Optional[int] = None) -> Tuple[Choice, Optional[str]]:
    """Pure policy: the choice for ``capability`` given the backends ``available``, with the
    hand-over limits for a GPU named ``gpu_name`` (:func:`hand_over_for`), their LSE head dims
    no wider than cuDNN ``cudnn_version`` runs (:func:`cudnn_lse_head_dim`), their ``sms`` the
    GPU's ``sm_count`` where given.

    Returns ``(choice, skipped)`` where ``skipped`` names the preferred backend that was
    missing (for the fallback warning) or is None. Raises UnsupportedGPUError below sm80.
    """
    if capability is None:  # Triton interpreter on the CPU
        if "triton" not in available:
            raise RuntimeError("sageattn: Triton is not available to run on the CPU interpreter")
        return _TRITON, None
    if tuple(capability) < MIN_CAPABILITY:
        raise UnsupportedGPUError(
            f"sageattn: {gpu_name} has compute capability {capability[0]}.{capability[1]} "
            f"(sm{capability[0]}{capability[1]}); sageattention needs sm80 (Ampere) or newer. "
            "Use torch.nn.functional.scaled_dot_product_attention on this GPU"
        )
    prefs = PREFERENCE.get(tuple(capability), DEFAULT_PREFERENCE)
    for choice in prefs:
        if choice.backend in available:
            skipped = prefs[0].backend if choice is not prefs[0] else None
            limits = hand_over_for(capability, gpu_name, choice.backend)
            if limits is not None:
                limits = limits._replace(lse_head_dim=min(limits.lse_head_dim, cudnn_lse_head_dim(cudnn_version)),
                                         sms=sm_count or limits.sms)
            return replace(choice, hand_over=limits), skipped
    missing = ", ".join(c.backend for c in prefs)
    raise RuntimeError(
        f"sageattn: no kernel for {gpu_name} (sm{capability[0]}{capability[1]}) is available "
        f"(tried {missing}); install triton or a build of sageattention with CUDA kernels"
    )


def available_backends(device=None) -> List[str]:
    """Names of the backends that can run on ``device`` (default: the current CUDA device).

    Returns an empty list when no CUDA GPU is present (except under Triton's interpreter).
    """
    if device is None and not torch.cuda.is_available():
        return ["triton"] if _interpreting() and triton_status()[0] else []
    cap = capability_of(device)
    return [n for n in BACKENDS if backend_status(n, cap)[0]]


def report(device=None) -> Dict[str, str]:
    """Every backend with 'available' or the reason it is not, for ``python -m sageattention``."""
    cap = capability_of(device) if (device is not None or torch.cuda.is_available()) else None
    out = {}
    for name in BACKENDS:
        ok, why = backend_status(name, cap)
        out[name] = "available" if ok else why
    return out


def _cudnn_version() -> Optional[int]:
    """torch.backends.cudnn.version() (the cuDNN torch loads), or None where torch has none."""
    try:
        return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # a cuDNN that fails to load is no cuDNN to hand calls to
        return None


def _sm_count(device) -> Optional[int]:
    """The GPU's streaming multiprocessors (None where torch cannot say)."""
    try:
        return torch.cuda.get_device_properties(device).multi_processor_count
    except Exception:
        return None


_warned: set = set()
#: choose's Choices by (capability, GPU name) and ("device", type, index); chosen's constants by
#: ("chosen", type, index)
_cache: Dict[tuple, Any] = {}


def _device_key(device) -> Tuple[torch.device, tuple]:
    """``device`` as a torch.device, and the key of its entries in ``_cache`` (an index-less
    "cuda" is the current device)."""
    if not isinstance(device, torch.device):
        device = torch.device(device)
    index = device.index
    if index is None and device.type == "cuda":
        index = torch.cuda.current_device()
    return device, (device.type, index)


def choose(device: torch.device) -> Choice:
    """The backend ``sageattn`` runs on ``device``, warning once per GPU kind on a fallback."""
    # by device first: reading the capability costs more than the rest of a short call's checks
    device, where = _device_key(device)
    dkey = ("device",) + where
    cached = _cache.get(dkey)
    if cached is not None:
        return cached
    cap = capability_of(device)
    name = _gpu_name(device) if cap is not None else "CPU"
    key = (cap, name)
    cached = _cache.get(key)
    if cached is not None:
        _cache[dkey] = cached
        return cached
    avail = [n for n in BACKENDS if backend_status(n, cap)[0]]
    choice, skipped = select(cap, avail, name, _cudnn_version() if cap is not None else None,
                             _sm_count(device) if cap is not None else None)
    if skipped is not None and (cap, skipped) not in _warned:
        _warned.add((cap, skipped))
        warnings.warn(
            f"sageattn: the {skipped} kernel preferred on sm{cap[0]}{cap[1]} is not in this build "
            f"({backend_status(skipped, cap)[1]}); using {choice.backend} instead "
            "(README.md, 'What is in this release').",
            RuntimeWarning,
            stacklevel=3,
        )
    _cache[key] = _cache[dkey] = choice
    return choice


@torch.compiler.assume_constant_result
def chosen(device: torch.device) -> Tuple[str, Tuple[Tuple[str, str], ...], Optional[Tuple[int, ...]]]:
    """``choose`` as constants (backend name, option pairs, hand_over as a plain tuple):
    torch.compile folds the decision into the graph instead of tracing the environment checks
    behind it. Built once per device (``_cache``), as every sageattn call asks."""
    device, where = _device_key(device)
    ckey = ("chosen",) + where
    hit = _cache.get(ckey)
    if hit is None:
        c = choose(device)
        hit = _cache[ckey] = (c.backend, tuple(sorted(c.options.items())),
                              tuple(c.hand_over) if c.hand_over is not None else None)
    return hit


def on_tile(length: int, length_aligned: int, aligned: bool) -> int:
    """A GQA length limit, at least ``length_aligned`` for calls whose Nq and Nk are multiples of
    :data:`CUDNN_TILE` (``aligned``: cuDNN runs those best, so the kernel passes it later)."""
    return max(length, length_aligned) if aligned else length


def call_limits(lim: HandOver, head_dim: int, causal: bool, gqa: bool, aligned: bool,
                long_causal: bool = False) -> Tuple[int, int]:
    """The ``(length, pairs)`` limits of :func:`short_call` for one kind of call: ``causal`` with
    as many keys as queries (short_call reduces the other causal calls to that or to non-causal),
    ``gqa`` with :data:`GQA_GROUP` or more query heads per K/V head, ``aligned`` with Nq and Nk
    multiples of :data:`CUDNN_TILE`, ``long_causal`` causal from ``lim.length_causal_long``
    queries. ``python -m sageattention`` prints its table from here."""
    length, pairs = lim.length, lim.pairs
    if causal:
        length = lim.length_causal_d64 if head_dim <= 64 else lim.length_causal
        pairs = lim.pairs_causal_gqa if gqa else lim.pairs_causal
        if long_causal and head_dim <= 128:
            pairs = min(pairs, lim.pairs_causal_long)
        if head_dim < 64:  # run as 64 columns, zero-padded
            length = max(length, lim.length_causal_padded_d64)
        elif 64 < head_dim < 128:  # run as 128
            length = max(length, lim.length_causal_padded)
    elif head_dim <= 128:  # non-causal: cuDNN runs lengths off its tile slower, and GQA calls
        # quantize K and V of fewer heads
        if gqa:
            length = on_tile(lim.length_gqa_d64 if head_dim == 64 else lim.length_gqa, lim.length_gqa_aligned, aligned)
            pairs = lim.pairs_gqa
        elif not aligned:
            length, pairs = lim.length_unaligned, lim.pairs_unaligned
    if 128 < head_dim <= 192:  # run on 192 of MAX_HEAD_DIM's columns, zero-padded
        if causal:
            length = max(length, lim.length_causal_192_gqa if gqa else lim.length_causal_192)
            pairs = max(pairs, lim.pairs_192_gqa if gqa else lim.pairs_192)
        else:  # as they are: the H200's GQA limits are below those of head dims up to 128
            length = on_tile(lim.length_192_gqa, lim.length_192_gqa_aligned, aligned) if gqa else lim.length_192
            pairs = lim.pairs_192_gqa if gqa else lim.pairs_192
    elif 192 < head_dim < MAX_HEAD_DIM:  # run as MAX_HEAD_DIM, zero-padded
        length = max(length, lim.length_padded)
    return length, pairs


#: Keys from which the Hopper kernel runs D=128 (and 65-127) on three consumer warpgroups, 192
#: query rows per work tile, not 128 (SAGE_SM90_NC3_KEYS in csrc/kernels/attn_sm90.cuh, non-causal,
#: V in one term; D <= 64 always runs 192). Below it, from :data:`SM90_NC3_ROUNDS_KEYS` keys, it
#: runs 192 where that takes enough fewer rounds of work tiles (:func:`sm90_rows`).
SM90_NC3_KEYS = 1536
#: SAGE_SM90_NC3_ROUNDS_KEYS and SAGE_SM90_NC3_ROUNDS (per mille) in csrc/kernels/attn_sm90.cuh
SM90_NC3_ROUNDS_KEYS = 512
SM90_NC3_ROUNDS = 1286


def work_tiles(heads: int, len_q: int, rows: int) -> int:
    """Work tiles of ``rows`` query rows over ``heads`` (B·Hq) heads of ``len_q`` queries, the
    last of each head partly filled (the Hopper kernel's sm90_tiles; cuDNN's with its tile)."""
    return heads * -(-len_q // rows)


def sm90_rows(heads: int, len_q: int, len_k: int, head_dim: int, sms: int) -> int:
    """Query rows per work tile of the Hopper kernel on a non-causal call of ``heads`` (B·Hq) query
    heads with V in one term, as sm90_consumers (csrc/kernels/attn_sm90_host.cu) chooses them:
    128 above head dim 128; 192 (three consumers) up to 64 and from :data:`SM90_NC3_KEYS` keys; from
    :data:`SM90_NC3_ROUNDS_KEYS` keys where ``SM90_NC3_ROUNDS`` / 1000 times the rounds of 192-row
    tiles over ``sms`` SMs is under those of 128-row tiles; else 128 (two)."""
    if head_dim > 128:  # the D=256 kernel: two consumers
        return 128
    if head_dim <= 64 or len_k >= SM90_NC3_KEYS:
        return 192
    if len_k < SM90_NC3_ROUNDS_KEYS or sms <= 0:
        return 128
    r2, r3 = (-(-work_tiles(heads, len_q, rows) // sms) for rows in (128, 192))
    return 192 if SM90_NC3_ROUNDS * r3 < 1000 * r2 else 128


def round_fill(tiles: int, slots: int) -> float:
    """How full the rounds are that ``tiles`` equal work tiles take on ``slots`` at a time."""
    return tiles / (slots * -(-tiles // slots))


def grid_slower(lim: HandOver, heads: int, len_q: int, len_k: int, head_dim: int) -> bool:
    """Whether the kernel is expected slower than cuDNN on a non-causal call of ``heads`` (B·Hq)
    query heads by the round fill model: its time over cuDNN's is ``base`` (``lim.grid_base``, from
    ``lim.grid_long`` keys ``lim.grid_base_long``, per mille: the ratio at equal fill) times cuDNN's
    round fill over its own, the kernel's persistent CTAs taking one work tile of 192 or 128 query
    rows (:func:`sm90_rows`) per SM per round and cuDNN one 128-row tile (bench/HANDOVER.md,
    "Rounds of work tiles")."""
    rows = sm90_rows(heads, len_q, len_k, head_dim, lim.sms)
    ours = round_fill(work_tiles(heads, len_q, rows), lim.sms)
    cudnn = round_fill(work_tiles(heads, len_q, CUDNN_TILE), lim.sms)
    base = lim.grid_base_long if len_k >= lim.grid_long else lim.grid_base
    return base * cudnn >= 1000 * ours


def as_hand_over(limits: Sequence[int]) -> HandOver:
    """``limits`` as a :class:`HandOver`: chosen() passes them as a plain tuple (a constant to
    torch.compile), goes_to_sdpa passes its HandOver on to short_call."""
    return limits if isinstance(limits, HandOver) else HandOver(*limits)


def long_q_call(lim: HandOver, len_q: int, len_k: int, head_dim: int, causal: bool) -> bool:
    """Whether :func:`short_call` takes a call by ``lim.long_q`` (many queries on few keys; 0:
    never): non-causal, head dim 65-128, :data:`SM90_NC3_ROUNDS_KEYS` up to :data:`SM90_NC3_KEYS`
    keys and at least ``long_q`` times as many queries."""
    return bool(lim.long_q and not causal and 64 < head_dim <= 128 and SM90_NC3_ROUNDS_KEYS <= len_k < SM90_NC3_KEYS
                and len_q >= lim.long_q * len_k)


def short_call(limits: Sequence[int], batch: int, heads_q: int, len_q: int, len_k: int, head_dim: int,
               causal: bool, heads_kv: Optional[int] = None) -> bool:
    """Whether a call is too small for the quantized kernel by the :class:`HandOver` ``limits``
    (``heads_kv``: K/V heads, as many as query heads when not given), the limits of its kind
    being :func:`call_limits`'.

    Causal calls (top-left) with more keys than queries count as square calls of ``Nq``:
    sageattn drops the keys they never see (core._visible_keys). With fewer keys than queries
    most rows see every key, and the non-causal limits put all 9 measured shapes on their
    faster side (the ``causal-rect`` set, bench/results/…-8b3577e-crossover-causal-rect.md); so
    does the round fill model (:func:`grid_slower`) where it applies, not measured for them."""
    lim = as_hand_over(limits)
    gqa = heads_q >= GQA_GROUP * (heads_kv or heads_q)
    kernel_causal = causal  # the kernel runs causal calls on its causal consumer counts, whatever the lengths
    if causal:
        len_k = min(len_k, len_q)
        causal = len_q == len_k
    aligned = len_q % CUDNN_TILE == 0 and len_k % CUDNN_TILE == 0
    length, pairs = call_limits(lim, head_dim, causal, gqa, aligned, causal and len_q >= lim.length_causal_long)
    n = batch * heads_q * len_q * len_k
    if long_q_call(lim, len_q, len_k, head_dim, kernel_causal):
        # many queries on few keys (three consumers, sm90_rows): the pair limit of the call's kind
        # alone (GQA's, or off cuDNN's tile pairs_unaligned), not the length nor the round fill model
        return n < pairs
    # L < length, without the division: 2 Nq Nk < length (Nq + Nk)
    if 2 * len_q * len_k < length * (len_q + len_k) or n < pairs:
        return True
    # non-causal calls off the tile, not GQA, at head dims up to 128, from their pair limit
    # (pairs_unaligned) up to lim.pairs: by the rounds of work tiles where grid_base is set (H200)
    off_tile = not causal and not gqa and not aligned and head_dim <= 128
    return bool(lim.grid_base and off_tile and n < lim.pairs and grid_slower(lim, batch * heads_q, len_q, len_k, head_dim))


#: The head dims torch's cuDNN attention runs on sm90 (torch's check_cudnn_tensor_shapes):
#: multiples of 8 up to 128, and up to 256 from cuDNN 9.10 on: ((cuDNN version from, limit), ...).
CUDNN_LSE_HEAD_DIMS = ((91000, 256), (0, 128))


def cudnn_lse_head_dim(cudnn_version: Optional[int]) -> int:
    """The largest head dim cuDNN ``cudnn_version`` (torch.backends.cudnn.version(); None: no
    cuDNN) runs on sm90, from :data:`CUDNN_LSE_HEAD_DIMS`; 0 without cuDNN."""
    if not cudnn_version:
        return 0
    return next(dim for since, dim in CUDNN_LSE_HEAD_DIMS if cudnn_version >= since)


def lse_to_sdpa(dims, max_head_dim: int) -> bool:
    """Whether a ``return_lse`` call can take its LSE from SDPA (_sdpa.sdpa_lse): a head dim
    that is a multiple of 8 up to ``max_head_dim`` (the limits' ``lse_head_dim``) and more than
    one key (torch's cuDNN attention refuses a single key)."""
    return dims.head_dim % 8 == 0 and dims.head_dim <= max_head_dim and dims.len_k > 1


def goes_to_sdpa(limits: Optional[Sequence[int]], dims, causal: bool, return_lse: bool) -> bool:
    """Whether ``sageattn`` hands this call (``dims``: _checks.Dims) to SDPA by the choice's
    :class:`HandOver` ``limits`` (None: never): a head dim above its limit, or a call too small
    for the kernel (:func:`short_call`) at a head dim that is a multiple of 8. With
    ``return_lse`` only where SDPA can give the LSE (:func:`lse_to_sdpa`); the other LSE calls
    keep our kernel."""
    if limits is None:
        return False
    lim = as_hand_over(limits)
    if return_lse and not lse_to_sdpa(dims, lim.lse_head_dim):
        return False
    if dims.head_dim > lim.head_dim_above:
        return True
    # Head dims that are not multiples of 8 SDPA runs only on flash, padded (cuDNN refuses them),
    # and there the kernel was 1.18-2.5x faster on every measured shape, from 1 x 16 x 2048^2 and
    # 4 x 32 x 1024^2 (…-ca170a2-crossover-odd-dims.md, …-194c756-crossover-wide-gqa-edge.md):
    # the limits, measured against cuDNN, are not theirs.
    return dims.head_dim % 8 == 0 and short_call(lim, dims.batch, dims.heads_q, dims.len_q, dims.len_k,
                                                 dims.head_dim, causal, dims.heads_kv)


#: ``sageattn_varlen`` on the Hopper kernel runs packed sequences as the entries of a batch
#: whose quantized buffers give every entry the longest one's rows (INT8 Q and K and e4m3 V;
#: the padding costs memory and the quantization's zero writes, not attention work: the kernel
#: skips the tiles past each sequence's end). Sequences are grouped so that in each group the
#: padded rows are at most this many times the rows its sequences have (the buffers then stay
#: within twice the size of the fp16/bf16 inputs); each group is one quantization and one
#: kernel launch.
VARLEN_PADDING = 4


def seen_keys(lens_q: Sequence[int], lens_k: Sequence[int], causal: bool) -> List[int]:
    """The keys each packed sequence's queries see: all of them, or (causal, top-left) the
    first Nq (the others are never attended, and the kernel is not given them)."""
    return [min(a, b) for a, b in zip(lens_k, lens_q)] if causal else list(lens_k)


def varlen_groups(backend: str, lens_q: Sequence[int], lens_k: Sequence[int],
                  causal: bool) -> Optional[List[List[int]]]:
    """How ``sageattn_varlen`` runs packed sequences (their query and key lengths) on the
    Hopper kernel (_cuda.forward_varlen): groups of sequence indices, longest first, each
    within :data:`VARLEN_PADDING`; sequences without queries or without a key their queries
    see (causal: among their first Nq keys) are in none. None (the Triton kernel) unless
    ``backend`` is ``cuda_sm90`` and some sequence has work."""
    if backend != "cuda_sm90":
        return None
    seen_k = seen_keys(lens_q, lens_k, causal)
    longest = [max(a, b) if a and b else 0 for a, b in zip(lens_q, seen_k)]
    # longest first, ties in index order (a reversed sort keeps equal items in their order)
    work = [i for i in sorted(range(len(longest)), key=longest.__getitem__, reverse=True) if longest[i]]
    groups: List[List[int]] = []
    g: List[int] = []
    mq = mk = rows = 0  # the group g's longest queries and keys and its rows, kept as it grows
    for i in work:
        nq, nk = lens_q[i], seen_k[i]
        mq2, mk2 = (mq if mq > nq else nq), (mk if mk > nk else nk)
        if g and (len(g) + 1) * (mq2 + mk2) <= VARLEN_PADDING * (rows + nq + nk):
            g.append(i)
            mq, mk, rows = mq2, mk2, rows + nq + nk
        else:
            g = [i]
            groups.append(g)
            mq, mk, rows = nq, nk, nq + nk
    return groups or None
