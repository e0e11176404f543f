"""CTA pairs sharing K and V (the D=128 three-consumer kernel's clusters) on and off, end to end,
beside SDPA's cuDNN backend.

    python bench/pairs_ab.py [--rounds 5] [--shapes BxHxN[/G] ...] [--power S] [--out DIR] [--tag NAME]
    python bench/pairs_ab.py --switch SAGEATTN_SM90_TAIL=0 --d 64 ...   # another switch, head dim

For each shape (G: K/V heads, GQA; default H) this prints the end-to-end GPU time (do_bench
median, quantization included) of the sm90 function with pairs off (SAGEATTN_SM90_CLUSTER=0)
and as shipped, and cuDNN's; the three rotate within each round so that the board's state
(power cap, temperature) spreads over all of them. The default shapes have an odd number of
192-row work tiles per head (2048, 5000, 8192, 32768 queries), which got pairs only once pairs
could hold two query heads' tiles, plus 16384 (pairs inside heads before too) as a control.

--switch VAR=VALUE compares another of the op's per-call switches the same way (VAR=VALUE
against VAR unset), --d the head dim (default 128).

With --power S each measurement is instead S seconds of back-to-back calls under the board's
energy counter (bench/power.py, needs nvidia-ml-py): time and joules per call and the mean SM
clock. At the power cap that is far steadier than do_bench's short bursts (on an H200 the
rounds of one setting agreed within ~0.3 %, where do_bench's medians moved by ~1 %).
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

SHAPES = ["4x32x2048", "4x32x5000", "4x32x8192", "4x32x8192/8", "1x40x8192", "1x32x32768", "4x32x16384"]
SETTINGS = {"off": "0", "shipped": None}
SWITCH = "SAGEATTN_SM90_CLUSTER"  # the variable "off" sets (--switch replaces both)


def parse(shape: str) -> tuple[int, int, int, int]:
    dims, _, g = shape.partition("/")
    b, h, n = (int(x) for x in dims.split("x"))
    return b, h, n, int(g) if g else h


def tiles_per_head(n: int) -> int:
    return math.ceil(n / 192)  # 192-row tiles over the queries (attn_sm90.cuh: sm90_q_tiles)


def under(setting: str, measure):
    """`measure()` with SWITCH (SAGEATTN_SM90_CLUSTER) as `setting` has it (read by the op per call)."""
    return with_env(SWITCH, SETTINGS[setting], measure)


def use_switch(arg: str) -> None:
    """--switch VAR=VALUE: "off" sets VAR to VALUE from now on (instead of SAGEATTN_SM90_CLUSTER=0)."""
    global SWITCH
    var, eq, value = arg.partition("=")
    if not var.startswith("SAGEATTN_") or not eq or not value:
        raise SystemExit(f"--switch takes SAGEATTN_...=VALUE, got {arg!r}")
    SWITCH, SETTINGS["off"] = var, value


def timed(setting: str, fn) -> float:
    return under(setting, lambda: gpu_us(fn))


def sustained(setting: str, fn, meter, seconds: float, ms: float) -> dict:
    """`seconds` of back-to-back calls of `fn` (each about `ms`) under `setting`."""
    from power import calls_for  # bench/power.py (nvidia-ml-py)

    return under(setting, lambda: meter.measure(fn, calls_for(seconds, ms), torch.cuda.synchronize))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", nargs="+", default=SHAPES, metavar="BxHxN[/G]")
    ap.add_argument("--out", type=Path, default=None, help="write <date>-<gpu>-<commit>-pairs[-tag].md/.json here")
    ap.add_argument("--tag", default="")
    ap.add_argument("--power", type=float, default=0.0, metavar="SECONDS",
                    help="time and joules per call from SECONDS of back-to-back calls per measurement")
    ap.add_argument("--switch", default=None, metavar="VAR=VALUE", help="the setting compared with the shipped one")
    ap.add_argument("--d", type=int, default=128, help="head dim")
    args = ap.parse_args()
    if args.switch:
        use_switch(args.switch)
    if SWITCH in os.environ:
        sys.exit(f"unset {SWITCH}: this script sets it per measurement")
    d = args.d
    props = torch.cuda.get_device_properties(0)
    meter = None
    if args.power:
        from power import meter_for_current_gpu  # bench/power.py

        meter = meter_for_current_gpu()
    rows = []
    for shape in args.shapes:
        b, h, n, g = parse(shape)
        q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, g, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        sm90 = lambda: sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v)  # noqa: E731

        def cudnn():
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=g != h)

        names = list(SETTINGS) + ["cudnn"]
        times = {x: [] for x in names}
        energy = {x: [] for x in names}  # (J per call, mean SM MHz) with --power
        ms = 1e-3 * gpu_us(sm90)
        for r in range(args.rounds):
            for x in names[r % len(names):] + names[: r % len(names)]:
                if meter is None:
                    times[x].append(gpu_us(cudnn) if x == "cudnn" else timed(x, sm90))
                    continue
                m = sustained("off" if x == "cudnn" else x, cudnn if x == "cudnn" else sm90, meter, args.power, ms)
                times[x].append(1e6 * m["seconds"] / m["calls"])
                energy[x].append((m["j_per_call"], m["mhz_mean"]))
        med = {x: statistics.median(t) for x, t in times.items()}
        tops = {x: 4 * b * h * n * n * d / (med[x] * 1e-6) / 1e12 for x in names}
        row = {"shape": shape, "b": b, "h": h, "n": n, "kv_heads": g, "tiles_per_head": tiles_per_head(n),
               "us": med, "tops": tops, "all_us": times}
        if meter is not None:
            row["j_per_call"] = {x: statistics.median(j for j, _ in e) for x, e in energy.items()}
            row["mhz"] = {x: statistics.median(c for _, c in e) for x, e in energy.items()}
            row["all_energy"] = energy
        rows.append(row)
        print(f"{shape}: tiles/head {row['tiles_per_head']}  " + "  ".join(f"{x} {med[x]:.1f} µs ({tops[x]:.0f})" for x in names)
              + f"  off / shipped {med['off'] / med['shipped']:.4f}", flush=True)
        del q, k, v
    commit = os.environ.get("SAGEATTN_COMMIT", "unknown")
    when = datetime.datetime.now(datetime.timezone.utc)
    how = (f"time per call over {args.power:g} s of back-to-back calls under the energy counter (median of the rounds)"
           if meter else "median of the rounds' do_bench medians")
    off = f"{SWITCH}={SETTINGS['off']}"
    lines = [f"# {props.name}, {when:%Y-%m-%d %H:%M} UTC, commit {commit}: {off} against shipped", "",
             f"torch {torch.__version__}, {props.multi_processor_count} SMs, D={d}, bf16, HND, non-causal. "
             f"Command: `python bench/pairs_ab.py {' '.join(sys.argv[1:])}`", "",
             f"End-to-end GPU time of the sm90 function (µs, {how}; TOPS in brackets) "
             f"with {off} (off) and as shipped, and SDPA's cuDNN. Shape: BxHxN, /G: K/V heads."
             + (" J: joules per call, MHz: mean SM clock." if meter else ""), "",
             "| shape | tiles per head | off | shipped | cuDNN | off / shipped |"
             + (" J off / shipped | MHz off / shipped |" if meter else ""),
             "|---|---|---|---|---|---|" + ("---|---|" if meter else "")]
    for r in rows:
        m, t = r["us"], r["tops"]
        line = (f"| {r['shape']} | {r['tiles_per_head']} | {m['off']:.1f} ({t['off']:.0f}) | {m['shipped']:.1f} "
                f"({t['shipped']:.0f}) | {m['cudnn']:.1f} ({t['cudnn']:.0f}) | {m['off'] / m['shipped']:.4f} |")
        if meter:
            j, c = r["j_per_call"], r["mhz"]
            line += f" {j['off']:.4f} / {j['shipped']:.4f} | {c['off']:.0f} / {c['shipped']:.0f} |"
        lines.append(line)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        write_run(args.out, when, props.name, commit, "pairs" if SWITCH == "SAGEATTN_SM90_CLUSTER" else "switch", args.tag, text, rows)


if __name__ == "__main__":
    main()
