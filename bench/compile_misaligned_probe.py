"""What torch.compile does with a view cuDNN's attention cannot read (a GPU probe).

Eager SDPA with cuDNN first gives wrong values, without an error, for q, k, v whose start is not
a multiple of 16 bytes (bench/results/2026-11-27-NVIDIA_H100_80GB_HBM3-f091bf2-fuzz.md), and
sageattn's hand-over copies such views first (_sdpa.cudnn_ready). Under torch.compile a traced
tensor has no address to check. This compiles ``F.scaled_dot_product_attention`` with cuDNN
first, as sageattn's hand-over traced it before it became a custom op, and ``sageattn`` itself,
on rows of a wider tensor at an offset, with dynamo's backends, and prints the largest error
against fp32 attention:

    python bench/compile_misaligned_probe.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import sageattention as sa

ORDER = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def cudnn_first(q, k, v):
    with sdpa_kernel(ORDER, set_priority=True):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def sliced(x):  # the view made inside the graph from an aligned input
    return cudnn_first(x[..., 3:67], x[..., 67:131], x[..., 131:195])


def sageattn(q, k, v):
    return sa.sageattn(q, k, v, is_causal=True)


def main():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2, 4, 300, 195, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v = x[..., 3:67], x[..., 67:131], x[..., 131:195]  # each starts 6 bytes past 16
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    print(f"q start % 16 = {q.data_ptr() % 16}; B=2 H=4 N=300 D=64 bf16 causal; max |o - fp32|:")
    print("| call | not compiled | compiled: eager | aot_eager | inductor |")
    print("|---|---|---|---|---|")
    cases = (("SDPA cuDNN first, views as inputs", cudnn_first, (q, k, v)),
             ("SDPA cuDNN first, views made in the graph", sliced, (x,)),
             ("sageattn, views as inputs", sageattn, (q, k, v)))
    for name, fn, args in cases:
        row = [f"{(fn(*args).float() - want).abs().max().item():.3g}"]
        for backend in ("eager", "aot_eager", "inductor"):
            torch._dynamo.reset()
            try:
                o = torch.compile(fn, fullgraph=True, backend=backend)(*args)
                torch.cuda.synchronize()
                row.append(f"{(o.float() - want).abs().max().item():.3g}")
            except Exception as e:  # noqa: BLE001 - a probe reports what happened
                row.append(f"{type(e).__name__}: {str(e).splitlines()[0][:60]}")
        print(f"| {name} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
