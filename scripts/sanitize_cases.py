"""Run every compiled kernel over the compute-sanitizer case list: D in {64, 128},
N in {1, 17, 1000, 4097}, causal and not, each PV accumulation mode, GQA.

    compute-sanitizer --tool memcheck  --error-exitcode 1 python scripts/sanitize_cases.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python scripts/sanitize_cases.py

Exits non-zero on a non-finite output as well (the sanitizer reports its own errors).
"""

import itertools
import sys

import torch

import sageattention as sa
from sageattention import dispatch

MODES = [
    ("cuda_fp16", {"pv_accum_dtype": "fp32"}),
    ("cuda_fp16", {"pv_accum_dtype": "fp16+fp32", "qk_quant_gran": "per_warp"}),
    ("cuda_fp8", {"pv_accum_dtype": "fp32", "smooth_v": True}),
    ("cuda_fp8", {"pv_accum_dtype": "fp32+fp32", "qk_quant_gran": "per_warp"}),
    ("cuda_fp8", {"pv_accum_dtype": "fp32+fp16"}),
    ("cuda_sm90", {"pv_accum_dtype": "fp32+fp32"}),
    ("cuda_sm90", {"pv_accum_dtype": "fp32+fp32", "qk_quant_gran": "per_warp"}),
]


def main(argv=None) -> int:
    only = set((argv if argv is not None else sys.argv[1:]))
    bad = 0
    for backend, opts in MODES:
        if only and backend not in only:
            continue
        ok, why = dispatch.backend_status(backend, torch.cuda.get_device_capability())
        if not ok:
            print(f"skip {backend}: {why}")
            continue
        fn = getattr(sa, dispatch.BACKENDS[backend].function)
        for d, n, causal in itertools.product((64, 128), (1, 17, 1000, 4097), (False, True)):
            g = torch.Generator(device="cuda").manual_seed(n + d)
            q = torch.randn(1, 4, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
            k = torch.randn(1, 2, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
            v = torch.randn(1, 2, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
            o, lse = fn(q, k, v, is_causal=causal, return_lse=True, **opts)
            torch.cuda.synchronize()
            fine = bool(torch.isfinite(o).all() and torch.isfinite(lse).all())
            bad += not fine
            print(f"{backend} {opts} D={d} N={n} causal={causal}: {'ok' if fine else 'NON-FINITE'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
