"""quant_qkv's kernels timed by the GPU's clock, alone and with other work around them.

    python bench/quant_context.py [--n 1024] [--d 128] [--reps 300]

Why: do_bench gives quant_qkv alone ~69 µs at 1k (D=128, B=4, H=32), while the profiler's
timeline of one call of the sm90 function shows the same kernels spanning ~80 µs, and the sum of the two
ops alone falls ~12 µs short of the call (bench/NOTES.md). This script runs the op in loops
that differ only in what else each round does, and reports per loop, from the profiler's
kernel records of the last third of the rounds (medians, µs):
  - stats, quant: the two kernels' durations; op: the first one's start to the second one's end;
  - MHz: the SM clock at the end of the round, from a spin of a known number of cycles
    (torch.cuda._sleep) timed by the same records.
Loops (each round starts with a 256 MiB write meant to evict L2, as do_bench's):
  alone   quant_qkv
  read    quant_qkv, then a read of another 256 MiB (a sum: memory traffic, little power)
  matmul  quant_qkv, then 20 small fp16 matmuls (tensor-core power, a 6 MiB footprint)
  call    the sm90 function (quant_qkv, then the attention kernel on its outputs; sageattn
          itself hands calls this short to SDPA since the short-call rule, dispatch.HAND_OVER)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sageattention as sa  # noqa: E402
from sageattention import _cuda  # noqa: E402

SPIN = 40_000  # cycles of the clock probe: ~20 µs at 1980 MHz


def records(fn, reps: int) -> list[list[tuple[str, float, float]]]:
    """The CUDA kernels of each round of ``fn`` (a round starts with the flush): (name, start, end) µs."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    ks = sorted(((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                 if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA), key=lambda x: x[1])
    rounds, cur = [], None
    for k in ks:
        if "fill" in k[0].lower() or "zero" in k[0].lower():  # the flush opens a round
            cur = []
            rounds.append(cur)
        elif cur is not None:
            cur.append(k)
    return rounds


def summary(rounds) -> dict:
    tail = rounds[-max(1, len(rounds) // 3):]
    out: dict[str, list[float]] = {"stats": [], "quant": [], "op": [], "MHz": []}
    for r in tail:
        st = next((k for k in r if "qkv_stats" in k[0]), None)
        qu = next((k for k in r if "qkv_quant" in k[0]), None)
        sp = next((k for k in r if "sleep" in k[0].lower() or "spin" in k[0].lower()), None)
        if st and qu:
            out["stats"].append(st[2] - st[1])
            out["quant"].append(qu[2] - qu[1])
            out["op"].append(qu[2] - st[1])
        if sp and sp[2] > sp[1]:
            out["MHz"].append(SPIN / (sp[2] - sp[1]))
    return {k: statistics.median(v) if v else float("nan") for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[1024])
    ap.add_argument("--d", type=int, nargs="+", default=[128])
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--h", type=int, default=32)
    ap.add_argument("--reps", type=int, default=300)
    args = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, B={args.b} H={args.h} bf16 HND, "
          f"non-causal; medians of the last third of {args.reps} rounds (µs)")
    print("| D | N | loop | stats | quant | op (stats start to quant end) | SM MHz at the round's end |")
    print("|---|---|---|---|---|---|---|")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    other = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)

    def burn():
        for _ in range(20):
            torch.mm(a, a)
    for d in args.d:
        for n in args.n:
            q, k, v = (torch.randn(args.b, args.h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            op = _cuda.ops(_cuda.SM90)
            dp = _cuda.padded_head_dim(d)
            nq_pad, nk_pad = _cuda._ceil(n, _cuda.BLOCK_Q), _cuda._ceil(n, _cuda.SM90_BLOCK_K)
            scale = d ** -0.5 * _cuda.LOG2E

            def quant():
                return op.quant_qkv(q, k, v, scale, 8, 4, True, False, False, _cuda.FP8_MAX, nq_pad, nk_pad, dp)

            loops = {
                "alone": lambda: (flush.zero_(), quant(), torch.cuda._sleep(SPIN)),
                "read": lambda: (flush.zero_(), quant(), torch.cuda._sleep(SPIN), other.sum(dtype=torch.int32)),
                "matmul": lambda: (flush.zero_(), quant(), torch.cuda._sleep(SPIN), burn()),
                "call": lambda: (flush.zero_(), sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v), torch.cuda._sleep(SPIN)),
            }
            for _ in range(2):  # two passes: the clock's state carries from one loop to the next
                for name, fn in loops.items():
                    s = summary(records(fn, args.reps))
                    print(f"| {d} | {n} | {name} | {s['stats']:.1f} | {s['quant']:.1f} | {s['op']:.1f} | "
                          f"{s['MHz']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
