"""Accuracy of each backend against fp32 attention on the baseline inputs.

    python bench/accuracy.py [--d 64 128 256] [--out bench/results]

Inputs as in ../shared/reference/h100-baseline.md: B=1, H=8, N=4096, bf16, HND, q/k/v
standard normal, K with a per-channel bias of 3 sigma; D 64 and 128, causal and not. A
second table uses the same inputs with an attention sink (channel 0 of every query 3,
channel 0 of key 0 8*sqrt(D)/3: key 0's scores ~8 higher, about a third of each row's
weight; tests/helpers.py's "sink"). Reference: SDPA's math backend in fp32 on the same
bf16 inputs. Prints and writes Markdown tables (cosine similarity / relative L1); "—" where a
function does not take the head dim (v_fp8_terms=2 above 128).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import sageattention as sa  # noqa: E402
from bench import commit, record, utc_now  # noqa: E402
from sageattention.reference import error_metrics  # noqa: E402


def inputs(d, sink=False, seed=1):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 8, 4096, d, generator=g) for _ in range(3))
    k = k + 3.0 * torch.randn(1, 1, 1, d, generator=g)
    if sink:
        q[..., 0] = 3.0
        k[..., 0, 0] = 8.0 * d**0.5 / 3.0
    return [t.to(torch.bfloat16).cuda() for t in (q, k, v)]


def main():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    ap = argparse.ArgumentParser()
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128], help="head dims")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    funcs = {
        "sdpa (bf16)": lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c),
        "sageattn": lambda q, k, v, c: sa.sageattn(q, k, v, is_causal=c),
        "triton": lambda q, k, v, c: sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, is_causal=c),
    }
    if "cuda_sm90" in sa.available_backends():
        funcs["cuda_sm90"] = lambda q, k, v, c: sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, is_causal=c)
        funcs["cuda_sm90 v_fp8_terms=2"] = lambda q, k, v, c: sa.sageattn_qk_int8_pv_fp8_cuda_sm90(
            q, k, v, is_causal=c, v_fp8_terms=2)
    tables = {}
    for sink in (False, True):
        rows = []
        for d in args.d:
            for causal in (False, True):
                q, k, v = inputs(d, sink)
                with sdpa_kernel([SDPBackend.MATH]):
                    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
                cells = []
                for name, fn in funcs.items():
                    if d > 128 and "v_fp8_terms=2" in name:
                        cells.append("—")
                        continue
                    m = error_metrics(fn(q, k, v, causal), ref)
                    cells.append(f"{m['cos']:.6f} / {m['rel_l1']:.4f}")
                rows.append(f"| {d} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")
        tables[sink] = "| D | causal | " + " | ".join(funcs) + " |\n|---|---|" + "---|" * len(funcs) + "\n" + "\n".join(rows)
    dev = torch.cuda.get_device_name()
    date = utc_now()
    text = (f"# Accuracy vs fp32, {dev}, {date}, commit {commit()}\n\n"
            f"Command: `python bench/accuracy.py --d {' '.join(map(str, args.d))}`. B=1, H=8, N=4096, bf16, K bias 3 sigma; "
            "cosine / relative L1 against SDPA math in fp32.\n\n" + tables[False] + "\n\n"
            "The same inputs with an attention sink (key 0's scores ~8 higher, about a third of each "
            "row's weight):\n\n" + tables[True] + "\n")
    record(text, args.out, date, dev, "accuracy")


if __name__ == "__main__":
    main()
