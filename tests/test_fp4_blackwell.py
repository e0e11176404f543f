"""The FP4 attention kernels of sageattention3_blackwell on a Blackwell GPU (sm_100, sm_120,
sm_121), against the emulation (their oracle, the same tiles and rounding) and fp32 attention.

Marked ``blackwell``: skipped with the GPU named on anything else. This project has compiled
these kernels (scripts/compile_check.py) but has not yet run them: no Blackwell GPU was
available to it. The first run on one is these tests.
"""

import pytest
import torch

import sageattention3_blackwell as sa3
from sageattention.reference import error_metrics
from sageattention3_blackwell import emulation as em
from test_fp4 import BASELINE_COS, BASELINE_L1, baseline_inputs, fp32_attention

pytestmark = pytest.mark.blackwell

# The kernels compute what the emulation does with the same tiles; they differ only in exp2
# and division rounding and in the order of fp32 sums, which can move a P value across an
# E2M1 rounding boundary now and then.
VS_EMULATION_COS, VS_EMULATION_L1 = 0.9995, 0.02


def make(b, hq, hk, nq, nk, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=g)
    k = torch.randn(b, hk, nk, d, generator=g) + torch.randn(1, 1, 1, d, generator=g)
    v = torch.randn(b, hk, nk, d, generator=g)
    return [t.to(dtype).cuda() for t in (q, k, v)]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_accuracy_on_the_baseline_inputs(d, causal):
    q, k, v = baseline_inputs(d, device="cuda")
    out = sa3.sageattn3_blackwell(q, k, v, is_causal=causal)
    m = error_metrics(out, fp32_attention(q, k, v, causal))
    print(f"FP4 kernel, {torch.cuda.get_device_name()}, D={d} causal={causal}: cos {m['cos']:.5f} rel-L1 {m['rel_l1']:.4f}")
    assert m["finite"] and m["cos"] >= BASELINE_COS and m["rel_l1"] <= BASELINE_L1, m


@pytest.mark.parametrize("nq,nk", [(1, 1), (17, 17), (1000, 1000), (4097, 4097), (300, 1000), (1000, 129)])
@pytest.mark.parametrize("d", [64, 128, 80])
@pytest.mark.parametrize("causal", [False, True])
def test_kernel_matches_the_emulation(nq, nk, d, causal):
    q, k, v = make(2, 4, 4, nq, nk, d, torch.bfloat16, seed=nq + d)
    out = sa3.sageattn3_blackwell(q, k, v, is_causal=causal)
    ref = em.attention(q, k, v, is_causal=causal)
    m = error_metrics(out, ref)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert m["finite"] and m["cos"] >= VS_EMULATION_COS and m["rel_l1"] <= VS_EMULATION_L1, m


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_gqa_layouts_dtypes_scale_and_lse(dtype, layout):
    q, k, v = make(2, 8, 2, 333, 700, 128, dtype, seed=5)
    args = [t.transpose(1, 2).contiguous() for t in (q, k, v)] if layout == "NHD" else [q, k, v]
    out, lse = sa3.sageattn3_blackwell(*args, is_causal=True, tensor_layout=layout, sm_scale=0.07, return_lse=True)
    ref, ref_lse = em.attention(*args, is_causal=True, tensor_layout=layout, sm_scale=0.07, return_lse=True)
    assert out.dtype == dtype and out.shape == args[0].shape
    m = error_metrics(out, ref)
    assert m["cos"] >= VS_EMULATION_COS and m["rel_l1"] <= VS_EMULATION_L1, m
    assert torch.allclose(lse, ref_lse, atol=1e-2)


@pytest.mark.parametrize("per_block_mean", [True, False])
def test_per_block_mean_and_the_callers_k_is_untouched(per_block_mean):
    q, k, v = make(1, 2, 2, 1000, 1000, 128, torch.float16, seed=9)
    k_before = k.clone()
    out = sa3.sageattn3_blackwell(q, k, v, per_block_mean=per_block_mean)
    assert torch.equal(k, k_before)
    m = error_metrics(out, em.attention(q, k, v, per_block_mean=per_block_mean))
    assert m["cos"] >= VS_EMULATION_COS, m


def test_zero_inputs_give_zero_not_nan():
    z = torch.zeros(1, 2, 300, 128, dtype=torch.bfloat16, device="cuda")
    out = sa3.sageattn3_blackwell(z, z, z, is_causal=True)
    assert torch.equal(out, torch.zeros_like(out))


def test_torch_compile_traces_the_pipeline():
    q, k, v = make(1, 2, 2, 256, 256, 64, torch.bfloat16)
    compiled = torch.compile(sa3.sageattn3_blackwell, fullgraph=True)
    m = error_metrics(compiled(q, k, v), sa3.sageattn3_blackwell(q, k, v))
    assert m["cos"] > 0.99999, m
