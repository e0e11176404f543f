"""How the Hopper kernel's FP8 tensor cores sum P·V: the sm90 kernel against the reference
with exact block sums and with reference.mma_truncated's model at 12, 13 and 14 kept bits,
and at 13 bits rounded toward -inf instead of toward zero.

    python bench/mma_bits.py [--out bench/results]

Inputs: tests/helpers.py's "sink" (key 0's scores ~8 above the rest: its P of 448 shares a
block with P values near 1, so the kept bits show) and random inputs with a K bias, 4 heads,
1000 keys, bf16, D 64 and 128, causal and not. Each cell: the kernel's output against that
model (cosine / relative L1) and the rows whose LSE differs by more than 1e-3 (of 4000).
The model that fits is the one the tests use (_cuda.SM90_MMA_BITS). Needs an sm90 GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

import sageattention as sa  # noqa: E402
from bench import commit, record, utc_now  # noqa: E402
from helpers import hostile_qkv, make_qkv  # noqa: E402
from sageattention import _cuda  # noqa: E402
from sageattention import reference as R  # noqa: E402

TRUNC = R.mma_truncated


def _toward_minus_inf(a, b, bits, k=32):
    """mma_truncated with its dropped bits rounded toward -inf: x - (x mod unit) with a
    non-negative remainder."""
    fmod = torch.fmod
    torch.fmod = lambda x, u: torch.remainder(x, u)
    try:
        return TRUNC(a, b, bits, k)
    finally:
        torch.fmod = fmod


MODELS = [("exact sums", None, TRUNC), ("12 bits", 12, TRUNC), ("13 bits", 13, TRUNC),
          ("14 bits", 14, TRUNC), ("13 bits, toward -inf", 13, _toward_minus_inf)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    rows = []
    for kind in ("sink", "random"):
        for d in (64, 128):
            for causal in (False, True):
                if kind == "sink":
                    q, k, v = hostile_qkv("sink", 1000, d, torch.bfloat16, "cuda", heads=4)
                else:
                    q, k, v = make_qkv(1, 4, 4, 1000, 1000, d, torch.bfloat16, "HND", "cuda", k_bias=1.0, seed=d)
                o, lse = sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, is_causal=causal, return_lse=True)
                cfg = _cuda.reference_config(_cuda.SM90, "per_thread", "fp32+fp32", torch.bfloat16)
                cells = []
                for _, bits, fn in MODELS:
                    R.mma_truncated = fn
                    try:
                        ro, rl = R.attention_quantized(q, k, v, "HND", causal, None, True, cfg.with_(mma_bits=bits))
                    finally:
                        R.mma_truncated = TRUNC
                    m = R.error_metrics(o, ro)
                    off = int(((lse - rl).abs() > 1e-3).sum())
                    cells.append(f"{m['cos']:.7f} / {m['rel_l1']:.1e} / {off}")
                rows.append(f"| {kind} | {d} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")
    head = "| inputs | D | causal | " + " | ".join(n for n, _, _ in MODELS) + " |\n|---|---|---|" + "---|" * len(MODELS)
    dev = torch.cuda.get_device_name()
    date = utc_now()
    text = (f"# FP8 tensor-core sums of the sm90 kernel, {dev}, {date}, commit {commit()}\n\n"
            "Command: `python bench/mma_bits.py`. The kernel against the reference with each model "
            "of its P·V block sums: cosine / relative L1 of the output / LSE rows off by > 1e-3 "
            "(of 4000). 4 heads, 1000 keys, bf16, default options (per_thread, fp32+fp32).\n\n"
            + head + "\n" + "\n".join(rows) + "\n")
    record(text, args.out, date, dev, "mma-bits")


if __name__ == "__main__":
    main()
