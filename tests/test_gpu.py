"""The full GPU grid: every public function x fp16/bf16 x HND/NHD x causal x D x N x GQA x
Nq != Nk x return_lse, against fp32 SDPA and, tightly, the reference; varlen; acceptance
accuracy; large tensors (64-bit offsets). Marked ``gpu``: skipped with a reason without one.
"""

import itertools

import pytest
import torch

import sageattention as sa
from helpers import (
    capture,
    cu_seqlens,
    FP8_BACKENDS,
    LSE_VS_FP32,
    assert_close_to_fp32,
    assert_close_to_reference,
    assert_lse_close_to_reference,
    HOSTILE,
    hnd,
    hostile_qkv,
    make_qkv,
    public_functions,
    reference_config,
    runs,
    sdpa_fp32,
    visible_kv,
)
from sageattention import _staging, dispatch
from sageattention._checks import Dims
from sageattention import triton as st
from sageattention.reference import attention_exact, attention_quantized, error_metrics

pytestmark = pytest.mark.gpu

HEAD_DIMS = [40, 64, 80, 96, 128, 160, 256]
LENGTHS = [1, 77, 1000, 4097]


FUNCS = public_functions()


# fp8 PV against fp32 SDPA: the reference of that pipeline reaches cos 0.99928, rel-L1 0.038
# at worst over D 40..256, N 77/1000, causal, fp16/bf16 (K bias 1 sigma); ~2x room
FP8_VS_FP32 = {"cos": 0.998, "l1": 0.06}


def _fp32_bars(fn, q, k, layout="HND", causal=False, lse=False):
    return FP8_VS_FP32 if runs(fn, q, k, layout, causal, lse)[0] in FP8_BACKENDS else {}


def _reference_config(fn, q, k, layout="HND", causal=False, lse=False):
    """The reference configuration of what ``fn`` computes for this call, for the tight
    comparison (None: no quantized pipeline to compare with)."""
    return reference_config(*runs(fn, q, k, layout, causal, lse), q, k, layout, causal)


@pytest.mark.parametrize("lse", [False, True], ids=["o", "lse"])
@pytest.mark.parametrize("cross", [False, True], ids=["nq=nk", "nq!=nk"])
@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("fn", list(FUNCS))
def test_grid(fn, dtype, layout, causal, d, n, gqa, cross, lse):
    hq, hk = (4, 2) if gqa else (2, 2)
    nq, nk = (n, n) if not cross else (max(1, n // 2 + 3), n)
    q, k, v = make_qkv(1, hq, hk, nq, nk, d, dtype, layout, "cuda", k_bias=1.0, seed=n + d)
    out = FUNCS[fn](q, k, v, tensor_layout=layout, is_causal=causal, return_lse=lse)
    o, lse_out = out if lse else (out, None)
    assert o.shape == q.shape and o.dtype == dtype
    assert_close_to_fp32(hnd(o, layout), hnd(sdpa_fp32(q, k, v, layout, causal), layout), fn,
                         **_fp32_bars(fn, q, k, layout, causal, lse))
    kr, vr = visible_kv(q, k, v, layout, causal)
    cfg = _reference_config(fn, q, kr, layout, causal, lse)
    if cfg is not None:
        ref = attention_quantized(q, kr, vr, layout, causal, None, lse, cfg)
        ro, rl = ref if lse else (ref, None)
        assert_close_to_reference(o, ro, dtype, fn, fp8=runs(fn, q, k, layout, causal, lse)[0] in FP8_BACKENDS)
        if lse:
            assert_lse_close_to_reference(lse_out, rl)
    if lse:
        _, el = attention_exact(q, k, v, layout, causal, None, True)
        assert lse_out.shape == (1, hq, nq) and (lse_out - el).abs().max() < LSE_VS_FP32


@pytest.mark.parametrize("lse", [False, True], ids=["o", "lse"])
@pytest.mark.parametrize("d", [64, 128, 160])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("fn", list(FUNCS))
def test_long_sequences(fn, dtype, causal, d, lse):
    """Many KV blocks; from 8k keys on the Triton kernel switches to BLOCK_N=128 tiles."""
    n = 8200
    q, k, v = make_qkv(1, 2, 1, n, n, d, dtype, "HND", "cuda", k_bias=1.0, seed=d)
    out = FUNCS[fn](q, k, v, is_causal=causal, return_lse=lse)
    o, lse_out = out if lse else (out, None)
    assert_close_to_fp32(o, sdpa_fp32(q, k, v, "HND", causal), fn, **_fp32_bars(fn, q, k, "HND", causal, lse))
    if fn == "triton":
        assert st.config_for(d, dtype, q.device, n).block_n == (128 if d <= 128 else 64)
    cfg = _reference_config(fn, q, k, "HND", causal, lse)
    if cfg is None:  # sageattn handed the call to SDPA: the fp32 comparison above is the test
        return
    ref = attention_quantized(q, k, v, "HND", causal, None, lse, cfg)
    ro, rl = ref if lse else (ref, None)
    assert_close_to_reference(o, ro, dtype, fn, fp8=runs(fn, q, k, "HND", causal, lse)[0] in FP8_BACKENDS)
    if lse:
        assert_lse_close_to_reference(lse_out, rl)


@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("fn", list(FUNCS))
def test_many_work_tiles_per_sm(fn, causal, d, gqa):
    """Far more 128-row work tiles (9 x 72 = 648) than an H100 has SMs, Nq != Nk: the
    persistent sm90 kernel walks several tiles per CTA. Every (batch, head) is checked on
    its own against fp32, so one tile given to the wrong head or rows cannot hide in a
    global metric; the whole output against the reference, as everywhere. (Per head, the
    reference bar is too tight for causal heads: the first rows see one or two keys and
    feel a rounding tie flipped the other way, see assert_lse_close_to_reference.)"""
    b, hq, hk, nq, nk = 3, 24, 8 if gqa else 24, 1100, 900
    q, k, v = make_qkv(b, hq, hk, nq, nk, d, torch.bfloat16, "HND", "cuda", k_bias=1.0, seed=d + causal)
    o, lse = FUNCS[fn](q, k, v, is_causal=causal, return_lse=True)
    exact = sdpa_fp32(q, k, v, "HND", causal)
    bars = _fp32_bars(fn, q, k, "HND", causal, True)
    for i, j in itertools.product(range(b), range(hq)):
        assert_close_to_fp32(o[i, j], exact[i, j], f"{fn} batch {i} head {j}", **bars)
    cfg = _reference_config(fn, q, k, "HND", causal, True)
    if cfg is None:  # sageattn handed the call to SDPA: the LSE against the exact one
        _, el = attention_exact(q, k, v, "HND", causal, None, True)
        assert (lse - el).abs().max() < 2e-3
        return
    ro, rl = attention_quantized(q, k, v, "HND", causal, None, True, cfg)
    assert_close_to_reference(o, ro, torch.bfloat16, fn, fp8=runs(fn, q, k, "HND", causal, True)[0] in FP8_BACKENDS)
    assert_lse_close_to_reference(lse, rl)


@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_varlen_grid(dtype, causal, d, gqa):
    hq, hk = (4, 2) if gqa else (2, 2)
    lens_q = [1, 77, 1000, 4097, 0, 33]
    lens_k = lens_q if causal else [5, 77, 1500, 4097, 9, 0]
    g = torch.Generator().manual_seed(d)
    q = torch.randn(sum(lens_q), hq, d, generator=g).to(dtype).cuda()
    k = (torch.randn(sum(lens_k), hk, d, generator=g) + 1.0).to(dtype).cuda()
    v = torch.randn(sum(lens_k), hk, d, generator=g).to(dtype).cuda()

    o, lse = sa.sageattn_varlen(q, k, v, cu_seqlens(lens_q, "cuda"), cu_seqlens(lens_k, "cuda"), max(lens_q), max(lens_k),
                                is_causal=causal, return_lse=True)
    assert torch.isfinite(o).all()
    # the dense function of the kernel sageattn_varlen runs: the Hopper one where sageattn's is
    # (dispatch.varlen_groups; test_cuda.py holds it to that function bit for bit), else Triton
    hopper = dispatch.varlen_groups(dispatch.chosen(q.device)[0], lens_q, lens_k, causal) is not None
    dense = sa.sageattn_qk_int8_pv_fp8_cuda_sm90 if hopper else sa.sageattn_qk_int8_pv_fp16_triton
    sq = sk = 0
    for nq, nk in zip(lens_q, lens_k):
        if nq and nk:
            part = [t[None] for t in (q[sq:sq + nq], k[sk:sk + nk], v[sk:sk + nk])]
            eo, el = attention_exact(*part, tensor_layout="NHD", is_causal=causal, return_lse=True)
            assert_close_to_fp32(o[sq:sq + nq][None], eo, f"varlen {nq}x{nk}", **(FP8_VS_FP32 if hopper else {}))
            assert (lse[:, sq:sq + nq] - el[0]).abs().max() < LSE_VS_FP32
            od = dense(*part, tensor_layout="NHD", is_causal=causal)
            assert_close_to_reference(o[sq:sq + nq], od[0], dtype, f"varlen {nq}x{nk} vs dense", fp8=hopper)
        elif nq:
            assert (o[sq:sq + nq] == 0).all()
        sq += nq
        sk += nk


class _SyncError(Exception):
    pass


def _no_sync(fn):
    """fn() with torch's sync debug mode at "error": any op that makes the host wait for the GPU
    raises (re-raised as _SyncError, so a failure says what it was)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn()
    except RuntimeError as e:
        if "synchroniz" in str(e):
            raise _SyncError(str(e)) from e
        raise
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("path", ["default", "triton"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_offsets_on_the_cpu_never_wait_for_the_gpu(path, causal, monkeypatch):
    """Offsets on the CPU: the same bits as offsets on the GPU, and no host-GPU sync in the call
    (with offsets on the GPU the read-back is one, which the sync check must catch). The lengths
    make two launch groups on the Hopper kernel and one sequence with queries but no keys
    (non-causal), which the zero-fill covers."""
    if path == "triton":
        monkeypatch.setattr(dispatch, "varlen_groups", lambda *a: None)
    lens_q = [2048, 100, 5, 96, 130]
    lens_k = lens_q if causal else [2048, 100, 0, 96, 130]
    g = torch.Generator().manual_seed(3)
    q = torch.randn(sum(lens_q), 4, 128, generator=g).to(torch.bfloat16).cuda()
    k = (torch.randn(sum(lens_k), 2, 128, generator=g) + 1.0).to(torch.bfloat16).cuda()
    v = torch.randn(sum(lens_k), 2, 128, generator=g).to(torch.bfloat16).cuda()
    host = [cu_seqlens(lens_q), cu_seqlens(lens_k)]

    def call(cu_q, cu_k):
        return sa.sageattn_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal, return_lse=True)

    o_gpu, lse_gpu = call(*(c.cuda() for c in host))  # also compiles what the call runs
    o_cpu, lse_cpu = _no_sync(lambda: call(*host))
    assert torch.equal(o_cpu, o_gpu) and torch.equal(lse_cpu, lse_gpu)
    on_gpu = [c.cuda() for c in host]
    with pytest.raises(_SyncError):
        _no_sync(lambda: call(*on_gpu))


@pytest.mark.parametrize("path", ["default", "triton"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_replays_in_a_cuda_graph(path, causal, monkeypatch):
    """sageattn_varlen with CPU offsets captured in a CUDA graph, replayed on new inputs copied
    into the captured ones: eager's bits, the lengths of the capture. (Before
    sageattention/_staging.py the capture failed: torch refuses copies from pageable host
    memory inside one.) Between capture and replay other calls build tables of the same sizes
    on the host with other lengths, and pin some memory: the pinned tables the graph's copies
    read must not be reused."""
    if path == "triton":
        monkeypatch.setattr(dispatch, "varlen_groups", lambda *a: None)
    lens_q = [2048, 100, 5, 96, 130]
    lens_k = lens_q if causal else [2048, 100, 0, 96, 130]
    other_q, other_k = [130, 96, 2048, 100, 5], [130, 96, 2048, 0, 100]  # same totals and count

    def inputs(seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(sum(lens_q), 4, 128, generator=g).to(torch.bfloat16).cuda(),
                (torch.randn(sum(lens_k), 2, 128, generator=g) + 1.0).to(torch.bfloat16).cuda(),
                torch.randn(sum(lens_k), 2, 128, generator=g).to(torch.bfloat16).cuda())

    def call(q, k, v, lq=lens_q, lk=lens_k):
        return sa.sageattn_varlen(q, k, v, cu_seqlens(lq), cu_seqlens(lk), max(lq), max(lk), is_causal=causal,
                                  return_lse=True)

    q, k, v = inputs(1)
    # a registry of this test's own: a table the same as one an earlier test kept is not kept twice
    monkeypatch.setattr(_staging, "_KEPT", {})
    graph, (o, lse) = capture(call, q, k, v)
    assert _staging.kept_tables() > 0
    for seed in (2, 3):
        for _ in range(3):  # host tables of the same sizes, other values, freed again
            call(q, k, v, other_q, other_k if not causal else other_q)
            torch.tensor([7] * 64, dtype=torch.int32).pin_memory()
        new = inputs(seed)
        for dst, src in zip((q, k, v), new):
            dst.copy_(src)
        graph.replay()
        eo, el = call(*new)
        assert torch.equal(o, eo) and torch.equal(lse, el), f"replay with seed {seed}"


@pytest.mark.parametrize("where", ["cu_seqlens_q", "max_seqlen_k"])
def test_varlen_capture_refuses_what_it_would_read_from_the_gpu(where):
    """Offsets (or a max length) on the GPU are read on the host, a sync that capture forbids
    (torch would fail with a CUDA error and invalidate the capture): an error naming the
    argument, raised before anything is captured."""
    lens = [300, 17]
    q, k, v = (torch.randn(sum(lens), 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 300, 317], dtype=torch.int32)
    args = {"cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": 300, "max_seqlen_k": 300}
    args[where] = args[where].cuda() if where.startswith("cu") else torch.tensor(300, device="cuda")
    sa.sageattn_varlen(q, k, v, **args)  # outside a capture: read back, fine
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match=f"{where} is a tensor on cuda:0.*CUDA graph is being captured"):
        with torch.cuda.graph(graph):
            sa.sageattn_varlen(q, k, v, **args)
    assert torch.equal(sa.sageattn_varlen(q, k, v, **args), sa.sageattn_varlen(q, k, v, **args))


@pytest.mark.parametrize("offsets_on", ["cpu", "cuda"])
def test_varlen_compiled_with_cuda_graphs(offsets_on):
    """torch.compile(mode="reduce-overhead") around sageattn_varlen: inductor leaves the varlen
    op out of its CUDA graphs (the cudagraph_unsafe tag; with GPU offsets a capture would refuse
    their read-back), and each call, warm-up, recording and replays, gives eager's bits."""
    lens = [700, 33, 1500]
    cu = cu_seqlens(lens, offsets_on)

    def fn(q, k, v, cu):
        return sa.sageattn_varlen(q * 1.0, k, v, cu, cu, 1500, 1500, is_causal=True)

    torch._dynamo.reset()
    compiled = torch.compile(fn, mode="reduce-overhead", fullgraph=True)
    for seed in (1, 2, 3, 4):
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(sum(lens), 4, 128, generator=g).to(torch.bfloat16).cuda() for _ in range(3))
        got = compiled(q, k, v, cu).clone()
        assert torch.equal(got, fn(q, k, v, cu)), (offsets_on, seed)


@pytest.mark.parametrize("n", [1024, 4096])
def test_sageattn_never_waits_for_the_gpu(n):
    """sageattn (the kernel at 4096, SDPA where a GPU's hand-over takes 1024) issues its work
    without a host-GPU sync."""
    q, k, v = make_qkv(1, 8, 8, n, n, 128, torch.bfloat16, device="cuda")
    want = sa.sageattn(q, k, v)
    assert torch.equal(_no_sync(lambda: sa.sageattn(q, k, v)), want)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("fn", list(FUNCS))
def test_acceptance_accuracy(fn, d, causal):
    """Baseline inputs of ../shared/reference/h100-baseline.md: B=1, H=8, N=4096, K with a
    per-channel bias of 3 sigma. Triton path: cos >= 0.9999, rel-L1 <= 0.015 vs fp32. The
    CUDA kernels: within 1e-5 (cos) and 2e-3 (rel-L1) of their own reference's accuracy,
    computed on two of the heads (the reference is slow). sageattn handed to SDPA (this shape
    is short on an H100): the Triton bars."""
    q, k, v = make_qkv(1, 8, 8, 4096, 4096, d, torch.bfloat16, "HND", "cuda", k_bias=3.0, seed=1)
    o = FUNCS[fn](q, k, v, is_causal=causal)
    ref32 = sdpa_fp32(q, k, v, "HND", causal)
    m = error_metrics(o, ref32)
    backend = runs(fn, q, k, "HND", causal)[0]
    if backend in ("triton", "sdpa"):
        assert m["cos"] >= 0.9999 and m["rel_l1"] <= 0.015, m
    else:
        cfg = _reference_config(fn, q, k, "HND", causal)
        ro = attention_quantized(q[:, :2], k[:, :2], v[:, :2], "HND", causal, None, False, cfg)
        mr = error_metrics(ro, ref32[:, :2])
        mk = error_metrics(o[:, :2], ref32[:, :2])
        assert mk["cos"] >= mr["cos"] - 1e-5 and mk["rel_l1"] <= mr["rel_l1"] + 2e-3, (mk, mr)
        if backend == "cuda_fp16":
            assert m["cos"] >= 0.9999 and m["rel_l1"] <= 0.015, m


@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("fn", list(FUNCS))
def test_hostile_large(fn, dtype, kind):
    q, k, v = hostile_qkv(kind, 4097, 128, dtype, "cuda", heads=4)
    for causal in (False, True):
        o, lse = FUNCS[fn](q, k, v, is_causal=causal, return_lse=True)
        assert torch.isfinite(o).all() and torch.isfinite(lse).all(), (fn, kind, causal)
        if kind == "all_zero":
            assert (o == 0).all()
        elif kind != "huge_q":
            # sink: key 0's score error from INT8 Q and K (its own channels quantized with the
            # step of its outlier channel) weighs with its third of the row; the reference models
            # 0.99935 / 0.031 at 16-bit P.V and 0.99899 / 0.039 for the fp8 kernels (CPU), so the
            # fp8 bars hold for all. An 8-bit integer P would give ~0.986 / 0.69 (pv_formats.py).
            bars = FP8_VS_FP32 if kind == "sink" else _fp32_bars(fn, q, k, "HND", causal, True)
            assert_close_to_fp32(o, sdpa_fp32(q, k, v, "HND", causal), f"{fn} {kind}", **bars)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_more_than_2_31_elements(layout):
    """Offsets past 2^31 elements: the last batch entry equals a call on it alone, on the kernel
    sageattn's dispatch picks here (called directly: at N=512 sageattn itself hands an H100's
    calls to SDPA). One tensor serves as q, k and v (~13 GB in all instead of ~22) so the test
    fits beside other workers."""
    b, h, n, d = 2049, 16, 512, 128  # 2.15e9 elements
    shape = (b, h, n, d) if layout == "HND" else (b, n, h, d)
    x = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    fn = dispatch.choose(x.device).backend
    o = FUNCS[fn](x, x, x, tensor_layout=layout, is_causal=True)
    tail = FUNCS[fn](x[-2:], x[-2:], x[-2:], tensor_layout=layout, is_causal=True)
    assert torch.equal(o[-2:], tail)
    assert_close_to_fp32(hnd(tail, layout), hnd(sdpa_fp32(x[-2:], x[-2:], x[-2:], layout, True), layout),
                         **_fp32_bars(fn, x, x, layout, True))


def _sdpa_cudnn_first(q, k, v, layout, causal, scale=None):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                      SDPBackend.MATH], set_priority=True):
        return torch.nn.functional.scaled_dot_product_attention(
            hnd(q, layout), hnd(k, layout), hnd(v, layout), is_causal=causal, scale=scale,
            enable_gqa=k.shape[1 if layout == "HND" else 2] != q.shape[1 if layout == "HND" else 2])


def _h100_class():
    """Whether sageattn should hand calls over on this GPU, decided apart from dispatch's table:
    an sm90 part whose name has one of the words H100, H800, H200, GH200."""
    words = set(torch.cuda.get_device_name().replace("-", " ").split())
    return torch.cuda.get_device_capability() == (9, 0) and bool(words & {"H100", "H800", "H200", "GH200"})


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("d", [160, 256])
def test_sageattn_wide_heads_on_hopper(layout, d):
    """On H100-class GPUs (dispatch.HAND_OVER), a short call with a head dim above 128 runs SDPA
    (cuDNN first); with return_lse torch's cuDNN attention with its LSE where the cuDNN present
    runs that head dim (9.10 or newer), else our kernel; a long one (N = 8192 at D=160, which the
    kernel runs on 192 of 256 columns, 2048 at D=256) the wgmma kernel where it is the choice,
    SDPA where another kernel of ours is. Elsewhere sageattn keeps its kernel (the results must
    differ from SDPA's)."""
    q, k, v = make_qkv(2, 4, 2, 300, 300, d, torch.bfloat16, layout, "cuda", k_bias=1.0, seed=d)
    o = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=True, sm_scale=0.05)
    assert o.shape == q.shape and o.is_contiguous()
    ref = _sdpa_cudnn_first(q, k, v, layout, True, scale=0.05)
    sdpa_here = _h100_class()
    assert torch.equal(hnd(o, layout), ref) == sdpa_here
    if sdpa_here:  # the hand-over traces whole, like the kernels' custom ops
        compiled = torch.compile(sa.sageattn, fullgraph=True)
        assert torch.equal(compiled(q, k, v, tensor_layout=layout, is_causal=True, sm_scale=0.05), o)
    o_lse, lse = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=True, sm_scale=0.05, return_lse=True)
    choice = dispatch.choose(q.device)
    lse_here = sdpa_here and choice.hand_over.lse_head_dim >= d
    fp32 = hnd(sdpa_fp32(q, k, v, layout, True, scale=0.05), layout)
    if lse_here:  # cuDNN's exact attention and LSE
        _, exact_lse = attention_exact(q, k, v, layout, True, 0.05, True)
        assert (lse - exact_lse).abs().max() < 2e-3
        assert_close_to_fp32(hnd(o_lse, layout), fp32)
    else:
        assert not torch.equal(hnd(o_lse, layout), ref), "with return_lse the quantized kernel runs"
        assert_close_to_fp32(hnd(o_lse, layout), fp32, **FP8_VS_FP32)
    n, h = (2048, 64) if d == 256 else (8192, 8)  # 2^28 query-key pairs; 2^29 (pairs_192) at D=160
    q, k, v = make_qkv(1, h, h, n, n, d, torch.bfloat16, layout, "cuda", k_bias=1.0, seed=d + 1)
    o = sa.sageattn(q, k, v, tensor_layout=layout)
    ours = not sdpa_here or choice.backend == "cuda_sm90"
    assert torch.equal(hnd(o, layout), _sdpa_cudnn_first(q, k, v, layout, False)) != ours
    if ours:
        assert torch.equal(o, FUNCS[choice.backend](q, k, v, tensor_layout=layout, **choice.options))


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sageattn_gives_short_calls_to_sdpa_on_hopper(layout, causal):
    """On H100-class GPUs a short call runs SDPA (cuDNN first), also traced by torch.compile;
    with return_lse torch's cuDNN attention with its LSE (exact, compiled the same bits); long
    enough (16 heads x 4096^2 non-causal, 64 heads causal), the quantized kernel, bit for bit
    what the kernel function gives. Elsewhere sageattn always runs its kernel."""
    sdpa_here = _h100_class()
    q, k, v = make_qkv(2, 4, 2, 700, 700, 128, torch.bfloat16, layout, "cuda", k_bias=1.0, seed=5)
    o = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=causal)
    assert o.shape == q.shape and o.is_contiguous()
    assert torch.equal(hnd(o, layout), _sdpa_cudnn_first(q, k, v, layout, causal)) == sdpa_here
    if sdpa_here:
        assert torch.equal(torch.compile(sa.sageattn, fullgraph=True)(q, k, v, tensor_layout=layout,
                                                                        is_causal=causal), o)
    choice = dispatch.choose(q.device)

    def kernel(*a, **kw):  # the function sageattn's dispatch picked, with its options
        return FUNCS[choice.backend](*a, **choice.options, **kw)

    o_lse, lse = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=causal, return_lse=True)
    ko, kl = kernel(q, k, v, tensor_layout=layout, is_causal=causal, return_lse=True)
    assert o_lse.shape == q.shape and o_lse.is_contiguous() and lse.shape == (2, 4, 700)
    assert (torch.equal(o_lse, ko) and torch.equal(lse, kl)) != sdpa_here
    if sdpa_here:
        _, exact_lse = attention_exact(q, k, v, layout, causal, None, True)
        assert (lse - exact_lse).abs().max() < 2e-3
        assert_close_to_fp32(hnd(o_lse, layout), hnd(sdpa_fp32(q, k, v, layout, causal), layout))
        torch._dynamo.reset()  # (each call signature compiles anew: stay under dynamo's recompile limit)
        co, cl = torch.compile(sa.sageattn, fullgraph=True)(q, k, v, tensor_layout=layout, is_causal=causal,
                                                            return_lse=True)
        assert torch.equal(co, o_lse) and torch.equal(cl, lse)
    h = 64 if causal else 16
    q, k, v = make_qkv(1, h, h, 4096, 4096, 128, torch.bfloat16, layout, "cuda", k_bias=1.0, seed=6)
    o = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=causal)
    assert torch.equal(o, kernel(q, k, v, tensor_layout=layout, is_causal=causal))
    assert_close_to_fp32(hnd(o, layout), hnd(sdpa_fp32(q, k, v, layout, causal), layout),
                         **_fp32_bars("sageattn", q, k, layout, causal))


@pytest.mark.parametrize("name", sorted(FUNCS))
def test_backward_raises_on_every_function(name):
    """q, k, v that require grad (grad mode on): each function's bits without grad, and a backward
    through o or the LSE that raises naming it (the compiled ops have no autograd formula: without
    sageattention/_inference.py their o would come back a constant, silently)."""
    fn = FUNCS[name]
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(1, 2, 300, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    with torch.no_grad():
        want = fn(q, k, v, return_lse=True)
    for i in range(2):
        got = fn(*(t.detach().requires_grad_() for t in (q, k, v)), return_lse=True)
        assert all(x.requires_grad and torch.equal(x.detach(), w) for x, w in zip(got, want))
        with pytest.raises(RuntimeError, match=rf"^{fn.__name__} has no backward"):
            got[i].float().sum().backward()


@pytest.mark.parametrize("lse", [False, True], ids=["o", "lse"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_compiled_hand_over_of_misaligned_views(backend, layout, lse):
    """A short call compiled with torch.compile whose q, k, v are rows of a wider tensor at an
    offset (start 6 bytes past 16, as a fused QKV's slices can be) reaches cuDNN as aligned copies
    through the hand-over's custom op: eager's bits for the same views, and fp32 attention's
    values (cuDNN reads such views wrong without an error: tests/test_fuzz.py)."""
    if not _h100_class():
        pytest.skip(f"sageattn hands no call over on {torch.cuda.get_device_name()}")
    q, k, v = make_qkv(2, 4, 2, 300, 300, 64, torch.bfloat16, layout, "cuda", k_bias=1.0, seed=8)
    wide = [torch.cat([t.new_zeros(*t.shape[:-1], 3), t], dim=-1)[..., 3:] for t in (q, k, v)]
    assert all(w.data_ptr() % 16 for w in wide)
    kw = dict(tensor_layout=layout, is_causal=True, return_lse=lse)
    want = sa.sageattn(*wide, **kw)
    torch._dynamo.reset()
    got = torch.compile(sa.sageattn, fullgraph=True, backend=backend)(*wide, **kw)
    for g, w in zip(got if lse else (got,), want if lse else (want,)):
        assert torch.equal(g, w)
    o = got[0] if lse else got
    assert o.shape == q.shape and o.is_contiguous()
    assert_close_to_fp32(hnd(o, layout), hnd(sdpa_fp32(q, k, v, layout, True), layout))
    if lse:
        _, exact_lse = attention_exact(q, k, v, layout, True, None, True)
        assert (got[1] - exact_lse).abs().max() < 2e-3


LSE_DIMS = [(1, 2, 2, 1, 2), (2, 4, 2, 77, 77), (1, 4, 1, 300, 1000), (2, 2, 2, 1000, 7), (2, 4, 2, 1000, 300),
            (1, 8, 8, 1500, 1500)]


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("d", range(8, 257, 8))
def test_lse_hand_over_agrees_with_torchs_cudnn_check(layout, d):
    """Every short return_lse call that dispatch.lse_to_sdpa sends to torch's cuDNN attention
    passes torch's own check for that backend on an H100-class GPU (so eager mode never falls
    back to the kernel for them, and torch.compile, which skips the check, routes them alike),
    and gives the exact LSE and output (causal with Nq != Nk too: top-left, as SDPA; GQA with
    K and V as they are, which sageattn passes without repeating their heads)."""
    if not _h100_class():
        pytest.skip(f"sageattn hands no call over on {torch.cuda.get_device_name()}")
    limits = dispatch.choose(torch.device("cuda")).hand_over
    top = limits.lse_head_dim
    if d > top:
        pytest.skip(f"head dim {d}: cuDNN {torch.backends.cudnn.version()} takes the LSE up to {top}")
    import warnings

    from sageattention import _sdpa

    bad = []
    for b, hq, hkv, nq, nk in LSE_DIMS:
        for causal in (False, True) if min(nq, nk) > 1 else (False,):  # (one visible key: our kernel)
            dims = Dims(b, hq, hkv, nq, min(nk, nq) if causal else nk, d)
            assert dispatch.goes_to_sdpa(limits, dims, causal, True)
            q, k, v = make_qkv(b, hq, hkv, nq, nk, d, torch.float16, layout, "cuda", k_bias=1.0, seed=d + nq)
            ks, vs = visible_kv(q, k, v, layout, causal)
            qh, kh, vh = (hnd(t, layout) for t in (q, ks, vs))
            if not _sdpa._cudnn_can_run(qh, kh, vh, causal):
                with warnings.catch_warnings(record=True) as why:  # torch's reasons, for the message
                    warnings.simplefilter("always")
                    params = torch.backends.cuda.SDPAParams(qh, kh, vh, None, 0.0, causal, hkv != hq)
                    torch.backends.cuda.can_use_cudnn_attention(params, True)
                bad.append(((b, hq, hkv, nq, nk, causal), [str(w.message)[:100] for w in why]))
                continue
            o, lse = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=causal, return_lse=True)
            _, exact_lse = attention_exact(q, k, v, layout, causal, None, True)
            assert (lse - exact_lse).abs().max() < 2e-3, (b, hq, hkv, nq, nk, d, causal)
            assert_close_to_fp32(hnd(o, layout), hnd(sdpa_fp32(q, k, v, layout, causal), layout),
                                 f"{(b, hq, hkv, nq, nk, d, causal)}")
    assert not bad, bad


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_sageattn_causal_with_unequal_lengths_on_hopper(layout):
    """Causal calls with Nq != Nk (top-left): short ones go to SDPA on H100-class GPUs, which
    must then mask as SDPA's contract says (checked against fp32 SDPA); long ones run the kernel
    on the keys a query can see (more keys than queries: the first Nq), bit for bit the kernel
    function on those keys."""
    sdpa_here = _h100_class()
    choice = dispatch.choose(torch.device("cuda"))
    for nq, nk in ((1000, 300), (300, 1000)):
        q, k, v = make_qkv(2, 4, 2, nq, nk, 128, torch.bfloat16, layout, "cuda", k_bias=1.0, seed=nq)
        o = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=True)
        ks, vs = visible_kv(q, k, v, layout, True)
        assert torch.equal(hnd(o, layout), _sdpa_cudnn_first(q, ks, vs, layout, True)) == sdpa_here
        assert_close_to_fp32(hnd(o, layout), hnd(sdpa_fp32(q, k, v, layout, True), layout),
                             **_fp32_bars("sageattn", q, k, layout, True))
    for h, nq, nk in ((16, 8192, 4096), (64, 4096, 16384)):  # long: the non-causal limits; 2^30 causal pairs
        q, k, v = make_qkv(1, h, h, nq, nk, 128, torch.bfloat16, layout, "cuda", k_bias=1.0, seed=nk)
        o = sa.sageattn(q, k, v, tensor_layout=layout, is_causal=True)
        ks, vs = visible_kv(q, k, v, layout, True)
        assert torch.equal(o, FUNCS[choice.backend](q, ks, vs, tensor_layout=layout, is_causal=True, **choice.options))


@pytest.mark.parametrize("fn", [f for f in FUNCS if f != "sageattn"])
def test_kernel_functions_drop_keys_no_query_sees(fn):
    """Every kernel function, causal with more keys than queries, runs on the first Nq keys:
    bit for bit the call given only those (the K mean and the V scales taken over them), and
    the LSE too (16384 keys for 300 queries: until 1fa6ebd the functions quantized all of them)."""
    for nq, nk, d in ((300, 16384, 128), (77, 1000, 64)):
        q, k, v = make_qkv(1, 4, 2, nq, nk, d, torch.bfloat16, "HND", "cuda", k_bias=1.0, seed=nk)
        o, lse = FUNCS[fn](q, k, v, is_causal=True, return_lse=True)
        ks, vs = visible_kv(q, k, v, "HND", True)
        os_, lses = FUNCS[fn](q, ks.contiguous(), vs.contiguous(), is_causal=True, return_lse=True)
        assert torch.equal(o, os_) and torch.equal(lse, lses), (fn, nq, nk, d)


GRAPH_SHAPES = [(2, 4, 700, False), (2, 4, 700, True), (1, 16, 4096, False)]


@pytest.mark.parametrize("b,h,n,causal", GRAPH_SHAPES, ids=[f"{b}x{h}x{n}{'-causal' if c else ''}" for b, h, n, c in GRAPH_SHAPES])
def test_sageattn_replays_in_a_cuda_graph(b, h, n, causal):
    """sageattn captured in a CUDA graph, then replayed on new inputs copied into the captured
    ones: eager's bits. On H100-class GPUs the two short shapes are SDPA's (cuDNN) inside the
    graph and 16 heads x 4096^2 the quantized kernel; elsewhere all three are the kernel."""
    def inputs(seed):
        return make_qkv(b, h, h, n, n, 128, torch.bfloat16, "HND", "cuda", k_bias=1.0, seed=seed)

    q, k, v = inputs(1)
    graph, o = capture(lambda *a: sa.sageattn(*a, is_causal=causal), q, k, v)
    for seed in (2, 3):
        new = inputs(seed)
        for dst, src in zip((q, k, v), new):
            dst.copy_(src)
        graph.replay()
        assert torch.equal(o, sa.sageattn(*new, is_causal=causal)), f"replay with seed {seed}"


def test_sageattn_compiled_with_cuda_graphs():
    """torch.compile(mode="reduce-overhead") (inductor's CUDA graphs) around sageattn: a short
    call (SDPA on H100-class GPUs) and a long one (the kernel), each the same bits as eager."""
    torch._dynamo.reset()
    compiled = torch.compile(sa.sageattn, mode="reduce-overhead", fullgraph=True)
    for b, h, n, seed in ((2, 4, 700, 1), (2, 4, 700, 2), (2, 4, 700, 3), (1, 16, 4096, 4), (1, 16, 4096, 5)):
        q, k, v = make_qkv(b, h, h, n, n, 128, torch.bfloat16, "HND", "cuda", k_bias=1.0, seed=seed)
        got = compiled(q, k, v).clone()  # the graph's output buffer is reused by the next replay
        assert torch.equal(got, sa.sageattn(q, k, v)), (b, h, n, seed)


def test_dispatch_on_this_gpu():
    cap = torch.cuda.get_device_capability()
    names = sa.available_backends()
    assert "triton" in names
    choice = dispatch.choose(torch.device("cuda"))
    assert choice.backend in names
    if cap == (9, 0) and "cuda_sm90" in names:
        assert choice.backend == "cuda_sm90"
    elif cap == (9, 0):
        assert choice.backend == "triton"
    assert (choice.hand_over is not None) == _h100_class(), torch.cuda.get_device_name()
