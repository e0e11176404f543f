"""Where the Triton varlen path's time goes: per-kernel GPU time (profiler) of one
``triton.forward_varlen`` call, beside the dense Triton function run on each sequence alone
(NHD views of the same packed tensors, and HND copies), with a few configuration switches.

    python bench/triton_varlen_probe.py [--cases ...]

Prints one markdown table; the caller records it under bench/results/.
"""

import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sageattention import triton as st  # noqa: E402
from timing import gpu_us  # noqa: E402
from varlen import CASES, make, profiled_calls  # noqa: E402


def kernels(fn, calls=3):
    """{kernel name: GPU µs per call}, median over `calls` profiled calls."""
    runs = profiled_calls(fn, calls)
    return {n: sorted(r.get(n, 0.0) for r in runs)[len(runs) // 2] for n in set().union(*runs)}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    args = ap.parse_args()
    print("| case | variant | µs (do_bench) | TOPS | kernels (µs, profiler) |")
    print("|---|---|---|---|---|")
    for name in args.cases:
        lens, hq, hk, d, causal = CASES[name]
        q, k, v, cu = make(lens, hq, hk, d)
        o = torch.empty_like(q)
        n = max(lens)
        ops = 4 * hq * d * sum(x * x for x in lens) / (2 if causal else 1)
        starts = [0]
        for x in lens:
            starts.append(starts[-1] + x)
        base = st.config_for(d, q.dtype, q.device, n, packed=True)

        def varlen(cfg=None, smooth=True):
            return lambda: st.forward_varlen(q, k, v, o, lens, lens, is_causal=causal,
                                             sm_scale=d ** -0.5, smooth_k=smooth, return_lse=False, config=cfg)

        def per_seq(hnd):
            views = []
            for a, b in zip(starts[:-1], starts[1:]):
                t = [x[a:b].transpose(0, 1)[None] for x in (q, k, v, o)]  # [1, H, N, D] views
                if hnd:
                    t = [x.contiguous() for x in t[:3]] + [torch.empty_like(t[0].contiguous())]
                views.append(t)

            def run():
                for q4, k4, v4, o4 in views:
                    st.forward(q4, k4, v4, o4, is_causal=causal, sm_scale=d ** -0.5, smooth_k=True,
                               return_lse=False, config=st.config_for(d, q.dtype, q.device, q4.shape[2]))
            return run

        variants = {
            f"forward_varlen (BLOCK_N {base.block_n}, {base.num_stages} stages)": varlen(),
            "forward_varlen, smooth_k=False": varlen(smooth=False),
            "forward_varlen, BLOCK_N 64": varlen(dataclasses.replace(base, block_n=64)),
            "forward_varlen, BLOCK_N 128": varlen(dataclasses.replace(base, block_n=128)),
            "dense forward per sequence, NHD views": per_seq(False),
            "dense forward per sequence, HND copies": per_seq(True),
        }
        for vname, fn in variants.items():
            us = gpu_us(fn)
            ks = kernels(fn)
            top = ", ".join(f"{k_}: {t:.0f}" for k_, t in sorted(ks.items(), key=lambda x: -x[1])[:5])
            print(f"| {name} | {vname} | {us:.0f} | {ops / us / 1e6:.0f} | {top} |", flush=True)
        # accuracy against fp32 SDPA, sequence by sequence: the packed call, then the dense one
        import torch.nn.functional as F
        from sageattention.reference import error_metrics

        refs, outs = [], {}
        for a, b in zip(starts[:-1], starts[1:]):
            q4, k4, v4 = (x[a:b].transpose(0, 1)[None].float() for x in (q, k, v))
            refs.append(F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal, enable_gqa=hq != hk)[0].transpose(0, 1))
        ref = torch.cat(refs)
        for vname in (next(iter(variants)), "dense forward per sequence, NHD views"):
            o.zero_()
            variants[vname]()
            m = error_metrics(o, ref)
            outs[vname] = f"cos {m['cos']:.6f}, rel-L1 {m['rel_l1']:.4f}"
        print(f"| {name} | accuracy vs fp32 SDPA | | | " + "; ".join(f"{k_}: {v_}" for k_, v_ in outs.items()) + " |")
        q = k = v = o = ref = refs = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
