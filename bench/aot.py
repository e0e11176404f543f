"""Compile the Triton kernels for a GPU arch on a machine without a GPU, and report on them.

    python bench/aot.py --arch 90 --d 128 --n 16384 [--causal] [--dtype fp16] [--sass FILE]

Runs the real launch code on ``meta`` tensors with the kernel launches intercepted, turns
the captured arguments into the signature, constants and divisibility hints Triton's JIT
would use, and compiles for ``sm_<arch>`` with Triton's bundled ptxas. Prints registers,
spills, shared memory and the mix of matrix/load instructions: enough to see whether a
change kept the kernel on wgmma with vector loads before spending GPU time on it.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int8: "i8",
           torch.int32: "i32", torch.int64: "i64"}


class _Capture:
    """Stands in for a @triton.jit kernel: records the arguments of ``kernel[grid](...)``."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.calls = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((args, kwargs))

        return launch


def _signature(kernel, args, kwargs):
    names = list(inspect.signature(kernel.fn).parameters)
    dont = set(kernel.do_not_specialize) if getattr(kernel, "do_not_specialize", None) else set()
    dont |= {names[i] if isinstance(i, int) else i for i in dont}
    sig, consts, attrs = {}, {}, {}
    options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
    for i, name in enumerate(names):
        v = args[i] if i < len(args) else kwargs[name]
        if name in kwargs and i >= len(args):
            sig[name] = "constexpr"
            consts[name] = v
        elif isinstance(v, torch.Tensor):
            sig[name] = "*" + _DTYPES[v.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # allocations are 16-byte aligned
        elif isinstance(v, bool):
            sig[name] = "i1"
        elif isinstance(v, int):
            if v == 1 and name not in dont:
                sig[name] = "constexpr"
                consts[name] = 1
                continue
            sig[name] = "i64" if abs(v) >= 2 ** 31 else "i32"
            if v % 16 == 0 and name not in dont:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"{name}: {type(v)}")
    return sig, consts, attrs, options


def compile_captured(kernel, args, kwargs, arch):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, consts, attrs, options = _signature(kernel, list(args), dict(kwargs))
    src = ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def _tool(name):
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def report(name, compiled, sass_path=None):
    cubin = Path(f"/tmp/sa_{name}.cubin")
    cubin.write_bytes(compiled.asm["cubin"])
    sass = subprocess.run([_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True).stdout
    res = subprocess.run([_tool("cuobjdump"), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
    if sass_path:
        Path(sass_path).write_text(sass)
    ops = collections.Counter(re.findall(r"\b((?:[HIQ]GMMA|HMMA|IMMA)\.[0-9x]+[.A-Z0-9]*|MUFU\.EX2|LDL|STL|"
                                         r"LDGSTS[.A-Z0-9]*|UTMALDG[.A-Z0-9]*|LDG\.E[.A-Z0-9]*|STG\.E[.A-Z0-9]*)", sass))
    usage = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", res)
    print(f"{name}: " + (f"regs {usage.group(1)}, stack {usage.group(2)} B, local {usage.group(4)} B"
                         if usage else "usage n/a") + f", dynamic smem {compiled.metadata.shared} B")
    for op, n in sorted(ops.items()):
        print(f"    {n:5d}  {op}")


def main():
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--n", type=int, default=16384)
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--h", type=int, default=32)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--lse", action="store_true")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--layout", choices=["HND", "NHD"], default="HND")
    ap.add_argument("--sass", help="write the attention kernel's SASS here")
    args = ap.parse_args()

    from sageattention import triton as st
    from sageattention.triton import attn, quant

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    shape = (args.b, args.h, args.n, args.d) if args.layout == "HND" else (args.b, args.n, args.h, args.d)
    q, k, v = (torch.empty(shape, dtype=dtype, device="meta") for _ in range(3))
    o = torch.empty_like(q)
    tr = (lambda t: t) if args.layout == "HND" else (lambda t: t.transpose(1, 2))
    cap_a, cap_q = _Capture(attn._attn_fwd_kernel), _Capture(quant._quant_qk_kernel)
    attn._attn_fwd_kernel, quant._quant_qk_kernel = cap_a, cap_q
    try:
        cfg = attn.choose_config(args.d, dtype, (args.arch // 10, args.arch % 10), n_k=args.n)
        print(cfg)
        st.forward(tr(q), tr(k), tr(v), tr(o), is_causal=args.causal, sm_scale=args.d ** -0.5,
                   smooth_k=True, return_lse=args.lse, config=cfg)
    finally:
        attn._attn_fwd_kernel, quant._quant_qk_kernel = cap_a.kernel, cap_q.kernel
    report("quant", compile_captured(cap_q.kernel, *cap_q.calls[0], args.arch))
    report("attn", compile_captured(cap_a.kernel, *cap_a.calls[0], args.arch), args.sass)


if __name__ == "__main__":
    main()
