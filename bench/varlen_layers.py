"""sageattn_varlen inside a model: what the offsets' read-back costs a forward pass.

A stack of transformer-like layers on packed sequences (x [T, H*D] bf16; per layer: layer norm,
x @ W_qkv, attention, @ W_o, then layer norm and a GELU MLP of --mlp times the width, 4 by
default, 0 for none; one set of weights reused by every layer). With the offsets on the GPU,
sageattn_varlen reads them back in each layer, so the host waits for the GPU there and the GPU
then idles while the host issues the rest of the call;
with the offsets on the CPU the call has no sync and the host runs ahead of the GPU. torch's
FlashAttention varlen (offsets on the GPU, no read-back) is the same model with another kernel.

    python bench/varlen_layers.py --out bench/results [--mlp 0]  # writes <date>-<gpu>-<commit>-varlen-layers-mlp4.md

Per case and variant: wall ms per forward (synchronize, L layers, synchronize; median of 10,
the variants interleaved), from the profiler trace of one forward the time the GPU sat idle
between its first and last kernel, and, for sageattn_varlen with offsets on the CPU, its host
µs per call with the GPU kept busy (timing.host_us): while that is below the GPU time per layer
the host stays ahead.
"""

import argparse
import contextlib
import datetime
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sageattention as sa  # noqa: E402
from timing import host_us  # noqa: E402
from varlen import CASES, cpu_offsets, triton_path, write_table  # noqa: E402

DEFAULT_CASES = ["4 x 4096", "video: 8k 6k 4k 2k", "prefill: 16 x 256-4096 causal GQA"]


class Model:
    def __init__(self, hq, hk, d, layers, mlp):
        g = torch.Generator(device="cuda").manual_seed(0)
        hidden = hq * d

        def w(i, o):
            return torch.randn(i, o, device="cuda", dtype=torch.bfloat16, generator=g) / i ** 0.5

        self.hq, self.hk, self.d, self.layers = hq, hk, d, layers
        self.w_qkv, self.w_o = w(hidden, (hq + 2 * hk) * d), w(hidden, hidden)
        self.w_1, self.w_2 = (w(hidden, mlp * hidden), w(mlp * hidden, hidden)) if mlp else (None, None)

    def forward(self, x, attention):
        t, hidden = x.shape
        for _ in range(self.layers):
            qkv = F.layer_norm(x, (hidden,)) @ self.w_qkv
            q, k, v = qkv.split([self.hq * self.d, self.hk * self.d, self.hk * self.d], dim=1)
            o = attention(q.view(t, self.hq, self.d), k.reshape(t, self.hk, self.d), v.reshape(t, self.hk, self.d))
            x = x + o.reshape(t, hidden) @ self.w_o
            if self.w_1 is not None:
                x = x + F.gelu(F.layer_norm(x, (hidden,)) @ self.w_1) @ self.w_2
        return x


def variants(lens, hq, hk, causal):
    n = max(lens)
    cpu = cpu_offsets(lens)
    gpu = cpu.cuda()

    def sage(cu, triton=False):
        def attention(q, k, v):
            with triton_path() if triton else contextlib.nullcontext():
                return sa.sageattn_varlen(q, k, v, cu, cu, n, n, is_causal=causal)
        return attention

    out = {"sageattn_varlen, offsets on the GPU": sage(gpu), "sageattn_varlen, offsets on the CPU": sage(cpu),
           "Triton path, offsets on the GPU": sage(gpu, True), "Triton path, offsets on the CPU": sage(cpu, True)}
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        varlen_attn = None
    if varlen_attn is not None and hq == hk:  # (torch 2.11's varlen_attn has no GQA)
        def flash(q, k, v):
            return varlen_attn(q, k, v, gpu, gpu, n, n, window_size=(-1, 0) if causal else (-1, -1))

        out["torch varlen_attn (flash), offsets on the GPU"] = flash
    return out


def wall_ms(fns, rounds=5, per_round=2):
    """Wall ms per forward of each of ``fns`` (name -> fn): rounds in which every variant runs
    ``per_round`` forwards from an idle GPU, the order rotating per round (the board's clock
    moves at its power cap; interleaving spreads that over the variants); median per variant."""
    names = list(fns)
    for name in names:
        fns[name]()
        fns[name]()
    torch.cuda.synchronize()
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            for _ in range(per_round):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fns[name]()
                torch.cuda.synchronize()
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def gpu_idle_ms(fn):
    """From the profiler trace of one forward: (span from the first kernel's start to the last's
    end, time in it when no kernel ran), ms."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type.name == "CUDA")
    busy, end = 0.0, spans[0][0]
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    span = end - spans[0][0]
    return span / 1e3, (span - busy) / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for the markdown table")
    ap.add_argument("--cases", nargs="*", default=DEFAULT_CASES, choices=list(CASES))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--mlp", type=int, default=4, help="MLP width over the hidden size (0: no MLP)")
    args = ap.parse_args()
    gpu_name = torch.cuda.get_device_name()
    commit = os.environ.get("SAGEATTN_COMMIT", "unknown")
    lines = [f"# sageattn_varlen in a {args.layers}-layer model on {gpu_name}", "",
             f"Commit {commit}, torch {torch.__version__}, {datetime.date.today()}, "
             f"`python bench/varlen_layers.py --layers {args.layers} --mlp {args.mlp}`. Per layer: layer norm, QKV "
             f"projection, attention, output projection, then (with --mlp > 0) layer norm and a GELU MLP ({args.mlp}x). bf16. Wall: median of 10 forwards from an "
             "idle GPU, the variants interleaved in 5 rounds. From the profiler trace of one more forward: its span "
             "(first kernel start to last kernel end) and the GPU's idle time in it (no kernel running). "
             "Host µs per call: sageattn_varlen with CPU offsets, GPU kept busy (timing.host_us).", "",
             "| case | variant | wall (ms) | traced span (ms) | GPU idle in it (ms) | host µs per attention call |",
             "|---|---|---|---|---|---|"]
    for name in args.cases:
        lens, hq, hk, d, causal = CASES[name]
        model = Model(hq, hk, d, args.layers, args.mlp)
        x = torch.randn(sum(lens), hq * d, device="cuda", dtype=torch.bfloat16)
        attns = variants(lens, hq, hk, causal)
        fwds = {vname: (lambda a=attention: model.forward(x, a)) for vname, attention in attns.items()}
        try:
            walls = wall_ms(fwds)
        except Exception as exc:  # a baseline this torch or GPU cannot run: time the others
            print(f"{name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            walls = {}
        for vname, attention in attns.items():
            try:
                span, idle = gpu_idle_ms(fwds[vname])
                host = ""
                if "offsets on the CPU" in vname:
                    q = torch.randn(sum(lens), hq, d, device="cuda", dtype=torch.bfloat16)
                    kv = torch.randn(sum(lens), hk, d, device="cuda", dtype=torch.bfloat16)
                    host = f"{host_us(lambda: attention(q, kv, kv)):.0f}"
                wall = f"{walls[vname]:.2f}" if vname in walls else "-"
                row = f"| {name} (D {d}, H {hq}/{hk}) | {vname} | {wall} | {span:.2f} | {idle:.2f} | {host} |"
            except Exception as exc:  # a baseline this torch or GPU cannot run
                row = f"| {name} | {vname} | failed: {type(exc).__name__}: {str(exc)[:80]} | | | |"
            print(row, flush=True)
            lines.append(row)
        model = x = None
        torch.cuda.empty_cache()
    write_table(args.out, f"{commit}-varlen-layers-mlp{args.mlp}", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
