"""Host side of sageattn_varlen: one call from an idle GPU (synchronize, call, synchronize),
its kernels' GPU time, and when the host issued each launch, for the Hopper path and the Triton
path. (The sleep-kernel method of host_overhead.py does not apply: with its offsets on the GPU, as
here, the call reads them back, which waits for the GPU; varlen_layers.py times the host with
offsets on the CPU.)

    python bench/varlen_host.py [--cases ...]

Per case and path: wall µs (median of 30 idle-start calls), kernels µs (profiler), and the
launch timeline of one profiled call: µs after the call's first host event at which each
kernel launch was issued, with the GPU kernel it started; then the host ops with the most self
CPU time.
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sageattention as sa  # noqa: E402
from varlen import CASES, kernel_ms, make, triton_path  # noqa: E402


def wall_us(fn, calls=30):
    fn()
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def timeline(fn):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type.name == "CPU"]
    t0 = min(e.time_range.start for e in events)
    launches = sorted((e.time_range.start - t0, e.name) for e in events
                      if "Launch" in e.name or "Memcpy" in e.name or "synchronize" in e.name.lower())
    gpu = sorted((e.time_range.start - t0, e.name[:50]) for e in prof.events() if e.device_type.name == "CUDA")
    lines = ["  host events (µs after the call's first host event): "
             + ", ".join(f"{t:.0f} {n}" for t, n in launches)]
    lines.append("  GPU kernels start (same clock): " + ", ".join(f"{t:.0f} {n}" for t, n in gpu))
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60)
    return "\n".join(lines) + "\n" + table


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", nargs="*", default=["4 x 4096", "4 x 4096 causal", "prefill: 16 x 256-4096 causal GQA"],
                    choices=list(CASES))
    args = ap.parse_args()
    for name in args.cases:
        lens, hq, hk, d, causal = CASES[name]
        q, k, v, cu = make(lens, hq, hk, d)
        n = max(lens)

        def hopper():
            return sa.sageattn_varlen(q, k, v, cu, cu, n, n, is_causal=causal)

        def triton():
            with triton_path():
                return sa.sageattn_varlen(q, k, v, cu, cu, n, n, is_causal=causal)

        for path, fn in (("default (Hopper where chosen)", hopper), ("Triton", triton)):
            print(f"## {name}, {path}: wall {wall_us(fn):.0f} µs from an idle GPU, kernels "
                  f"{kernel_ms(fn) * 1e3:.0f} µs", flush=True)
            print(timeline(fn), flush=True)


if __name__ == "__main__":
    main()
