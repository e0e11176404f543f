"""The Triton kernels against the reference (tightly) and exact attention (loosely).

Runs on the GPU when one is visible, else in Triton's CPU interpreter on small shapes: the
same kernel code, so CI checks the kernels' logic (indexing, masking, GQA, varlen, LSE) on
every change. The large grid lives in test_gpu.py.
"""

import dataclasses

import pytest
import torch

import sageattention as sa
from sageattention import dispatch
from helpers import (
    cu_seqlens,
    LSE_VS_FP32,
    assert_close_to_fp32,
    assert_close_to_reference,
    assert_lse_close_to_reference,
    HOSTILE,
    hnd,
    hostile_qkv,
    make_qkv,
    public_functions,
    visible_kv,
)
from sageattention import triton as st
from sageattention.reference import attention_exact, attention_quantized, error_metrics

FUNCS = {"sageattn": sa.sageattn, "triton": sa.sageattn_qk_int8_pv_fp16_triton}


@pytest.fixture(autouse=True)
def sageattn_runs_triton(monkeypatch):
    """This file checks the Triton kernels through ``sageattn`` too, against the Triton
    kernel's reference and bounds. On a GPU with a compiled kernel ``sageattn`` would choose
    that one instead (the fp8 Hopper kernel on an H100, which failed these bounds there);
    test_gpu.py tests those choices. Here the dispatcher sees only Triton, and hands nothing to
    SDPA (on an H100 sageattn would give it these short calls and D=160)."""
    select = dispatch.select

    def triton_only(cap, avail, *a):
        choice, skipped = select(cap, [b for b in avail if b == "triton"], *a)
        # a kernel hidden here is not missing from the build: no warning saying it is (on a GPU
        # machine it gave 72 "not in this build ()" warnings, with an empty reason)
        return dataclasses.replace(choice, hand_over=None), (None if skipped in avail else skipped)

    monkeypatch.setattr(dispatch, "select", triton_only)
    monkeypatch.setattr(dispatch, "_warned", set())
    monkeypatch.setattr(dispatch, "_cache", {})


# (hq, hk, nq, nk, d): GQA, MQA, Nq != Nk both ways, tails, head dims that need padding
SHAPES = [
    (2, 2, 130, 130, 64),
    (4, 2, 77, 200, 40),
    (4, 1, 200, 77, 96),
    (2, 2, 1, 1, 128),
    (2, 1, 65, 64, 160),
    (1, 1, 64, 129, 16),
]


def run(fn, q, k, v, layout, causal, lse):
    out = FUNCS[fn](q, k, v, tensor_layout=layout, is_causal=causal, return_lse=lse)
    return out if lse else (out, None)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}-{}_n{}-{}_d{}".format(*s))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_kernel_matches_reference(device, shape, dtype, layout, causal):
    hq, hk, nq, nk, d = shape
    q, k, v = make_qkv(2, hq, hk, nq, nk, d, dtype, layout, device, k_bias=2.0)
    fn = "sageattn" if (hq + nq + d) % 2 else "triton"
    o, lse = run(fn, q, k, v, layout, causal, True)
    assert o.shape == q.shape and o.dtype == dtype and lse.shape == (2, hq, nq)
    kr, vr = visible_kv(q, k, v, layout, causal)
    cfg = st.config_for(d, dtype, q.device, hnd(kr, layout).shape[2]).reference(dtype)
    ro, rlse = attention_quantized(q, kr, vr, layout, causal, None, True, cfg)
    assert_close_to_reference(o, ro, dtype, f"{fn} {shape}")
    assert_lse_close_to_reference(lse, rlse)
    eo, else_ = attention_exact(q, k, v, layout, causal, None, True)
    assert_close_to_fp32(o, eo, f"{fn} {shape}")
    assert (lse - else_).abs().max() < LSE_VS_FP32


@pytest.mark.parametrize("fn", list(FUNCS))
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_causal_drops_keys_no_query_sees(device, layout, fn):
    """Causal (top-left) with more keys than queries: query i sees keys 0..i, so the call runs
    on the first Nq keys only, bit for bit the call given only those, and the same attention as
    over every key."""
    q, k, v = make_qkv(2, 4, 2, 70, 300, 64, torch.bfloat16, layout, device, k_bias=2.0, seed=11)
    o, lse = run(fn, q, k, v, layout, True, True)
    ks, vs = (hnd(hnd(t, layout)[:, :, :70], layout) for t in (k, v))
    os_, lses = run(fn, q, ks, vs, layout, True, True)
    assert torch.equal(o, os_) and torch.equal(lse, lses)
    eo, el = attention_exact(q, k, v, layout, True, None, True)
    assert_close_to_fp32(o, eo, f"{fn}: causal, 70 queries x 300 keys")
    assert (lse - el).abs().max() < LSE_VS_FP32


@pytest.mark.parametrize("lse", [False, True], ids=["o", "lse"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("name", [n for n in public_functions() if n != "sageattn"])
def test_batches_beyond_the_grid_limit_run_in_slices(device, monkeypatch, name, layout, lse):
    """CUDA caps a grid's y and z sizes at 65535, and the kernels put batch entries there: a
    larger batch runs in slices (core.MAX_GRID_YZ, lowered here to 2) and gives the bits of one
    call, as every batch entry's attention is its own."""
    from sageattention import core

    fn = public_functions()[name]
    # two query heads: within the lowered limit
    q, k, v = make_qkv(5, 2, 1, 70, 90, 64, torch.float16, layout, device, k_bias=1.0, seed=21)
    whole = fn(q, k, v, tensor_layout=layout, is_causal=True, return_lse=lse)
    monkeypatch.setattr(core, "MAX_GRID_YZ", 2)
    sliced = fn(q, k, v, tensor_layout=layout, is_causal=True, return_lse=lse)
    for a, b in zip(whole if lse else [whole], sliced if lse else [sliced]):
        assert torch.equal(a, b) and a.is_contiguous() and b.is_contiguous()


def test_more_query_heads_than_the_grid_limit_are_refused(device, monkeypatch):
    from sageattention import core

    monkeypatch.setattr(core, "MAX_GRID_YZ", 3)
    q, k, v = make_qkv(1, 4, 2, 16, 16, 64, torch.float16, "HND", device)
    with pytest.raises(ValueError, match=r"sageattn_qk_int8_pv_fp16_triton: q has 4 heads; the kernels take at most 3"):
        sa.sageattn_qk_int8_pv_fp16_triton(q, k, v)
    lens = [6, 10]
    with pytest.raises(ValueError, match=r"sageattn_varlen: q has 4 heads"):
        sa.sageattn_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu_seqlens(lens, device),
                           cu_seqlens(lens, device), 10, 10)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_packed_sequences_beyond_the_grid_limit_run_in_slices(device, monkeypatch, causal):
    """More sequences than a grid dimension holds: slices of sequences (limit lowered to 2), the
    bits of one call, sequences without queries or keys included."""
    from sageattention import core

    lens_q, lens_k = [5, 0, 40, 7, 33], [9, 4, 40, 0, 20]
    g = torch.Generator().manual_seed(4)
    q = torch.randn(sum(lens_q), 2, 64, generator=g).to(torch.bfloat16).to(device)
    k, v = (torch.randn(sum(lens_k), 1, 64, generator=g).to(torch.bfloat16).to(device) for _ in range(2))

    def call():
        return sa.sageattn_varlen(q, k, v, cu_seqlens(lens_q, device), cu_seqlens(lens_k, device), max(lens_q),
                                  max(lens_k), is_causal=causal, return_lse=True)

    o, lse = call()
    monkeypatch.setattr(core, "MAX_GRID_YZ", 2)
    os_, lses = call()
    assert torch.equal(o, os_) and torch.equal(lse, lses)


@pytest.mark.parametrize("smooth_k", [True, False], ids=["smooth", "nosmooth"])
def test_varlen_causal_ignores_keys_no_query_sees(device, smooth_k):
    """Causal (top-left) packed sequences with more keys than queries: a query sees only its
    sequence's first Nq keys, and the others must not touch the result (not the K mean, not an
    INT8 block's scale): the same bits as the packed call given only those keys. Before, the
    Triton path quantized every key (found by tests/test_fuzz.py: 43 queries over 2549 keys)."""
    lens_q, lens_k = [43, 5, 0, 130, 64], [300, 5, 17, 200, 64]
    seen = [min(a, b) for a, b in zip(lens_q, lens_k)]
    g = torch.Generator().manual_seed(11)
    q = torch.randn(sum(lens_q), 4, 64, generator=g).to(torch.bfloat16).to(device)
    k = (torch.randn(sum(lens_k), 2, 64, generator=g) + 2.0).to(torch.bfloat16).to(device)
    v = torch.randn(sum(lens_k), 2, 64, generator=g).to(torch.bfloat16).to(device)
    keep = torch.cat([torch.arange(a, a + n) for a, n in zip(cu_seqlens(lens_k).tolist(), seen)]).to(device)
    ks, vs = k[keep], v[keep]

    def call(kk, vv, lens):
        return sa.sageattn_varlen(q, kk, vv, cu_seqlens(lens_q, device), cu_seqlens(lens, device), max(lens_q),
                                  max(lens), is_causal=True, smooth_k=smooth_k, return_lse=True)

    o, lse = call(k, v, lens_k)
    os_, lses = call(ks, vs, seen)
    assert torch.equal(o, os_) and torch.equal(lse, lses)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
def test_varlen_matches_each_sequence_alone(device, dtype, causal, gqa):
    """Each packed sequence gives what a dense call on it alone gives: same per-sequence K
    mean, same quantization blocks, same tiles. (Not bit for bit: the two paths sum the K
    mean in different orders, which can flip an INT8 value at a tie.)"""
    hq, hk, d = (4, 2, 48) if gqa else (2, 2, 64)
    lens_q = [5, 70, 0, 130, 1]
    lens_k = [5, 70, 3, 130, 0] if not causal else lens_q  # last: queries but no keys
    tq, tk = sum(lens_q), sum(lens_k)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(tq, hq, d, generator=g).to(dtype).to(device)
    k = (torch.randn(tk, hk, d, generator=g) + 2.0).to(dtype).to(device)
    v = torch.randn(tk, hk, d, generator=g).to(dtype).to(device)

    o, lse = sa.sageattn_varlen(q, k, v, cu_seqlens(lens_q, device), cu_seqlens(lens_k, device), max(lens_q), max(lens_k),
                                is_causal=causal, return_lse=True)
    assert o.shape == q.shape and lse.shape == (hq, tq)
    sq = sk = 0
    for nq, nk in zip(lens_q, lens_k):
        if nq:
            if nk == 0:
                assert (o[sq:sq + nq] == 0).all() and torch.isneginf(lse[:, sq:sq + nq]).all()
            else:
                part = [t[None] for t in (q[sq:sq + nq], k[sk:sk + nk], v[sk:sk + nk])]
                od, ld = sa.sageattn(*part, tensor_layout="NHD", is_causal=causal, return_lse=True)
                assert_close_to_reference(o[sq:sq + nq], od[0], dtype, f"seq {nq}x{nk}")
                assert_lse_close_to_reference(lse[:, sq:sq + nq], ld[0])
                eo = attention_exact(*part, tensor_layout="NHD", is_causal=causal)
                assert_close_to_fp32(od, eo, f"seq {nq}x{nk}")
        sq += nq
        sk += nk


def test_non_contiguous_inputs_give_the_same_result(device):
    q, k, v = make_qkv(2, 4, 2, 100, 90, 64, torch.float16, "HND", device)
    big = torch.randn(2, 4, 100, 96, dtype=torch.float16, device=device)
    big[..., 16:80] = q
    qs = big[..., 16:80]  # strided rows, contiguous last dim
    kt = k.transpose(1, 2).contiguous().transpose(1, 2)  # HND view of NHD storage
    o_strided = sa.sageattn(qs, kt, v)
    o = sa.sageattn(q, k, v)
    assert not qs.is_contiguous() and torch.equal(o_strided, o)


def test_single_key_returns_v(device):
    q, k, v = make_qkv(1, 2, 2, 9, 1, 64, torch.float16, "HND", device)
    o = sa.sageattn(q, k, v)
    assert torch.allclose(o, v.expand_as(o), atol=1e-3)


@pytest.mark.parametrize("shape", [(0, 2, 5, 16), (1, 2, 0, 16)])
def test_empty_query_gives_empty_output(device, shape):
    q = torch.randn(shape, dtype=torch.float16, device=device)
    k = torch.randn(shape[0], 2, 7, 16, dtype=torch.float16, device=device)
    o, lse = sa.sageattn(q, k, k, return_lse=True)
    assert o.shape == q.shape and lse.shape == (shape[0], 2, shape[2])


def test_sm_scale_and_scale_are_the_same(device):
    q, k, v = make_qkv(1, 2, 2, 64, 64, 32, torch.float16, "HND", device)
    a = sa.sageattn(q, k, v, sm_scale=0.3)
    b = sa.sageattn(q, k, v, scale=0.3)
    assert torch.equal(a, b)
    assert_close_to_fp32(a, attention_exact(q, k, v, sm_scale=0.3))


def test_smooth_k_off_still_correct(device):
    q, k, v = make_qkv(1, 2, 2, 100, 100, 64, torch.bfloat16, "HND", device)
    o = sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, smooth_k=False)
    cfg = st.config_for(64, torch.bfloat16, q.device, 100).reference(torch.bfloat16, smooth_k=False)
    assert_close_to_reference(o, attention_quantized(q, k, v, cfg=cfg), torch.bfloat16)


# ---------------------------------------------------------------------------------------
# hostile inputs: never NaN or Inf


@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_hostile_inputs_stay_finite_and_accurate(device, kind, causal):
    q, k, v = hostile_qkv(kind, 192, 64, torch.bfloat16, device)
    o, lse = sa.sageattn(q, k, v, is_causal=causal, return_lse=True)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all(), kind
    exact = attention_exact(q, k, v, is_causal=causal)
    if kind == "all_zero":
        assert (o == 0).all()
        return
    if kind == "constant_v_channel":
        assert torch.allclose(o[..., 5].float(), torch.full_like(o[..., 5].float(), -2.5), rtol=1e-2)
    # huge_q: the softmax is nearly one-hot; INT8 Q/K may pick a near-tie differently
    cos, l1 = (0.99, 0.15) if kind == "huge_q" else (0.9995, 0.025)
    m = error_metrics(o, exact)
    assert m["cos"] >= cos and m["rel_l1"] <= l1, (kind, m)


def test_bf16_values_beyond_fp16_range_stay_finite(device):
    """fp16 inputs cannot hold |V| > 65504 in the first place; bf16 ones can and stay finite
    because the PV product runs in V's own dtype."""
    q, k, v = hostile_qkv("huge_v", 192, 64, torch.bfloat16, device)
    assert v.dtype == torch.bfloat16 and v.float().abs().max() > 65504
    assert torch.isfinite(sa.sageattn(q, k, v)).all()


def test_lse_without_smoothing(device):
    q, k, v = make_qkv(1, 2, 1, 70, 90, 32, torch.float16, "NHD", device, k_bias=1.0)
    _, lse = sa.sageattn_qk_int8_pv_fp16_triton(q, k, v, "NHD", smooth_k=False, return_lse=True)
    _, ref = attention_exact(q, k, v, "NHD", return_lse=True)
    assert (lse - ref).abs().max() < LSE_VS_FP32


def test_output_layout_matches_input(device):
    q, k, v = make_qkv(1, 3, 3, 40, 40, 32, torch.float16, "NHD", device)
    o = sa.sageattn(q, k, v, "NHD")
    assert o.shape == q.shape and o.is_contiguous()
    assert_close_to_fp32(hnd(o, "NHD"), hnd(attention_exact(q, k, v, "NHD"), "NHD"))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_long_sequence_tiles_on_short_inputs(device, causal):
    """The BLOCK_N=128 tiles used from 8k keys on, forced on a short input (same code)."""
    from dataclasses import replace

    q, k, v = make_qkv(1, 2, 2, 300, 300, 64, torch.bfloat16, "HND", device, k_bias=2.0)
    cfg = replace(st.config_for(64, torch.bfloat16, q.device, 300), block_n=128)
    o = torch.empty_like(q)
    lse = st.forward(q, k, v, o, is_causal=causal, sm_scale=0.125, smooth_k=True, return_lse=True, config=cfg)
    ro, rl = attention_quantized(q, k, v, "HND", causal, 0.125, True, cfg.reference(torch.bfloat16))
    assert_close_to_reference(o, ro, torch.bfloat16)
    assert_lse_close_to_reference(lse, rl)


def test_fp16_block_accumulation_option(device):
    """The two-level fp16-per-block accumulation (off by default: it overflows for |V| >
    ~1024) still computes what the reference's "fp16+fp32" mode does."""
    from dataclasses import replace

    q, k, v = make_qkv(1, 2, 2, 200, 200, 64, torch.float16, "HND", device, k_bias=1.0)
    cfg = replace(st.config_for(64, torch.float16, q.device, 200), pv_fp16_acc=True)
    o = torch.empty_like(q)
    st.forward(q, k, v, o, is_causal=False, sm_scale=0.125, smooth_k=True, return_lse=False, config=cfg)
    ref = attention_quantized(q, k, v, "HND", False, 0.125, False, cfg.reference(torch.float16))
    assert cfg.reference(torch.float16).pv_accum == "fp16+fp32"
    assert_close_to_reference(o, ref, torch.float16)


def test_torch_compile_fullgraph_traces_the_triton_path(device):
    """The Triton pipeline is one custom op with a fake implementation: dynamo traces
    sageattn whole (aot_eager: no code generation) and the result equals eager."""
    import torch._dynamo

    q, k, v = make_qkv(1, 2, 1, 70, 70, 32, torch.float16, "HND", device, k_bias=1.0)
    fn = sa.sageattn_qk_int8_pv_fp16_triton
    eager = fn(q, k, v, is_causal=True, return_lse=True)
    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, is_causal=True, return_lse=True)
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])


@pytest.mark.parametrize("offsets_on", ["cpu", "q"])
@pytest.mark.parametrize("return_lse", [False, True], ids=["o", "lse"])
def test_torch_compile_fullgraph_traces_sageattn_varlen(device, return_lse, offsets_on):
    """sageattn_varlen reads its offsets on the host, which dynamo cannot trace: the call is one
    custom op (sageattention::varlen) with a fake implementation, so fullgraph=True traces it
    (with inductor: code is generated around it) and the result equals eager. A bad offset is
    the same ValueError from inside the compiled call. Before the op, fullgraph failed on the
    data-dependent `cu_seqlens_q[0] != 0`, and without it (on the CPU, Triton's interpreter) dynamo
    traced into the kernels and failed."""
    import torch._dynamo

    lens_q, lens_k = [5, 70, 0, 33], [9, 70, 4, 0]
    g = torch.Generator().manual_seed(7)
    q = torch.randn(sum(lens_q), 4, 64, generator=g).to(torch.float16).to(device)
    k = (torch.randn(sum(lens_k), 2, 64, generator=g) + 1.0).to(torch.float16).to(device)
    v = torch.randn(sum(lens_k), 2, 64, generator=g).to(torch.float16).to(device)
    where = "cpu" if offsets_on == "cpu" else device
    cu_q, cu_k = cu_seqlens(lens_q, where), cu_seqlens(lens_k, where)

    def fn(q, k, v, cu_q, cu_k):
        return sa.sageattn_varlen(q, k, v, cu_q, cu_k, 70, 70, return_lse=return_lse)

    eager = fn(q, k, v, cu_q, cu_k)
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    got = compiled(q, k, v, cu_q, cu_k)
    for a, b in zip(got if return_lse else (got,), eager if return_lse else (eager,)):
        assert torch.equal(a, b)
    bad = cu_q.clone()
    bad[-1] -= 1
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[-1\] must equal the number of packed tokens \(108\), got 107"):
        compiled(q, k, v, bad, cu_k)


def test_varlen_op_is_cudagraph_unsafe_for_inductor():
    """The varlen op reads GPU offsets back (a sync): inductor's CUDA graphs must not capture it,
    which the cudagraph_unsafe tag tells them (on every torch that has the tag)."""
    from sageattention import core

    tag = getattr(torch.Tag, "cudagraph_unsafe", None)
    if tag is None:  # an older torch: no tag, and its inductor knows none
        assert core._VARLEN_TAGS == ()
        return
    assert tag in torch.ops.sageattention.varlen.default.tags and core._VARLEN_TAGS == (tag,)


def test_varlen_op_passes_opcheck(device):
    """The varlen custom op's schema, fake implementation and registration (torch.library.opcheck)."""
    from sageattention import core

    lens = [3, 20, 9]
    q, k, v = (torch.randn(sum(lens), 2, 32, dtype=torch.float16, device=device) for _ in range(3))
    cu = cu_seqlens(lens)
    for lse in (False, True):
        torch.library.opcheck(core._varlen, (q, k, v, cu, cu, 20, 20, True, 0.2, True, lse),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))


def test_packed_launches_keep_64_key_tiles():
    """Dense launches switch to 128-key tiles from 8k keys; packed (varlen) ones never do
    (the varlen kernel spills with them: choose_config's docstring has the measurement)."""
    assert st.choose_config(128, torch.bfloat16, n_k=16384).block_n == 128
    for d in (64, 128):
        assert st.choose_config(d, torch.bfloat16, n_k=16384, packed=True).block_n == 64


@pytest.mark.parametrize("d", [40, 64])
def test_packed_k_mean_is_each_sequences_own_mean(device, d):
    """The Triton varlen path's K mean: per sequence and head, over that sequence's rows only
    (chunks of 512 rows, a strided K, an empty sequence gets zeros), and the same bits on a
    second call."""
    from sageattention.triton.quant import packed_k_mean

    lens = [3, 0, 1100, 512, 513, 1]
    g = torch.Generator().manual_seed(d)
    kv = (torch.randn(sum(lens), 2, 3, d, generator=g) * 2 + 1).to(torch.bfloat16).to(device)
    k3 = kv[:, 0]  # rows two heads' worth apart: not contiguous
    cu = cu_seqlens(lens, device)
    km = packed_k_mean(k3, cu, max(lens))
    assert km.shape == (len(lens), 3, d) and km.dtype == torch.float32
    for b, (a, n) in enumerate(zip(cu[:-1].tolist(), lens)):
        want = k3[a:a + n].double().mean(0) if n else torch.zeros(3, d, dtype=torch.float64, device=device)
        assert (km[b].double() - want).abs().max() < 1e-5, (b, n)
    assert torch.equal(packed_k_mean(k3, cu, max(lens)), km)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_packed_sequences_layout_for_the_hopper_kernel(causal):
    """What _cuda.forward_varlen hands the ops for a group of packed sequences, read the way
    the kernels read it (Input4D::seqs: entry b starts seq[0][b] rows into the view and has
    seq[1][b] rows): each entry is its sequence's rows of the packed tensor, strided inputs
    included, in the group's order; causal entries count only the keys their queries see."""
    from sageattention import _cuda

    lens_q, lens_k = [5, 0, 17, 3, 9], [7, 4, 0, 12, 9]
    group = [4, 0, 3]
    seq_q, seq_k = _cuda.packed_seqs(lens_q, lens_k, group, causal)
    seen = [min(a, b) for a, b in zip(lens_k, lens_q)] if causal else lens_k
    assert seq_q[1] == [lens_q[i] for i in group] and seq_k[1] == [seen[i] for i in group]
    qkv = torch.randn(sum(lens_k), 3, 2, 8)  # k and v as views of one packed tensor: strided rows
    for t, seq, lens in ((torch.randn(sum(lens_q), 4, 8), seq_q, lens_q), (qkv[:, 1], seq_k, lens_k)):
        rows = max(seq[1])
        view = _cuda.packed_view(t, len(group), rows)
        assert view.shape == (len(group), t.shape[1], rows, 8) and view.stride(0) == 0
        for b, i in enumerate(group):
            start = sum(lens[:i])
            assert seq[0][b] == start and seq[1][b] <= lens[i]
            entry = view[0].as_strided((t.shape[1], seq[1][b], 8), view.stride()[1:],
                                       view.storage_offset() + seq[0][b] * view.stride(2))
            assert torch.equal(entry, t[start:start + seq[1][b]].transpose(0, 1))


@pytest.mark.parametrize("return_lse", [False, True], ids=["o", "o+lse"])
def test_packed_groups_are_put_together_in_one_output(monkeypatch, return_lse):
    """_cuda.forward_varlen with the op replaced by a stand-in that marks each row it is given
    with its call's number (and garbage elsewhere): every packed row ends with the mark of the
    group that holds its sequence, rows of sequences in no group (queries but no key) with 0
    and an LSE of -inf, whatever order the groups list the sequences in."""
    from sageattention import _cuda

    lens_q = [3, 0, 6, 2, 4, 5, 1]
    lens_k = [3, 2, 6, 0, 4, 5, 9]
    groups = [[2, 5], [4, 0, 6]]  # sequence 3 has queries but no keys: in no group
    starts = [sum(lens_q[:i]) for i in range(len(lens_q))]
    total, heads, d = sum(lens_q), 2, 8
    calls = []

    class Op:
        def quant_attn(self, q, k, v, *args):
            seq_q, total_q, want_lse = args[-3], args[-1], args[-4]
            assert total_q == total and want_lse == return_lse
            calls.append(seq_q.tolist())
            o = torch.full((total_q, heads, d), float("nan"))
            lse = torch.full((heads, total_q), float("nan"))
            for start, count in zip(*seq_q.tolist()):
                o[start:start + count] = len(calls)
                lse[:, start:start + count] = 10.0 * len(calls)
            return o, lse

    monkeypatch.setattr(_cuda, "require", lambda fn, module: None)
    monkeypatch.setattr(_cuda, "ops", lambda module: Op())
    q = torch.randn(total, heads, d)
    k = v = torch.randn(sum(lens_k), heads, d)
    o, lse = _cuda.forward_varlen("sageattn_varlen", q, k, v, lens_q, lens_k, groups, False, 0.3,
                                  "per_warp", True, return_lse)
    assert calls == [[[starts[i] for i in g], [lens_q[i] for i in g]] for g in groups]
    mark = {i: n + 1 for n, g in enumerate(groups) for i in g}
    for i, (start, count) in enumerate(zip(starts, lens_q)):
        rows = slice(start, start + count)
        assert torch.equal(o[rows], torch.full((count, heads, d), float(mark.get(i, 0)))), i
        if return_lse:
            want = 10.0 * mark[i] if i in mark else float("-inf")
            assert torch.equal(lse[:, rows], torch.full((heads, count), want)), i
    assert lse is None or return_lse


@pytest.mark.parametrize("first,count", [
    ([9, 0, 20], [11, 5, 3]),   # out of order
    ([4, 7, 7], [3, 0, 2]),     # a sequence with no rows
    ([5], [0]),
    ([3, 8, 1, 2], [0, 2, 0, 0]),  # empty sequences first and last
    ([], []),
])
def test_rows_index_lists_each_sequences_rows_in_turn(first, count):
    """_staging.rows_index (the packed paths' row gathers) against the plain per-sequence list."""
    from sageattention._staging import rows_index

    idx = rows_index(first, count, torch.device("cpu"))
    assert idx.dtype == torch.int64
    assert idx.tolist() == [r for a, n in zip(first, count) for r in range(a, a + n)]
