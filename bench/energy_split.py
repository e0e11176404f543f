"""Where the joules of one sm90 call go: the whole call, quant_qkv alone and the attention kernel
alone (on inputs quantized beforehand), beside SDPA's cuDNN backend. Each runs back to back for
--seconds under the board's energy counter (bench/power.py). Needs an sm90 GPU, the CUDA
extensions and nvidia-ml-py.

    python bench/energy_split.py [--n 16384 4096 1024] [--d 128] [--seconds 2]
"""

from __future__ import annotations

import argparse

import torch

from power import calls_for, meter_for_current_gpu  # bench/
from prof_short import sdpa, stages  # bench/ (puts the repository root on sys.path)
from timing import gpu_us


def sm90_rows(q, k, v) -> dict:
    """The sm90 call and its two parts on these inputs: the whole call, quant_qkv alone, and the
    attention kernel alone on inputs quantized beforehand (also stream_energy.py's reference rows)."""
    import sageattention as sa

    st = stages(q, k, v)
    return {
        "sm90 call": lambda: sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v),
        "quant_qkv alone": st["quant_qkv"],
        "attention alone": st["attn"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[16384, 4096, 1024])
    ap.add_argument("--d", type=int, nargs="+", default=[128])
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--h", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    meter = meter_for_current_gpu()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, B={args.b} H={args.h} bf16 HND, non-causal, "
          f"power limit {meter.limit_w:.0f} W; each row {args.seconds:g} s back to back")
    print("| D | N | what | µs per call (do_bench) | µs per call (back to back) | J per call | board W | SM MHz | capped |")
    print("|---|---|---|---|---|---|---|---|---|")
    for d in args.d:
        for n in args.n:
            q, k, v = (torch.randn(args.b, args.h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            rows = {**sm90_rows(q, k, v), "sdpa_cudnn": lambda: sdpa("CUDNN_ATTENTION")(q, k, v)}
            for name, fn in rows.items():
                us = gpu_us(fn)
                calls = calls_for(args.seconds, us * 1e-3)
                m = meter.measure(fn, calls, torch.cuda.synchronize)
                print(f"| {d} | {n} | {name} | {us:.1f} | {1e6 * m['seconds'] / calls:.1f} | {m['j_per_call']:.4f} | "
                      f"{m['watts']:.0f} | {m['mhz_mean']:.0f} | {100 * m['power_cap_share']:.0f} % |", flush=True)
            del q, k, v, rows


if __name__ == "__main__":
    main()
