"""Where the reference's bits on the GPU part from its bits on the CPU, step by step, on one
fuzz case.

The kernel tests run the oracle (sageattention.reference) on CUDA tensors; bench/lse_parts.py
runs it on the CPU. When a kernel follows one and not the other, this finds the first step of
the oracle whose output differs between the two devices: it records every call of the
reference's quantization and rounding helpers in order, on the CPU and then on the GPU, and
prints the first calls whose outputs differ, with a few of the differing elements and the
call's inputs there. Needs a GPU (not the CUDA extension).

    PYTHONPATH=$PWD python bench/oracle_devices.py --seed 95 --case 261
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

# the helpers whose outputs are compared (each one's calls in the order the reference makes them)
STEPS = ("chain_mean", "quantize_int8", "quantize_qk", "quantize_v_fp8", "_fma32", "_kernel_exponent", "round_to",
         "mma_truncated")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--case", type=int, required=True)
    ap.add_argument("--name", default="cuda_sm90", help="the public function (test_fuzz.py's name) whose call it is")
    ap.add_argument("--show", type=int, default=8, help="differing calls to print")
    args = ap.parse_args()
    os.environ["SAGEATTN_FUZZ_SEED"] = str(args.seed)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [root, os.path.join(root, "tests")]

    import torch

    import test_fuzz as tf
    from helpers import reference_config, runs, visible_kv
    from sageattention import reference as ref

    case = tf.make_case(args.case)
    opts = tf.function_options(args.name, case)
    print(f"case {case}\noptions {opts}")
    q, k, v, _ = tf.make_inputs(case, "cuda", k_bias=opts.get("smooth_k", True))
    # the backend and options the function runs with on this GPU, and their reference, as test_fuzz.py
    backend, run_opts = runs(args.name, q, k, case.layout, case.causal, case.lse, opts)
    cfg = reference_config(backend, run_opts, q, k, case.layout, case.causal)
    if cfg is None:
        raise SystemExit(f"{args.name} hands this call to {backend}: no quantized pipeline to compare")
    print(f"{backend} {run_opts}\nconfig {cfg}")
    q, k, v = (t.cpu() for t in (q, k, v))
    kr, vr = visible_kv(q, k, v, case.layout, case.causal)

    calls = []

    def recorded(name):
        fn = getattr(ref, name)

        @functools.wraps(fn)
        def wrapper(*a, **kw):
            out = fn(*a, **kw)
            outs = out if isinstance(out, tuple) else (out,)
            calls.append((name, [x.detach().cpu() for x in a if isinstance(x, torch.Tensor)],
                          [x.detach().cpu() if isinstance(x, torch.Tensor) else x for x in outs]))
            return out

        return wrapper

    saved = {n: getattr(ref, n) for n in STEPS}
    runs = {}
    try:
        for n in STEPS:
            setattr(ref, n, recorded(n))
        for dev in ("cpu", "cuda"):
            calls.clear()
            o, lse = ref.attention_quantized(q.to(dev), kr.to(dev), vr.to(dev), case.layout, case.causal, case.scale,
                                             True, cfg)
            runs[dev] = (o.cpu(), lse.cpu(), list(calls))
    finally:
        for n, fn in saved.items():
            setattr(ref, n, fn)

    (oc, lc, cc), (og, lg, cg) = runs["cpu"], runs["cuda"]
    print(f"\noutput equal: {torch.equal(oc, og)}; LSE equal: {torch.equal(lc, lg)}; calls {len(cc)} / {len(cg)}")
    shown = 0
    for i, ((name, ins, outc), (_, ins_g, outg)) in enumerate(zip(cc, cg)):
        same = [torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(outc, outg)]
        if all(same) or shown >= args.show:
            continue
        shown += 1
        inputs_equal = all(torch.equal(a, b) for a, b in zip(ins, ins_g))
        print(f"\ncall {i}, {name}: inputs {'equal' if inputs_equal else 'differ'}, outputs differ")
        for j, (a, b) in enumerate(zip(outc, outg)):
            if not isinstance(a, torch.Tensor) or same[j]:
                continue
            diff = a != b
            print(f"  output {j} {tuple(a.shape)} {a.dtype}: {int(diff.sum())} of {a.numel()} differ, "
                  f"max |cpu - cuda| {(a.double() - b.double()).abs().nan_to_num().max().item():.3g}")
            for idx in diff.nonzero()[:5].tolist():
                at = tuple(idx)
                there = "".join(f"; input {m} {x[at].item()!r}" for m, x in enumerate(ins) if x.shape == a.shape)
                print(f"    at {at}: cpu {a[at].item()!r}, cuda {b[at].item()!r}{there}")


if __name__ == "__main__":
    main()
