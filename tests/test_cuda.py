"""The compiled mma.sync kernels: every accumulation mode and granularity against the
reference, torch.compile, the custom ops' registration (opcheck), odd strides. GPU only;
each test skips with the reason when its extension is not in this build."""

import pytest
import torch

import sageattention as sa
from helpers import assert_close_to_fp32, assert_close_to_reference, assert_lse_close_to_reference, make_qkv, sdpa_fp32
from sageattention import _cuda, _ops, dispatch
from sageattention.reference import attention_quantized

pytestmark = pytest.mark.gpu

FP16, FP8 = "cuda_fp16", "cuda_fp8"
MODES = [(FP16, acc, False) for acc in ("fp32", "fp16+fp32")] + \
        [(FP8, acc, False) for acc in ("fp32", "fp32+fp32", "fp32+fp16")] + [(FP8, "fp32", True)]
FP8_BARS = {"cos": 0.998, "l1": 0.06}


def _need(backend):
    ext = dispatch.BACKENDS[backend].extension
    ok, why = _ops.status(ext)
    if not ok:
        pytest.skip(f"{backend}: {why}")
    if torch.cuda.get_device_capability() < dispatch.BACKENDS[backend].min_capability:
        pytest.skip(f"{backend} needs sm{''.join(map(str, dispatch.BACKENDS[backend].min_capability))}")
    return getattr(sa, dispatch.BACKENDS[backend].function), ext


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 96, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("gran", ["per_warp", "per_thread"])
@pytest.mark.parametrize("backend,accum,smooth_v", MODES, ids=[f"{b}-{a}{'-smooth_v' if s else ''}" for b, a, s in MODES])
def test_modes_against_reference(backend, accum, smooth_v, gran, dtype, d, causal):
    fn, ext = _need(backend)
    q, k, v = make_qkv(2, 4, 2, 333, 333, d, dtype, "HND", "cuda", k_bias=1.0, seed=d)
    v = v + 0.5  # a V mean for smooth_v to remove
    kw = dict(is_causal=causal, qk_quant_gran=gran, pv_accum_dtype=accum, return_lse=True)
    if smooth_v:
        kw["smooth_v"] = True
    o, lse = fn(q, k, v, **kw)
    cfg = _cuda.reference_config(ext, gran, accum, dtype, smooth_v=smooth_v)
    ro, rl = attention_quantized(q, k, v, "HND", causal, None, True, cfg)
    assert_close_to_reference(o, ro, dtype, f"{backend} {accum} {gran}", fp8=backend == FP8)
    assert_lse_close_to_reference(lse, rl)
    assert_close_to_fp32(o, sdpa_fp32(q, k, v, "HND", causal), backend, **(FP8_BARS if backend == FP8 else {}))


@pytest.mark.parametrize("backend", [FP16, FP8])
def test_inputs_are_not_modified(backend):
    fn, _ = _need(backend)
    q, k, v = make_qkv(1, 2, 2, 200, 200, 64, torch.float16, "HND", "cuda", k_bias=2.0)
    before = [t.clone() for t in (q, k, v)]
    fn(q, k, v, smooth_k=True)
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, v)))


@pytest.mark.parametrize("backend", [FP16, FP8])
def test_misaligned_and_strided_inputs(backend):
    """Rows whose start is not 16-byte aligned and a head dim that is a slice: the kernels
    fall back to element loads (quantization) or a padded copy (fp16 V)."""
    fn, ext = _need(backend)
    base = torch.randn(1, 3, 150, 2 * 72 + 1, device="cuda", dtype=torch.bfloat16)
    q, k, v = base[..., 1:73], base[..., 73:145], base[..., 2:74]  # D=72, odd offsets
    o = fn(q, k, v)
    cfg = _cuda.reference_config(ext, "per_thread", _cuda_default(backend), torch.bfloat16)
    assert_close_to_reference(o, attention_quantized(q, k, v, "HND", False, None, False, cfg), torch.bfloat16,
                              fp8=backend == FP8)


def _cuda_default(backend):
    return "fp32" if backend == FP16 else "fp32+fp16"


@pytest.mark.parametrize("backend", [FP16, FP8])
def test_torch_compile_fullgraph_matches_eager(backend):
    fn, _ = _need(backend)
    q, k, v = make_qkv(1, 4, 2, 300, 300, 128, torch.bfloat16, "NHD", "cuda", k_bias=1.0)
    eager = fn(q, k, v, tensor_layout="NHD", is_causal=True, return_lse=True)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    got = compiled(q, k, v, tensor_layout="NHD", is_causal=True, return_lse=True)
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])


@pytest.mark.parametrize("backend", ["chosen", FP16, FP8])
def test_torch_compile_fullgraph_sageattn(backend, monkeypatch):
    """sageattn traced whole, on the kernel dispatch picks here and forced onto each CUDA kernel."""
    if backend != "chosen":
        _need(backend)
        monkeypatch.setattr(dispatch, "_cache", {(torch.cuda.get_device_capability(), "choice"): dispatch.Choice(backend)})
    q, k, v = make_qkv(2, 8, 8, 513, 513, 64, torch.float16, "HND", "cuda")
    eager = sa.sageattn(q, k, v, return_lse=True)
    torch._dynamo.reset()
    got = torch.compile(sa.sageattn, fullgraph=True)(q, k, v, return_lse=True)
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])


@pytest.mark.parametrize("backend", [FP16, FP8])
def test_opcheck(backend):
    """Schema, fake (meta) implementation and dispatcher registration of every op."""
    _, ext = _need(backend)
    op = _cuda.ops(ext)
    x = torch.randn(2, 4, 100, 64, device="cuda", dtype=torch.float16)
    km = x.float().mean(2)
    torch.library.opcheck(op.quant_int8, (x, km, None, 1.0, 64, 4, 128, 64))
    q8, qs, qdot = op.quant_int8(x, None, km, 0.18, 16, 8, 128, 64)
    k8, ks, _ = op.quant_int8(x, km, None, 1.0, 64, 4, 128, 64)
    if backend == FP8:
        torch.library.opcheck(op.quant_v_fp8, (x, 448.0, True, 128, 64))
        v, vs, vm = op.quant_v_fp8(x, 448.0, True, 128, 64)
        accum = 0
    else:
        v, vs, vm, accum = x, None, None, 0
    # opcheck's schema test multiplies the inputs, which torch does not implement for fp8
    utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    kw = {"test_utils": utils} if backend == FP8 else {}
    torch.library.opcheck(op.attn, (q8, k8, v, qs, ks, vs, vm, qdot, 8, 4, 100, 100, 64, True, accum, False, True,
                                    0.125, torch.float16), **kw)


def test_bf16_v_beyond_fp16_range_stays_finite():
    """fp32 accumulation keeps bf16 V in bf16: |V| = 1e6 must not overflow (fp16 would)."""
    fn, _ = _need(FP16)
    q, k, v = make_qkv(1, 2, 2, 256, 256, 64, torch.bfloat16, "HND", "cuda")
    v = v * 1e6
    o = fn(q, k, v)
    assert torch.isfinite(o).all()
    assert_close_to_fp32(o, sdpa_fp32(q, k, v, "HND"))
