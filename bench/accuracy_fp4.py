"""Accuracy of the FP4 scheme (sageattention3_blackwell) against fp32 attention on the
baseline inputs, beside sageattention's INT8/FP8 path where a GPU runs it.

    python bench/accuracy_fp4.py [--device cpu|cuda] [--out bench/results]

Inputs as in bench/accuracy.py (../shared/reference/h100-baseline.md): B=1, H=8, N=4096,
bf16, q/k/v standard normal, K with a per-channel bias of 3 sigma; D 64 and 128, causal and
not. Columns: the emulation (sageattention3_blackwell.emulation.attention, any device); the
FP4 kernels when the GPU is Blackwell; sageattn (INT8 QK, FP8/FP16 PV) on a GPU. Writes a
Markdown table to bench/results.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench import commit, record, utc_now  # noqa: E402  (bench/bench.py)
from sageattention.reference import error_metrics  # noqa: E402
from sageattention3_blackwell import emulation  # noqa: E402


def inputs(d, device, seed=1):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 8, 4096, d, generator=g) for _ in range(3))
    k = k + 3.0 * torch.randn(1, 1, 1, d, generator=g)
    return [t.to(torch.bfloat16).to(device) for t in (q, k, v)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    dev = torch.device(args.device)
    funcs = {"FP4 emulation": lambda q, k, v, c: emulation.attention(q, k, v, is_causal=c)}
    if dev.type == "cuda":
        if torch.cuda.get_device_capability(dev) in ((10, 0), (12, 0), (12, 1)):
            from sageattention3_blackwell import sageattn3_blackwell

            funcs["FP4 kernel"] = lambda q, k, v, c: sageattn3_blackwell(q, k, v, is_causal=c)
        import sageattention

        funcs["sageattn (INT8/FP8)"] = lambda q, k, v, c: sageattention.sageattn(q, k, v, is_causal=c)
    rows = []
    t0 = time.time()
    for d in (64, 128):
        for causal in (False, True):
            q, k, v = inputs(d, dev)
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
            cells = []
            for fn in funcs.values():
                m = error_metrics(fn(q, k, v, causal), ref)
                cells.append(f"{m['cos']:.5f} / {m['rel_l1']:.4f}")
            rows.append(f"| {d} | {'yes' if causal else 'no'} | " + " | ".join(cells) + " |")
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({platform.machine()}, torch {torch.__version__})"
    date = utc_now()
    text = (f"# FP4 accuracy vs fp32, {name}, {date}, commit {commit()}\n\n"
            f"Command: `python bench/accuracy_fp4.py --device {dev.type}` ({time.time() - t0:.0f} s). "
            "B=1, H=8, N=4096, bf16, K bias 3 sigma; cosine / relative L1 against fp32 SDPA on the same inputs.\n\n"
            "| D | causal | " + " | ".join(funcs) + " |\n|---|---|" + "---|" * len(funcs) + "\n"
            + "\n".join(rows) + "\n")
    record(text, args.out, date, name.split(" (")[0], "fp4-accuracy")


if __name__ == "__main__":
    main()
