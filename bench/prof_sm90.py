"""A small workload for profiling the Hopper kernel under ncu on the device:
    ncu -k regex:attn_sm90 -c 1 --section WarpStateStats python bench/prof_sm90.py [D]
"""
import sys

import torch

import sageattention as sa

d = int(sys.argv[1]) if len(sys.argv) > 1 else 128
q, k, v = (torch.randn(1, 16, 16384, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(2):
    sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v)
torch.cuda.synchronize()
