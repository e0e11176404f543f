"""Run every compiled kernel over the compute-sanitizer case list: D in {64, 128} (and, for
the Hopper kernel, 96, which runs 96 of the D=128 kernel's columns, 256, whose variant
loads Q and K rows in two spans, and 192 and 160, which run 192 of the D=256 kernel's columns,
160 writing 4-byte column pairs up to its last column; for the mma.sync kernels 80, which runs
D=128's kernel and writes pairs up to its last column),
N in {1, 17, 1000, 4097}, causal and not, each PV accumulation mode, GQA; and 40 heads at
N=1000 (more work tiles than SMs; on the Hopper kernel at D 96 and 128, non-causal, three
consumer warpgroups on 1000 keys, as dispatch.sm90_rows has them on 132 SMs); for the Hopper
kernel also 10 query heads on 2 K/V heads at N=2400 (D=128: CTA pairs across query heads)
and 2 heads at N=150 (one 192-row tile; counted over the 128-row padding they were two, the
second wholly past the queries). Above 128 keys the last KV head's V has an outlier on a key
outside quant_qkv's 128-key sample, so the fp8 families' V-scale fallback runs too: in
the statistics (these V fit in L2) and, from a direct quant_qkv call, in the quantization
kernel (the last tile of each 32-channel group).

    compute-sanitizer --tool memcheck  --error-exitcode 1 python scripts/sanitize_cases.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python scripts/sanitize_cases.py
    compute-sanitizer ... python scripts/sanitize_cases.py cuda_sm90 cuda_sm90_varlen d=96   # a subset

The Hopper kernel's packed sequences (``cuda_sm90_varlen``: sageattn_varlen on an sm90 GPU):
lengths 1, 17, 1000 and 4097 with an empty sequence and one without keys, at D 64, 96, 128, 192, 256.

Exits non-zero on a non-finite output as well (the sanitizer reports its own errors).
"""

import itertools
import sys

import torch

import sageattention as sa
from sageattention import _cuda, dispatch

MODES = [
    ("cuda_fp16", {"pv_accum_dtype": "fp32"}),
    ("cuda_fp16", {"pv_accum_dtype": "fp16+fp32", "qk_quant_gran": "per_warp"}),
    ("cuda_fp8", {"pv_accum_dtype": "fp32", "smooth_v": True}),
    ("cuda_fp8", {"pv_accum_dtype": "fp32+fp32", "qk_quant_gran": "per_warp"}),
    ("cuda_fp8", {"pv_accum_dtype": "fp32+fp16"}),
    ("cuda_sm90", {"pv_accum_dtype": "fp32+fp32"}),
    ("cuda_sm90", {"pv_accum_dtype": "fp32+fp32", "qk_quant_gran": "per_warp"}),
    ("cuda_sm90", {"pv_accum_dtype": "fp32+fp32", "v_fp8_terms": 2}),
]


def main(argv=None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    only = {a for a in args if not a.startswith("d=")}
    wanted = {int(a[2:]) for a in args if a.startswith("d=")}  # head dims to run, or all

    def pick(dims):
        return [d for d in dims if not wanted or d in wanted]

    bad = 0
    for backend, opts in MODES:
        if only and backend not in only:
            continue
        ok, why = dispatch.backend_status(backend, torch.cuda.get_device_capability())
        if not ok:
            print(f"skip {backend}: {why}")
            continue
        fn = getattr(sa, dispatch.BACKENDS[backend].function)
        # (heads_q, heads_kv, N): the case list, plus one with more 128-row work tiles (8 x 40)
        # than the GPU has SMs, so that a persistent kernel walks several per CTA
        shapes = [(4, 2, n) for n in (1, 17, 1000, 4097)] + [(40, 8, 1000)]
        if backend == "cuda_sm90":
            # 13 work tiles of 192 rows per head: at D=128 CTA pairs that hold two query heads'
            # tiles, sharing K and V (heads 0 and 1, one group of 5) or not (heads 4 and 5)
            shapes.append((10, 2, 2400))
            # 150 queries: one 192-row tile (it counted two over the 128-row padding, the second
            # all padding, and at D=64 the idle consumers then faulted)
            shapes.append((2, 2, 150))
        dims = (64, 96, 128, 160, 192, 256) if backend == "cuda_sm90" and opts.get("v_fp8_terms", 1) == 1 else (
            (64, 128) if backend == "cuda_sm90" else (64, 80, 128))
        for d, (hq, hk, n), causal in itertools.product(pick(dims), shapes, (False, True)):
            g = torch.Generator(device="cuda").manual_seed(n + d)
            q = torch.randn(1, hq, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
            k = torch.randn(1, hk, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
            v = torch.randn(1, hk, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
            if n > 128:
                v[0, -1, 1, :5] = 1000.0  # key 1 is in no sample of more than 128 keys
            o, lse = fn(q, k, v, is_causal=causal, return_lse=True, **opts)
            if backend in ("cuda_fp8", "cuda_sm90") and not opts.get("smooth_v") and not causal:
                # quant_qkv as a V too large for L2 gets it: sampled scale, overflow flags, the group's fix
                ext = dispatch.BACKENDS[backend].extension
                nk_pad = -(-n // _cuda.kv_block(ext)) * _cuda.kv_block(ext)
                _cuda.ops(ext).quant_qkv(q, k, v, 0.1, 8, 4, True, False, False, _cuda.FP8_MAX,
                                         -(-n // _cuda.BLOCK_Q) * _cuda.BLOCK_Q, nk_pad, _cuda.padded_head_dim(d), False,
                                         opts.get("v_fp8_terms", 1))
            torch.cuda.synchronize()
            fine = bool(torch.isfinite(o).all() and torch.isfinite(lse).all())
            bad += not fine
            print(f"{backend} {opts} D={d} H={hq}/{hk} N={n} causal={causal}: {'ok' if fine else 'NON-FINITE'}",
                  flush=True)
    if not only or "cuda_sm90_varlen" in only:
        bad += varlen_cases(pick((64, 96, 128, 192, 256)))
    return 1 if bad else 0


def varlen_cases(dims) -> int:
    """sageattn_varlen on the Hopper kernel (these lengths run in several launches: dispatch.varlen_groups)."""
    ok, why = dispatch.backend_status("cuda_sm90", torch.cuda.get_device_capability())
    if not ok:
        print(f"skip cuda_sm90_varlen: {why}")
        return 0
    bad = 0
    lens_q = [1, 17, 0, 1000, 4097, 33]
    for d, causal in itertools.product(dims, (False, True)):
        lens_k = lens_q if causal else [5, 17, 9, 1300, 4097, 0]
        g = torch.Generator(device="cuda").manual_seed(d)
        q = torch.randn(sum(lens_q), 4, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(sum(lens_k), 2, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(sum(lens_k), 2, d, device="cuda", dtype=torch.bfloat16, generator=g)
        cu_q, cu_k = (torch.tensor([0] + list(itertools.accumulate(n)), dtype=torch.int32, device="cuda")
                      for n in (lens_q, lens_k))
        o, lse = sa.sageattn_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal, return_lse=True)
        torch.cuda.synchronize()
        keyed = torch.tensor([lk > 0 for lk in lens_k]).repeat_interleave(torch.tensor(lens_q)).cuda()
        fine = bool(torch.isfinite(o).all() and torch.isfinite(lse[:, keyed]).all())
        bad += not fine
        print(f"cuda_sm90_varlen D={d} lens {lens_q} / {lens_k} causal={causal}: {'ok' if fine else 'NON-FINITE'}",
              flush=True)
    return bad


if __name__ == "__main__":
    sys.exit(main())
