"""The Triton attention kernel with and without VARLEN on the same tokens: one (and two) packed
8k sequences through ``triton.forward_varlen`` against the dense ``triton.forward`` on the
first sequence's NHD view, over key-tile widths and pipeline depths, smooth_k off (attention
and quantization only); then the registers and spills Triton reports for each compiled kernel.

    python bench/triton_varlen_tiles.py
"""

import dataclasses
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sageattention import triton as st  # noqa: E402
from sageattention.triton.attn import _attn_fwd_kernel  # noqa: E402
from timing import gpu_us  # noqa: E402
from varlen import make  # noqa: E402


def main():
    for lens in ([8192], [8192, 8192]):
        q, k, v, cu = make(lens, 32, 32, 128)
        o = torch.empty_like(q)
        n = max(lens)
        base = st.config_for(128, q.dtype, q.device, n)
        q4, k4, v4, o4 = (t[:n].transpose(0, 1)[None] for t in (q, k, v, o))
        for bn, stages in ((128, 3), (128, 2), (128, 1), (64, 3)):
            cfg = dataclasses.replace(base, block_n=bn, num_stages=stages)

            def packed():
                st.forward_varlen(q, k, v, o, lens, lens, is_causal=False, sm_scale=0.088,
                                  smooth_k=False, return_lse=False, config=cfg)

            def dense():
                st.forward(q4, k4, v4, o4, is_causal=False, sm_scale=0.088, smooth_k=False,
                           return_lse=False, config=cfg)

            print(f"lens {lens} BLOCK_N {bn} stages {stages}: varlen {gpu_us(packed):.0f} us, "
                  f"dense (first sequence) {gpu_us(dense):.0f} us", flush=True)
    for cache in _attn_fwd_kernel.device_caches.values():
        for key, kern in cache[0].items():
            try:
                kern._init_handles()  # fills n_regs / n_spills
            except Exception:
                pass
            md = kern.metadata
            # the specialization's constant arguments in order (the kernel's constexprs D, BLOCK_M,
            # BLOCK_N, BLOCK_D, CAUSAL, VARLEN, ... among them)
            consts = re.findall(r"\('constexpr', (\w+)\)", str(key))
            print(f"compiled: constants {' '.join(consts)}, stages {md.num_stages} -> registers {kern.n_regs}, spills {kern.n_spills}, "
                  f"shared {md.shared}, warps {md.num_warps}")


if __name__ == "__main__":
    main()
