"""Where a packed call's GPU time goes, kernel by kernel: sageattn_varlen (offsets on the CPU)
against the sm90 function on the same tokens as one dense batch, for cases of equal lengths
(the same work both ways), and the dense call without cluster pairs and with the packed calls'
schedule (tiles from the counter), through the kernel's per-call switches. Median over 7
profiled calls of each kernel's GPU µs.

    python bench/varlen_kernels.py [--cases ...]
"""

import argparse
import os
import statistics
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sageattention as sa  # noqa: E402
from varlen import CASES, cpu_offsets, make, profiled_calls  # noqa: E402

EQUAL = [name for name, c in CASES.items() if len(set(c[0])) == 1]


def per_kernel(fn, calls=7):
    runs = profiled_calls(fn, calls)
    names = sorted({n for r in runs for n in r})
    return {n: statistics.median(r.get(n, 0.0) for r in runs) for n in names}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=EQUAL, choices=EQUAL)
    args = ap.parse_args()
    for name in args.cases:
        lens, hq, hk, d, causal = CASES[name]
        q, k, v, _ = make(lens, hq, hk, d)
        n, b = lens[0], len(lens)
        cu = cpu_offsets(lens)

        def packed():
            return sa.sageattn_varlen(q, k, v, cu, cu, n, n, is_causal=causal)

        def dense():
            return sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q.view(b, n, hq, d), k.view(b, n, hk, d), v.view(b, n, hk, d),
                                                        tensor_layout="NHD", is_causal=causal)

        def env(var, value):  # the dense call with one of the kernel's per-call switches set
            def fn():
                os.environ[var] = value
                try:
                    return dense()
                finally:
                    del os.environ[var]
            return fn

        print(f"## {name}: GPU µs per kernel (median of 7 calls)")
        for label, fn in (("sageattn_varlen, offsets on the CPU", packed), ("sm90 function, dense batch", dense),
                          ("dense, no cluster pairs (SAGEATTN_SM90_CLUSTER=0)", env("SAGEATTN_SM90_CLUSTER", "0")),
                          ("dense, tiles from the counter (SAGEATTN_SM90_SCHED=1)", env("SAGEATTN_SM90_SCHED", "1"))):
            times = per_kernel(fn)
            print(f"- {label}: total {sum(times.values()):.0f}; "
                  + "; ".join(f"{t:.0f} {k}" for k, t in sorted(times.items(), key=lambda x: -x[1])))


if __name__ == "__main__":
    main()
