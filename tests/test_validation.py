"""Bad inputs: each one must raise a clear error naming the argument and what was given.

These run before any kernel, so they need no GPU (CPU tensors pass the device check under
the Triton interpreter that conftest turns on when no GPU is visible).
"""

import math

import pytest
import torch

import sageattention as sa
from sageattention import KernelUnavailableError, _ops, core, dispatch

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def qkv(shape=(1, 2, 8, 16), kshape=None, dtype=torch.bfloat16):
    q = torch.randn(shape, dtype=dtype, device=DEV)
    k = torch.randn(kshape or shape, dtype=dtype, device=DEV)
    return q, k, torch.randn_like(k)


def packed(total=10, h=2, d=16):
    q = torch.randn(total, h, d, dtype=torch.float16, device=DEV)
    k = torch.randn(total, h, d, dtype=torch.float16, device=DEV)
    cu = torch.tensor([0, 4, total], dtype=torch.int32, device=DEV)
    return q, k, torch.randn_like(k), cu


F = sa.sageattn
T = sa.sageattn_qk_int8_pv_fp16_triton
C16 = sa.sageattn_qk_int8_pv_fp16_cuda
C8 = sa.sageattn_qk_int8_pv_fp8_cuda
C90 = sa.sageattn_qk_int8_pv_fp8_cuda_sm90
VL = sa.sageattn_varlen


def _dense(fn, q=None, k=None, v=None, *args, **kw):
    dq, dk, dv = qkv()
    return lambda: fn(dq if q is None else q, dk if k is None else k, dv if v is None else v, *args, **kw)


def _var(**over):
    q, k, v, cu = packed()
    a = dict(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=6, max_seqlen_k=6)
    kw = {key: over.pop(key) for key in list(over) if key not in a}
    a.update(over)
    return lambda: VL(a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"],
                      a["max_seqlen_q"], a["max_seqlen_k"], **kw)


q0, k0, v0 = qkv()
CASES = [
    # (id, call, exception, substrings that must appear in the message)
    ("q-not-tensor", _dense(F, q=[1, 2]), TypeError, ["q", "list"]),
    ("k-not-tensor", _dense(F, k=3.0), TypeError, ["k", "float"]),
    ("v-none", lambda: F(q0, k0, None), TypeError, ["v", "NoneType"]),
    ("q-3d", _dense(F, q=q0[0]), ValueError, ["q", "4-D", "(2, 8, 16)"]),
    ("k-5d", _dense(F, k=k0[None]), ValueError, ["k", "4-D"]),
    ("q-fp32", _dense(F, q=q0.float(), k=k0.float(), v=v0.float()), TypeError, ["q", "torch.float32", "bfloat16"]),
    ("v-int8", _dense(F, v=torch.zeros_like(v0, dtype=torch.int8)), TypeError, ["v", "torch.int8"]),
    ("dtype-mismatch", _dense(F, k=k0.half(), v=v0.half()), TypeError, ["one dtype", "torch.float16", "torch.bfloat16"]),
    ("q-last-dim-strided", _dense(F, q=torch.randn(1, 2, 16, 8, dtype=torch.bfloat16, device=DEV).transpose(-1, -2)),
     ValueError, ["q", "contiguous", "strides"]),
    ("k-last-dim-strided", _dense(F, k=torch.randn(1, 2, 16, 8, dtype=torch.bfloat16, device=DEV).transpose(-1, -2)),
     ValueError, ["k", "contiguous"]),
    ("k-sparse", _dense(F, k=k0.to_sparse(), v=v0), TypeError, ["k", "dense", "sparse_coo", "to_dense()"]),
    ("kv-shape-mismatch", _dense(F, v=v0[:, :, :4]), ValueError, ["k and v", "(1, 2, 8, 16)", "(1, 2, 4, 16)"]),
    ("batch-mismatch", _dense(F, k=torch.cat([k0, k0]), v=torch.cat([v0, v0])), ValueError, ["batch", "1", "2"]),
    ("head-dim-mismatch", _dense(F, k=k0[..., :8], v=v0[..., :8]), ValueError, ["head dim", "16", "8"]),
    ("head-dim-0", lambda: F(*qkv((1, 2, 8, 0))), ValueError, ["head dim", "between 1 and 256", "got 0"]),
    ("head-dim-257", lambda: F(*qkv((1, 1, 2, 257))), ValueError, ["head dim", "256", "257"]),
    ("heads-not-divisible", lambda: F(*qkv((1, 3, 8, 16), (1, 2, 8, 16))), ValueError, ["3", "2", "multiple"]),
    ("enable-gqa-false", lambda: F(*qkv((1, 4, 8, 16), (1, 2, 8, 16)), enable_gqa=False), ValueError,
     ["enable_gqa=False", "4", "2"]),
    ("enable-gqa-str", _dense(F, enable_gqa="yes"), TypeError, ["enable_gqa", "'yes'"]),
    ("layout-unknown", _dense(F, None, None, None, "BHND"), ValueError, ["tensor_layout", "'HND'", "'NHD'", "'BHND'"]),
    ("layout-none-sdpa-positional", _dense(F, None, None, None, None, 0.0, True), TypeError,
     ["tensor_layout", "None", "SDPA"]),
    ("layout-tensor-sdpa-positional", _dense(F, None, None, None, torch.ones(8, 8, dtype=torch.bool)), TypeError,
     ["tensor_layout", "tensor of shape (8, 8)", "SDPA"]),
    ("is-causal-int", _dense(F, is_causal=1), TypeError, ["is_causal", "1", "int"]),
    ("is-causal-str", _dense(F, is_causal="True"), TypeError, ["is_causal", "'True'"]),
    ("return-lse-none", _dense(F, return_lse=None), TypeError, ["return_lse", "None"]),
    ("sm-scale-str", _dense(F, sm_scale="0.1"), TypeError, ["sm_scale", "'0.1'", "str"]),
    ("sm-scale-nan", _dense(F, sm_scale=math.nan), ValueError, ["sm_scale", "finite", "nan"]),
    ("sm-scale-inf", _dense(F, sm_scale=math.inf), ValueError, ["sm_scale", "inf"]),
    ("sm-scale-bool", _dense(F, sm_scale=True), TypeError, ["sm_scale", "True", "bool"]),
    ("scale-disagrees", _dense(F, sm_scale=0.1, scale=0.2), ValueError, ["sm_scale=0.1", "scale=0.2"]),
    ("scale-str", _dense(F, scale="x"), TypeError, ["scale", "'x'"]),
    ("dropout", _dense(F, dropout_p=0.1), ValueError, ["dropout_p=0.1", "inference"]),
    ("dropout-str", _dense(F, dropout_p="0"), TypeError, ["dropout_p", "'0'"]),
    ("attn-mask", _dense(F, attn_mask=torch.ones(8, 8, dtype=torch.bool, device=DEV)), ValueError,
     ["attn_mask", "(8, 8)", "not supported"]),
    ("unknown-kwarg", _dense(F, foo=1), TypeError, ["unexpected keyword", "'foo'"]),
    ("unknown-kwargs-listed", _dense(F, foo=1, bar=2), TypeError, ["'bar'", "'foo'"]),
    ("empty-keys", lambda: F(*qkv((1, 2, 8, 16), (1, 2, 0, 16))), ValueError, ["no tokens", "8"]),
    ("nhd-heads-mismatch", lambda: F(*qkv((1, 8, 2, 16), (1, 8, 3, 16)), "NHD"), ValueError, ["2", "3", "multiple"]),
    ("device-mismatch", _dense(F, k=torch.empty(1, 2, 8, 16, dtype=torch.bfloat16, device="meta"),
                               v=torch.empty(1, 2, 8, 16, dtype=torch.bfloat16, device="meta")),
     ValueError, ["one device", "meta"]),
    # Triton function
    ("triton-quant-backend", _dense(T, quantization_backend="cudnn"), ValueError,
     ["quantization_backend", "'triton'", "'cuda'", "'cudnn'"]),
    ("triton-smooth-k-str", _dense(T, smooth_k="yes"), TypeError, ["smooth_k", "'yes'"]),
    ("triton-attn-mask", _dense(T, attn_mask=torch.zeros(8, 8, device=DEV)), ValueError, ["attn_mask", "not supported"]),
    ("triton-quant-cuda-missing", _dense(T, quantization_backend="cuda"), KernelUnavailableError,
     ["quantization_backend='cuda'", "not in this build", "sageattn"]),
    # CUDA functions
    ("fp16-gran", _dense(C16, qk_quant_gran="per_block"), ValueError, ["qk_quant_gran", "'per_warp'", "'per_thread'", "'per_block'"]),
    ("fp16-accum-fp16", _dense(C16, pv_accum_dtype="fp16"), ValueError, ["pv_accum_dtype='fp16'", "overflow", "'fp16+fp32'"]),
    ("fp16-accum-bad", _dense(C16, pv_accum_dtype="fp8"), ValueError, ["pv_accum_dtype", "'fp8'", "'fp32'"]),
    ("fp16-smooth-v", _dense(C16, smooth_v=True), ValueError, ["smooth_v", "'fp32'"]),
    ("fp8-accum-bad", _dense(C8, pv_accum_dtype="fp16+fp32"), ValueError, ["pv_accum_dtype", "'fp32+fp16'", "'fp16+fp32'"]),
    ("fp8-smooth-v-mode", _dense(C8, smooth_v=True), ValueError, ["smooth_v", "'fp32'", "'fp32+fp16'"]),
    ("fp8-smooth-v-str", _dense(C8, smooth_v="no"), TypeError, ["smooth_v", "'no'"]),
    ("sm90-accum", _dense(C90, pv_accum_dtype="fp32"), ValueError, ["pv_accum_dtype", "'fp32+fp32'", "'fp32'"]),
    ("sm90-smooth-v-unknown", _dense(C90, smooth_v=True), TypeError, ["unexpected keyword", "'smooth_v'"]),
    ("sm90-gran", _dense(C90, qk_quant_gran=3), ValueError, ["qk_quant_gran", "3"]),
    ("sm90-v-terms-3", _dense(C90, v_fp8_terms=3), ValueError, ["v_fp8_terms", "1 or 2", "3"]),
    ("sm90-v-terms-bool", _dense(C90, v_fp8_terms=True), ValueError, ["v_fp8_terms", "True"]),
    ("sm90-v-terms-str", _dense(C90, v_fp8_terms="2"), ValueError, ["v_fp8_terms", "'2'"]),
    ("sm90-v-terms-d256", _dense(C90, *qkv((1, 2, 8, 200)), v_fp8_terms=2), ValueError,
     ["v_fp8_terms=2", "at most 128", "200"]),
    ("fp8-v-terms-unknown", _dense(C8, v_fp8_terms=2), TypeError, ["unexpected keyword", "'v_fp8_terms'"]),
    ("sageattn-v-terms-unknown", _dense(F, v_fp8_terms=2), TypeError, ["unexpected keyword", "'v_fp8_terms'"]),
    # varlen
    ("varlen-q-4d", _var(q=torch.randn(1, 10, 2, 16, dtype=torch.float16, device=DEV)), ValueError, ["q", "3-D"]),
    ("varlen-cu-float", _var(cu_seqlens_q=torch.tensor([0.0, 4.0, 10.0], device=DEV)), TypeError,
     ["cu_seqlens_q", "torch.float32"]),
    ("varlen-cu-list", _var(cu_seqlens_k=[0, 4, 10]), TypeError, ["cu_seqlens_k", "list"]),
    ("varlen-cu-2d", _var(cu_seqlens_q=torch.tensor([[0, 4, 10]], dtype=torch.int32, device=DEV)), ValueError,
     ["cu_seqlens_q", "1-D", "(1, 3)"]),
    ("varlen-cu-start", _var(cu_seqlens_q=torch.tensor([1, 4, 10], dtype=torch.int32, device=DEV)), ValueError,
     ["cu_seqlens_q[0]", "1"]),
    ("varlen-cu-decreasing", _var(cu_seqlens_k=torch.tensor([0, 6, 4, 10], dtype=torch.int32, device=DEV)), ValueError,
     ["cu_seqlens_k", "non-decreasing", "[0, 6, 4, 10]", "cu_seqlens_k[2]=4 after cu_seqlens_k[1]=6"]),
    # a long list is cut short in the message: the place where it decreases is named
    ("varlen-cu-decreasing-long", _var(cu_seqlens_k=torch.tensor([0] + [1] * 40 + [0, 10], dtype=torch.int32, device=DEV)),
     ValueError, ["non-decreasing", "cu_seqlens_k[41]=0 after cu_seqlens_k[40]=1"]),
    ("varlen-cu-total", _var(cu_seqlens_q=torch.tensor([0, 4, 9], dtype=torch.int32, device=DEV)), ValueError,
     ["cu_seqlens_q[-1]", "10", "9"]),
    ("varlen-cu-device", _var(cu_seqlens_k=torch.tensor([0, 4, 10], dtype=torch.int32, device="meta")), ValueError,
     ["cu_seqlens_k", "meta", "q's device or on the CPU"]),
    ("varlen-max-too-small", _var(max_seqlen_q=5), ValueError, ["max_seqlen_q=5", "6"]),
    ("varlen-max-negative", _var(max_seqlen_k=-1), ValueError, ["max_seqlen_k", "-1"]),
    ("varlen-max-float", _var(max_seqlen_q=3.5), TypeError, ["max_seqlen_q", "3.5"]),
    ("varlen-count-mismatch", _var(cu_seqlens_k=torch.tensor([0, 2, 4, 10], dtype=torch.int32, device=DEV)),
     ValueError, ["same number of sequences", "2", "3"]),
    ("varlen-mask", _var(attn_mask=torch.ones(1, device=DEV)), ValueError, ["attn_mask"]),
    ("varlen-causal-str", _var(is_causal="yes"), TypeError, ["is_causal", "'yes'"]),
    ("varlen-unknown", _var(tensor_layout="NHD"), TypeError, ["unexpected keyword", "'tensor_layout'"]),
]


@pytest.mark.parametrize("call,exc,parts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_message(call, exc, parts):
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    for part in parts:
        assert part in msg, f"{part!r} missing from: {msg}"


def test_enough_cases():
    assert len(CASES) >= 40


def test_every_message_names_its_function():
    names = {"sageattn", "sageattn_varlen", "sageattn_qk_int8_pv_fp16_triton", "sageattn_qk_int8_pv_fp16_cuda",
             "sageattn_qk_int8_pv_fp8_cuda", "sageattn_qk_int8_pv_fp8_cuda_sm90"}
    for case_id, call, exc, _ in CASES:
        with pytest.raises(exc) as info:
            call()
        assert any(n in str(info.value) for n in names), f"{case_id}: {info.value}"


_CUDA_FUNCTIONS = {"fp16_cuda": (C16, "cuda_fp16"), "fp8_cuda": (C8, "cuda_fp8"), "fp8_cuda_sm90": (C90, "cuda_sm90")}


@pytest.mark.parametrize("name", list(_CUDA_FUNCTIONS))
def test_cuda_functions_say_not_in_build(name):
    fn, backend = _CUDA_FUNCTIONS[name]
    if _ops.status(dispatch.BACKENDS[backend].extension)[0]:
        pytest.skip("this build has the function's compiled module")  # pragma: no cover
    with pytest.raises(KernelUnavailableError) as info:
        fn(*qkv())
    msg = str(info.value)
    assert fn.__name__ in msg and "not in this build" in msg and "sageattn(" in msg


@pytest.mark.parametrize("name", list(_CUDA_FUNCTIONS))
def test_cuda_functions_refuse_cpu_tensors_when_built(name, monkeypatch):
    """With the compiled module present (simulated here: the build check passes), CPU tensors,
    which the Triton interpreter lets through validation, get an error naming q's device, not
    the dispatcher's "Could not run ... with arguments from the 'CPU' backend"."""
    fn, _ = _CUDA_FUNCTIONS[name]
    monkeypatch.setattr(core, "require", lambda function, module: None)
    monkeypatch.setattr(core, "_interpreting", lambda: True)  # as in the CPU test runs, on any machine
    q, k, v = (torch.randn(1, 2, 16, 64, dtype=torch.float16) for _ in range(3))
    with pytest.raises(RuntimeError, match=fn.__name__ + r": q is on cpu; .*NVIDIA GPU only"):
        fn(q, k, v)


def test_cpu_tensors_refused_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = (torch.randn(1, 1, 4, 8, dtype=torch.float16) for _ in range(3))
    with pytest.raises(RuntimeError, match=r"sageattn: q is on cpu.*NVIDIA GPUs"):
        sa.sageattn(q, k, v)


@pytest.mark.parametrize("triton_v, numpy_v, broken", [
    ("3.6.0", "2.4.6", True), ("3.6.0", "2.5.2", True), ("3.5.1", "2.4.0", True),  # 3.6.0 + 2.4.6: seen here
    ("3.6.0", "2.3.5", False), ("3.7.0", "2.4.6", False), ("3.9.0", "2.4.6", False),  # ... and passing
    ("3.10.0", "3.0.0", False), ("unknown", "2.4.6", False),
])
def test_interpreter_problem_names_the_versions_and_the_way_out(triton_v, numpy_v, broken):
    """Triton's CPU interpreter before 3.7 converts one-element arrays with int(), which numpy
    refuses from 2.4 (triton-lang/triton#9171): with such a pair installed a CPU call says so, with
    both versions and what to install, instead of a TypeError from inside the kernel."""
    from sageattention import _checks as C

    problem = C.interpreter_problem(triton_v, numpy_v)
    assert bool(problem) == broken
    if broken:
        assert f"Triton {triton_v}" in problem and f"numpy {numpy_v}" in problem
        assert "numpy<2.4" in problem and "Triton 3.7 or newer" in problem


def _broken_interpreter(monkeypatch):
    from sageattention import _checks as C

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(C, "installed_interpreter_problem", lambda: C.interpreter_problem("3.6.0", "2.4.6"))


@pytest.mark.parametrize("entry", ["sageattn", "sageattn_qk_int8_pv_fp16_triton", "sageattn_varlen"])
def test_cpu_call_refused_where_the_interpreter_cannot_run(monkeypatch, entry):
    """A CPU call that would start a Triton kernel in the interpreter checks the installed pair
    first (here: a broken one) and names the function, instead of a TypeError from the kernel."""
    _broken_interpreter(monkeypatch)
    if entry == "sageattn_varlen":
        q, k, v = (torch.randn(12, 1, 8, dtype=torch.float16) for _ in range(3))
        cu = torch.tensor([0, 5, 12], dtype=torch.int32)
        call = lambda: sa.sageattn_varlen(q, k, v, cu, cu, 7, 7)  # noqa: E731
    else:
        q, k, v = (torch.randn(1, 1, 4, 8, dtype=torch.float16) for _ in range(3))
        call = lambda: getattr(sa, entry)(q, k, v)  # noqa: E731
    with pytest.raises(RuntimeError, match=entry + r": Triton 3.6.0's CPU interpreter cannot run beside numpy 2.4.6"):
        call()


def test_cpu_calls_that_start_no_kernel_are_not_refused_for_the_interpreter(monkeypatch):
    """The pair is asked only where a kernel would start: an empty CPU call returns its empty
    output, and a CUDA kernel function given CPU tensors names q's device (the interpreter would
    never run it), with the same broken pair installed."""
    _broken_interpreter(monkeypatch)
    q, k, v = (torch.randn(0, 1, 4, 8, dtype=torch.float16) for _ in range(3))
    o, lse = sa.sageattn(q, k, v, return_lse=True)
    assert o.shape == q.shape and lse.shape == (0, 1, 4)
    fn, _ = _CUDA_FUNCTIONS["fp8_cuda_sm90"]
    monkeypatch.setattr(core, "require", lambda function, module: None)
    q, k, v = (torch.randn(1, 2, 16, 64, dtype=torch.float16) for _ in range(3))
    with pytest.raises(RuntimeError, match=fn.__name__ + r": q is on cpu; .*NVIDIA GPU only"):
        fn(q, k, v)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_varlen_offsets_may_be_on_the_cpu_for_gpu_tensors(dtype):
    """For q on a GPU, offsets on the CPU are accepted (read without a device sync) and checked
    like offsets on q's device; a third device is refused. (Only the check runs: no GPU needed.)"""
    from sageattention import _checks as C

    gpu = torch.device("cuda", 0)
    cu = torch.tensor([0, 3, 3, 10], dtype=dtype)
    assert C.check_cu_seqlens("f", "cu_seqlens_q", cu, 10, gpu, "max_seqlen_q", 7) == [3, 0, 7]
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[-1\] must equal .*\(9\), got 10"):
        C.check_cu_seqlens("f", "cu_seqlens_q", cu, 9, gpu, "max_seqlen_q", 7)
    with pytest.raises(ValueError, match=r"max_seqlen_q=6 is smaller"):
        C.check_cu_seqlens("f", "cu_seqlens_q", cu, 10, gpu, "max_seqlen_q", 6)
    with pytest.raises(ValueError, match=r"cu_seqlens_q is on meta but q is on cuda:0"):
        C.check_cu_seqlens("f", "cu_seqlens_q", cu.to("meta"), 10, gpu, "max_seqlen_q", 7)


def test_gpu_values_read_on_the_host_are_refused_inside_graph_capture(monkeypatch):
    """A GPU tensor that must be read on the host (varlen offsets, a max length) is refused
    while a CUDA graph is being captured, with what to pass instead; outside a capture, and for
    CPU tensors, nothing is refused. (The capture state is faked: no GPU needed; the GPU tests
    capture for real.)"""
    from types import SimpleNamespace

    from sageattention import _checks as C

    on_gpu = SimpleNamespace(device=torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    C.refuse_read_in_capture("f", "cu_seqlens_q", on_gpu)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    C.refuse_read_in_capture("f", "cu_seqlens_q", torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^f: cu_seqlens_q is a tensor on cuda:0, read on the host, which is not "
                                         r"possible while a CUDA graph is being captured; pass it as a CPU tensor"):
        C.refuse_read_in_capture("f", "cu_seqlens_q", on_gpu)
    with pytest.raises(ValueError, match=r"max_seqlen_k is a tensor on cuda:0.*pass it as a Python int or a CPU tensor"):
        C.refuse_read_in_capture("f", "max_seqlen_k", on_gpu, "a Python int or a CPU tensor")


def test_host_tables_stay_on_the_host_for_cpu_work():
    """The staging helper on the CPU (Triton's interpreter): the table itself, nothing kept."""
    from sageattention import _staging

    before = _staging.kept_tables()
    t = torch.tensor([[0, 3], [5, 7]], dtype=torch.int32)
    assert _staging.to_device(t, torch.device("cpu")) is t and _staging.kept_tables() == before


# --- backward: every public function is forward-only (sageattention/_inference.py) ---


def _backward_raises(fn_name, out, q):
    """A loss that reaches q through ``out`` and also directly (a residual stream): with ``out``
    a constant the backward would run and give q only the direct share."""
    loss = out.float().sum() + q.float().sum()
    with pytest.raises(RuntimeError, match=rf"^{fn_name} has no backward: .*torch\.no_grad\(\) or "
                                           r"torch\.inference_mode\(\).*scaled_dot_product_attention"):
        loss.backward()


@pytest.mark.parametrize("which", [0, 1], ids=["o", "lse"])
def test_backward_through_a_call_raises_and_names_the_function(which):
    """q that requires grad (a trained projection before the attention): the forward gives the bits
    of the same call without grad, and its outputs can be changed in place; a backward through o
    or the LSE raises, naming the function and what to do, also when the loss reaches q otherwise."""
    q, k, v = qkv()
    q.requires_grad_()
    with torch.no_grad():
        want = T(q, k, v, return_lse=True)
    got = T(q, k, v, return_lse=True)
    for g, w in zip(got, want):
        assert g.requires_grad and torch.equal(g.detach(), w)
    _backward_raises("sageattn_qk_int8_pv_fp16_triton", got[which], q)
    o = T(q, k, v)
    o.mul_(2.0)
    assert torch.equal(o.detach(), want[0] * 2.0)


def test_backward_through_a_packed_call_raises():
    q, k, v, cu = packed()
    k.requires_grad_()
    _backward_raises("sageattn_varlen", VL(q, k, v, cu, cu, 6, 6), k)


def test_calls_without_grad_are_left_alone():
    """Inference as usual: under no_grad or inference_mode, or with nothing that requires grad,
    the output is the function's own (no backward node)."""
    q, k, v = qkv()
    with torch.no_grad():
        assert T(q.requires_grad_(), k, v).grad_fn is None
    with torch.inference_mode():
        assert not T(q, k, v).requires_grad
    assert T(q.detach(), k, v).grad_fn is None


def test_compiled_call_that_needs_grad_runs_eagerly_or_refuses_fullgraph():
    """Under torch.compile a call that needs grad breaks the graph and runs as in eager mode (same
    bits, backward raising); with fullgraph=True it fails to compile, with the same message."""
    q, k, v = qkv()
    q.requires_grad_()
    with torch.no_grad():
        want = T(q, k, v)
    torch._dynamo.reset()
    got = torch.compile(T, backend="eager")(q, k, v)
    assert torch.equal(got.detach(), want)
    _backward_raises("sageattn_qk_int8_pv_fp16_triton", got, q)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="sageattn_qk_int8_pv_fp16_triton has no backward"):
        torch.compile(T, backend="eager", fullgraph=True)(q, k, v)
    torch._dynamo.reset()
    with torch.no_grad():  # and a call without grad still compiles whole
        assert torch.equal(torch.compile(T, backend="eager", fullgraph=True)(q, k, v), want)

def test_every_public_attention_function_is_forward_only():
    """Each public function carries the wrapper (the compiled ones cannot run here; the GPU tests
    run them with inputs that require grad)."""
    import inspect

    import sageattention3_blackwell as sa3

    for fn in (F, T, C16, C8, C90, VL, sa3.sageattn3_blackwell):
        assert inspect.unwrap(fn) is not fn and fn.__wrapped__.__name__ == fn.__name__, fn.__name__
