"""Input makers and accuracy assertions shared by the tests."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sageattention.reference import error_metrics

INTERPRETER = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

# the MMA's token order within each 16-token group of the fp8 families' e4m3 V layout
# [channel][token] (quant_fp8.cu's permuted_pos): column j of a group holds token V_MMA_ORDER[j]
V_MMA_ORDER = torch.tensor([0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15])


def bench_script(stem: str, name: str):
    """bench/<stem>.py loaded as the module ``name`` (bench/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / "bench" / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nvcc_path():
    """nvcc from PATH, else from CUDA_HOME / CUDA_PATH; None when neither has it."""
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    cand = os.path.join(home, "bin", "nvcc") if home else None
    return cand if cand and os.path.exists(cand) else None


def build_cpp_check(tmp_path, source, flags=(), why="", compile_only=False):
    """tests/cpp/<source> built with nvcc against csrc/kernels (the kernels' own headers) into
    tmp_path; the path of the program (or object, compile_only). Skips, saying `why` nvcc is
    needed, where there is none."""
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip(f"nvcc not found (PATH, CUDA_HOME): {why}")
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / (Path(source).stem + (".o" if compile_only else ""))
    cmd = [nvcc, "-std=c++17", *flags, "-I", str(root / "csrc" / "kernels"), str(root / "tests" / "cpp" / source),
           "-o", str(out)] + (["-c"] if compile_only else [])
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    return out


def run_cpp_check(exe, timeout=300):
    """Runs a program of build_cpp_check; its stdout, once it has exited with status 0."""
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def make_qkv(b, hq, hk, nq, nk, d, dtype, layout="HND", device="cpu", k_bias=0.0, seed=0):
    """Random normal q, k, v in ``layout``; K gets a per-channel bias of ``k_bias`` sigma."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(h, n):
        return torch.randn(b, h, n, d, generator=g)

    q, k, v = rnd(hq, nq), rnd(hk, nk), rnd(hk, nk)
    if k_bias:
        k = k + k_bias * torch.randn(1, 1, 1, d, generator=g)
    out = []
    for t in (q, k, v):
        t = t.to(dtype)
        if layout == "NHD":
            t = t.transpose(1, 2).contiguous()
        out.append(t.to(device))
    return out


def public_functions():
    """name -> function for every public attention function this machine can run: ``sageattn``,
    the Triton one, and the compiled kernel functions built for this GPU (none without one)."""
    import sageattention as sa
    from sageattention import dispatch

    funcs = {"sageattn": sa.sageattn, "triton": sa.sageattn_qk_int8_pv_fp16_triton}
    if torch.cuda.is_available():
        for name in sa.available_backends():
            if name != "triton":
                funcs[name] = getattr(sa, dispatch.BACKENDS[name].function)
    return funcs


HOSTILE = ["k_bias", "zero_blocks", "all_zero", "constant_v_channel", "huge_v", "huge_q", "sink"]


def hostile_qkv(kind, n, d, dtype, device, heads=2):
    """Inputs that break naive quantization: a huge per-channel K bias, all-zero blocks,
    all zeros, a constant V channel, |V| beyond fp16's range (bf16; fp16 gets its largest
    values), an extremely peaked softmax, an attention sink (key 0 scores ~8 above the
    rest in every row, which then spread their weight thinly over all other keys: a P.V
    format that flushes small weights, such as an 8-bit integer P, fails here; see
    bench/pv_formats.py)."""
    q, k, v = make_qkv(1, heads, heads, n, n, d, torch.float32, "HND", "cpu")
    if kind == "k_bias":
        k = k + 50.0 * torch.randn(d)
    elif kind == "zero_blocks":
        q[..., :128, :] = 0
        k[..., 64:128, :] = 0
        v[..., :64, :] = 0
    elif kind == "all_zero":
        q, k, v = q * 0, k * 0, v * 0
    elif kind == "constant_v_channel":
        v[..., 5] = -2.5
    elif kind == "huge_v":
        v = v * 1e6 if dtype == torch.bfloat16 else v / v.abs().max() * 65000
    elif kind == "huge_q":
        q = q * 300.0
    elif kind == "sink":
        q[..., 0] = 3.0
        k[..., 0, 0] = 8.0 * d**0.5 / 3.0
    else:
        raise ValueError(kind)
    return [t.to(dtype).to(device) for t in (q, k, v)]


def hnd(t, layout):
    return t if layout == "HND" else t.transpose(1, 2)


def visible_kv(q, k, v, layout, causal):
    """K and V as the functions run them: every entry point drops the keys a top-left causal call
    never sees (from Nq on, core._visible_keys), so the reference is computed on those (the
    rule is restated here so that the oracle does not call the code under test)."""
    n_q = q.shape[2 if layout == "HND" else 1]
    if not causal or hnd(k, layout).shape[2] <= n_q:
        return k, v
    return tuple(hnd(hnd(t, layout)[:, :, :n_q], layout) for t in (k, v))


def sdpa_fp32(q, k, v, layout, is_causal=False, scale=None):
    """torch's SDPA in fp32 (math backend), GQA by repeating K/V heads."""
    qh, kh, vh = (hnd(t, layout).float() for t in (q, k, v))
    rep = qh.shape[1] // kh.shape[1]
    if rep > 1:
        kh, vh = kh.repeat_interleave(rep, 1), vh.repeat_interleave(rep, 1)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=is_causal, scale=scale)
    return o if layout == "HND" else o.transpose(1, 2)


def tol_vs_reference(dtype, fp8=False):
    """(min cos, max rel-L1) of a kernel against the reference of the same quantized math.

    They differ only by fp32 evaluation order, exp2 approximations and, rarely, an INT8
    value rounded the other way at a tie; the interpreter also rounds bf16 toward zero.
    With fp8 P (3 mantissa bits) an exp2 that differs in the last bit can move a P value
    to the next e4m3 step (1/16 of it): seen on an H100 as cos 0.99999 on a causal row that
    sees a few keys, so fp8 PV gets the bf16 bounds whatever the input dtype. (The sm90
    kernel's exponent is modelled step by step, QuantConfig.kernel_exponent: its constant
    term's rounding moved such a step on a one-row call, rel-L1 0.0046, fuzz seed 83.)
    """
    if dtype == torch.bfloat16 or fp8:
        return (0.99995, 8e-3) if INTERPRETER else (0.99998, 4e-3)
    return (0.999995, 1.5e-3)


def assert_close_to_reference(out, ref, dtype, what="", fp8=False):
    m = error_metrics(out, ref)
    cos, l1 = tol_vs_reference(dtype, fp8)
    assert m["finite"], f"{what}: non-finite output"
    assert m["cos"] >= cos and m["rel_l1"] <= l1, f"{what}: vs reference {m} (need cos>={cos}, rel_l1<={l1})"
    return m


def assert_lse_close_to_reference(lse, ref):
    """LSE against the reference: equal to fp32 rounding on nearly every row. A row may
    differ more when one of its INT8 Q values was rounded the other way at a tie (the GPU's
    fp32 division and FMA contraction differ from the reference's IEEE steps in the last
    bit; bf16 inputs land on exact ties more often; rows that see one or two keys, as the
    first causal rows, feel a flip most): at most max(4, 2%) rows, by at most 0.05."""
    d = (lse.float() - ref.float()).abs()
    d = torch.where(torch.isinf(lse) & torch.isinf(ref) & (lse == ref), torch.zeros_like(d), d)
    off = int((d > 1e-3).sum().item())
    worst = d.max().item() if d.numel() else 0.0
    assert off <= max(4, 0.02 * d.numel()) and worst <= 0.05, (
        f"LSE vs reference: {off} of {d.numel()} rows off by > 1e-3, max {worst:.3g}")


# Against fp32 attention, random normal inputs: INT8 Q/K is the dominant error. The
# reference's worst case over D 40..256, N 1..1000, causal, GQA, Nq != Nk was cos 0.99993,
# rel-L1 0.012, |LSE error| 0.03; these bounds leave about 2x room.
COS_VS_FP32 = 0.9995
L1_VS_FP32 = 0.025
LSE_VS_FP32 = 0.08


def assert_close_to_fp32(out, ref, what="", cos=COS_VS_FP32, l1=L1_VS_FP32):
    m = error_metrics(out, ref)
    assert m["finite"], f"{what}: non-finite output"
    assert m["cos"] >= cos and m["rel_l1"] <= l1, f"{what}: vs fp32 {m} (need cos>={cos}, rel_l1<={l1})"
    return m


CUDA_BACKENDS = ("cuda_fp16", "cuda_fp8", "cuda_sm90")  # the compiled kernel functions
FP8_BACKENDS = ("cuda_fp8", "cuda_sm90")  # fp8 P and V: wider bounds against fp32


def cuda_defaults(backend):
    """qk_quant_gran and pv_accum_dtype a CUDA kernel function uses when not given (read
    from its signature, the one place they are written)."""
    import inspect

    import sageattention as sa
    from sageattention import dispatch

    sig = inspect.signature(getattr(sa, dispatch.BACKENDS[backend].function))
    return {name: sig.parameters[name].default for name in ("qk_quant_gran", "pv_accum_dtype")}


def runs(fn, q, k, layout="HND", causal=False, lse=False, opts=None):
    """(backend, options) that public function ``fn`` runs for this call, with the kernel
    function's defaults: for ``sageattn`` dispatch's choice ("sdpa" where it hands the call over;
    causal calls count only the keys a query sees), for a kernel function ``opts`` over its own
    defaults. K with one head expanded over the query heads counts as Hq K/V heads, as the
    stride-0 view sageattn receives."""
    from sageattention import dispatch
    from sageattention._checks import Dims

    if fn == "sageattn":
        choice = dispatch.choose(q.device)
        h, n = (1, 2) if layout == "HND" else (2, 1)
        dims = Dims(q.shape[0], q.shape[h], k.shape[h], q.shape[n], _visible_len(q, k, layout, causal), q.shape[3])
        if dispatch.goes_to_sdpa(choice.hand_over, dims, causal, lse):
            return "sdpa", {}
        fn, opts = choice.backend, dict(choice.options)
    return fn, dict(cuda_defaults(fn) if fn in CUDA_BACKENDS else {}, **(opts or {}))


def _visible_len(q, k, layout, causal):
    """How many keys the call's queries see (top-left causal: at most Nq; :func:`visible_kv`)."""
    n = 2 if layout == "HND" else 1
    return min(k.shape[n], q.shape[n]) if causal else k.shape[n]


def reference_config(backend, opts, q, k, layout="HND", causal=False):
    """The reference QuantConfig (sageattention.reference) of what ``backend`` computes with
    ``opts`` (as :func:`runs` gives them) for this call; None for "sdpa" (no quantized pipeline
    to compare with)."""
    from sageattention import _cuda, dispatch
    from sageattention import triton as st

    d, dtype = q.shape[-1], q.dtype
    smooth_k = opts.get("smooth_k", True)
    if backend == "triton":
        return st.config_for(d, dtype, q.device, _visible_len(q, k, layout, causal)).reference(dtype, smooth_k)
    if backend in CUDA_BACKENDS:
        return _cuda.reference_config(dispatch.BACKENDS[backend].extension, opts["qk_quant_gran"],
                                      opts["pv_accum_dtype"], dtype, smooth_k, opts.get("smooth_v", False),
                                      opts.get("v_fp8_terms", 1))
    return None


def cu_seqlens(lens, device="cpu"):
    """int32 offsets [0, l0, l0 + l1, ...] of packed sequences with these lengths."""
    import itertools

    return torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device=device)


def capture(call, *args):
    """torch's recipe for a CUDA graph: ``call(*args)`` once, once more on a side stream (so
    what it loads or compiles is done outside the capture), then captured. Returns the graph
    and what the captured call returned (the buffers each replay writes)."""
    call(*args)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call(*args)
    return graph, out
