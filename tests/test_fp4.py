"""sageattention3_blackwell: the FP4 number format, the pure-torch emulation (the kernels'
oracle) against fp32 attention, the public function's argument handling, and the FP4
quantization kernel, which runs on any GPU, bit for bit against the emulation."""

import math

import pytest
import torch
import torch.nn.functional as F

import sageattention3_blackwell as sa3
from sageattention.reference import error_metrics
from sageattention3_blackwell import api, emulation as em

HAS_CUDA = torch.cuda.is_available()

# The FP4 scheme's error on the baseline inputs (standard normal q, k, v; K with a per-channel
# bias of 3 sigma): FP4 keeps ~3 significant bits, so on random data (no structure for the
# smoothing to remove) each of Q, K, V and P costs a few percent; bench/accuracy_fp4.py
# reports the numbers. These bounds are a little below what the scheme reaches.
BASELINE_COS, BASELINE_L1 = 0.975, 0.24


def baseline_inputs(d, n=4096, heads=8, seed=1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, n, d, generator=g) for _ in range(3))
    k = k + 3.0 * torch.randn(1, 1, 1, d, generator=g)
    return [t.to(torch.bfloat16).to(device) for t in (q, k, v)]


def fp32_attention(q, k, v, causal=False, scale=None):
    hq, hk = q.shape[1], k.shape[1]
    k, v = (t.float().repeat_interleave(hq // hk, dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(q.float(), k, v, is_causal=causal, scale=scale)


# ---- the number format ----

def test_e2m1_rounds_to_nearest_even_and_saturates():
    x = torch.linspace(-8, 8, 20001)
    x = torch.cat([x, torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, 1e9, -1e9])])
    got = em.e2m1_value(em.e2m1_code(x))
    grid = torch.tensor(em.E2M1_VALUES)
    # independent model: the nearest magnitude, ties to the even code, sign kept
    dist = (x.abs().clamp(max=7).unsqueeze(-1) - grid).abs()  # beyond 6 saturates
    best = dist.min(dim=-1, keepdim=True).values
    cands = (dist == best).float() * (1 + (torch.arange(8) % 2 == 0).float())  # prefer even codes on ties
    want = grid[cands.argmax(dim=-1)] * torch.sign(x)
    assert torch.equal(got.abs(), want.abs()) and torch.all((got == 0) | (torch.sign(got) == torch.sign(x)))
    assert em.e2m1_value(em.e2m1_code(torch.tensor([7.0, -100.0]))).tolist() == [6.0, -6.0]


def test_e4m3_round_up_is_the_smallest_e4m3_not_below():
    every = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # all finite >= 0
    t = torch.cat([torch.rand(5000) * 460, torch.rand(2000) * 0.02, every, every * 1.0001, torch.tensor([0.0, 1e-12])])
    got = em.e4m3_round_up(t)
    cand = torch.where(every.unsqueeze(0) >= t.clamp(max=448).unsqueeze(1), every.unsqueeze(0), torch.tensor(math.inf))
    assert torch.equal(got, cand.min(dim=1).values)


def test_quantize_never_saturates_and_bounds_the_error():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 128, generator=g) * torch.logspace(-6, 4, 64).unsqueeze(1)  # 10 decades of magnitude
    fq = em.quantize(x)
    xh = fq.dequantize()
    step = (fq.scale * fq.gscale.unsqueeze(-1)).repeat_interleave(16, dim=-1)  # one E2M1 unit
    assert torch.all((x - xh).abs() <= step * 1.0 + 1e-30)  # at most half the widest gap (4 -> 6)
    assert torch.all(x.abs() <= 6 * step * (1 + 1e-6))  # the scale covers the group: no clipping
    assert fq.scale.max() == 448  # the row's largest group uses the top of the E4M3 range
    rel = (x - xh).abs().sum(dim=1) / x.abs().sum(dim=1)
    assert rel.max() < 0.15, rel.max()  # the same relative error at every magnitude


def test_packed_bytes_put_the_even_element_low():
    fq = em.Fp4Tensor(codes=torch.tensor([[1, 2] + [0] * 14], dtype=torch.uint8),
                      scale=torch.tensor([[1.5]]), gscale=torch.tensor([1.0]))
    codes, scale = fq.packed()
    assert codes[0, 0].item() == 0x21 and scale.view(torch.float8_e4m3fn).float().item() == 1.5


# ---- the emulation against fp32 attention ----

@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_emulation_accuracy_on_the_baseline_inputs(d, causal):
    q, k, v = baseline_inputs(d)
    m = error_metrics(em.attention(q, k, v, is_causal=causal), fp32_attention(q, k, v, causal))
    print(f"FP4 emulation, CPU, D={d} causal={causal}: cos {m['cos']:.5f} rel-L1 {m['rel_l1']:.4f}")
    assert m["finite"] and m["cos"] >= BASELINE_COS and m["rel_l1"] <= BASELINE_L1, m


@pytest.mark.parametrize("per_block_mean", [True, False])
def test_q_smoothing_is_corrected_exactly(per_block_mean):
    # a large common offset on Q changes the attention (q.k does not ignore it); smoothing
    # removes it before quantization and delta adds its exact contribution back, so the
    # accuracy stays at the unbiased level
    q, k, v = baseline_inputs(64, n=512, heads=2)
    q = (q.float() + 8.0 * torch.randn(1, 1, 1, 64, generator=torch.Generator().manual_seed(3))).to(q.dtype)
    m = error_metrics(em.attention(q, k, v, per_block_mean=per_block_mean), fp32_attention(q, k, v))
    assert m["cos"] >= BASELINE_COS and m["rel_l1"] <= BASELINE_L1, m


@pytest.mark.parametrize("nq,nk,hq,hk,d,causal,layout", [
    (1, 1, 2, 2, 64, False, "HND"),
    (17, 300, 4, 2, 128, False, "NHD"),
    (300, 17, 4, 1, 64, True, "HND"),
    (257, 257, 2, 2, 80, True, "NHD"),
    (130, 1000, 2, 2, 32, False, "HND"),
])
def test_emulation_shapes_gqa_layouts_and_lse(nq, nk, hq, hk, d, causal, layout):
    g = torch.Generator().manual_seed(nq + nk)
    q = torch.randn(2, hq, nq, d, generator=g).to(torch.float16)
    k = torch.randn(2, hk, nk, d, generator=g).to(torch.float16)
    v = torch.randn(2, hk, nk, d, generator=g).to(torch.float16)
    nhd = layout == "NHD"
    args = [t.transpose(1, 2) if nhd else t for t in (q, k, v)]
    o, lse = em.attention(*args, is_causal=causal, tensor_layout=layout, return_lse=True, sm_scale=0.1)
    o = o.transpose(1, 2) if nhd else o
    assert o.dtype == torch.float16 and o.shape == (2, hq, nq, d) and lse.shape == (2, hq, nq)
    ref = fp32_attention(q, k, v, causal, scale=0.1)
    m = error_metrics(o, ref)
    assert m["finite"] and m["cos"] >= 0.97, m
    s = (q.float() @ k.float().repeat_interleave(hq // hk, 1).transpose(2, 3)) * 0.1
    if causal:
        s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool).triu(1), -math.inf)
    err = (lse - torch.logsumexp(s, dim=-1)).abs()  # FP4 S: about 0.02 on average
    assert err.max() < 0.6 and err.mean() < 0.05, (err.max(), err.mean())  # worst: rows with 1-2 keys


def test_emulation_does_not_modify_its_inputs():
    q, k, v = baseline_inputs(64, n=200, heads=2)
    before = [t.clone() for t in (q, k, v)]
    em.attention(q, k, v)
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v)))


def test_emulation_of_zero_inputs_is_zero_not_nan():
    q = torch.zeros(1, 1, 130, 64, dtype=torch.bfloat16)
    out = em.attention(q, q, q, is_causal=True)
    assert torch.equal(out, torch.zeros_like(out))


# ---- the public function's arguments (no Blackwell GPU needed to reach these errors) ----

def _qkv(d=64, n=8, dtype=torch.float16):
    return [torch.randn(1, 2, n, d, dtype=dtype) for _ in range(3)]


def test_cpu_tensors_get_a_clear_error_naming_the_emulation():
    with pytest.raises(api.UnsupportedDeviceError, match="emulation.attention"):
        sa3.sageattn3_blackwell(*_qkv())


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(attn_mask=torch.ones(8, 8, dtype=torch.bool)), ValueError, "attn_mask is not supported"),
    (dict(bogus=1), TypeError, "unexpected keyword argument.*'bogus'"),
    (dict(is_causal=1), TypeError, "is_causal must be True or False"),
    (dict(per_block_mean="yes"), TypeError, "per_block_mean must be True or False"),
    (dict(tensor_layout="BHND"), ValueError, "tensor_layout must be one of"),
    (dict(dropout_p=0.1), ValueError, "dropout_p=0.1 is not supported"),
    (dict(sm_scale=0.1, scale=0.2), ValueError, "disagree"),
])
def test_bad_arguments_are_refused(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        sa3.sageattn3_blackwell(*_qkv(), **kwargs)


def test_bad_tensors_are_refused():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="head dim must be at most 128.*got 256"):
        sa3.sageattn3_blackwell(*_qkv(d=256))
    with pytest.raises(TypeError, match="dtype torch.float32"):
        sa3.sageattn3_blackwell(q.float(), k.float(), v.float())
    with pytest.raises(ValueError, match="multiple of the number of k/v heads"):
        sa3.sageattn3_blackwell(torch.randn(1, 3, 8, 64, dtype=torch.float16), k, v)


def test_version_and_entry_point_match_upstream_names():
    import inspect

    import sageattention

    assert sa3.__version__ == sageattention.__version__
    params = list(inspect.signature(sa3.sageattn3_blackwell).parameters)
    assert params[:6] == ["q", "k", "v", "attn_mask", "is_causal", "per_block_mean"]


# ---- the FP4 quantization kernel: any GPU, bit for bit against the emulation ----

def _quant_module():
    from sageattention3_blackwell import _kernels

    ok, why = _kernels.available(_kernels.QUANT)
    if not ok:
        pytest.fail(f"the FP4 quantization kernel is not built: {why}")
    return _kernels


@pytest.mark.gpu
@pytest.mark.parametrize("n,d,dtype,nhd", [(1, 64, torch.float16, False), (17, 128, torch.bfloat16, True),
                                          (1000, 80, torch.float16, False), (4097, 128, torch.bfloat16, False)])
@pytest.mark.parametrize("per_block_mean", [True, False])
def test_quant_kernel_matches_the_emulation_bit_for_bit(n, d, dtype, nhd, per_block_mean):
    kern = _quant_module()
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(2, 3, n, d, generator=g).to(dtype).cuda() for _ in range(3))
    k = k + 3 * torch.randn(1, 1, 1, d, generator=g).to(dtype).cuda()
    if nhd:  # strided [B, H, N, D] views of [B, N, H, D] tensors
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    k_before = k.clone()
    (qc, sq, gq), (kc, sk, gk), (vc, sv, gv), delta, _ = kern.quantize_qkv(q, k, v, per_block_mean)
    assert torch.equal(k, k_before)  # the caller's K is never smoothed in place

    dp = kern.padded_head_dim(d)
    nq_pad = -(-n // 128) * 128
    q_mean, rows, k_mean = em.smoothing_means(q, k, per_block_mean)
    row_block = torch.arange(n, device=q.device) // rows if rows else torch.zeros(n, dtype=torch.long, device=q.device)
    pad = lambda t: F.pad(t, (0, dp - d, 0, nq_pad - n))  # noqa: E731
    for (codes, scale, gsc), x in (((qc, sq, gq), pad(q.float() - q_mean[:, :, row_block])),
                                   ((kc, sk, gk), pad(k.float() - k_mean)),
                                   ((vc, sv, gv), pad(v.float()).transpose(2, 3))):
        want = em.quantize(x)
        want_codes, want_scale = want.packed()
        assert torch.equal(scale, want_scale)
        assert torch.equal(gsc, want.gscale)
        # compare values, not bytes: a negative input that rounds to 0 may carry the sign bit
        lo_hi = lambda c: torch.stack([c & 15, c >> 4], -1).flatten(-2)  # noqa: E731
        assert torch.equal(em.e2m1_value(lo_hi(codes)), em.e2m1_value(lo_hi(want_codes)))
    assert delta.shape == (2, 3, nq_pad // 128, nq_pad)
    want_delta = em.smoothing_delta(q_mean, k, k_mean, nq_pad)
    if not per_block_mean:
        want_delta = want_delta.expand(-1, -1, nq_pad // 128, -1)
    assert torch.equal(delta, want_delta)


@pytest.mark.gpu
def test_quantization_traces_under_torch_compile():
    kern = _quant_module()
    q, k, v = (t.cuda() for t in _qkv(d=128, n=300))
    eager = kern.quantize_qkv(q, k, v, True)
    compiled = torch.compile(kern.quantize_qkv, fullgraph=True)(q, k, v, True)
    # the same ops; inductor may sum the fp32 means in another order, which can move a value
    # across a rounding boundary now and then
    for a, b in zip(torch.utils._pytree.tree_leaves(eager), torch.utils._pytree.tree_leaves(compiled)):
        assert a.shape == b.shape and a.dtype == b.dtype
        if a.dtype == torch.uint8:
            assert (a != b).float().mean() < 0.01
        else:
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_emulation_accuracy_on_the_gpu(d, causal):
    q, k, v = baseline_inputs(d, device="cuda")
    m = error_metrics(em.attention(q, k, v, is_causal=causal), fp32_attention(q, k, v, causal))
    print(f"FP4 emulation, {torch.cuda.get_device_name()}, D={d} causal={causal}: "
          f"cos {m['cos']:.5f} rel-L1 {m['rel_l1']:.4f}")
    assert m["finite"] and m["cos"] >= BASELINE_COS and m["rel_l1"] <= BASELINE_L1, m


@pytest.mark.gpu
def test_non_blackwell_gpu_gets_a_clear_error():
    if torch.cuda.get_device_capability() in ((10, 0), (12, 0), (12, 1)):
        pytest.skip("this GPU is Blackwell: tests/test_fp4_blackwell.py runs the kernels")
    q, k, v = (t.cuda() for t in _qkv())
    with pytest.raises(api.UnsupportedDeviceError, match="compute capability .* need Blackwell"):
        sa3.sageattn3_blackwell(q, k, v)


def test_python_m_sageattention_reports_the_fp4_kernels():
    from sageattention.__main__ import fp4_status
    from sageattention3_blackwell import _kernels

    assert fp4_status((9, 0)).startswith("not for sm90")
    built = all(_kernels.available(m)[0] for m in (_kernels.QUANT, _kernels.SM120))
    want = "available (sageattention3_blackwell._fp4_sm120)" if built else "unavailable: "
    assert fp4_status((12, 0)).startswith(want)
