"""K smoothed by the mean of a 128-key sample against the mean of every key, on the CPU.

    python bench/k_sample.py [--n 4096] [--heads 8] [--out bench/results]

Inputs: pv_formats.py's (accuracy.py's baseline, K with a per-channel bias of 3 sigma, and
the same with an attention sink) at D=64 and 128, non-causal. For each: the fp8 kernels'
modelled pipeline (reference.attention_quantized with the sm90 configuration, exact
FP8 sums for speed) with ``k_mean_rows=None`` (every key) and 128 (what quant_qkv does),
against exact float64 attention: cosine similarity / relative L1 of the output and the
largest LSE error. Writes a Markdown table.
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
from sageattention.reference import attention_exact, attention_quantized, error_metrics  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    date = utc_now()
    lines = [f"# K mean of all keys vs of a {_cuda.K_SAMPLE_ROWS}-key sample (CPU, float64 model, {date})", "",
             f"Command: `python bench/k_sample.py --n {args.n} --heads {args.heads}`; B=1, H={args.heads}, "
             f"N={args.n}, bf16 inputs, non-causal; sm90 configuration with exact FP8 sums.", "",
             "| input | D | K mean over | cos | rel-L1 | max LSE error |", "|---|---|---|---|---|---|"]
    for sink in (False, True):
        for d in (128, 64):
            q, k, v = inputs(args.n, args.heads, sink, d=d)
            o_ex, lse_ex = attention_exact(q, k, v, return_lse=True)
            base = _cuda.reference_config(_cuda.SM90, "per_thread", "fp32+fp32", torch.bfloat16, head_dim=d)
            for rows in (None, _cuda.K_SAMPLE_ROWS):
                cfg = base.with_(mma_bits=None, k_mean_rows=rows)
                o, lse = attention_quantized(q, k, v, return_lse=True, cfg=cfg)
                m = error_metrics(o, o_ex)
                lse_err = float((lse.double() - lse_ex).abs().max())
                lines.append(f"| {'sink' if sink else 'baseline'} | {d} | {'all keys' if rows is None else f'{rows} keys'} "
                             f"| {m['cos']:.6f} | {m['rel_l1']:.4f} | {lse_err:.4f} |")
                print(lines[-1], flush=True)
    record("\n".join(lines) + "\n", args.out, date, "CPU", "k-sample")


if __name__ == "__main__":
    main()
