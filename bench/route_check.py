"""Where a set of hand-over limits would send the calls of recorded crossover runs, and what that
costs: no GPU, only bench/results/*crossover*.json (crossover.py's output).

    python bench/route_check.py RUN [RUN ...] [--set FIELD=VALUE ...] [--only EXPR] [--list] [--by-length]

RUN: a file stem or glob under bench/results (``2026-11-28-NVIDIA_H200-5a7acc2-crossover-*``).
Each run is routed by the limits of the GPU named in it (dispatch.hand_over_for, cuda_sm90), or
with ``--set`` by those limits with fields replaced (``--set length_192_gqa=1920
pairs_192_gqa=3*2**26``), as sageattn would route it (dispatch.goes_to_sdpa). A call's cost is its
time on that route over the faster side's: SDPA's faster backend, or with the LSE cuDNN's
operator, where sageattn sends those calls (as tests/test_dispatch.py holds the recorded runs).
``--only`` keeps the rows for which a Python expression over b, h, hkv, nq, nk, d, causal, lse
and gqa is true (``"128 < d <= 192 and not causal and gqa"``). Prints per run and in all: calls,
calls more than 6 % from their faster side, the worst, the mean excess; ``--list`` names the
calls more than 6 % off; ``--by-length`` adds, for each key length, the kernel's time over SDPA's
(not the route's cost: where the crossover lies, whatever the limits) over the rows kept, with the
lengths that are multiples of cuDNN's tile (dispatch.CUDNN_TILE, Nq and Nk both) marked.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sageattention import dispatch  # noqa: E402
from sageattention._checks import Dims  # noqa: E402

RESULTS = ROOT / "bench" / "results"
TIE = 1.06  # the band within which either side counts as the faster (tests/test_dispatch.py)


def runs(patterns):
    """The crossover runs (path) that the stems or globs name, each once, in name order."""
    found = {p for pat in patterns for p in RESULTS.glob(pat if pat.endswith(".json") else f"{pat}.json")}
    if not found:
        sys.exit(f"no run matches {patterns} under {RESULTS}")
    return sorted(found)


def limits_for(device: str, replace: dict):
    lim = dispatch.hand_over_for((9, 0), device, "cuda_sm90")
    if lim is None:
        sys.exit(f"no sm90 hand-over row matches the device {device!r}")
    return lim._replace(**replace) if replace else lim


def route(r: dict, limits, lse: bool) -> tuple[bool, float, float]:
    """(handed to SDPA by ``limits``, SDPA's time, the kernel's time) for a row of a recorded run
    (``lse``: one made with --lse): SDPA's time is cuDNN's with the LSE, where sageattn sends those
    calls, else the faster backend's. tests/test_dispatch.py holds the recorded runs with it."""
    us = r["us"]
    sdpa = us["sdpa_cudnn"] if lse else min(us[n] for n in ("sdpa_cudnn", "sdpa_flash") if n in us)
    dims = Dims(r["b"], r["h"], r.get("hkv") or r["h"], r["nq"], r["nk"], r["d"])
    return dispatch.goes_to_sdpa(limits, dims, r["causal"], lse), sdpa, us["kernel"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="file stems or globs under bench/results")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="replace these limits")
    ap.add_argument("--only", default="True", help="keep rows for which this expression is true")
    ap.add_argument("--list", action="store_true", help="name the calls more than 6 %% off")
    ap.add_argument("--by-length", action="store_true",
                    help="kernel / SDPA by key length (min, median, max), multiples of cuDNN's tile marked")
    args = ap.parse_args(argv)
    replace = {}
    for item in args.set:
        field, _, value = item.partition("=")
        if field not in dispatch.HandOver._fields or not value:
            sys.exit(f"--set {item!r}: want FIELD=VALUE with FIELD one of {', '.join(dispatch.HandOver._fields)}")
        replace[field] = int(eval(value, {"__builtins__": {}}))  # 3*2**26, 1<<28
    total = [0, 0, 1.0, 0.0]  # calls, off, worst, summed excess
    by_length = {}  # (nk, on cuDNN's tile) -> [kernel / SDPA]
    for path in runs(args.runs):
        run = json.loads(path.read_text())
        limits = limits_for(run["device"], replace)
        stats = [0, 0, 1.0, 0.0]
        for r in run["rows"]:
            hkv = r.get("hkv") or r["h"]
            names = dict(b=r["b"], h=r["h"], hkv=hkv, nq=r["nq"], nk=r["nk"], d=r["d"], causal=r["causal"],
                         lse=bool(r.get("lse")), gqa=r["h"] >= dispatch.GQA_GROUP * hkv)
            if not eval(args.only, {"__builtins__": {}}, names):
                continue
            if "sdpa_cudnn" not in r["us"]:
                continue  # a head dim cuDNN refused: the kernel's call either way
            go, sdpa, kernel = route(r, limits, names["lse"])
            cost = (sdpa if go else kernel) / min(sdpa, kernel)
            tiled = r["nq"] % dispatch.CUDNN_TILE == 0 and r["nk"] % dispatch.CUDNN_TILE == 0
            by_length.setdefault((r["nk"], tiled), []).append(kernel / sdpa)
            stats[0] += 1
            stats[1] += cost > TIE
            stats[2] = max(stats[2], cost)
            stats[3] += cost - 1
            if args.list and cost > TIE:
                print(f"  {path.stem}: {r['b']} x {r['h']} / {hkv} x {r['nq']} x {r['nk']} D={r['d']} "
                      f"causal={int(r['causal'])} -> {'SDPA' if go else 'kernel'}, kernel / SDPA "
                      f"{kernel / sdpa:.3f}, cost {cost:.3f}")
        if stats[0]:
            print(f"{path.stem}: {stats[0]} calls, {stats[1]} more than 6 % off, worst {stats[2]:.3f}, "
                  f"mean excess {100 * stats[3] / stats[0]:.2f} %")
        total = [total[0] + stats[0], total[1] + stats[1], max(total[2], stats[2]), total[3] + stats[3]]
    if total[0]:
        print(f"all: {total[0]} calls, {total[1]} more than 6 % off, worst {total[2]:.3f}, "
              f"mean excess {100 * total[3] / total[0]:.2f} %")
    else:
        print("no rows left by --only")
    if args.by_length:
        print(f"kernel / SDPA by key length ('*': Nq and Nk multiples of {dispatch.CUDNN_TILE}): "
              "calls, min, median, max")
        for (nk, tiled), ratios in sorted(by_length.items()):
            ratios.sort()
            print(f"  {nk:>6}{'*' if tiled else ' '} {len(ratios):>4}  {ratios[0]:.2f}  "
                  f"{ratios[len(ratios) // 2]:.2f}  {ratios[-1]:.2f}")


if __name__ == "__main__":
    main()
