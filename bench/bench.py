"""Throughput of sageattention's kernels beside SDPA's flash and cuDNN backends.

    python bench/bench.py                 # full table: N 1k..32k, D 64/128, causal and not
    python bench/bench.py --quick         # N 1k, 4k, 16k only
    python bench/bench.py --n 16384 --d 128 --no-causal
    python bench/bench.py --replot bench/results/<run>.json   # redraw a recorded run's PNG
    python bench/bench.py --power 2       # also energy: TOPS per watt, board power, SM clock
    python bench/bench.py --layout NHD --kv-heads 8   # [B, N, H, D] inputs, 8 K/V heads (GQA)

TOPS = 4*B*H*N^2*D (halved when causal) over the median time of the whole call, quantization
included. B=4, H=32 (B=1 at N=32768), bf16, HND, random normal inputs. ``--layout NHD`` makes
the inputs [B, N, H, D] tensors: sageattention's functions get ``tensor_layout="NHD"``, SDPA gets
them as transposed views (its output is left in its own [B, H, N, D] layout: a caller who wants
NHD back pays a copy on top, not counted). ``--kv-heads G`` gives K and V G heads (GQA; SDPA with
``enable_gqa=True``); the operation count stays that of the H query heads. Each backend's time
is the median of ``--repeats`` do_bench medians. The repeats go round the backends, the
first backend of each round rotating (``--order rotate``, the default), so that no backend
is always timed right after the others: the H100 runs these kernels at its power cap and
clocks down as it warms. (Measured on one H100, the order moved the numbers less than
run-to-run noise; bench/NOTES.md.) ``--order fixed`` times each backend's repeats back to
back in the given order, as runs before 2026-11-23 did. ``--power S`` (needs nvidia-ml-py) then
runs each call back to back for S seconds under the board's energy counter (bench/power.py) and
adds a second table: TOPS per watt, mean board power, mean SM clock and how often the power cap
held the clock down. Writes JSON, the Markdown tables and a PNG plot into bench/results/ (name:
date, GPU, commit).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # power.py

import sageattention as sa  # noqa: E402
from power import calls_for  # noqa: E402  (bench/power.py; imports no NVML until used)


def sdpa_call(q, k, v, causal, layout="HND"):
    """F.scaled_dot_product_attention on bench inputs in `layout`: NHD tensors as transposed
    views, fewer K/V heads than query heads through enable_gqa. Returns SDPA's [B, H, N, D] output."""
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)


def _sdpa(backend, layout):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal):
        with sdpa_kernel([backend]):
            return sdpa_call(q, k, v, causal, layout)

    return run


def backends(selected=None, layout="HND"):
    """name -> fn(q, k, v, causal) for inputs in `layout` (HND or NHD)."""
    from torch.nn.attention import SDPBackend

    lay = {"tensor_layout": layout}
    table = {
        "sdpa_flash": _sdpa(SDPBackend.FLASH_ATTENTION, layout),
        "sdpa_cudnn": _sdpa(SDPBackend.CUDNN_ATTENTION, layout),
        "sageattn": lambda q, k, v, c: sa.sageattn(q, k, v, is_causal=c, **lay),
        "triton": lambda q, k, v, c: sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, is_causal=c, **lay),
    }
    avail = sa.available_backends()
    for name, base, fn in (
        ("cuda_fp16", "cuda_fp16", lambda q, k, v, c: sa.sageattn_qk_int8_pv_fp16_cuda(q, k, v, is_causal=c, **lay)),
        ("cuda_fp16_acc16", "cuda_fp16",
         lambda q, k, v, c: sa.sageattn_qk_int8_pv_fp16_cuda(q, k, v, is_causal=c, pv_accum_dtype="fp16+fp32", **lay)),
        ("cuda_fp8", "cuda_fp8", lambda q, k, v, c: sa.sageattn_qk_int8_pv_fp8_cuda(q, k, v, is_causal=c, **lay)),
        ("cuda_fp8_acc32", "cuda_fp8",
         lambda q, k, v, c: sa.sageattn_qk_int8_pv_fp8_cuda(q, k, v, is_causal=c, pv_accum_dtype="fp32+fp32", **lay)),
        ("cuda_sm90", "cuda_sm90", lambda q, k, v, c: sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, is_causal=c, **lay)),
        ("cuda_sm90_v2", "cuda_sm90",
         lambda q, k, v, c: sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, is_causal=c, v_fp8_terms=2, **lay)),
    ):
        if base in avail:
            table[name] = fn
    if selected:
        table = {k: v for k, v in table.items() if k in selected}
    return table


# --flush read: a 256 MiB buffer of other data read after do_bench's own flush. do_bench "clears"
# L2 before each timed call by writing 256 MiB (zero_); on the H100 two things then differ from
# a cold, clean L2 (bench/NOTES.md, bench/quant_context.py): part of what the previous call read
# survives that write (quant_qkv alone: 68.5 µs after it, 79 when an unrelated read came before
# the write), and L2 is left full of dirty lines. Measured with both flushes in one device call
# (D=128, B=4, H=32), every backend runs faster after the read, most at short N: cuDNN +1-2 % at
# 1k and +9 % at 2k, sageattn +4.5 % and +2 %, equal at 16k. Default: do_bench's write, as every
# recorded table; the read is for checking how much a comparison depends on it.
_read_flush = None


def time_ms(fn) -> float:
    """One do_bench median (ms)."""
    from triton import runtime
    from triton.testing import do_bench

    if _read_flush is None:
        return do_bench(fn, warmup=25, rep=200, return_mode="median")
    drv = runtime.driver.active
    write = drv.clear_cache

    def write_then_read(cache):
        write(cache)
        _read_flush.sum(dtype=torch.int32)

    drv.clear_cache = write_then_read  # (an attribute of the instance, deleted below)
    try:
        return do_bench(fn, warmup=25, rep=200, return_mode="median")
    finally:
        del drv.clear_cache


def rounds(names, repeats: int, order: str):
    """The backends in the order they are timed: `repeats` rounds over all of them, round r
    starting at backend r mod len(names) (rotate), or each backend's repeats back to back."""
    if order == "fixed":
        return [n for n in names for _ in range(repeats)]
    return [names[(r + i) % len(names)] for r in range(repeats) for i in range(len(names))]


def commit() -> str:
    env = os.environ.get("SAGEATTN_COMMIT")
    if env:
        return env
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
    except Exception:
        return "unknown"


def switches() -> str:
    """The kernel switches set in this process's environment (SAGEATTN_*, e.g.
    SAGEATTN_SM90_NARROW=0; SAGEATTN_COMMIT, which only names the run, left out), written as a
    command-line prefix, so that a recorded command says which side of an A/B run it was."""
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("SAGEATTN_") and k != "SAGEATTN_COMMIT")
    return "".join(f"{k}={v} " for k, v in env)


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def record(text: str, out, date: str, device: str, what: str) -> Path:
    """Print a Markdown result and write it as ``<out>/<day>-<device>-<commit>-<what>.md``,
    the naming of bench/results/."""
    print(text)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{date[:10]}-{device.replace(' ', '_').replace('/', '_')}-{commit()}-{what}.md"
    path.write_text(text)
    return path


def inputs(b, heads, kv_heads, n, d, layout="HND", device="cuda"):
    """Random bf16 q, k, v in `layout`: q with `heads` heads, k and v with `kv_heads`."""
    def one(h):
        shape = (b, n, h, d) if layout == "NHD" else (b, h, n, d)
        return torch.randn(*shape, device=device, dtype=torch.bfloat16)

    return one(heads), one(kv_heads), one(kv_heads)


def run(ns, ds, causals, names, repeats, heads=32, batch=4, order="rotate", meter=None, power_s=1.0,
        layout="HND", kv_heads=None):
    """The rows of the table; with a `meter` (power.PowerMeter), after the timing rounds of each
    shape every backend also runs back to back for `power_s` seconds under the energy counter."""
    rows = []
    table = backends(names, layout)
    kv_heads = kv_heads or heads
    for d in ds:
        for causal in causals:
            for n in ns:
                b = 1 if n >= 32768 else batch
                q, k, v = inputs(b, heads, kv_heads, n, d, layout)
                ops = 4 * b * heads * n * n * d / (2 if causal else 1)
                times = {}
                for name in table:  # first call (compilation, planning) outside the timing
                    try:
                        table[name](q, k, v, causal)
                        times[name] = []
                    except Exception as exc:  # a backend SDPA cannot run here: record why
                        print(f"  {name} failed: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
                torch.cuda.synchronize()
                for name in rounds([x for x in table if x in times], repeats, order):
                    fn = table[name]
                    times[name].append(time_ms(lambda: fn(q, k, v, causal)))
                power = {}
                if meter is not None:
                    for name in rounds([x for x in table if times.get(x)], 1, order):
                        fn, calls = table[name], calls_for(power_s, statistics.median(times[name]))
                        m = meter.measure(lambda: fn(q, k, v, causal), calls, torch.cuda.synchronize)
                        m["tops_per_w"] = ops / m["j_per_call"] / 1e12 if m["j_per_call"] > 0 else None
                        m["sustained_tops"] = ops * calls / m["seconds"] / 1e12
                        power[name] = m
                for name in table:
                    ms = statistics.median(times[name]) if times.get(name) else None
                    tops = ops / (ms * 1e-3) / 1e12 if ms else None
                    rows.append(dict(d=d, causal=causal, n=n, b=b, h=heads, hkv=kv_heads, layout=layout,
                                     backend=name, ms=ms, tops=tops,
                                     repeats_ms=times.get(name), **({"power": power[name]} if name in power else {})))
                    print(f"D={d:<4} causal={int(causal)} N={n:<6} {name:<11} "
                          + (f"{tops:7.1f} TOPS  {ms:8.3f} ms" if tops else "   n/a")
                          + (f"  {power[name]['watts']:5.0f} W {power[name]['mhz_mean']:5.0f} MHz "
                             f"{power[name]['tops_per_w'] or 0:.3f} TOPS/W" if name in power else ""), flush=True)
                del q, k, v
    return rows


def markdown(rows, names):
    keys = sorted({(r["d"], r["causal"], r["n"]) for r in rows}, key=lambda t: (-t[0], t[1], t[2]))
    head = "| D | causal | N | " + " | ".join(names) + " |\n|" + "---|" * (3 + len(names)) + "\n"
    body = ""
    for d, c, n in keys:
        cells = []
        for name in names:
            r = next((r for r in rows if (r["d"], r["causal"], r["n"], r["backend"]) == (d, c, n, name)), None)
            cells.append(f"{r['tops']:.0f}" if r and r["tops"] else "n/a")
        body += f"| {d} | {'yes' if c else 'no'} | {n} | " + " | ".join(cells) + " |\n"
    return head + body


def power_markdown(rows, names, seconds: float, limit_w: float | None = None) -> str:
    """The --power table: per shape and backend, TOPS per watt (tera-operations per joule) and,
    in brackets, the mean board power, SM clock and GPU temperature while the call ran back to back."""
    keys = sorted({(r["d"], r["causal"], r["n"]) for r in rows if "power" in r}, key=lambda t: (-t[0], t[1], t[2]))
    if not keys:
        return ""
    limit = f" (board power limit {limit_w:.0f} W)" if limit_w else ""
    text = (f"Energy (`--power {seconds:g}`): each call run back to back for {seconds:g} s, no cache flush between "
            f"calls, under the board's energy counter (NVML){limit}. Cells: TOPS per watt (mean board power, "
            f"mean SM clock, mean GPU temperature where the board reports it; share of clock samples held "
            f"down by the power cap).\n\n")
    text += "| D | causal | N | " + " | ".join(names) + " |\n|" + "---|" * (3 + len(names)) + "\n"
    for d, c, n in keys:
        cells = []
        for name in names:
            r = next((r for r in rows if (r["d"], r["causal"], r["n"], r["backend"]) == (d, c, n, name)), None)
            p = r.get("power") if r else None
            temp = f", {p['temp_c_mean']:.0f} °C" if p and p.get("temp_c_mean") is not None else ""
            cells.append(f"{p['tops_per_w']:.2f} ({p['watts']:.0f} W, {p['mhz_mean']:.0f} MHz{temp}; "
                         f"cap {100 * p['power_cap_share']:.0f} %)" if p and p.get("tops_per_w") else "n/a")
        text += f"| {d} | {'yes' if c else 'no'} | {n} | " + " | ".join(cells) + " |\n"
    return text


def shapes(rows) -> str:
    """The inputs of a run in words, e.g. "bf16, B=4, H=32 (B=1 at 32k)" or "bf16, NHD, B=4, H=32,
    8 K/V heads (B=1 at 32k)" (rows recorded before --layout/--kv-heads existed are HND, MHA)."""
    r = rows[0] if rows else {}
    h, hkv, layout = r.get("h", 32), r.get("hkv") or r.get("h", 32), r.get("layout", "HND")
    return ("bf16, " + (f"{layout}, " if layout != "HND" else "") + f"B=4, H={h}"
            + (f", {hkv} K/V heads" if hkv != h else "") + " (B=1 at 32k)")


def plot(rows, names, path, device=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["d"], r["causal"]) for r in rows}, key=lambda t: (-t[0], t[1]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (d, c) in zip(axes[0], panels):
        for name in names:
            pts = sorted((r["n"], r["tops"]) for r in rows
                         if (r["d"], r["causal"], r["backend"]) == (d, c, name) and r["tops"])
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(f"D={d}, {'causal' if c else 'non-causal'}")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("TOPS (end to end)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{device or torch.cuda.get_device_name()} - {shapes(rows)}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N in 1k, 4k, 16k")
    ap.add_argument("--n", type=int, nargs="*", help="sequence lengths")
    ap.add_argument("--d", type=int, nargs="*", default=[128, 64], help="head dims")
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--causal-only", action="store_true")
    ap.add_argument("--backends", nargs="*", help="subset of backend names")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--order", choices=["rotate", "fixed"], default="rotate",
                    help="rounds over the backends with a rotating start (default), or each backend's repeats in a row")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--flush", choices=["write", "read"], default="write",
                    help="before each timed call: do_bench's 256 MiB write (default), or that write and then a "
                         "256 MiB read of other data (see the comment above time_ms)")
    ap.add_argument("--power", type=float, default=0.0, metavar="SECONDS",
                    help="also run each call back to back for SECONDS under the GPU's energy counter (NVML, "
                         "nvidia-ml-py): TOPS per watt, board power and SM clock per shape and backend")
    ap.add_argument("--layout", choices=["HND", "NHD"], default="HND",
                    help="inputs as [B, H, N, D] (default) or [B, N, H, D] (sageattention's tensor_layout)")
    ap.add_argument("--kv-heads", type=int, default=None, metavar="G",
                    help="K and V heads (GQA; a divisor of the 32 query heads; default 32)")
    ap.add_argument("--tag", default="", help="extra word in the output file names")
    ap.add_argument("--replot", metavar="JSON", help="only draw the PNG of a recorded run, next to its JSON (no GPU)")
    args = ap.parse_args(argv)
    if args.replot:
        rec = json.loads(Path(args.replot).read_text())
        names = list(dict.fromkeys(r["backend"] for r in rec["rows"]))
        plot(rec["rows"], names, Path(args.replot).with_suffix(".png"), rec["meta"]["device"])
        return
    if not torch.cuda.is_available():
        sys.exit("bench.py needs a CUDA GPU")
    if args.flush == "read":
        global _read_flush
        _read_flush = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
    ns = args.n or ([1024, 4096, 16384] if args.quick else [1024, 2048, 4096, 8192, 16384, 32768])
    causals = [True] if args.causal_only else [False] if args.no_causal else [False, True]
    meter = None
    if args.power > 0:
        from power import NvmlMissing, meter_for_current_gpu

        try:
            meter = meter_for_current_gpu()
        except NvmlMissing as exc:
            sys.exit(str(exc))
    if args.kv_heads is not None and (args.kv_heads < 1 or 32 % args.kv_heads):
        sys.exit(f"--kv-heads must divide the 32 query heads, got {args.kv_heads}")
    rows = run(ns, args.d, causals, args.backends, args.repeats, order=args.order, meter=meter, power_s=args.power,
               layout=args.layout, kv_heads=args.kv_heads)
    names = list(dict.fromkeys(r["backend"] for r in rows))
    dev = torch.cuda.get_device_name()
    meta = {
        "device": dev,
        "date": utc_now(),
        "commit": commit(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": __import__("triton").__version__,
        "command": switches() + "python bench/bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "order": args.order,
        "flush": args.flush,
        "dispatch": sa.dispatch.choose(torch.device("cuda")).backend,
        "power_s": args.power,
        "power_limit_w": meter.limit_w if meter else None,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "-".join(filter(None, [meta["date"][:10], dev.replace(" ", "_").replace("/", "_"), meta["commit"], args.tag]))
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = (f"# {dev}, {meta['date']}, commit {meta['commit']}\n\n"
          f"torch {meta['torch']}, CUDA {meta['cuda']}, triton {meta['triton']}; sageattn -> {meta['dispatch']}; "
          f"timing order: {meta['order']}; L2 flush before each call: {meta['flush']}\n\n"
          f"Command: `{meta['command']}`\n\nTOPS, end to end (quantization included), {shapes(rows)}:\n\n"
          + markdown(rows, names))
    if meter:
        md += "\n" + power_markdown(rows, names, args.power, meter.limit_w)
    (out / f"{stem}.md").write_text(md)
    try:
        plot(rows, names, out / f"{stem}.png")
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
    print()
    print(md)


if __name__ == "__main__":
    main()
