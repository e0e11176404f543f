"""Where the quantized kernel and SDPA cross over: short sequences and unequal Nq, Nk.

    python bench/crossover.py [--set NAME ...] [--lse] [--repeats 3] [--out bench/results]

(NAME: a key of SETS below, described here; `--help` lists them.)

For each shape (B, H, H_kv, Nq, Nk, D, causal) the GPU time of:
  - kernel: the quantized call that dispatch chooses for this GPU (its public kernel function
    with dispatch's options, quantization included), whatever sageattn would do with the shape;
  - sdpa_cudnn, sdpa_flash: F.scaled_dot_product_attention on one backend;
  - sageattn: the public function as it routes today.
Times are do_bench medians (bench.py's time_ms: L2 written over before each call) of calls
issued back to back, so a call whose host work exceeds its GPU work measures its host time, as
it would in an eager loop. Sets: ``square`` (Nq = Nk from 512 to 4096, D 64 and 128, causal and
not, B x H 4 x 32 and 1 x 16) and ``rect`` (D=128, non-causal, B x H 2 x 24: short Nq against
long Nk, as in chunked prefill, and long Nq against short Nk, as in a video model's
cross-attention to its text tokens) were measured to set sageattn's short-call limits on sm90
(dispatch.HAND_OVER); ``check`` holds other shapes (B x H, lengths, D=96, GQA) to test those
limits on; ``wide`` (D 160, 192 and 256, Nq = Nk from 1024 to 8192, causal and not, B x H
4 x 32 and 1 x 16) sets which head dims above 128 sageattn keeps and from which length, and
``wide-narrow`` (D 160 and 192, N 2048 to 8192) the lengths for 129-192, which the kernel runs
on 192 of D=256's columns, ``wide-gqa`` those lengths with GQA (4 and 8 query heads per K/V
head) and ``wide-gqa-check`` other GQA shapes to test them on (2, 7 and 8 per K/V head),
``wide-gqa-short`` non-causal GQA calls around N=2048 (where the H200 parts from the H100) and
``wide-gqa-short-check`` other such calls around the H200's limit, ``wide-gqa-edge`` others
around the H100's (2304, since the kernel's column-pair stores; 2176 after it),
``wide-gqa-edge-check`` others around 2176, ``wide-gqa-2112`` around 2112 and ``wide-gqa-2048``
around 2048 (the H200's, since the pair stores), ``wide-gqa-1920-check`` other groups and
head dims around 1920 (the H200's, set without a run of its own), ``wide-gqa-1856-check`` others
around 1856 (the H200's, set on that check and the six before it), ``wide-gqa-below`` a ladder
of shorter lengths (1280-1664) and ``wide-gqa-below-check`` other calls between them,
``wide-gqa-aligned-check`` lengths that are multiples of 128 and others around the H200's two
lengths since (1344, and 1664 for multiples of 128); ``unaligned`` and ``unaligned-causal`` head
dims 64 and 128 at lengths between multiples of 128 beside the multiples around their limits
(whose ladders had only multiples of 128), ``unaligned-check`` other non-causal calls around the
limits set on it; ``rect-edge`` non-causal calls with Nq != Nk around the limits (L from about
1200 to 2600 each way, with and without GQA); ``rect-edge-check`` other heads, groups and
lengths of that kind, to check the length formula set on it; ``rect-long-q`` many queries on few
keys (4k-32k on 768-1280), where the runs of 2026-11-24 had the kernel ahead at 16k-32k on 1024,
``rect-long-q-check`` other such calls to check dispatch's ``long_q`` on, ``rect-long-q-edges``
calls with 2-3x as many queries as keys and calls off cuDNN's tile, at the edges of that rule,
``rect-long-q-edges-check`` other such calls, to check the edges moved on it;
``odd-dims`` head dims that are
not multiples of 8 (60, 100, 140, 188, 250), which cuDNN does not run (SDPA runs flash), and
``odd-dims-small`` the same head dims on small and decode-like calls;
``causal-rect`` holds causal calls with Nq != Nk (top-left: query i sees keys 0..i); ``gqa``
LLM-like head groups (4, 8, 7 and 8 query heads per K/V head; N 1024 to 4096), ``gqa-small``
2 and 3 per K/V head; ``padded`` head dims that the Hopper kernel runs zero-padded to 64 or 128
columns (32, 48, 80, 96, 112; N 1024 to 8192), ``padded-causal`` causal calls at those head
dims between the lengths measured there, ``padded-causal-check`` the same lengths on other heads;
``causal-pairs`` causal calls around the causal pair limit, ``causal-pairs-check`` other head
counts around it, ``causal-long`` few heads at 6144 keys and more (the lower pair limit there);
``short-h200-check`` non-causal calls at head dims 64 and 128 around the H200's limits for GQA and
lengths off cuDNN's tile (shapes ``unaligned`` and ``unaligned-check``, which set them, did not
have), ``short-h200-gqa-check`` GQA calls off the tile around the length it moved that limit to,
``short-gqa-d64`` GQA calls at D=64 below that length, ``unaligned-pairs`` calls off the tile on few
heads around the pair limit, ``pairs-gqa-d64-check`` the limits those two set, on other shapes, ``fill-check`` calls off the tile
(not GQA) on few heads at 2^26.3-2^28 pairs on which a rule by how full the kernel's rounds of
work tiles are and the pair limit disagree, with a few on which they agree, ``grid-check`` other
such calls, where the round fill model fitted after it (dispatch.grid_slower) and the pair limit
before it (2^27) disagree. With
``--lse`` every call returns the LSE: the kernel and sageattn with return_lse=True, cuDNN as
sageattn's hand-over calls it (_sdpa.sdpa_lse: torch's cuDNN attention operator with its
log-sum-exp), flash as torch's flash operator (not for causal Nq != Nk, which it aligns
bottom-right). Writes the Markdown table and JSON into --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

import bench as B  # bench/bench.py: time_ms, rounds, record, sdpa helpers

sa = B.sa

SQUARE_N = (512, 1024, 1536, 2048, 3072, 4096)
SQUARE_BH = ((4, 32), (1, 16))
RECT = ((64, 4096), (256, 4096), (1024, 4096), (256, 16384), (1024, 16384), (4096, 16384),
        (4096, 512), (16384, 512), (32768, 512), (16384, 1024), (16384, 2048))
# (b, h, h_kv, nq, nk, d, causal), none of them in the two sets above
CHECK = (
    [(2, 24, 24, n, n, 128, c) for c in (False, True) for n in (1024, 2048, 3072, 4096)]
    + [(1, 32, 32, n, n, 128, c) for c in (False, True) for n in (2048, 4096, 8192)]
    + [(1, 16, 16, 8192, 8192, d, c) for d in (128, 64) for c in (False, True)]
    + [(8, 16, 16, n, n, 128, False) for n in (1024, 2048)]
    + [(4, 32, 32, n, n, 96, c) for c in (False, True) for n in (2048, 3072)]
    + [(4, 32, 8, n, n, 128, c) for c in (False, True) for n in (1024, 2048, 4096)]
    + [(2, 24, 24, nq, nk, 128, False) for nq, nk in ((512, 8192), (2048, 8192), (8192, 768), (8192, 4096),
                                                       (32768, 1024))]
)


WIDE_N = (1024, 2048, 3072, 4096, 8192)
WIDE = [(b, h, h, n, n, d, c) for d in (256, 192, 160) for c in (False, True) for b, h in SQUARE_BH for n in WIDE_N]
# head dims 129-192 since the kernel computes 192 of D=256's columns for them: lengths around
# where it should now pass cuDNN (``wide`` put the full width's crossover between 4096 and 8192)
WIDE_NARROW = [(b, h, h, n, n, d, c) for d in (192, 160) for c in (False, True) for b, h in SQUARE_BH
               for n in (2048, 3072, 4096, 6144, 8192)]
# head dims 129-192 with GQA (8 and 4 query heads per K/V head): the 129-192 limits were set on
# ``wide-narrow``, as many K/V heads as query heads
WIDE_GQA = [(b, h, hkv, n, n, d, c) for d in (192, 160) for b, h, hkv in ((4, 32, 8), (1, 32, 4))
            for c in (False, True) for n in (2048, 3072, 4096, 6144, 8192)]
# the limits set on ``wide-gqa`` checked on shapes it did not have: 2 query heads per K/V head
# (dispatch.GQA_GROUP), 2 x 28 / 4 (Qwen2 7B's heads) and 1 x 64 / 8, around the new lengths
WIDE_GQA_CHECK = [(b, h, hkv, n, n, d, c) for d in (192, 160) for c in (False, True)
                  for b, h, hkv in ((4, 32, 16), (2, 28, 4), (1, 64, 8))
                  for n in ((3072, 4096, 6144) if c else (2048, 3072, 4096))]
# non-causal GQA at head dims 129-192 around N=2048 on shapes and head dims ``wide-gqa`` and
# ``wide-gqa-check`` did not have (176 and 144; 2 x 40 / 8): on the H200 the kernel passed cuDNN
# at 2048 with 4 to 8 query heads per K/V head at D=192 (…-NVIDIA_H200-78df896-crossover-wide-gqa.md),
# where ``length_192`` hands those calls over (it set the H200's ``length_192_gqa``)
WIDE_GQA_SHORT = [(b, h, hkv, n, n, d, False) for d in (192, 176, 160, 144)
                  for b, h, hkv in ((4, 32, 8), (1, 64, 8), (2, 40, 8)) for n in (1792, 2048, 2560)]
# the H200's length_192_gqa (2560, set on ``wide-gqa-short``) checked on head dims and groups that
# set did not have (184 and 136; 2, 7 and 8 query heads per K/V head) on either side of it
WIDE_GQA_SHORT_CHECK = [(b, h, hkv, n, n, d, False) for d in (184, 160, 136)
                        for b, h, hkv in ((4, 32, 16), (2, 28, 4), (1, 64, 8)) for n in (2304, 2560, 2816)]
# the H100's length_192_gqa (2304, set on ``wide-gqa-short`` and ``wide-gqa-short-check`` at da6d172,
# after the column-pair stores) checked on head dims, groups and lengths neither had (152, 168,
# 188; 4, 8 and 2 query heads per K/V head; 2176 and 2432), each at 2^28 pairs or more
WIDE_GQA_EDGE = [(b, h, hkv, n, n, d, False) for d in (188, 168, 152)
                 for b, h, hkv in ((2, 32, 8), (3, 24, 3), (1, 64, 32)) for n in (2176, 2304, 2432)]
# wide-gqa-edge put the H100's crossover below 2304 (at 2176 the kernel 0.90-0.98 of SDPA's time):
# length_192_gqa 2176, checked on groups neither set had (8, 2 and 4 query heads per K/V head with
# 64, 80 and 96 query heads) at 2112, 2176 and 2240
WIDE_GQA_EDGE_CHECK = [(b, h, hkv, n, n, d, False) for d in (192, 176, 144)
                       for b, h, hkv in ((4, 16, 2), (2, 40, 20), (2, 48, 12)) for n in (2112, 2176, 2240)]
# which put it lower still (at 2112 the kernel 0.87-0.99, at 2176 0.96-1.09: cuDNN runs multiples
# of 128 best): length_192_gqa 2112, checked on groups and lengths none of the three had (4, 8 and
# 2 query heads per K/V head with 96, 96 and 72 query heads; 2080, 2112 and 2144)
WIDE_GQA_2112 = [(b, h, hkv, n, n, d, False) for d in (184, 168, 152)
                 for b, h, hkv in ((4, 24, 6), (1, 96, 12), (2, 36, 18)) for n in (2080, 2112, 2144)]
# the H200's length_192_gqa (2048, set on the four sets above at ef638f6, after the column-pair
# stores) and the H100's (2080) checked on groups, head dims and lengths none of them had (8, 3
# and 4 query heads per K/V head with 32, 48 and 40; 1920, 1984, 2048 and 2112)
WIDE_GQA_2048 = [(b, h, hkv, n, n, d, False) for d in (184, 160, 136)
                 for b, h, hkv in ((2, 32, 4), (1, 48, 16), (3, 40, 10)) for n in (1920, 1984, 2048, 2112)]
# the H200's non-causal GQA limits at head dims 129-192 (1920, 3 x 2^26 pairs), set on the six
# sets above with no run of their own, checked on groups, head dims and lengths none of them had:
# 4, 7, 2 and 4 query heads per K/V head, D 152, 168, 192, N 1792-2048 (2^26-2^30 pairs)
WIDE_GQA_1920_CHECK = [(b, h, hkv, n, n, d, False) for d in (192, 168, 152)
                       for b, h, hkv in ((4, 24, 6), (2, 56, 8), (1, 64, 32), (8, 16, 4)) for n in (1792, 1856, 1920, 2048)]
# the H200's length_192_gqa moved to 1856 on the union of that check and the six sets before it;
# checked on groups, head dims and lengths none of them had: 8, 8, 4 and 8 query heads per K/V
# head with 96, 80, 96 and 56 of them, D 192, 176, 144, N 1824-1984 (1 x 56 / 7 from 1984 only by
# the pair limit)
WIDE_GQA_1856_CHECK = [(b, h, hkv, n, n, d, False) for d in (192, 176, 144)
                       for b, h, hkv in ((3, 32, 4), (1, 80, 10), (2, 48, 12), (1, 56, 7)) for n in (1824, 1856, 1888, 1984)]
# every check of the H200's non-causal GQA length at head dims 129-192 found the kernel faster
# below it, down to the shortest length measured (1792, 1824): a ladder below (4, 8, 8 and 4 query
# heads per K/V head, 96-192 of them, D 192, 160, 136, N 1280-1664), and calls between its lengths
# on other groups and head dims to check a limit set on it (1344-1728; 8, 8, 8, 9 per K/V head)
WIDE_GQA_BELOW = [(b, h, hkv, n, n, d, False) for d in (192, 160, 136)
                  for b, h, hkv in ((4, 32, 8), (2, 64, 8), (8, 24, 3), (1, 96, 24)) for n in (1280, 1408, 1536, 1664)]
WIDE_GQA_BELOW_CHECK = [(b, h, hkv, n, n, d, False) for d in (184, 168, 144)
                        for b, h, hkv in ((3, 40, 5), (1, 112, 14), (6, 16, 2), (2, 36, 4)) for n in (1344, 1472, 1600, 1728)]
# the check above found the kernel faster at every length it had, all odd multiples of 64, where the
# ladder (multiples of 128) had it slower up to 1536-1664: cuDNN runs lengths that are multiples of
# its 128-row tile best. The H200's limits since: 1344, and 1664 where both lengths are multiples of
# 128 (HandOver.length_192_gqa_aligned), set on all the sets above; checked on groups and lengths
# none had (4, 8, 8, 4 query heads per K/V head with 160, 144, 192, 128 of them; D 184 and 144;
# 1216-1568 not multiples of 128, 1408-1792 multiples)
WIDE_GQA_ALIGNED_CHECK = [(b, h, hkv, n, n, d, False) for d in (184, 144)
                          for b, h, hkv in ((4, 40, 10), (2, 72, 9), (6, 32, 4), (1, 128, 32))
                          for n in (1216, 1312, 1440, 1568, 1408, 1536, 1664, 1792)]
# cuDNN's time per pair is 12-20 % higher at lengths that are not multiples of its 128-row tile
# (``wide-gqa-aligned-check``), and the limits at head dims up to 128 were set on ladders of
# multiples of 128 and 256 only (every recorded row at D <= 128 but 64 queries on 4096 keys): the same
# split should move their crossover too. Lengths between multiples of 128 (odd multiples of 64 and
# 32) beside the multiples around ``length`` (2048), causal around ``length_causal`` (3072) and
# ``length_causal_d64`` (4096); as many K/V heads as query heads, and 4 per K/V head
UNALIGNED = [(b, h, hkv, n, n, d, False) for d in (128, 64) for b, h, hkv in ((4, 32, 32), (1, 32, 32), (4, 32, 8))
             for n in (1344, 1472, 1536, 1600, 1728, 1792, 1856, 1984, 2048, 2112)]
UNALIGNED_CAUSAL = [(b, h, hkv, n, n, d, True) for d, ns in ((128, (2560, 2624, 2880, 3072, 3136)),
                                                             (64, (3584, 3648, 3904, 4096, 4160)))
                    for b, h, hkv in ((4, 32, 32), (1, 32, 32), (4, 32, 8)) for n in ns]
# the non-causal limits set on ``unaligned`` (H100, 75b30ed): 1792 for lengths off the tile, and with
# GQA 1472, or 1792 where both lengths are multiples of 128 (1664 since this check); checked on
# heads, groups (2, 8, 4, 5 and 4 per K/V head) and a head dim (96, which the kernel runs on 96 of
# 128 columns) that set did not have, at lengths around each limit, and on Nq != Nk off the tile
UNALIGNED_CHECK = ([(b, h, hkv, n, n, d, False) for b, h, hkv, d in ((8, 16, 16, 128), (2, 64, 64, 64), (4, 32, 32, 96),
                                                                     (4, 40, 40, 128))
                    for n in (1700, 1760, 1830, 1900, 2000)]
                   + [(b, h, hkv, n, n, d, False) for b, h, hkv, d in ((4, 32, 16, 128), (2, 64, 8, 128), (8, 32, 8, 64),
                                                                       (4, 40, 8, 128), (4, 32, 8, 96))
                      for n in (1400, 1440, 1500, 1560, 1700)]
                   + [(b, h, hkv, n, n, d, False) for b, h, hkv, d in ((4, 32, 16, 128), (2, 64, 8, 128), (8, 32, 8, 64),
                                                                       (4, 32, 8, 96))
                      for n in (1664, 1920)]
                   + [(4, 32, hkv, nq, nk, 128, False) for hkv in (32, 8)
                      for nq, nk in ((1000, 3000), (3000, 1000), (2500, 1500), (1500, 2500))])
# non-causal Nq != Nk around the limits: L = 3 Nq Nk / (Nq + 2 Nk) (the length until 2026-11-28)
# from ~1200 to ~2600 with fewer queries than keys and with more, at head dims 64 and 128, as many
# K/V heads as query heads or a quarter (unaligned-check's four such shapes left the kernel faster
# on two handed over, and slower on one kept: does L weigh Nq and Nk as the kernel's cost does?)
RECT_EDGE = [(4, 32, hkv, nq, nk, d, False) for d in (128, 64) for hkv in (32, 8)
             for nq, nk in ((768, 3072), (1024, 2048), (1024, 3072), (1024, 4096), (1280, 2560), (1536, 3072),
                            (1536, 4096), (2048, 4096), (2048, 1024), (3072, 1024), (4096, 1024), (4096, 768),
                            (8192, 512), (8192, 768), (3072, 1536), (4096, 1536))]
# other heads (2 x 40, 8 x 16 / 4, 1 x 64 / 8) and lengths than rect-edge, with fewer queries than
# keys and with more, around the length 7 Nq Nk / (3 Nq + 4 Nk) fitted on rect-edge and the runs
# before (it did not hold there; the harmonic mean 2 Nq Nk / (Nq + Nk) did better: the length since)
RECT_EDGE_CHECK = [(b, h, hkv, nq, nk, d, False) for d in (128, 64)
                   for b, h, hkv in ((2, 40, 40), (8, 16, 4), (1, 64, 8))
                   for nq, nk in ((1280, 4096), (1792, 2560), (1152, 3584), (6144, 1024), (12288, 896), (2560, 1280),
                                  (5120, 1152))]
# many queries on few keys (cross-attention to a short context): the 2026-11-24 runs (older kernel)
# had the kernel 2-14 % ahead at 16k and 32k queries on 1024 keys, which a length weighing queries
# and keys alike would hand over
RECT_LONG_Q = [(b, h, h, nq, nk, 128, False) for b, h in ((2, 24), (4, 32)) for nq in (4096, 8192, 16384, 32768)
               for nk in (768, 1024, 1280)]


def non_causal(d, calls):
    """Non-causal shapes (b, h, h_kv, nq, nk, d, False) at head dim ``d`` from (b, h, h_kv, nq, nk)."""
    return [(b, h, hkv, nq, nk, d, False) for b, h, hkv, nq, nk in calls]


# the check of a rule for many queries on few keys, chosen on rect-long-q and rect-edge at 2b17f9a
# after the kernel took three consumers below 1536 keys where they take fewer rounds (bench/
# HANDOVER.md): other heads, groups, head dims (96) and lengths; queries 2.4-19x the keys, 512-1408
# keys, on both sides of the rule's 3x and 2^28 pairs
RECT_LONG_Q_CHECK = (non_causal(128, ((1, 64, 8, 6144, 1024), (1, 64, 8, 3072, 1024), (2, 40, 40, 3584, 1152),
                                      (2, 40, 40, 2816, 1152), (2, 40, 40, 12288, 640), (8, 16, 4, 4096, 896),
                                      (8, 16, 4, 2560, 896), (1, 32, 32, 16384, 1408), (1, 32, 32, 8192, 600),
                                      (4, 24, 24, 3072, 1024), (4, 24, 24, 6144, 512)))
                     + non_causal(96, ((4, 32, 32, 4096, 1024), (2, 24, 24, 8192, 768)))
                     + non_causal(128, ((4, 32, 32, 2048, 640),)))
# the check of long_q's two open edges, after rect-long-q-check held long_q = 3 on the H200 at
# 2ada7e1 (with GQA calls by pairs_gqa): 2-3x as many queries as keys (GQA and not; D 128, 96
# and 80), where long_q = 2 would keep calls that the length hands over, and lengths off cuDNN's
# tile under 2^28 pairs, which the rule hands over and the round fill model keeps or not
RECT_LONG_Q_EDGES = (non_causal(128, ((4, 32, 32, 2560, 1024), (2, 48, 48, 2304, 1152), (4, 24, 24, 3072, 1280),
                                      (8, 16, 16, 2048, 896), (2, 32, 32, 3328, 1408), (1, 64, 64, 2560, 1152),
                                      (8, 32, 32, 1536, 768), (4, 32, 8, 2048, 896), (2, 64, 8, 2560, 1024),
                                      (4, 48, 12, 1792, 768), (8, 16, 2, 2304, 1024), (2, 128, 16, 1536, 640),
                                      (2, 32, 32, 5000, 1000), (1, 32, 32, 6000, 700), (2, 24, 24, 4000, 900),
                                      (1, 48, 48, 3500, 1100), (4, 16, 16, 3300, 1000), (1, 32, 32, 9000, 600)))
                     + non_causal(96, ((4, 32, 32, 2560, 1024),)) + non_causal(80, ((4, 32, 32, 2048, 768),)))
# rect-long-q-edges moved both edges (H200, f02ad34): long_q 2 and, off cuDNN's tile, the rule by
# pairs_unaligned; checked on shapes no run had: 2-3x as many queries as keys on both sides of
# 2^28 pairs (GQA: 2^27), off the tile on both sides of 11 x 2^23, D 112 and 80, and one call
# under 2x (the rule's outside)
RECT_LONG_Q_EDGES_CHECK = (non_causal(128, ((2, 40, 40, 2304, 1024), (3, 32, 32, 2560, 1152), (1, 96, 96, 2048, 1024),
                                            (6, 16, 16, 2816, 1280), (4, 32, 4, 2304, 896), (1, 64, 16, 2048, 768),
                                            (2, 32, 8, 1792, 640), (1, 96, 12, 2560, 1152), (2, 40, 8, 2048, 896),
                                            (1, 24, 24, 5000, 800), (1, 16, 16, 7000, 700), (2, 16, 16, 3000, 1200),
                                            (1, 40, 40, 2500, 1100), (3, 8, 8, 6100, 610), (1, 28, 28, 4500, 1000),
                                            (4, 32, 32, 1920, 1024)))
                           + non_causal(112, ((4, 32, 32, 2560, 1152),)) + non_causal(80, ((2, 32, 32, 4000, 1000),)))
# head dims cuDNN does not run (not multiples of 8), where SDPA runs flash: one for each band of
# the limits (padded to 64, to 128, 192 of 256 columns, 256), N around and below their lengths
ODD_DIMS = ([(4, 32, 32, n, n, d, c) for d in (60, 100, 140, 188, 250) for c in (False, True)
             for n in (1024, 1536, 2048, 3072)]
            + [(1, 16, 16, n, n, d, False) for d in (60, 100, 140, 188, 250) for n in (2048, 4096)])
# the same head dims on calls far below those: the rule that never hands them over (set on
# ``odd-dims``, whose smallest call is 1 x 16 x 2048^2, 2^26 pairs) checked where host work and
# launches decide (1 x 8 at N 128 and 512, causal or not; 4 x 32 x 512^2; one-query decode
# against 4096 keys with 4 query heads per K/V head; 128-query chunks against 8192 keys)
ODD_DIMS_SMALL = ([(1, 8, 8, n, n, d, c) for d in (60, 100, 140, 188, 250) for n in (128, 512) for c in (False, True)]
                  + [(4, 32, 32, 512, 512, d, False) for d in (60, 100, 140, 188, 250)]
                  + [(4, 32, 8, 1, 4096, d, False) for d in (60, 100, 140, 188, 250)]
                  + [(2, 24, 24, 128, 8192, d, False) for d in (60, 100, 140, 188, 250)])
# GQA as LLMs use it (query heads per K/V head: 4 x 32 / 8 and 1 x 64 / 8 as Llama-3 8B and 70B,
# 2 x 28 / 4 as Qwen2 7B, 1 x 32 / 4); the limits were measured on as many K/V heads as query heads
GQA = [(b, h, hkv, n, n, d, c) for d, groups in ((128, ((4, 32, 8), (1, 64, 8), (2, 28, 4), (1, 32, 4))),
                                                 (64, ((4, 32, 8),)))
       for b, h, hkv in groups for c in (False, True) for n in (1024, 2048, 3072, 4096)]
# head dims the Hopper kernel runs zero-padded to 64 or 128 columns (the ``padded`` set) while SDPA
# runs them at their width: the limits were measured at 64 and 128 (D=96 only in ``check``)
PADDED = ([(4, 32, 32, n, n, d, c) for d in (32, 48, 80, 96, 112) for c in (False, True)
           for n in (1024, 2048, 3072, 4096, 8192)]
          + [(1, 16, 16, n, n, d, c) for d in (48, 96) for c in (False, True) for n in (2048, 4096, 8192)])
# causal calls at those head dims between the measured lengths, where the kernel and cuDNN cross
PADDED_CAUSAL = ([(4, 32, 32, n, n, d, True) for d in (32, 48) for n in (4096, 5120, 6144, 7168)]
                 + [(4, 32, 32, n, n, d, True) for d in (80, 96, 112) for n in (3072, 3584, 4096)])
# the same lengths on other batch and head counts (one GQA), to check a causal limit for padded
# head dims set on PADDED_CAUSAL (since three consumers from 3072 keys causal, 23bd5da)
PADDED_CAUSAL_CHECK = ([(1, 32, 32, n, n, d, True) for d in (80, 96) for n in (3072, 3584)]
                       + [(2, 40, 40, n, n, 96, True) for n in (3072, 3584)] + [(8, 32, 8, 3072, 3072, 96, True)])
# causal calls around the causal pair limit (2^30), set when they ran two consumers up to 8191 keys
CAUSAL_PAIRS = ([(1, 24, 24, n, n, 128, True) for n in (4096, 5120, 6144, 7168)]
                + [(1, 32, 32, n, n, 128, True) for n in (4096, 5120, 6144)]
                + [(2, 24, 24, n, n, 128, True) for n in (4096, 5120)]
                + [(2, 40, 40, n, n, 128, True) for n in (3072, 3584)]
                + [(1, 40, 40, n, n, 128, True) for n in (4096, 5120)]
                + [(1, 16, 16, n, n, 128, True) for n in (6144, 8192)]
                + [(2, 40, 40, 3584, 3584, 96, True), (1, 24, 24, 6144, 6144, 96, True), (1, 32, 32, 5120, 5120, 80, True)])
# the H100's causal pair limit (3 x 2^28 since 2885f05, set on CAUSAL_PAIRS) checked on head counts
# and lengths that set did not have, from 2^29.3 to 2^29.8 pairs (1 x 48 x 4096^2, 3 x 16 x 4096^2
# and 1 x 12 x 8192^2 exactly at the limit)
CAUSAL_PAIRS_CHECK = ([(1, 20, 20, n, n, 128, True) for n in (6144, 6656)]
                      + [(1, 12, 12, n, n, 128, True) for n in (7680, 8192)]
                      + [(2, 16, 16, n, n, 128, True) for n in (4608, 5120)]
                      + [(1, 56, 56, n, n, 128, True) for n in (3584, 4096)]
                      + [(1, 48, 48, 4096, 4096, 128, True), (3, 16, 16, 4096, 4096, 128, True)])
# causal-pairs-check ran calls of 6144 keys and more on few heads at 0.91-0.93 of cuDNN's time
# below the H100's 3 x 2^28 (2^29.3-2^29.5): from 6144 keys a lower pair limit (2^29), checked on
# head counts neither set had, from 2^28.6 to 2^29.5 pairs, and at D=64 and 96
CAUSAL_LONG = ([(1, h, h, n, n, 128, True) for h, n in ((6, 8192), (8, 8192), (14, 6144), (10, 7168), (11, 7168),
                                                       (5, 10240), (4, 12288))]
               + [(2, 8, 8, 6144, 6144, 128, True)]
               + [(1, h, h, n, n, d, True) for d in (64, 96) for h, n in ((16, 6144), (12, 7680), (8, 8192))])
# the H200's non-causal limits at head dims up to 128, set on ``unaligned`` and ``unaligned-check``
# (b55e7ac, 6329c6b: length_unaligned 1472, length_gqa 1344, length_gqa_aligned 1536, pairs_gqa
# 2^27), checked on calls those sets did not have: GQA off cuDNN's tile on both sides of 1344, on
# it at 1152-1408, GQA on few heads around 2^27 pairs, and other heads off the tile around 1472
SHORT_H200_CHECK = ([(b, h, hkv, n, n, d, False) for d in (128, 64) for b, h, hkv in ((4, 32, 8), (8, 16, 4), (2, 64, 16))
                     for n in (1088, 1216, 1312, 1376)]
                    + [(b, h, hkv, n, n, d, False) for d in (128, 64) for b, h, hkv in ((4, 32, 8), (2, 64, 16))
                       for n in (1152, 1280, 1408)]
                    + [(b, h, hkv, n, n, d, False) for d in (128, 64)
                       for b, h, hkv, n in ((1, 32, 4, 1600), (1, 32, 4, 2112), (1, 32, 4, 2496), (2, 16, 2, 2000),
                                            (2, 16, 2, 2240))]
                    + [(b, h, h, n, n, d, False) for d in (128, 64) for b, h in ((4, 32), (2, 48), (8, 16))
                       for n in (1400, 1504)])
# short-h200-check had GQA calls off the tile ahead on the kernel from 1216 keys (D=64 from 1088,
# the shortest measured): length_gqa 1344 -> 1216, checked on groups (8 and 2 query heads per K/V
# head), head counts and a head dim (96) that neither set had, on both sides of it
SHORT_H200_GQA_CHECK = ([(b, h, hkv, n, n, d, False) for d in (128, 64) for b, h, hkv in ((4, 32, 4), (1, 128, 16), (4, 32, 16))
                         for n in (1120, 1184, 1248)]
                        + [(4, 32, 8, n, n, 96, False) for n in (1184, 1248)])
# the H200's GQA calls at D=64 passed cuDNN from 1088 keys off its tile (the shortest measured:
# short-h200-check, short-h200-gqa-check), where D=128's pass it from 1216 (length_gqa): 800-1184
# off the tile and 896 / 1024 on it, on 256 query heads (above pairs_gqa from 800 keys)
SHORT_GQA_D64 = [(b, h, hkv, n, n, 64, False) for b, h, hkv in ((4, 64, 8), (8, 32, 4), (2, 128, 16))
                 for n in (800, 864, 928, 992, 1056, 1184, 896, 1024)]
# non-causal calls off cuDNN's tile, not GQA, above length_unaligned and on few heads: the H200's
# 1 x 32 x 2112^2 (pairs 2^27.1, under pairs 2^28) ran 9-15 % faster on the kernel in three runs,
# the H100's at D=64 12 %, while 1 x 32 x 2048^2 on the tile was cuDNN's by 13-15 %. Pairs from
# 2^26.5 to 2^28, lengths 1900-6000
UNALIGNED_PAIRS = [(b, h, h, n, n, d, False) for d in (128, 64)
                   for b, h, n in ((1, 32, 1900), (1, 16, 2500), (1, 8, 3500), (1, 32, 2112), (2, 16, 2112),
                                   (1, 16, 3000), (1, 8, 4200), (1, 4, 6000), (1, 24, 2500), (1, 32, 2800),
                                   (1, 16, 3900), (1, 8, 5500))]
# the two limits those sets gave the H200 (length_gqa_d64 896, pairs_unaligned 2^27), checked on
# shapes they did not have: GQA at D=64 with 2 and 4 query heads per K/V head and other lengths on
# both sides of 896; off the tile, other head counts and lengths from 2^26.7 to 2^27.4 pairs
PAIRS_GQA_D64_CHECK = ([(b, h, hkv, n, n, 64, False) for b, h, hkv in ((8, 32, 16), (4, 48, 12))
                        for n in (832, 880, 960, 1000, 1120)]
                       + [(b, h, h, n, n, d, False) for d in (128, 64)
                          for b, h, n in ((1, 12, 3800), (1, 20, 2700), (2, 8, 2600), (1, 40, 2000), (1, 6, 5000),
                                          (1, 28, 2300), (1, 48, 1700), (1, 2, 9000), (2, 24, 1800), (1, 10, 3300))])
# a rule by how full the kernel's rounds of 192-row work tiles are (tiles / (SMs x rounds)), fitted
# on the H200's recorded calls of this kind (bench/HANDOVER.md, the end of "The H200's row"), set
# against the pair limit on shapes no run had: off the tile, not GQA, 2^26.3-2^28 pairs. The first
# eight the pair limit keeps and the rule hands over (two or more rounds, under 70 % full), the
# next ten the pair limit hands over and the rule keeps (80 % full or more, from 2112 keys), the
# last four both route alike (73 % full kept; 2 x 27 kept; 1 x 22 x 2100 and the one-round
# 1 x 2 x 7550 handed over).
FILL_CHECK = [(b, h, h, n, n, d, False) for d in (128, 64)
              for b, h, n in ((1, 5, 5750), (1, 4, 6950), (1, 10, 5050), (3, 2, 5250), (2, 9, 2800), (2, 2, 8000),
                              (1, 6, 5600), (1, 3, 9150),
                              (1, 27, 2150), (2, 11, 2150), (3, 6, 2400), (1, 17, 2800), (3, 7, 2150), (1, 16, 2850),
                              (2, 10, 2300), (1, 19, 2350), (2, 2, 5350), (1, 5, 4750),
                              (1, 6, 6100), (2, 27, 2050), (1, 22, 2100), (1, 2, 7550))]
# the round fill model (dispatch.grid_slower: the kernel's time over cuDNN's 0.90 below 4096 keys and
# 0.77 from them at equal fill, times cuDNN's round fill of 128-row tiles over the kernel's of
# 192-row ones), fitted on the H200's runs with fill-check among them, checked on shapes none had:
# the first eight the pair limit before it (2^27) keeps and the model hands over, the next eight
# the pair limit hands over and the model keeps, the last six both route alike (1 x 6 x 4500,
# 1 x 1 x 10850 and 1 x 8 x 4050 to SDPA; 1 x 4 x 6100, 1 x 3 x 8400 and 1 x 22 x 3100 kept).
GRID_CHECK = [(b, h, h, n, n, d, False) for d in (128, 64)
              for b, h, n in ((1, 5, 6200), (2, 13, 2900), (2, 10, 3650), (1, 29, 2250), (3, 5, 3750), (1, 4, 7750),
                              (3, 7, 2650), (4, 1, 6550),
                              (3, 4, 3250), (1, 20, 2400), (4, 9, 1850), (2, 8, 2850), (1, 28, 2000), (1, 15, 2550),
                              (1, 14, 2850), (1, 10, 3500),
                              (1, 6, 4500), (1, 1, 10850), (1, 8, 4050), (1, 4, 6100), (1, 3, 8400), (1, 22, 3100))]
# GQA with 2 and 3 query heads per K/V head (``gqa`` measured 4 to 8): below dispatch.GQA_GROUP
GQA_SMALL = [(b, h, hkv, n, n, d, c) for d, groups in ((128, ((4, 32, 16), (2, 24, 8), (1, 48, 24))),
                                                       (64, ((4, 32, 16),)))
             for b, h, hkv in groups for c in (False, True) for n in (1024, 2048, 3072, 4096)]
CAUSAL_RECT = ([(2, 24, 24, nq, nk, 128, True) for nq, nk in RECT if nq >= 256]
               + [(4, 32, 32, nq, nk, d, True) for d in (128, 64)
                  for nq, nk in ((1024, 4096), (2048, 8192), (4096, 2048), (8192, 4096))])


# every set by its --set name, in the order shapes() runs them
SETS = {
    "square": [(b, h, h, n, n, d, c) for d in (128, 64) for c in (False, True) for b, h in SQUARE_BH for n in SQUARE_N],
    "rect": [(2, 24, 24, nq, nk, 128, False) for nq, nk in RECT],
    "check": CHECK,
    "wide": WIDE,
    "wide-narrow": WIDE_NARROW,
    "wide-gqa": WIDE_GQA,
    "wide-gqa-check": WIDE_GQA_CHECK,
    "wide-gqa-short": WIDE_GQA_SHORT,
    "wide-gqa-short-check": WIDE_GQA_SHORT_CHECK,
    "wide-gqa-edge": WIDE_GQA_EDGE,
    "wide-gqa-edge-check": WIDE_GQA_EDGE_CHECK,
    "wide-gqa-2112": WIDE_GQA_2112,
    "wide-gqa-2048": WIDE_GQA_2048,
    "wide-gqa-1920-check": WIDE_GQA_1920_CHECK,
    "wide-gqa-1856-check": WIDE_GQA_1856_CHECK,
    "wide-gqa-below": WIDE_GQA_BELOW,
    "wide-gqa-below-check": WIDE_GQA_BELOW_CHECK,
    "wide-gqa-aligned-check": WIDE_GQA_ALIGNED_CHECK,
    "unaligned": UNALIGNED,
    "unaligned-causal": UNALIGNED_CAUSAL,
    "unaligned-check": UNALIGNED_CHECK,
    "rect-edge": RECT_EDGE,
    "rect-edge-check": RECT_EDGE_CHECK,
    "rect-long-q": RECT_LONG_Q,
    "rect-long-q-check": RECT_LONG_Q_CHECK,
    "rect-long-q-edges": RECT_LONG_Q_EDGES,
    "rect-long-q-edges-check": RECT_LONG_Q_EDGES_CHECK,
    "odd-dims": ODD_DIMS,
    "odd-dims-small": ODD_DIMS_SMALL,
    "causal-rect": CAUSAL_RECT,
    "gqa": GQA,
    "gqa-small": GQA_SMALL,
    "padded": PADDED,
    "padded-causal": PADDED_CAUSAL,
    "padded-causal-check": PADDED_CAUSAL_CHECK,
    "causal-pairs": CAUSAL_PAIRS,
    "causal-pairs-check": CAUSAL_PAIRS_CHECK,
    "causal-long": CAUSAL_LONG,
    "short-h200-check": SHORT_H200_CHECK,
    "short-h200-gqa-check": SHORT_H200_GQA_CHECK,
    "short-gqa-d64": SHORT_GQA_D64,
    "unaligned-pairs": UNALIGNED_PAIRS,
    "pairs-gqa-d64-check": PAIRS_GQA_D64_CHECK,
    "fill-check": FILL_CHECK,
    "grid-check": GRID_CHECK,
}


def shapes(sets):
    """(b, h, h_kv, nq, nk, d, causal) of the chosen sets."""
    return [shape for name, members in SETS.items() if name in sets for shape in members]


def pairs_of(nq, nk, causal):
    """Query-key pairs a call computes: nq·nk, causal (top-left) sum over i < nq of min(i + 1, nk),
    taken as n²/2 when nq == nk (bench.py's count)."""
    if not causal:
        return nq * nk
    if nq == nk:
        return nq * nk / 2
    m = min(nq, nk)
    return m * (m + 1) / 2 + (nq - m) * nk


def kernel_call(device):
    """The quantized function sageattn's dispatch picks on `device`, with the choice's options."""
    from sageattention import dispatch

    choice = dispatch.choose(device)
    fn = getattr(sa, dispatch.BACKENDS[choice.backend].function)
    opts = dict(choice.options)
    return choice.backend, lambda q, k, v, c, **kw: fn(q, k, v, is_causal=c, **opts, **kw)


def calls(device):
    name, kernel = kernel_call(device)
    sdpa = B.backends(["sdpa_cudnn", "sdpa_flash"])
    return name, {"kernel": kernel, **sdpa, "sageattn": lambda q, k, v, c: sa.sageattn(q, k, v, is_causal=c)}


def lse_calls(device):
    """The same four, each returning (o, lse)."""
    from sageattention import _sdpa

    name, kernel = kernel_call(device)

    def cudnn(q, k, v, c):
        res = _sdpa.sdpa_lse(q, k, v, c, q.shape[-1] ** -0.5)
        if res is None:
            raise RuntimeError("torch's check: cuDNN attention cannot run this call")
        return res

    def flash(q, k, v, c):
        if c and q.shape[2] != k.shape[2]:
            raise RuntimeError("flash aligns causal Nq != Nk bottom-right")
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, c, False, scale=q.shape[-1] ** -0.5)[:2]

    return name, {"kernel": lambda q, k, v, c: kernel(q, k, v, c, return_lse=True), "sdpa_cudnn": cudnn,
                  "sdpa_flash": flash, "sageattn": lambda q, k, v, c: sa.sageattn(q, k, v, is_causal=c, return_lse=True)}


def route(device, b, h, hkv, nq, nk, d, causal, lse=False):
    """Where sageattn sends the call: "sdpa" or "kernel"."""
    from sageattention import dispatch
    from sageattention._checks import Dims

    limits = dispatch.chosen(device)[2]
    return "sdpa" if dispatch.goes_to_sdpa(limits, Dims(b, h, hkv, nq, nk, d), causal, lse) else "kernel"


def run(sets, repeats, lse=False):
    dev = torch.device("cuda")
    kname, table = (lse_calls if lse else calls)(dev)
    rows = []
    for b, h, hkv, nq, nk, d, causal in shapes(sets):
        q = torch.randn(b, h, nq, d, device=dev, dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, nk, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
        ok = {}
        for name, fn in table.items():  # first call (compilation, cuDNN plans) untimed
            try:
                fn(q, k, v, causal)
                ok[name] = []
            except Exception as exc:
                print(f"  {name} failed: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
        torch.cuda.synchronize()
        for name in B.rounds(list(ok), repeats, "rotate"):
            ok[name].append(B.time_ms(lambda: table[name](q, k, v, causal)))
        us = {n: 1e3 * statistics.median(t) for n, t in ok.items()}
        pairs = pairs_of(nq, nk, causal)
        row = dict(b=b, h=h, hkv=hkv, nq=nq, nk=nk, d=d, causal=causal, us=us, repeats_ms=ok,
                   route=route(dev, b, h, hkv, nq, nk, d, causal, lse), lse=lse,
                   tops={n: 4 * b * h * pairs * d / (t * 1e-6) / 1e12 for n, t in us.items()})
        rows.append(row)
        print(f"{b}x{h}/{hkv} Nq={nq:<6} Nk={nk:<6} D={d:<4} causal={int(causal)}  "
              + "  ".join(f"{n} {t:9.1f}" for n, t in us.items())
              + f"  kernel/best SDPA {_ratio(us)} route {row['route']}", flush=True)
    return kname, rows


def _ratio(us):
    """The kernel's time over the faster SDPA backend's, as text ("n/a": neither ran the call)."""
    sdpa = [us[n] for n in ("sdpa_cudnn", "sdpa_flash") if n in us]
    return f"{us['kernel'] / min(sdpa):.2f}" if sdpa and "kernel" in us else "n/a"


def markdown(kname, rows, repeats):
    names = ["kernel", "sdpa_cudnn", "sdpa_flash", "sageattn"]
    lines = [
        f"Kernel: `{kname}` with sageattn's options. µs: median of {repeats} do_bench medians; "
        "ratio: kernel time over the faster SDPA backend's (> 1: SDPA faster); route: where this "
        "commit's sageattn sends the call (dispatch.goes_to_sdpa).",
        "",
        "| B x H (/ H_kv) | Nq | Nk | D | causal | " + " | ".join(f"{n} µs" for n in names)
        + " | kernel / best SDPA | route | kernel TOPS | cuDNN TOPS |",
        "|---" * (len(names) + 9) + "|",
    ]
    for r in rows:
        us = r["us"]
        cells = [f"{us[n]:.1f}" if n in us else "n/a" for n in names]
        heads = f"{r['b']}x{r['h']}" + (f" / {r['hkv']}" if r.get("hkv", r["h"]) != r["h"] else "")
        lines.append(f"| {heads} | {r['nq']} | {r['nk']} | {r['d']} | {int(r['causal'])} | "
                     + " | ".join(cells)
                     + f" | {_ratio(us)} | {r.get('route', '')} | {r['tops'].get('kernel', 0):.0f} | {r['tops'].get('sdpa_cudnn', 0):.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--set", nargs="*", default=["square", "rect"],
                    choices=list(SETS))
    ap.add_argument("--lse", action="store_true", help="every call returns the LSE (return_lse=True)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(B.ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    date, device = B.utc_now(), torch.cuda.get_device_name()
    kname, rows = run(args.set, args.repeats, args.lse)
    lse = " --lse" if args.lse else ""
    text = (f"# Crossover: quantized kernel against SDPA{', with the LSE' if args.lse else ''} ({device}, {date})\n\n"
            f"Command: `{B.switches()}python bench/crossover.py --set {' '.join(args.set)}{lse} --repeats {args.repeats}` "
            f"(commit {B.commit()}, torch {torch.__version__}).\n\n" + markdown(kname, rows, args.repeats))
    path = B.record(text, args.out, date, device, "-".join(["crossover"] + (["lse"] if args.lse else []) + args.set))
    path.with_suffix(".json").write_text(json.dumps(dict(device=device, date=date, commit=B.commit(), rows=rows),
                                                    indent=1))


if __name__ == "__main__":
    main()
