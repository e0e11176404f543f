"""Two or three consumers at D=128 on calls whose work tiles leave the last round of the
persistent grid partly empty (B=1 diffusion-style shapes), beside SDPA's cuDNN backend.

    python bench/waves.py [--rounds 3] [--out DIR] [--tag NAME]

The Hopper kernel runs 128-row work tiles on two consumer warpgroups or 192-row tiles on three
(from SAGE_SM90_NC3_KEYS keys, and below them where three take enough fewer rounds:
dispatch.sm90_rows), one CTA per SM walking tiles at a fixed stride, so a call takes
ceil(tiles / SMs) rounds. For each shape this prints both counts' rounds and the end-to-end GPU
time (do_bench median, quantization included) of the sm90 function with three consumers forced
(SAGEATTN_SM90_NC3_KEYS=1), with two forced (a key threshold no call reaches) and as shipped,
plus cuDNN; settings rotate within each round so the board's state spreads over all of them.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sageattention as sa  # noqa: E402
from ab_run import with_env, write_run  # noqa: E402  (bench/ab_run.py)
from timing import gpu_us  # noqa: E402  (bench/timing.py)

# (B, H, N): B=1 image and video models' self-attention lengths (text tokens included), LLM-style
# prefill lengths, and the B=4, H=32 rows as guards
SHAPES = [(1, h, n) for h in (24, 32, 40) for n in (2304, 2816, 3072, 3584, 4096, 4608, 5120, 6144, 8192)]
SHAPES += [(2, 24, 4608), (1, 24, 9216), (1, 12, 32760), (4, 32, 4096), (4, 32, 16384)]
SETTINGS = {"three": "1", "two": str(1 << 30), "shipped": None}


def rounds(b: int, h: int, nq: int, rows: int, sms: int) -> int:
    """ceil(work tiles / SMs), the tiles as the kernel counts them (dispatch.work_tiles)."""
    return math.ceil(sa.dispatch.work_tiles(b * h, nq, rows) / sms)


def sdpa_cudnn(q, k, v, causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def timed(setting: str, fn) -> float:
    return with_env("SAGEATTN_SM90_NC3_KEYS", SETTINGS[setting], lambda: gpu_us(fn))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--out", type=Path, default=None, help="write <date>-<gpu>-<commit>-waves[-tag].md/.json here")
    ap.add_argument("--tag", default="")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--v-terms", type=int, default=1, choices=(1, 2), help="v_fp8_terms of the sm90 function")
    ap.add_argument("--shapes", nargs="+", default=None, metavar="BxHxN[xNk]",
                    help="instead of the built-in list (a fourth number: keys, when not N)")
    args = ap.parse_args()
    if "SAGEATTN_SM90_NC3_KEYS" in os.environ:
        sys.exit("unset SAGEATTN_SM90_NC3_KEYS: this script sets it per measurement")
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    d = args.d
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes] if args.shapes else SHAPES
    rows = []
    for shape in shapes:
        b, h, n = shape[:3]
        nk = shape[3] if len(shape) > 3 else n
        q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, h, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        sm90 = lambda: sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, is_causal=args.causal,
                                                            v_fp8_terms=args.v_terms)  # noqa: E731
        names = list(SETTINGS) + ["cudnn"]
        times = {x: [] for x in names}
        for r in range(args.rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for x in order:
                times[x].append(gpu_us(lambda: sdpa_cudnn(q, k, v, args.causal)) if x == "cudnn" else timed(x, sm90))
        med = {x: statistics.median(t) for x, t in times.items()}
        # sm90_rows models non-causal calls with V in one term; the others' switch-overs are key counts
        # in the header only (SAGE_SM90_NC3_KEYS_CAUSAL and _CAUSAL_V2): no model there
        rule = None if args.causal or args.v_terms == 2 else sa.dispatch.sm90_rows(b * h, n, nk, d, sms) // 64
        row = {"b": b, "h": h, "n": n, "nk": nk, "d": d, "causal": args.causal, "v_terms": args.v_terms,
               "rounds_two": rounds(b, h, n, 128, sms), "rounds_three": rounds(b, h, n, 192, sms),
               "model": rule, "us": med, "all_us": times}
        rows.append(row)
        print(f"{b}x{h}x{n}x{nk}: rounds 2c {row['rounds_two']} 3c {row['rounds_three']} model {rule or '-'}c  "
              + "  ".join(f"{x} {med[x]:.1f}" for x in names)
              + f"  two/three {med['two'] / med['three']:.3f}", flush=True)
        del q, k, v
    commit = os.environ.get("SAGEATTN_COMMIT", "unknown")
    when = datetime.datetime.now(datetime.timezone.utc)
    lines = [f"# {props.name}, {when:%Y-%m-%d %H:%M} UTC, commit {commit}: two or three consumers by rounds", "",
             f"torch {torch.__version__}, {sms} SMs, D={d}, bf16, HND, {'causal' if args.causal else 'non-causal'}. "
             f"Command: `python bench/waves.py {' '.join(sys.argv[1:])}`", "",
             "End-to-end GPU time of the sm90 function (µs, do_bench median of the rounds' medians) with three "
             "consumers forced, two forced and as shipped, and SDPA's cuDNN; rounds: ceil(work tiles / SMs); "
             "model: the consumer count dispatch.sm90_rows gives for non-causal calls with V in one term (below the key "
             "switch-over by the rounds; the kernel's own choice, which `shipped` runs; — for the other calls).", "",
             "| B | H | Nq | Nk | rounds 2c | rounds 3c | model | three | two | shipped | cuDNN | two / three |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["us"]
        lines.append(f"| {r['b']} | {r['h']} | {r['n']} | {r['nk']} | {r['rounds_two']} | {r['rounds_three']} | {r['model'] or '—'} | "
                     f"{m['three']:.1f} | {m['two']:.1f} | {m['shipped']:.1f} | {m['cudnn']:.1f} | {m['two'] / m['three']:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_run(args.out, when, props.name, commit, "waves", args.tag, text, rows)


if __name__ == "__main__":
    main()
