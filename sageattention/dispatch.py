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
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

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

    A call's length is ``L = 3·Nq·Nk / (Nq + 2·Nk)``: ``N`` when ``Nq == Nk``, and in general the
    attention's work (``Nq·Nk``) over the tokens the quantization pass reads (Q, K and V), scaled
    so. Below ``length`` (non-causal calls at head dims up to 128: ``length_unaligned`` where Nq or
    Nk is not a multiple of :data:`CUDNN_TILE`, which cuDNN runs slower per pair; with
    :data:`GQA_GROUP` or more query heads per K/V head ``length_gqa``, at least
    ``length_gqa_aligned`` where both are multiples; ``length_causal`` for causal calls,
    ``length_causal_d64`` for causal calls with head dim <= 64, ``length_padded`` for head dims
    between 192 and 256, which the kernel runs zero-padded to 256 while SDPA runs them at their
    width, ``length_192`` and ``length_causal_192`` for head dims 129-192, which it runs on 192 of
    those columns; for causal calls at the head dims it pads to 128 or 64,
    ``length_causal_padded`` and ``length_causal_padded_d64``) the quantization costs more than
    the kernel saves; below ``pairs`` (``pairs_causal``; ``pairs_192`` for head dims 129-192, at
    least the causal pair limit for causal calls there) of ``B·Hq·Nq·Nk`` the call is too small
    to fill the GPU; causal calls of ``length_causal_long`` keys or more
    at head dims up to 128 are short only below ``pairs_causal_long`` if that is lower (the
    kernel gains on cuDNN with the length, so long causal calls on few heads still beat it).
    Causal GQA calls with at least
    :data:`GQA_GROUP` query heads per K/V head take ``pairs_causal_gqa`` instead: the
    quantization reads K and V of fewer heads. At head dims 129-192 GQA calls with that many
    query heads per K/V head take ``pairs_192_gqa`` instead of ``pairs_192``, and
    ``length_192_gqa`` and ``length_causal_192_gqa`` instead of ``length_192`` and
    ``length_causal_192``. Non-causal calls at head dims 129-192 take ``length_192`` (``_gqa``)
    and ``pairs_192`` (``_gqa``) as they are, which may be below ``length`` and ``pairs`` (the
    H200's GQA calls there, where its kernel passes cuDNN from shorter calls than at D=128);
    non-causal GQA calls there whose query and key lengths are both multiples of
    :data:`CUDNN_TILE` take at least ``length_192_gqa_aligned`` (cuDNN runs those lengths
    best, so the kernel passes it later there); causal calls there take the larger of those and
    the causal limits.
    Calls at head dims that are not multiples of 8 are never short: SDPA runs them on flash only,
    padded, slower than the kernel at every measured size (:func:`goes_to_sdpa`).
    Calls with ``return_lse`` go by the same limits where their head dim is a multiple of 8 up to
    ``lse_head_dim`` (:func:`lse_to_sdpa`; :func:`select` lowers it to what the cuDNN present
    runs, :data:`CUDNN_LSE_HEAD_DIMS`)."""

    head_dim_above: int
    length: int
    length_unaligned: int
    length_gqa: int
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
    pairs_causal: int
    pairs_causal_gqa: int
    length_causal_long: int
    pairs_causal_long: int
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
#: GH200; the H200 takes H200_SM90 below, these but three limits), measured on an H100 beside SDPA
#: with bench/crossover.py:
#: - short calls (the ``square`` and ``rect`` sets,
#:   bench/results/2026-11-24-NVIDIA_H100_80GB_HBM3-9b0eced-crossover.md): the kernel passes
#:   cuDNN at L ~1950 (D=128) and ~2200 (D=64), causal at ~3300 and ~3950; with 16 heads it is
#:   1-16 % slower still at N=4096. The ``check`` set (…-22de8f1-crossover.md) agreed but for
#:   one shape: 32 heads at N=4096 causal, 8 % slower, hence the causal pair limit 2^30 (it was
#:   2^28 there). Since 23bd5da causal calls from 3072 keys run three consumers (2-7 % faster
#:   than two at D=128): the ``causal-pairs`` set (…-48feaa2-crossover-causal-pairs.md and its
#:   LSE twin; B x H of 16 to 80 at 3072-8192, 2^28.6-2^30.9 pairs) ran 1 x 24 x 6144^2
#:   (2^29.75) at 0.90 of cuDNN's time, 1 x 40 x 5120^2 0.91, 1 x 32 x 5120^2 0.95, 2 x 40 x
#:   3584^2 0.95 (LSE 1.03) and at D=80-96 0.80-0.87, all handed over by 2^30; below 3 x 2^28
#:   (2^29.58) 1.00-1.13 but 1 x 16 x 6144^2 (0.96): ``pairs_causal`` 3 x 2^28 on the H100
#:   (2 x 24 x 4096^2, exactly that, 1.00 / LSE 1.05, and the padded-causal-check set agree).
#:   A check on other head counts (…-149d2d2-crossover-causal-pairs-check.md, LSE twin) held it
#:   at 3584-5120 keys (0.95-1.07, each call within 5 % of its faster side) but ran 1 x 20 x 6144^2 and 1 x 12 x 7680^2 (2^29.3-2^29.5)
#:   at 0.91-0.93 (LSE 0.94-0.97): the kernel gains on cuDNN with the length, so from
#:   ``length_causal_long`` 6144 keys at head dims up to 128 ``pairs_causal_long`` 2^29. Checked
#:   after (…-a7413c4-crossover-causal-long.md, LSE twin; 4 to 16 heads at 6144-12288 keys,
#:   2^28.6-2^29.5, D=64, 96, 128): kept calls 0.82-1.03 of cuDNN's time, handed-over 0.95-1.03;
#: - head dims above 128 (the ``wide`` set, …-1389d44-crossover.md): at D=256 the same limits
#:   put every shape on its faster side (the kernel 0.67-0.91 of cuDNN's time from N=2048 at
#:   4 x 32 heads, 1.54 at 1024); at D=160 and 192 the kernel pays for 256 columns and cuDNN
#:   for the real width, so it passes cuDNN only at N ~4096 (non-causal, 0.96-1.19) to 8192
#:   (0.88-0.91; causal there 0.93-1.02): ``length_padded`` 8192, kept for head dims 193-255.
#:   Since 6022f5f the kernel computes 192 of the 256 columns for head dims 129-192 (the
#:   ``wide-narrow`` set at D=160 and 192, …-6022f5f-crossover-wide-narrow.md): non-causal, it
#:   passes cuDNN between N=2048 (1.12-1.18 at 4 x 32 heads) and 3072 (0.91-0.99), with 1 x 16
#:   heads at 4096 still 1.03-1.07 and at 6144 0.84-0.89; causal, between 4096 (4 x 32: 1.03-1.07)
#:   and 6144 (0.89-0.91), 1 x 16 at 6144 1.02-1.05 and at 8192 0.85-0.89: ``length_192`` 3072,
#:   ``pairs_192`` 2^29 (1 x 16 x 4096^2 is 2^28), ``length_causal_192`` 5120 (between the
#:   two measured lengths; 5120 itself was not measured). With GQA (the ``wide-gqa`` set, 4 and
#:   8 query heads per K/V head, …-3e35ead-crossover-wide-gqa.md) it passes cuDNN earlier:
#:   causal 4 x 32 / 8 at 4096 0.88-0.91, 1 x 32 / 4 at 4096 0.93-1.00, non-causal 1 x 32 / 4 at
#:   3072 (2^28.2 pairs) 0.90-0.98, which 5120 and 2^29 handed over: ``length_causal_192_gqa``
#:   4096, ``pairs_192_gqa`` 2^28 from GQA_GROUP query heads per K/V head; checked after on
#:   ``wide-gqa-check`` (2, 7 and 8 per K/V head, …-59ea616-crossover-wide-gqa-check.md: every
#:   call on its faster side, with the LSE too). Non-causal GQA calls there kept ``length_192``
#:   3072 until the kernel wrote O in column pairs at head dims below 192 (da6d172, 5-8 % faster
#:   at D 144-176): then ``wide-gqa-short`` (144-192; 4 x 32, 1 x 64, 2 x 40, all / 8) ran the
#:   kernel at 0.93-1.04 of the faster SDPA's time at N=2048, 0.87-0.95 at 2560 (1.01-1.12 at
#:   1792), and ``wide-gqa-short-check`` (136, 160, 184; 2, 7 and 8 per K/V head) at 0.88-1.02
#:   at 2304 and 0.81-0.95 at 2560-2816 (with the LSE 0.93-1.05 and 0.85-0.98), all of which 3072
#:   handed over (up to 24 % lost): ``length_192_gqa`` 2304 (…-da6d172-crossover-wide-gqa-short.md,
#:   -wide-gqa-short-check and their LSE twins). Each check after put the crossover lower:
#:   ``wide-gqa-edge`` (152, 168; 2176 0.90-0.98, …-194c756-…), ``wide-gqa-edge-check`` (2112
#:   0.87-0.99, 2176 0.96-1.09: cuDNN runs multiples of 128 best, …-f8ee2e6-…),
#:   ``wide-gqa-2112`` (72 and 96 query heads: 2080 0.81-0.97, …-a440fbd-…): ``length_192_gqa``
#:   2080, set on all five runs (none left to check it), three calls 7-9 % from their faster side
#:   (4 x 32 / 8 x 2048^2 at D=176 handed over, kernel 0.93; 2 x 40 / 20 x 2176^2 with the LSE
#:   kept, 1.07-1.09): the crossover moves with the call's head count and N by ±10 %, more
#:   than one length can follow. Head dims the kernel pads to
#:   64 or 128 (the ``padded`` set: 32, 48, 80, 96, 112, …-8e86603-crossover-padded-gqa-small.md)
#:   keep the non-causal limits of 64 and 128 (the worst call 4 % from the faster side, 1 x 16 x
#:   4096^2 at D=96). Causal ones cross later: 3072 at D=80-112 and 4096 at D=32-48 ran 1-12 %
#:   faster on cuDNN (with the LSE the most), 3584 and 5120 within 3 % either way, 4096 and 6144
#:   faster in the kernel (the ``padded-causal`` set, …-9e96397-crossover-padded-causal.md and
#:   …-9e96397-crossover-lse-padded-causal.md): ``length_causal_padded`` 3584,
#:   ``length_causal_padded_d64`` 5120 (on an H200, …-a85d959-crossover-padded-gqa-small.md, every
#:   call with these within 5.1 % of the faster side). Since 23bd5da causal calls from 3072 keys
#:   run three consumers (5-11 % faster at D=96 than two, …-e74cd20-consumers.md), and the same
#:   set again (…-bae882e-crossover-padded-causal.md, LSE twin) ran 4 x 32 x 3072 at D=80-112 at
#:   0.89-0.97 of cuDNN's time (LSE 0.94-1.03), with a check on other heads
#:   (…-bae882e-crossover-padded-causal-check.md: 8 x 32 / 8 at 3072 0.73, 2 x 40 0.95, 1 x 32
#:   1.05-1.06, LSE 1.08-1.13, which the causal pair limit hands over): ``length_causal_padded``
#:   3072, the length of D=128 (the other kernels keep 3584 and a causal pair limit of 2^30:
#:   not measured since; the H200 takes 3072 too, checked there at 5a7acc2);
#: - GQA (the ``gqa`` set: 4, 7 and 8 query heads per K/V head, …-fa8b53b-crossover-gqa.md and
#:   …-fa8b53b-crossover-lse-gqa.md): the kernel quantizes K and V of fewer heads and gains
#:   6-19 % on cuDNN, which the lengths absorb but not the causal pair limit: 2 x 28 / 4 heads
#:   at N=4096 causal (2^29.8 pairs) ran 7-14 % faster in the kernel, and so did 1 x 32 / 4 at
#:   4096 (2^29). With 2 and 3 (the ``gqa-small`` set, …-8e86603-crossover-padded-gqa-small.md)
#:   likewise: 2 x 24 / 8 and 1 x 48 / 24 at N=4096 causal (2^29.6) ran 4-6 % faster in the
#:   kernel and are the only shapes of the set that the lower limit moves.
#:   Causal calls with 2 or more query heads per K/V head take 2^29;
#: - with ``return_lse`` (torch's cuDNN attention with its LSE, ``crossover.py --lse``): the same
#:   limits up to D=128 (…-abe33cf-crossover-lse-square.md, …-8b3577e-crossover-lse-rect.md) and
#:   at D=160, 192 and 256 (…-d563465-crossover-lse-wide.md, cuDNN 9.19: every shape within 4.2 %
#:   of the faster, the calls handed over 1.02-2.85x faster than the kernel).
#: - off cuDNN's tile and with GQA (non-causal, head dims up to 128; every run above had lengths
#:   that are multiples of 128 but 64 queries on 4096 keys): the ``unaligned`` set
#:   (…-75b30ed-crossover-unaligned-unaligned-causal.md; D 64 and 128, 4 x 32, 1 x 32 and 4 x 32 / 8,
#:   N 1344-2112) had the kernel at 0.93 of SDPA's time at 1856 and 1984 (4 x 32), from 1600 at
#:   0.89 with GQA (0.90 from 1472 at D=64), all handed over by 2048, and about even at 1536 and
#:   1792 with GQA: ``length_unaligned`` 1792, ``length_gqa`` 1472, ``length_gqa_aligned`` 1664
#:   (1792 at first; 1664 after its check, where four GQA calls on the tile ran 0.85-1.00 there).
#:   Checked on ``unaligned-check`` (other heads, 2 to 8 query heads per K/V head, D=96, Nq != Nk;
#:   H100 with and without the LSE, …-02d03a7-crossover-unaligned-check.md, and the H200 with the
#:   same limits, …-NVIDIA_H200-ace133f-*): over the 363 calls of the six runs 1.16 % over the
#:   faster side on average, 25 more than 6 % off, the worst 1.17; with 2048 for all 6.06 %, 141
#:   and 1.30 (tests/test_dispatch.py, UNALIGNED_RUNS). Most misses left: D=96 off the tile
#:   (cuDNN slow there, kernel 0.89-0.94 at 1700-1760) and Nq != Nk (L weighs them one way).
#:   The causal limits held on ``unaligned-causal`` (with the LSE none more than 6 % off).
GH100_SM90 = HandOver(head_dim_above=MAX_HEAD_DIM,  # no head dim handed over
                      length=2048, length_unaligned=1792, length_gqa=1472, length_gqa_aligned=1664,
                      length_causal=3072, length_causal_d64=4096, length_padded=8192,
                      length_causal_padded=3072, length_causal_padded_d64=5120,
                      length_192=3072, length_causal_192=5120, pairs_192=1 << 29,
                      length_192_gqa=2080, length_causal_192_gqa=4096, pairs_192_gqa=1 << 28,
                      length_192_gqa_aligned=2080,
                      pairs=1 << 28, pairs_causal=3 << 28, pairs_causal_gqa=1 << 29,
                      length_causal_long=6144, pairs_causal_long=1 << 29, lse_head_dim=256)
#: The other kernels on those GPUs (Triton, the mma.sync ones: the sm90 extension missing) take
#: the same short-call limits, and hand every head dim above 128 to SDPA: they reach 78-259
#: TOPS at D=256 against cuDNN's 438-691 (N 1k-16k, …-15c809f-d256.md).
#: The causal limits (a length, two pair limits) as they were before the H100's three-consumer
#: switch-over moved (23bd5da), kept where they were not measured again: the other kernels.
_CAUSAL_BEFORE_NC3 = dict(length_causal_padded=3584, pairs_causal=1 << 30, pairs_causal_long=1 << 30)
#: Likewise the non-causal length before lengths off cuDNN's tile and GQA calls were measured apart
#: (the ``unaligned`` set): one length for every call at head dims up to 128.
_NON_CAUSAL_ONE_LENGTH = dict(length_unaligned=2048, length_gqa=2048, length_gqa_aligned=2048)
GH100_OTHERS = GH100_SM90._replace(head_dim_above=128, **_CAUSAL_BEFORE_NC3, **_NON_CAUSAL_ONE_LENGTH)
#: The wgmma kernel on the H200: the H100's limits, checked there (the non-causal lengths off
#: cuDNN's tile and with GQA on …-NVIDIA_H200-ace133f-crossover-unaligned*.md; …-NVIDIA_H200-f331d83-h200.md:
#: the square, rect and check sets; …-a85d959-crossover-padded-gqa-small.md; at head dims 129-192
#: …-NVIDIA_H200-78df896-crossover-wide-narrow.md, -wide-gqa and -wide-gqa-check, the first two
#: with the LSE too; the causal limits of the three-consumer kernel on the five sets they were
#: set and checked on, with and without the LSE, 132 calls:
#: …-NVIDIA_H200-5a7acc2-crossover-causal-pairs.md and the others of that run), but for three
#: (``length_192_gqa``, ``length_192_gqa_aligned`` and ``pairs_192_gqa``, below). Until that
#: causal run the H200 kept the H100's causal limits from before the switch-over moved (3584 at
#: head dims 65-127, 2^30 pairs): 45 of the 132 calls went more than 6 % from their faster side,
#: the kernel up to 28 % faster (8 x 32 / 8 x 3072^2 causal at D=96 handed over: 0.72 of cuDNN's
#: time); with the H100's limits 3, the worst 8.7 % (2 x 40 x 3072^2 causal at D=96, handed over
#: with the kernel at 0.92). Its memory (4.8 TB/s against 3.35) makes the quantization cheaper,
#: and with GQA the kernel reads K and V of fewer heads: non-causal calls at head dims 129-192
#: with 2 or more query heads per K/V head cross at shorter lengths than on the H100, and where
#: they cross moves by ±10 % with the head count, the head dim and whether the lengths are
#: multiples of cuDNN's 128-row tile (:data:`CUDNN_TILE`). After the column-pair stores at D
#: 129-191 (79a6f1a) each check found the crossover below the limit it checked: 2048 (set on
#: ef638f6's four sets, checked by 8da278a's), 1920 (…-506c02d-crossover-wide-gqa-1920-check.md),
#: 1856 (…-3bf4edb-…-1856-check.md). A ladder of multiples of 128
#: (…-80adc06-crossover-wide-gqa-below.md: 96-192 heads, D 136-192) put it between 1408 and past
#: 1664 (kernel / SDPA 0.87-1.06 at 1664), while lengths between multiples of 128 ran 0.79-1.03
#: in the kernel from 1344 (its check, …-wide-gqa-below-check.md): cuDNN's time per pair is 12-20
#: % worse there (1440 and 1568 against 1408 and 1536 on the same heads, in the check below).
#: Hence ``length_192_gqa`` 1344 and ``length_192_gqa_aligned`` 1664 (Nq and Nk both multiples of
#: 128), ``pairs_192_gqa`` 3 x 2^26 (since c77a248; 1 x 48 / 16 x 2048^2 exactly). Checked after
#: on 64 calls none of those had (…-b57d29c-crossover-wide-gqa-aligned-check.md: 128-192 heads, D
#: 184 and 144, N 1216-1792): 13 more than 6 % from their faster side, all handed over with the
#: kernel 6-17 % faster (128 heads or more at 1216-1312, and at D=184 the multiples of 128 at
#: 1408-1536); 41 with 1856. Over all 706 calls of the 18 runs since the pair stores the calls
#: cost 1.03 % over their faster side's time on average, 53 more than 6 % off, worst 1.21 (1 x 64
#: / 32 x 1792^2 at D=192 with the LSE, kept); 1920 gave 3.44 %, 167 and 1.28
#: (…-CPU-b57d29c-route-check.md; held by tests/test_dispatch.py, H200_GQA_192_RUNS). Not moved
#: after that check, which would set them on the run that checks them; calls of many heads under
#: 1344 were not measured. (Before the pair stores the H200 kept these calls from 2560,
#: …-dbe9fc0- and …-c748037-crossover-wide-gqa-short*.md.)
#: The GH200 (HBM3 or HBM3e) keeps the H100's row: not measured.
H200_SM90 = GH100_SM90._replace(length_192_gqa=1344, length_192_gqa_aligned=1664, pairs_192_gqa=3 << 26)

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
#: get :data:`DEFAULT_PREFERENCE`. Why each row is what it is: README.md, "Which kernel runs".
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
           cudnn_version: Optional[int] = None) -> Tuple[Choice, Optional[str]]:
    """Pure policy: the choice for ``capability`` given the backends ``available``, with the
    hand-over limits for a GPU named ``gpu_name`` (:func:`hand_over_for`), their LSE head dims
    no wider than cuDNN ``cudnn_version`` runs (:func:`cudnn_lse_head_dim`).

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
                limits = limits._replace(lse_head_dim=min(limits.lse_head_dim, cudnn_lse_head_dim(cudnn_version)))
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


_warned: set = set()
_cache: Dict[tuple, Choice] = {}  # keys (capability, GPU name) and ("device", type, index)


def choose(device: torch.device) -> Choice:
    """The backend ``sageattn`` runs on ``device``, warning once per GPU kind on a fallback."""
    # by device first: reading the capability costs more than the rest of a short call's checks
    if not isinstance(device, torch.device):
        device = torch.device(device)
    index = device.index
    if index is None and device.type == "cuda":
        index = torch.cuda.current_device()
    dkey = ("device", device.type, index)
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
    choice, skipped = select(cap, avail, name, _cudnn_version() if cap is not None else None)
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
    behind it."""
    c = choose(device)
    return c.backend, tuple(sorted(c.options.items())), tuple(c.hand_over) if c.hand_over is not None else None


def _on_tile(length: int, length_aligned: int, aligned: bool) -> int:
    """A GQA length limit, at least ``length_aligned`` for calls whose Nq and Nk are multiples of
    :data:`CUDNN_TILE` (``aligned``: cuDNN runs those best, so the kernel passes it later)."""
    return max(length, length_aligned) if aligned else length


def short_call(limits: Sequence[int], batch: int, heads_q: int, len_q: int, len_k: int, head_dim: int,
               causal: bool, heads_kv: Optional[int] = None) -> bool:
    """Whether a call is too small for the quantized kernel by the :class:`HandOver` ``limits``
    (``heads_kv``: K/V heads, as many as query heads when not given).

    Causal calls (top-left) with more keys than queries count as square calls of ``Nq``:
    sageattn drops the keys they never see (core._visible_keys). With fewer keys than queries
    most rows see every key, and the non-causal limits put all 9 measured shapes on their
    faster side (the ``causal-rect`` set, bench/results/…-8b3577e-crossover-causal-rect.md)."""
    lim = HandOver(*limits)  # (chosen() passes the limits as a plain tuple)
    length, pairs = lim.length, lim.pairs
    gqa = heads_q >= GQA_GROUP * (heads_kv or heads_q)
    if causal:
        len_k = min(len_k, len_q)
        causal = len_q == len_k
    aligned = len_q % CUDNN_TILE == 0 and len_k % CUDNN_TILE == 0
    if causal:
        length = lim.length_causal_d64 if head_dim <= 64 else lim.length_causal
        pairs = lim.pairs_causal_gqa if gqa else lim.pairs_causal
        if len_q >= lim.length_causal_long and head_dim <= 128:
            pairs = min(pairs, lim.pairs_causal_long)
        if head_dim < 64:  # run as 64 columns, zero-padded
            length = max(length, lim.length_causal_padded_d64)
        elif 64 < head_dim < 128:  # run as 128
            length = max(length, lim.length_causal_padded)
    elif head_dim <= 128:  # non-causal: cuDNN runs lengths off its tile slower, and GQA calls
        # quantize K and V of fewer heads
        if gqa:
            length = _on_tile(lim.length_gqa, lim.length_gqa_aligned, aligned)
        elif not aligned:
            length = lim.length_unaligned
    if 128 < head_dim <= 192:  # run on 192 of MAX_HEAD_DIM's columns, zero-padded
        if causal:
            length = max(length, lim.length_causal_192_gqa if gqa else lim.length_causal_192)
            pairs = max(pairs, lim.pairs_192_gqa if gqa else lim.pairs_192)
        else:  # as they are: the H200's GQA limits are below those of head dims up to 128
            length = _on_tile(lim.length_192_gqa, lim.length_192_gqa_aligned, aligned) if gqa else lim.length_192
            pairs = lim.pairs_192_gqa if gqa else lim.pairs_192
    elif 192 < head_dim < MAX_HEAD_DIM:  # run as MAX_HEAD_DIM, zero-padded
        length = max(length, lim.length_padded)
    # L < length, without the division: 3 Nq Nk < length (Nq + 2 Nk)
    return 3 * len_q * len_k < length * (len_q + 2 * len_k) or batch * heads_q * len_q * len_k < pairs


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
    lim = HandOver(*limits)  # (chosen() passes the limits as a plain tuple)
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
    work = sorted((i for i, (a, b) in enumerate(zip(lens_q, seen_k)) if a and b),
                  key=lambda i: (-max(lens_q[i], seen_k[i]), i))
    groups: List[List[int]] = []
    for i in work:
        g = groups[-1] if groups else None
        if g is not None:
            mq, mk = max(lens_q[j] for j in g + [i]), max(seen_k[j] for j in g + [i])
            rows = sum(lens_q[j] + seen_k[j] for j in g) + lens_q[i] + seen_k[i]
            if (len(g) + 1) * (mq + mk) <= VARLEN_PADDING * rows:
                g.append(i)
                continue
        groups.append([i])
    return groups or None
