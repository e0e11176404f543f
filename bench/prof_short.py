"""Where the time of one short-sequence call goes (Hopper path), beside SDPA's cuDNN backend.

    python bench/prof_short.py [--n 1024 2048 4096] [--d 128 64] [--timeline]

For each shape it prints, in microseconds:
  - the end-to-end GPU time (do_bench median) of sageattn (on an H100 it hands calls this
    short to SDPA: dispatch.HAND_OVER), of the sm90 function and of cuDNN;
  - each stage of the sm90 pipeline alone (do_bench on prepared inputs): the separate
    quantization ops, and quant_qkv, which replaces them (its kernels also profiled);
  - the host time of one call: the GPU is held busy by a sleep kernel while 50 calls are
    queued, so the wall time per call is what the CPU spends (Python, dispatcher, launches;
    rounds in which the host waited for the GPU are not counted: timing.host_us).
A call whose host time exceeds its GPU time is host-bound: the GPU idles between calls.
With --timeline, also each kernel of one sm90 function call with its start and end (profiler), and
the same for quant_qkv alone and the attention kernel alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sageattention as sa  # noqa: E402
from sageattention import _cuda  # noqa: E402
from timing import gpu_us, host_us  # noqa: E402  (bench/timing.py)


def sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = getattr(SDPBackend, backend)

    def run(q, k, v):
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v)

    return run


def stages(q, k, v):
    """The sm90 pipeline of _cuda.forward split into its launches (non-causal, HND)."""
    mod = _cuda.SM90
    op = _cuda.ops(mod)
    d = q.shape[3]
    dp = _cuda.padded_head_dim(d)
    nq, nk = q.shape[2], k.shape[2]
    nq_pad, nk_pad = _cuda._ceil(nq, _cuda.BLOCK_Q), _cuda._ceil(nk, _cuda.SM90_BLOCK_K)
    scale = d ** -0.5 * _cuda.LOG2E
    km = k.mean(dim=2, dtype=torch.float32)
    q8, qs, _ = op.quant_int8(q, None, None, scale, _cuda.WARP_Q, 8, nq_pad, dp)
    k8, ks, _ = op.quant_int8(k, km, None, 1.0, _cuda.BLOCK_K, 4, nk_pad, dp)
    v8, vs, _ = op.quant_v_fp8(v, _cuda.FP8_MAX, False, nk_pad, dp)
    return {
        "k_mean": lambda: k.mean(dim=2, dtype=torch.float32),
        "quant_q": lambda: op.quant_int8(q, None, None, scale, _cuda.WARP_Q, 8, nq_pad, dp),
        "quant_k": lambda: op.quant_int8(k, km, None, 1.0, _cuda.BLOCK_K, 4, nk_pad, dp),
        "quant_v": lambda: op.quant_v_fp8(v, _cuda.FP8_MAX, False, nk_pad, dp),
        # the four rows above in one op (what _cuda.forward calls): statistics, then quantization
        "quant_qkv": lambda: op.quant_qkv(q, k, v, scale, 8, 4, True, False, False, _cuda.FP8_MAX, nq_pad, nk_pad, dp),
        "attn": lambda: op.attn(q8, k8, v8, qs, ks, vs, None, None, 8, 4, nq, nk, d, False, 2, False, False,
                                d ** -0.5, q.dtype),
    }


def kernel_us(fn, reps: int = 20) -> dict:
    """GPU µs per call of each kernel ``fn`` launches (torch.profiler), by a short name."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if total and e.count:
            name = next((k for k in ("qkv_stats", "qkv_quant") if k in e.key), e.key[:40])
            out[name] = total / e.count
    return out


def timeline(fn, reps: int = 10) -> list:
    """The kernels of one call of ``fn`` (after an L2-evicting write, as do_bench does), each as
    (name, start, end) in µs from the start of the call's first kernel: the last of ``reps``
    profiled calls. Shows the gaps between launches that per-kernel times hide."""
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    kernels = sorted(((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                      if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA), key=lambda x: x[1])
    starts = [i for i, (name, _, _) in enumerate(kernels) if "fill" in name.lower() or "zero" in name.lower()]
    last = kernels[starts[-1] + 1:] if starts else kernels
    t0 = last[0][1] if last else 0
    return [(name, a - t0, b - t0) for name, a, b in last]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--d", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--h", type=int, default=32)
    ap.add_argument("--timeline", action="store_true", help="also print the kernels' start and end: one sm90 function call, quant_qkv alone, attn alone")
    args = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, B={args.b} H={args.h} bf16 HND, non-causal")
    print("| D | N | what | GPU µs | host µs/call | TOPS (GPU) |")
    print("|---|---|---|---|---|---|")
    for d in args.d:
        for n in args.n:
            q, k, v = (torch.randn(args.b, args.h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            ops = 4 * args.b * args.h * n * n * d
            rows = {
                "sageattn": lambda: sa.sageattn(q, k, v),
                "sm90 function": lambda: sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v),
                "sdpa_cudnn": lambda: sdpa("CUDNN_ATTENTION")(q, k, v),
                "sdpa_flash": lambda: sdpa("FLASH_ATTENTION")(q, k, v),
            }
            rows.update(stages(q, k, v))
            for name, fn in rows.items():
                g, hst = gpu_us(fn), host_us(fn)
                print(f"| {d} | {n} | {name} | {g:.1f} | {hst:.1f} | {ops / g / 1e6:.0f} |", flush=True)
            try:  # the kernels of quant_qkv (profiler time, not do_bench)
                for kname, us in kernel_us(rows["quant_qkv"]).items():
                    print(f"| {d} | {n} | quant_qkv: {kname} (profiler) | {us:.1f} | | |", flush=True)
            except Exception as exc:  # noqa: BLE001 - a profiler problem must not lose the table
                print(f"# profiler breakdown failed: {exc!r}")
            if args.timeline:
                # one call of the sm90 function, and its two ops each alone: the spans the GPU's
                # own clock gives them, to set beside the do_bench rows above
                for what in ("sm90 function", "quant_qkv", "attn"):
                    try:
                        for kname, a, b in timeline(rows[what]):
                            print(f"# D={d} N={n} {what} timeline: {a:8.1f} .. {b:8.1f} µs  {kname[:70]}", flush=True)
                    except Exception as exc:  # noqa: BLE001
                        print(f"# {what} timeline failed: {exc!r}")


if __name__ == "__main__":
    main()
