"""Statistics of a 128-key sample against those of every key, on the CPU: K smoothed by the
sample's mean, and (``--v-margins``) V's fp8 scale from the sample's largest |v| times a
margin.

    python bench/k_sample.py [--n 4096] [--heads 8] [--v-margins 4 8 16] [--out bench/results]

Inputs: pv_formats.py's (accuracy.py's baseline, K with a per-channel bias of 3 sigma, and
the same with an attention sink) at D=64 and 128, non-causal. For each: the fp8 kernels'
modelled pipeline (reference.attention_quantized with the sm90 configuration, exact
FP8 sums for speed) with ``k_mean_rows=None`` (every key) and 128 (what quant_qkv does),
against exact float64 attention: cosine similarity / relative L1 of the output and the
largest LSE error. With ``--v-margins``, also V's scale from the same 128 keys' largest |v|
times each margin (``v_amax_rows``, ``v_amax_margin``), and how many of the channels fell
back to the exact scale. Writes a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench import record, utc_now  # noqa: E402
from pv_formats import inputs  # noqa: E402
from sageattention import _cuda  # noqa: E402
from sageattention.reference import attention_exact, attention_quantized, error_metrics, quantize_v_fp8  # noqa: E402


def fallbacks(v, rows, margin):
    """Channels (of all heads) whose sampled V scale would overflow: they get the exact one."""
    exact = quantize_v_fp8(v)[1]
    sampled = quantize_v_fp8(v, amax_rows=rows, margin=margin)[1]
    return int(torch.eq(exact, sampled).sum()), exact.numel()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--v-margins", type=float, nargs="*", default=[])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    date = utc_now()
    rows_s = _cuda.K_SAMPLE_ROWS
    margins = " ".join(f"{m:g}" for m in args.v_margins)
    lines = [f"# Statistics of all keys vs of a {rows_s}-key sample (CPU, float64 model, {date})", "",
             f"Command: `python bench/k_sample.py --n {args.n} --heads {args.heads}"
             f"{' --v-margins ' + margins if margins else ''}`; B=1, H={args.heads}, N={args.n}, bf16 inputs, "
             "non-causal; sm90 configuration with exact FP8 sums.", "",
             "| input | D | K mean over | V scale from | cos | rel-L1 | max LSE error | V channels on the exact scale |",
             "|---|---|---|---|---|---|---|---|"]
    # (K mean rows, V amax rows, margin)
    configs = [(None, None, 1.0), (rows_s, None, 1.0)] + [(rows_s, rows_s, m) for m in args.v_margins]
    for sink in (False, True):
        for d in (128, 64):
            q, k, v = inputs(args.n, args.heads, sink, d=d)
            o_ex, lse_ex = attention_exact(q, k, v, return_lse=True)
            base = _cuda.reference_config(_cuda.SM90, "per_thread", "fp32+fp32", torch.bfloat16)
            for krows, vrows, margin in configs:
                cfg = base.with_(mma_bits=None, k_mean_rows=krows, v_amax_rows=vrows, v_amax_margin=margin)
                o, lse = attention_quantized(q, k, v, return_lse=True, cfg=cfg)
                m = error_metrics(o, o_ex)
                lse_err = float((lse.double() - lse_ex).abs().max())
                vsrc, exact = "all keys", "all"
                if vrows is not None:
                    fb, total = fallbacks(v, vrows, margin)
                    vsrc, exact = f"{vrows} keys x {margin:g}", f"{fb} of {total}"
                lines.append(f"| {'sink' if sink else 'baseline'} | {d} | {'all keys' if krows is None else f'{krows} keys'} "
                             f"| {vsrc} | {m['cos']:.6f} | {m['rel_l1']:.4f} | {lse_err:.4f} | {exact} |")
                print(lines[-1], flush=True)
    record("\n".join(lines) + "\n", args.out, date, "CPU", "v-sample" if args.v_margins else "k-sample")


if __name__ == "__main__":
    main()
