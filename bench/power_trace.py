"""Work per joule as the board warms: each backend idles for --idle seconds (the board cools),
then runs one attention call back to back for --seconds in batches of about --batch seconds
under the board's energy counter (bench/power.py, PowerMeter.trace). Per batch: GPU
temperature, SM clock, board power, TOPS and TOPS per watt; under the table, the least-squares
slope of TOPS per watt against temperature.

Why: at the H100's 700 W cap, TOPS = 700 W x TOPS/W, and the same code has measured 1.22 and
1.254 TOPS/W at D=128 16k on two boards (bench/NOTES.md). If leakage grows with temperature,
work per joule falls as a board warms, and a cool board gives more TOPS at the same cap.

    python bench/power_trace.py --backends cuda_sm90 sdpa_cudnn cuda_sm90 --n 16384 --d 128 \\
        --idle 30 --seconds 40 --out bench/results

Needs an NVIDIA GPU, the backends' extensions and nvidia-ml-py. Calls run back to back with no
cache flush (not do_bench's protocol): compare batches with each other, not with bench.py's table.
"""

from __future__ import annotations

import argparse
import time

import torch

import bench  # bench/bench.py: the backends, the commit and the results' naming
from power import calls_for, meter_for_current_gpu


def slope(xs, ys):
    """Least-squares slope of ys on xs, or None when xs has no spread."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def trace_markdown(rows, ops: float, settle_s: float = 0.0) -> str:
    """One backend's batches as a Markdown table, and TOPS/W against temperature: the change
    per 10 °C relative to the mean. Left out of the fit: batches without a power reading and
    those starting in the first `settle_s` seconds (on the H100 the board overshoots its cap
    for ~2 s after an idle start, 740-765 W, while the power controller catches up)."""
    text = "| t (s) | GPU °C | SM MHz | board W | TOPS | TOPS/W | capped |\n|---|---|---|---|---|---|---|\n"
    fit = []
    for r in rows:
        tops = ops * r["calls"] / r["seconds"] / 1e12
        tpw = tops / r["watts"] if r["watts"] else None
        temp = r.get("temp_c_mean")
        cells = [f"{r['t_s']:.1f}", f"{temp:.1f}" if temp is not None else "n/a", f"{r['mhz_mean']:.0f}",
                 f"{r['watts']:.0f}" if r["watts"] else "n/a", f"{tops:.1f}", f"{tpw:.4f}" if tpw else "n/a",
                 f"{100 * r['power_cap_share']:.0f} %"]
        text += "| " + " | ".join(cells) + " |\n"
        if tpw and temp is not None and r["t_s"] >= settle_s:
            fit.append((temp, tpw))
    b = slope([t for t, _ in fit], [y for _, y in fit])
    if b is None:
        after = f" from {settle_s:g} s on" if settle_s else ""
        return text + (f"\nTOPS/W against temperature: no fit (fewer than two batches{after} with a power reading "
                       f"and a spread of temperatures).\n")
    mean = sum(y for _, y in fit) / len(fit)
    span = f"{min(t for t, _ in fit):.0f}-{max(t for t, _ in fit):.0f} °C"
    after = f", from {settle_s:g} s on" if settle_s else ""
    return text + (f"\nTOPS/W against temperature ({len(fit)} batches{after}, {span}): {b:+.5f} per °C, "
                   f"{1000 * b / mean:+.2f} % per 10 °C of the mean {mean:.4f}.\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", nargs="+", default=["cuda_sm90", "sdpa_cudnn"],
                    help="bench.py's backend names, run in this order (a name may repeat)")
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--h", type=int, default=32)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of idle before each backend's run")
    ap.add_argument("--seconds", type=float, default=40.0, help="length of each backend's run")
    ap.add_argument("--batch", type=float, default=1.0, help="seconds per batch (the counter steps every ~0.1 s)")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds at the start of each run left out of the fit (the power controller's overshoot)")
    ap.add_argument("--out", default=None, help="write the Markdown into this folder (bench/results naming)")
    args = ap.parse_args()

    table = bench.backends(set(args.backends))
    missing = [n for n in args.backends if n not in table]
    if missing:
        raise SystemExit(f"--backends: {missing} not available here; available: {sorted(bench.backends())}")
    meter = meter_for_current_gpu()
    q, k, v = (torch.randn(args.b, args.h, args.n, args.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ops = 4 * args.b * args.h * args.n * args.n * args.d / (2 if args.causal else 1)
    date, device = bench.utc_now(), torch.cuda.get_device_name()
    text = (f"# Work per joule as the board warms ({date})\n\n{device}, torch {torch.__version__}, commit "
            f"{bench.commit()}, power limit {meter.limit_w:.0f} W. B={args.b} H={args.h} N={args.n} D={args.d} "
            f"bf16 HND, {'causal' if args.causal else 'non-causal'}. Each backend: {args.idle:g} s idle, then "
            f"{args.seconds:g} s back to back in batches of ~{args.batch:g} s (no cache flush).\n\n"
            f"    python bench/power_trace.py --backends {' '.join(args.backends)} --n {args.n} --d {args.d} "
            f"--b {args.b} --h {args.h}{' --causal' if args.causal else ''} --idle {args.idle:g} "
            f"--seconds {args.seconds:g} --batch {args.batch:g} --settle {args.settle:g}\n")
    for name in args.backends:
        fn = table[name]
        call = lambda: fn(q, k, v, args.causal)  # noqa: E731
        call()  # compile / plan outside the trace
        ms = bench.time_ms(call)  # the batch size's estimate of one call
        idle_from = meter.temp_c()
        time.sleep(args.idle)
        idle_to = meter.temp_c()
        calls = calls_for(args.batch, ms)
        batches = max(2, round(args.seconds / args.batch))
        rows = meter.trace(call, calls, batches, torch.cuda.synchronize)
        section = (f"\n## {name}\n\nIdle {args.idle:g} s: GPU {idle_from} → {idle_to} °C. Batches of {calls} calls "
                   f"(~{ms:.3f} ms each).\n\n" + trace_markdown(rows, ops, args.settle))
        print(f"{name}: {section.strip().splitlines()[-1]}", flush=True)  # progress: the fit
        text += section
    if args.out:  # (prints the whole text too)
        bench.record(text, args.out, date, device, f"power-trace-d{args.d}-n{args.n}{'-causal' if args.causal else ''}")
    else:
        print(text)


if __name__ == "__main__":
    main()
