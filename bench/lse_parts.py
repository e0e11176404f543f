"""Where a CUDA kernel's LSE or output parts from the reference's on one fuzz case: the
quantization or the attention.

Rebuilds fuzz case ``--case`` of seed ``--seed`` (tests/test_fuzz.py), runs the kernel function,
then reads the quantization op's own outputs (INT8 Q and K codes and scales, the K mean, the
e4m3 V and its scales) for the same inputs and compares each with the reference's
(sageattention.reference.quantize_qk / quantize_v_fp8). Last it runs the reference's attention
on the kernel's quantized operands: if that LSE (output) equals the kernel's on every row, the
two parted in the quantization; if not, in the attention. Prints a per-row table of the LSE rows
past the test's 1e-3 bar, and the output's metrics per (batch, head) against both references.
For the Hopper kernel (cuda_sm90) of an fp8 family only.

    PYTHONPATH=$PWD python bench/lse_parts.py --seed 88 --case 279
"""

from __future__ import annotations

import argparse
import math
import os
import sys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--case", type=int, required=True)
    ap.add_argument("--name", default="cuda_sm90")
    args = ap.parse_args()
    os.environ["SAGEATTN_FUZZ_SEED"] = str(args.seed)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [root, os.path.join(root, "tests")]

    import torch

    import test_fuzz as tf
    from helpers import V_MMA_ORDER, reference_config, runs, visible_kv
    from sageattention import _cuda, reference
    from sageattention._ops import ops
    from sageattention.dispatch import BACKENDS
    from sageattention.reference import attention_quantized

    case = tf.make_case(args.case)
    name = args.name
    opts = tf.function_options(name, case)
    print(f"case {case}\noptions {opts}")
    q, k, v, _ = tf.make_inputs(case, "cuda", k_bias=opts.get("smooth_k", True))
    o, lse = tf.FUNCS[name](q, k, v, tensor_layout=case.layout, is_causal=case.causal, sm_scale=case.scale,
                            return_lse=True, **opts)
    backend, run_opts = runs(name, q, k, case.layout, case.causal, True, opts)
    cfg = reference_config(backend, run_opts, q, k, case.layout, case.causal)
    kr, vr = visible_kv(q, k, v, case.layout, case.causal)
    scale = 1.0 / math.sqrt(case.d) if case.scale is None else case.scale
    module = BACKENDS[backend].extension
    if not _cuda._fp8(module):
        raise SystemExit(f"{backend}: not an fp8 family (this script reads quant_qkv)")

    # the quantization op on the inputs forward() gives it
    nhd = case.layout == "NHD"
    qh, kh, vh = (t.transpose(1, 2) if nhd else t for t in (q, kr, vr))
    nq, nk, d = qh.shape[2], kh.shape[2], case.d
    per_thread = run_opts["qk_quant_gran"] == "per_thread"
    qgr, kgr = (8, 4) if per_thread else (1, 1)
    dp = _cuda.padded_head_dim(d)
    nq_pad, nk_pad = _cuda._ceil(nq, _cuda.BLOCK_Q), _cuda._ceil(nk, _cuda.kv_block(module))
    out = ops(module).quant_qkv(qh, kh, vh, scale * _cuda.LOG2E, qgr, kgr, cfg.smooth_k, cfg.smooth_v, cfg.smooth_k,
                                cfg.v_scale_max, nq_pad, nk_pad, dp, False, cfg.v_terms)
    q8, qs, qdot, k8, ks, km, v8, vs, _ = (t.cpu() for t in out)

    # the reference as the test computes it (on the GPU), then everything on the CPU
    _, rl_gpu = attention_quantized(q, kr, vr, case.layout, case.causal, case.scale, True, cfg)
    rl_gpu = rl_gpu.cpu()
    q, kr, vr, o, lse = (t.cpu() for t in (q, kr, vr, o, lse))
    qh, kh, vh = (reference.to_hnd(t, case.layout) for t in (q, kr, vr))
    rqq, rqs, qg, rkq, rks, kg, rkm = reference.quantize_qk(qh, kh, scale, cfg)
    rv, rvs, _ = reference.quantize_v_fp8(vh, cfg.v_scale_max, cfg.smooth_v, cfg.v_amax_rows, cfg.v_amax_margin,
                                          cfg.v_terms)
    kq, qq = k8[..., :nk, :d].float(), q8[..., :nq, :d].float()
    # V is stored [channel][token], each 16-token group in the MMA's order: back to token order;
    # with two terms the lo rows start dp rows after the hi ones (the reference's are d apart)
    v8 = torch.cat([v8[..., t * dp : t * dp + d, :] for t in range(cfg.v_terms)], dim=-2)
    groups = v8.unflatten(-1, (-1, 16))
    kv = groups[..., V_MMA_ORDER.argsort()].flatten(-2)[..., :nk].transpose(-1, -2).float()
    print(f"\nK mean: max |kernel - reference| {(km - rkm).abs().max().item():.3g} "
          f"(|mean| up to {rkm.abs().max().item():.3g})")
    for what, a, b in (("Q codes", qq, rqq), ("K codes", kq, rkq), ("V e4m3", kv, rv)):
        diff = (a != b)
        print(f"{what}: {int(diff.sum())} of {diff.numel()} differ; max |diff| {(a - b).abs().max().item():.3g}")
        if 0 < int(diff.sum()) <= 20:
            for idx in diff.nonzero().tolist():
                print(f"   at {idx}: kernel {a[tuple(idx)].item():g} reference {b[tuple(idx)].item():g}")
    for what, a, b in (("Q scales", qs[..., : rqs.shape[-1]], rqs), ("K scales", ks[..., : rks.shape[-1]], rks),
                       ("V scales", vs[..., :d], rvs)):
        diff = (a != b)
        print(f"{what}: {int(diff.sum())} of {diff.numel()} differ; max rel "
              f"{((a - b).abs() / b.abs().clamp_min(1e-30)).max().item():.3g}")
    if qdot.numel():
        rdot = torch.matmul(qh.double(), reference._expand_kv(rkm, qh.shape[1]).double().unsqueeze(-1)).squeeze(-1)
        print(f"Q.Kmean (the LSE's smoothing term): max |kernel - reference| "
              f"{(qdot.double() - rdot).abs().max().item():.3g} (kernel's op output, before any scale)")

    # the reference's attention on the kernel's operands
    def kernel_qk(q_hnd, k_hnd, sm_scale, c):
        return qq, qs[..., : rqs.shape[-1]], qg, kq, ks[..., : rks.shape[-1]], kg, km

    def kernel_v(*a, **kw):
        return kv, vs[..., :d], None

    ro, rl = attention_quantized(q, kr, vr, case.layout, case.causal, case.scale, True, cfg)
    saved = reference.quantize_qk, reference.quantize_v_fp8
    reference.quantize_qk, reference.quantize_v_fp8 = kernel_qk, kernel_v
    try:
        ko, kl = attention_quantized(q, kr, vr, case.layout, case.causal, case.scale, True, cfg)
    finally:
        reference.quantize_qk, reference.quantize_v_fp8 = saved
    eo, el = reference.attention_exact(q, kr, vr, case.layout, case.causal, case.scale, True)
    d_ref, d_kop = (lse - rl).abs(), (lse - kl).abs()
    print(f"\nLSE rows past 1e-3: kernel vs reference {int((d_ref > 1e-3).sum())} (reference on the GPU: "
          f"{int(((lse - rl_gpu).abs() > 1e-3).sum())}; GPU and CPU references equal: {torch.equal(rl, rl_gpu)}), "
          f"kernel vs reference on the kernel's operands {int((d_kop > 1e-3).sum())} (of {lse.numel()})")
    print(f"mean |LSE - exact|: kernel {(lse.double() - el).abs().mean().item():.6f}, reference "
          f"{(rl.double() - el).abs().mean().item():.6f}, reference on kernel operands "
          f"{(kl.double() - el).abs().mean().item():.6f}")
    print("\n| b | head | row | kernel - ref | kernel - ref(kernel operands) | ref - exact |")
    print("|---|---|---|---|---|---|")
    for b, h, r in ((d_ref > 1e-3) | (d_kop > 1e-3)).nonzero().tolist():
        print(f"| {b} | {h} | {r} | {(lse - rl)[b, h, r].item():+.5f} | {(lse - kl)[b, h, r].item():+.5f} | "
              f"{(rl.double() - el)[b, h, r].item():+.5f} |")

    # the output, per (batch, head): the kernel's against the reference and the reference on the
    # kernel's operands, and each against exact attention
    oh, roh, koh, eoh = (reference.to_hnd(t, case.layout).double() for t in (o, ro, ko, eo))

    def metrics(a, b):  # cos, rel-L1 over the trailing (rows, channels) of one (batch, head)
        a, b = a.flatten(-2), b.flatten(-2)
        cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
        return cos, (a - b).abs().sum(-1) / b.abs().sum(-1).clamp_min(1e-30)

    print("\n| b | head | kernel vs ref: cos / rel-L1 | kernel vs ref(kernel operands) | ref vs exact | kernel vs exact |")
    print("|---|---|---|---|---|---|")
    pairs = [metrics(oh, roh), metrics(oh, koh), metrics(roh, eoh), metrics(oh, eoh)]
    for b in range(oh.shape[0]):
        for h in range(oh.shape[1]):
            cells = " | ".join(f"{c[b, h].item():.6f} / {l1[b, h].item():.4f}" for c, l1 in pairs)
            print(f"| {b} | {h} | {cells} |")


if __name__ == "__main__":
    main()
