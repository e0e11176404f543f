"""GQA calls that return the LSE: does torch's cuDNN attention operator take fewer K/V heads
than query heads as they are, and what the copy that repeats them costs.

    python bench/gqa_lse.py [--repeats 3] [--out bench/results]

sageattn hands short ``return_lse`` calls to torch's cuDNN attention operator
(``_sdpa.sdpa_lse``). For GQA it repeats K and V for the query heads first. This script asks,
for each GQA shape: does torch's own check (``can_use_cudnn_attention`` with
``enable_gqa=True``) accept K and V as they are; does the operator then run them and agree with
fp32 attention over the repeated heads (output and LSE); and the GPU time of the repeat copy
alone, the operator with the copy, the operator without it (where it runs), sm90's kernel
function with ``return_lse`` and sageattn as it routes today. Times are bench.py's do_bench
medians, the calls timed in rotating rounds. Writes a Markdown table into --out.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

import bench as B  # bench/bench.py: time_ms, rounds, record

sa = B.sa

# (b, hq, hkv, n, d): LLM-like head groups (query heads per K/V head: 4 at 32/8, 8 at 64/8, 7 at 28/4)
SHAPES = [(b, hq, hkv, n, 128) for b, hq, hkv in ((4, 32, 8), (1, 64, 8), (2, 28, 4)) for n in (1024, 2048, 4096)]


def reference(q, k, v, causal, scale):
    """fp32 attention over K and V repeated for the query heads: (o, lse)."""
    g = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(g, dim=1) for t in (k, v))
    s = torch.einsum("bhqd,bhkd->bhqk", q.float(), k) * scale
    if causal:
        nq, nk = s.shape[-2:]
        s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, dim=-1), v), lse


def native(q, k, v, causal, scale):
    """torch's cuDNN attention operator on K and V with their own head count."""
    out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)
    return out[0], out[1].reshape(q.shape[0], q.shape[1], q.shape[2])


def check(q, k, v, causal, scale):
    """torch's check with enable_gqa, then the operator on a 2-batch slice against fp32:
    (check says, error text or None, max |o - ref|, max |lse - ref|)."""
    params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, causal, True)
    from sageattention import _sdpa

    ok = bool(_sdpa._cudnn_first(lambda: torch.backends.cuda.can_use_cudnn_attention(params, True)))
    qs, ks, vs = q[:1], k[:1], v[:1]
    try:
        o, lse = native(qs, ks, vs, causal, scale)
    except Exception as exc:  # the answer wanted here, recorded as text
        return ok, f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}", None, None
    ro, rl = reference(qs, ks, vs, causal, scale)
    return ok, None, (o.float() - ro).abs().max().item(), (lse - rl).abs().max().item()


def run(repeats):
    from sageattention import _sdpa

    dev = torch.device("cuda")
    rows = []
    for causal in (False, True):
        for b, hq, hkv, n, d in SHAPES:
            q = torch.randn(b, hq, n, d, device=dev, dtype=torch.bfloat16)
            k, v = (torch.randn(b, hkv, n, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
            scale = d ** -0.5
            says, err, do, dl = check(q, k, v, causal, scale)
            g = hq // hkv
            table = {
                "repeat K, V": lambda: (k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)),
                "cuDNN with the copy": lambda: _sdpa.sdpa_lse(q, k, v, causal, scale),
                "sm90 function": lambda: sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, is_causal=causal,
                                                                              return_lse=True),
                "sageattn": lambda: sa.sageattn(q, k, v, is_causal=causal, return_lse=True),
            }
            if err is None:
                table["cuDNN as is"] = lambda: native(q, k, v, causal, scale)
            for fn in table.values():
                fn()
            torch.cuda.synchronize()
            times = {name: [] for name in table}
            for name in B.rounds(list(table), repeats, "rotate"):
                times[name].append(B.time_ms(table[name]))
            us = {name: 1e3 * statistics.median(t) for name, t in times.items()}
            row = dict(b=b, hq=hq, hkv=hkv, n=n, d=d, causal=causal, says=says, err=err, do=do, dl=dl, us=us)
            rows.append(row)
            print(row, flush=True)
    return rows


def markdown(rows, repeats):
    names = ["repeat K, V", "cuDNN with the copy", "cuDNN as is", "sm90 function", "sageattn"]
    lines = [
        f"µs: median of {repeats} do_bench medians. check: torch's can_use_cudnn_attention with "
        "enable_gqa=True on K and V as they are; max errors: the operator on them (batch 0) against "
        "fp32 attention over the repeated heads.",
        "",
        "| B x Hq / Hkv | N | D | causal | check | operator as is: max err o / lse | "
        + " | ".join(f"{n} µs" for n in names) + " |",
        "|---" * (5 + len(names) + 1) + "|",
    ]
    for r in rows:
        res = r["err"] or f"{r['do']:.4f} / {r['dl']:.5f}"
        cells = [f"{r['us'][n]:.1f}" if n in r["us"] else "n/a" for n in names]
        lines.append(f"| {r['b']}x{r['hq']} / {r['hkv']} | {r['n']} | {r['d']} | {int(r['causal'])} | "
                     f"{'yes' if r['says'] else 'no'} | {res} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(B.ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    date, device = B.utc_now(), torch.cuda.get_device_name()
    rows = run(args.repeats)
    text = (f"# GQA calls with the LSE: cuDNN's operator with and without the head copy ({device}, {date})\n\n"
            f"Command: `python bench/gqa_lse.py --repeats {args.repeats}` (commit {B.commit()}, "
            f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}).\n\n" + markdown(rows, args.repeats))
    B.record(text, args.out, date, device, "gqa-lse")


if __name__ == "__main__":
    sys.exit(main())
