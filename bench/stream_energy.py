"""Joules per call of a streaming pass (bf16 Q, K, V in, one byte per element out) against the
number of SMs it runs on, beside quant_qkv, the attention kernel alone and the whole sm90 call
on the same shape. Needs an sm90 GPU, nvidia-ml-py, the CUDA extensions (for the reference rows)
and bench/stream_energy.cu built as a shared library:

    nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode arch=compute_90a,code=sm_90a \\
         bench/stream_energy.cu -o /tmp/stream_energy.so
    python bench/stream_energy.py --lib /tmp/stream_energy.so [--n 16384] [--ctas 132 88 66 44]
        [--kinds cast copy] [--no-reference]
"""

from __future__ import annotations

import argparse
import ctypes

import torch

from power import calls_for, meter_for_current_gpu  # bench/
from timing import gpu_us


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--n", type=int, nargs="+", default=[16384])
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--h", type=int, default=32)
    ap.add_argument("--ctas", type=int, nargs="+", default=[132, 110, 88, 66, 44, 33])
    ap.add_argument("--unroll", type=int, nargs="+", default=[8])
    ap.add_argument("--kinds", nargs="+", default=["cast", "copy"], choices=["cast", "copy"],
                    help="cast: int8 of x/2 (rounded, saturated); copy: the high byte of each bf16 value")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--no-reference", action="store_true", help="leave out the sageattention rows")
    args = ap.parse_args()

    lib = ctypes.CDLL(args.lib)
    lib.stream_cast.restype = ctypes.c_int
    lib.stream_cast.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_longlong, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                                        ctypes.c_longlong]
    meter = meter_for_current_gpu()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()} ({sms} SMs), torch {torch.__version__}, B={args.b} H={args.h} "
          f"D={args.d} bf16; power limit {meter.limit_w:.0f} W; each row {args.seconds:g} s back to back")
    print("| N | what | µs per call (do_bench) | TB/s | µs per call (back to back) | J per call | board W | SM MHz | capped |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.n:
        q, k, v = (torch.randn(args.b, args.h, n, args.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        outs = [torch.empty(x.shape, device="cuda", dtype=torch.int8) for x in (q, k, v)]
        elements = q.numel()
        moved = 3 * elements * 3  # bytes: 2 read and 1 written per element of each tensor
        stream = torch.cuda.current_stream().cuda_stream

        def cast(ctas, unroll, kind):
            def fn():
                err = lib.stream_cast(q.data_ptr(), k.data_ptr(), v.data_ptr(), *(o.data_ptr() for o in outs),
                                      elements, ctas, unroll, int(kind == "cast"), stream)
                if err:
                    raise RuntimeError(f"stream_cast: CUDA error {err}")
            return fn

        rows = {}
        for kind in args.kinds:
            for unroll in args.unroll:
                for ctas in args.ctas:
                    if ctas <= sms:
                        rows[f"{kind}, {ctas} SMs, U={unroll}"] = cast(ctas, unroll, kind)
        for kind in args.kinds:  # the outputs are what they say
            cast(sms // 2, args.unroll[0], kind)()
            torch.cuda.synchronize()
            if kind == "cast":
                want = torch.clamp(torch.round(k.float() * 0.5), -127, 127).to(torch.int8)
            else:
                want = (k.view(torch.int16) >> 8).to(torch.int8)
            assert torch.equal(outs[1], want), f"{kind}: wrong bytes"
        if not args.no_reference:
            from energy_split import sm90_rows  # bench/ (its prof_short import puts the root on sys.path)

            rows.update(sm90_rows(q, k, v))
        for name, fn in rows.items():
            us = gpu_us(fn)
            calls = calls_for(args.seconds, us * 1e-3)
            m = meter.measure(fn, calls, torch.cuda.synchronize)
            tbs = f"{moved / us / 1e6:.2f}" if name.startswith(("cast", "copy")) else ""
            print(f"| {n} | {name} | {us:.1f} | {tbs} | {1e6 * m['seconds'] / calls:.1f} | {m['j_per_call']:.4f} | "
                  f"{m['watts']:.0f} | {m['mhz_mean']:.0f} | {100 * m['power_cap_share']:.0f} % |", flush=True)
        del q, k, v, outs, rows


if __name__ == "__main__":
    main()
