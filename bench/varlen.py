"""Packed variable-length sequences: sageattn_varlen (Hopper kernel where the padding rule
lets it, else Triton) against its Triton path, torch's FlashAttention varlen
(torch.nn.attention.varlen.varlen_attn, where this torch has it) and a loop of per-sequence
SDPA calls with cuDNN first; sageattn_varlen also with its offsets on the CPU (no read-back). Every call is timed end to end (quantization included) with
do_bench, median of three; TOPS = 4 * Hq * D * sum(Nq * Nk) (halved when causal) over that time.

    python bench/varlen.py --out bench/results      # writes <date>-<gpu>-<commit>-varlen.md

Each row's "path" column says which kernel sageattn_varlen took and in how many launches
(dispatch.varlen_groups).
"""

import argparse
import contextlib
import datetime
import os
import random
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sageattention as sa  # noqa: E402
from sageattention import dispatch  # noqa: E402
from timing import gpu_us  # noqa: E402

# name -> (sequence lengths (queries = keys), query heads, K/V heads, head dim, causal)
_RNG = random.Random(7)
CASES = {
    "4 x 4096": ([4096] * 4, 32, 32, 128, False),
    "4 x 4096 causal": ([4096] * 4, 32, 32, 128, True),
    "video: 8k 6k 4k 2k": ([8192, 6144, 4096, 2048], 32, 32, 128, False),
    "video: 8k 6k 4k 2k, D=64": ([8192, 6144, 4096, 2048], 32, 32, 64, False),
    "prefill: 16 x 256-4096 causal GQA": ([_RNG.randrange(256, 4097) for _ in range(16)], 32, 8, 128, True),
    "skewed: 16k + 40 x 256 causal": ([16384] + [256] * 40, 32, 32, 128, True),
}


def make(lens, hq, hk, d):
    g = torch.Generator(device="cuda").manual_seed(sum(lens))
    total = sum(lens)
    q = torch.randn(total, hq, d, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(total, hk, d, device="cuda", dtype=torch.bfloat16, generator=g) + 1.0
    v = torch.randn(total, hk, d, device="cuda", dtype=torch.bfloat16, generator=g)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32, device="cuda")
    cu[1:] = torch.tensor(lens, device="cuda").cumsum(0)
    return q, k, v, cu


def cpu_offsets(lens):
    """cu_seqlens of ``lens`` as an int32 CPU tensor (sageattn_varlen reads it without a sync)."""
    return torch.tensor([0] + list(lens), dtype=torch.int32).cumsum(0, dtype=torch.int32)


@contextlib.contextmanager
def triton_path():
    """sageattn_varlen on its Triton path inside the block: no launch groups for the Hopper kernel."""
    keep = dispatch.varlen_groups
    dispatch.varlen_groups = lambda *a: None
    try:
        yield
    finally:
        dispatch.varlen_groups = keep


def write_table(out, stem, text):
    """Write ``text`` to ``out``/<date>-<gpu>-``stem``.md (``out`` None: nowhere)."""
    if out:
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f"{datetime.date.today()}-{torch.cuda.get_device_name().replace(' ', '_')}-{stem}.md")
        with open(path, "w") as f:
            f.write(text)
        print("wrote", path)


def backends(lens, hq, hk, causal):
    n = max(lens)

    def sage(q, k, v, cu):
        return sa.sageattn_varlen(q, k, v, cu, cu, n, n, is_causal=causal)

    def triton(q, k, v, cu):
        with triton_path():
            return sa.sageattn_varlen(q, k, v, cu, cu, n, n, is_causal=causal)

    starts = [0]
    for x in lens:
        starts.append(starts[-1] + x)

    def per_seq_cudnn(q, k, v, cu):
        o = torch.empty_like(q)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
            for a, b in zip(starts[:-1], starts[1:]):
                qs, ks, vs = (t[a:b].transpose(0, 1)[None] for t in (q, k, v))
                o[a:b] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal,
                                                        enable_gqa=hq != hk)[0].transpose(0, 1)
        return o

    def sage_cpu_offsets(q, k, v, cu):  # the same call without the offsets' read-back (no sync)
        return sa.sageattn_varlen(q, k, v, cu_cpu, cu_cpu, n, n, is_causal=causal)

    cu_cpu = cpu_offsets(lens)
    out = {"sageattn_varlen": sage, "sageattn_varlen, offsets on the CPU": sage_cpu_offsets,
           "sageattn_varlen (Triton)": triton, "SDPA per sequence (cuDNN)": per_seq_cudnn}
    if len(set(lens)) == 1:  # equal lengths: the same work as one dense batch
        def dense(q, k, v, cu):
            shape = (len(lens), n) + q.shape[1:]
            return sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q.view(shape), k.view(shape[:2] + k.shape[1:]),
                                                        v.view(shape[:2] + v.shape[1:]), tensor_layout="NHD",
                                                        is_causal=causal)

        out["sm90 function on the dense batch"] = dense
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        varlen_attn = None
    if varlen_attn is not None and hq == hk:  # (torch 2.11's varlen_attn has no GQA)
        def flash(q, k, v, cu):
            try:
                return varlen_attn(q, k, v, cu, cu, n, n, window_size=(-1, 0) if causal else (-1, -1))
            except TypeError:  # a torch whose varlen_attn takes is_causal instead
                return varlen_attn(q, k, v, cu, cu, n, n, is_causal=causal)

        out["torch varlen_attn (flash)"] = flash
    return out


def profiled_calls(fn, calls):
    """GPU µs of each kernel (name cut to 60 characters) one call launches, for `calls` calls
    under the profiler after a warm-up call: a list of {name: µs}."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(calls):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        per = defaultdict(float)
        for e in prof.events():
            if e.device_type.name == "CUDA":
                per[e.name[:60]] += e.device_time
        runs.append(per)
    return runs


def kernel_ms(fn, calls=5):
    """GPU time of the kernels one call launches (ms, median over `calls`), from the profiler:
    beside the do_bench time it shows what the host (the offsets read back, the set-up) adds."""
    per_call = sorted(sum(run.values()) / 1e3 for run in profiled_calls(fn, calls))
    return per_call[len(per_call) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for the markdown table")
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    args = ap.parse_args()
    gpu = torch.cuda.get_device_name()
    commit = os.environ.get("SAGEATTN_COMMIT", "unknown")
    lines = [f"# sageattn_varlen on {gpu}", "",
             f"Commit {commit}, torch {torch.__version__}, {datetime.date.today()}, `python bench/varlen.py`. "
             "bf16, K with a bias of 1; end to end; TOPS = 4 Hq D sum(Nq Nk) (halved when causal) / median time.",
             "The kernels column: the GPU time of the kernels one call launches (profiler), for sageattn's rows.",
             "", "| case | path | backend | ms | TOPS | kernels (ms) |", "|---|---|---|---|---|---|"]
    for name in args.cases:
        lens, hq, hk, d, causal = CASES[name]
        q, k, v, cu = make(lens, hq, hk, d)
        groups = dispatch.varlen_groups(dispatch.chosen(q.device)[0], lens, lens, causal)
        path = f"Hopper kernel, {len(groups)} launch{'es' if len(groups) > 1 else ''}" if groups else "Triton"
        ops = 4 * hq * d * sum(x * x for x in lens) / (2 if causal else 1)
        for bname, fn in backends(lens, hq, hk, causal).items():
            try:
                us = gpu_us(lambda: fn(q, k, v, cu))
                kern = f"{kernel_ms(lambda: fn(q, k, v, cu)):.3f}" if bname.startswith(("sageattn_varlen", "sm90")) else ""
                row = f"| {name} (lens {lens if len(lens) <= 4 else f'{len(lens)} seqs, {min(lens)}-{max(lens)}'}, " \
                      f"H {hq}/{hk}, D {d}) | {path} | {bname} | {us / 1e3:.3f} | {ops / us / 1e6:.0f} | {kern} |"
            except Exception as exc:  # a baseline this torch or GPU cannot run
                row = f"| {name} | {path} | {bname} | failed: {type(exc).__name__}: {str(exc)[:80]} | | |"
            print(row, flush=True)
            lines.append(row)
        q = k = v = cu = None  # free the inputs before the next case
        torch.cuda.empty_cache()
    write_table(args.out, f"{commit}-varlen", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
