"""Sweep the Triton kernel's tile configurations on the current GPU.

    python bench/sweep_triton.py [--d 128 64] [--n 16384 1024] [--causal]

For every configuration: end-to-end time (K mean + quantization + attention), the
attention kernel alone, the quantization kernel alone, and a correctness check against the
reference at a small size. Prints a table per (D, N) sorted by end-to-end TOPS; the
defaults in ``sageattention/triton/attn.py:choose_config`` should be the winners recorded in
bench/results/.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sageattention import triton as st  # noqa: E402
from sageattention.reference import attention_quantized, error_metrics  # noqa: E402
from sageattention.triton.attn import attn_int8  # noqa: E402


def check(cfg, d, causal):
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 4, 700, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    st.forward(q, k, v, o, is_causal=causal, sm_scale=d ** -0.5, smooth_k=True, return_lse=False, config=cfg)
    ref = attention_quantized(q, k, v, "HND", causal, None, False, cfg.reference(q.dtype))
    return error_metrics(o, ref)["rel_l1"]


def candidates(d, n, args):
    base = st.config_for(d, torch.bfloat16, torch.device("cuda"), n)
    out = [base, replace(base, q_per_token=False)]
    for bm, bn, w, s in itertools.product(args.block_m or [base.block_m], args.block_n, args.warps, args.stages):
        out.append(replace(base, block_m=bm, block_n=bn, num_warps=w, num_stages=s))
    return list(dict.fromkeys(out))


def sweep(cands, d, n, args):
    from triton.testing import do_bench

    b, h = args.b, args.h
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    ops = 4 * b * h * n * n * d / (2 if args.causal else 1)
    results = []
    for cfg in cands:
        try:
            err = check(cfg, d, args.causal)
            e2e = do_bench(lambda: st.forward(q, k, v, o, is_causal=args.causal, sm_scale=d ** -0.5,
                                              smooth_k=True, return_lse=False, config=cfg),
                           warmup=25, rep=150, return_mode="median")
            km = k.mean(dim=2, dtype=torch.float32)
            quant = lambda: st.quantize(q, k, km, d ** -0.5, cfg)  # noqa: E731
            qq = quant()
            kern = do_bench(lambda: attn_int8(qq, v, o, None, cfg, n_q=n, n_k=n, is_causal=args.causal),
                            warmup=25, rep=150, return_mode="median")
            tq = do_bench(quant, warmup=10, rep=50, return_mode="median")
            results.append((ops / e2e / 1e9, ops / kern / 1e9, tq, e2e, err, cfg))
        except Exception as exc:
            print(f"{cfg}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
    print(f"\nD={d} N={n} B={b} H={h} causal={args.causal}: TOPS end to end | kernel only | quant ms | e2e ms | rel-L1 vs reference")
    for e2e, kern, tq, ms, err, cfg in sorted(results, key=lambda r: -r[0]):
        print(f"{e2e:7.1f} {kern:7.1f} {tq:7.3f} {ms:7.3f} {err:.1e}  bm={cfg.block_m} bn={cfg.block_n} "
              f"w={cfg.num_warps} s={cfg.num_stages} qtok={int(cfg.q_per_token)}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, nargs="*", default=[128, 64])
    ap.add_argument("--n", type=int, nargs="*", default=[16384, 1024])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--h", type=int, default=32)
    ap.add_argument("--warps", type=int, nargs="*", default=[4, 8])
    ap.add_argument("--stages", type=int, nargs="*", default=[2, 3, 4])
    ap.add_argument("--block-n", type=int, nargs="*", default=[64, 128])
    ap.add_argument("--block-m", type=int, nargs="*", help="default: the configured one")
    args = ap.parse_args()
    for d in args.d:
        for n in args.n:
            sweep(candidates(d, n, args), d, n, args)


if __name__ == "__main__":
    main()
