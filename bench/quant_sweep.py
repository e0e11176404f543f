"""Time of quant_qkv (the one quantization launch of the fp8 families) beside a bandwidth floor.

    python bench/quant_sweep.py [--n 1024 4096 16384] [--d 128 64] [--sweep]

For each shape (B=4, H=32, bf16, HND, the sm90 module's padding) it prints the GPU µs of
  - quant_qkv as sageattn calls it (per-thread scales, K smoothing);
  - the floor: torch casting Q, K and V to e4m3 (reads every input once, writes one byte per
    element: the DRAM bytes of a perfect one-pass quantization), and its bandwidth.
--sweep also times quant_qkv under the launcher's experiment knobs
SAGE_QKV_CTAS_PER_SM (resident CTAs per SM) and SAGE_QKV_LAG_PCT (the lag between a head's
statistics and its quantization, in percent of the resident CTAs' tickets).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sageattention import _cuda  # noqa: E402


def gpu_us(fn) -> float:
    from triton.testing import do_bench

    fn()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(do_bench(fn, warmup=25, rep=100, return_mode="median") for _ in range(3))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--d", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--h", type=int, default=32)
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    op = _cuda.ops(_cuda.SM90)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, B={args.b} H={args.h} bf16 HND")
    print("| D | N | what | GPU µs | GB/s of the floor's bytes |")
    print("|---|---|---|---|---|")
    for d in args.d:
        dp = _cuda.padded_head_dim(d)
        for n in args.n:
            q, k, v = (torch.randn(args.b, args.h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            nq_pad, nk_pad = _cuda._ceil(n, _cuda.BLOCK_Q), _cuda._ceil(n, _cuda.SM90_BLOCK_K)
            scale = d ** -0.5 * _cuda.LOG2E
            nbytes = 3 * q.numel() * 3  # read 2 bytes, write 1 per element of Q, K and V

            def quant():
                return op.quant_qkv(q, k, v, scale, 8, 4, True, False, False, _cuda.FP8_MAX, nq_pad, nk_pad, dp)

            def floor():
                return tuple(t.to(torch.float8_e4m3fn) for t in (q, k, v))

            configs = [("quant_qkv", {})]
            if args.sweep:
                configs += [(f"quant_qkv ctas/SM={c} lag={lag}%", {"SAGE_QKV_CTAS_PER_SM": str(c),
                                                                     "SAGE_QKV_LAG_PCT": str(lag)})
                            for c in (2, 3, 4) for lag in (50, 100, 200)]
            configs.append(("floor: Q, K, V cast to e4m3 (torch)", None))
            for name, env in configs:
                saved = {key: os.environ.get(key) for key in ("SAGE_QKV_CTAS_PER_SM", "SAGE_QKV_LAG_PCT")}
                os.environ.update(env or {})
                try:
                    us = gpu_us(floor if env is None else quant)
                finally:
                    for key, val in saved.items():
                        if val is None:
                            os.environ.pop(key, None)
                        else:
                            os.environ[key] = val
                print(f"| {d} | {n} | {name} | {us:.1f} | {nbytes / us / 1e3:.0f} |", flush=True)


if __name__ == "__main__":
    main()
