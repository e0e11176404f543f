"""Host time of one call, next to its GPU time, for the sageattention package under a given root
(to compare two versions of the Python code in one process-per-version run on one machine).

    python bench/host_overhead.py [ROOT] [LABEL]     ROOT: the directory holding sageattention/
                                                     (default: this checkout); LABEL: the first column
    HOST_SHAPES=4x32x1024x64,1x16x512x128 python bench/host_overhead.py ...   (only these shapes)

Host µs/call: the GPU is held busy by a sleep kernel while 50 calls are queued; the wall time per
call is then what the CPU spends (checks, dispatch, the op calls, the launches); best of 5 rounds
the GPU stayed busy through (fewer calls per round where it did not; nan: the call waits for the
GPU by itself; timing.host_us). GPU µs:
do_bench median of three (a call whose host time exceeds its GPU time is host-bound, and do_bench
then measures the host). Prints Markdown rows: label, B x H x N x D, call, host µs, GPU µs.
On an H100 sageattn hands these shapes to SDPA (dispatch.HAND_OVER), so its rows time that route,
beside SDPA called bare and inside sdpa_kernel, the hand-over through sdpa_kernel (_sdpa.py), the
hand-over's own SDPA call (_sdpa.sdpa: what sageattn adds to it is its checks and decision), and
with return_lse the cuDNN operator that gives the LSE (_sdpa.sdpa_lse). The sm90 function's
call is split too: its two op calls alone (quant_qkv, then attn on its outputs), the one op that
does both (quant_attn, which the function calls where the extension has it) and the function with
the ops replaced by stubs returning those outputs (its Python part); and the fp16-PV function
beside its op and the separate op calls that op replaced. Then ``sageattn_varlen`` on packed
sequences (offsets on the CPU, so no read-back waits for the GPU): one group of four 1024-token
sequences, 2048 + 20 x 64 tokens, which runs as two groups (dispatch.varlen_groups), and two sets
of a thousand sequences (VARLEN_SETS); with HOST_VARLEN=only just those rows, HOST_VARLEN=0 none.
"""

import os
import sys
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
LABEL = sys.argv[2] if len(sys.argv) > 2 else "this checkout"
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from timing import gpu_us, host_us  # noqa: E402  (bench/timing.py: torch and triton only)

import sageattention as sa  # noqa: E402

if not Path(sa.__file__).resolve().is_relative_to(ROOT):
    sys.exit(f"imported {sa.__file__}, not the package under {ROOT}")


def _sdpa_rows(q, k, v):
    """SDPA beside sageattn's hand-over: the bare call, the call inside sdpa_kernel (as
    bench.py times cuDNN), and sageattn with its hand-over forced onto sdpa_kernel."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v)

    rows = {"F.sdpa (no context)": lambda: F.scaled_dot_product_attention(q, k, v), "sdpa_kernel(cuDNN)": cudnn}
    try:
        from sageattention import _sdpa
    except ImportError:  # a package from before the hand-over's fast path
        return rows

    def old_path():
        state, _sdpa._STATE = _sdpa._STATE, None
        try:
            return sa.sageattn(q, k, v)
        finally:
            _sdpa._STATE = state

    rows["sageattn, hand-over through sdpa_kernel"] = old_path
    if hasattr(_sdpa, "sdpa"):  # the hand-over's SDPA call alone: sageattn's time less this is its checks
        scale = q.shape[-1] ** -0.5
        rows["_sdpa.sdpa (the hand-over's SDPA call alone)"] = lambda: _sdpa.sdpa(q, k, v, False, scale, False)
    if hasattr(_sdpa, "sdpa_lse"):  # the LSE hand-over: torch's cuDNN operator, its check first
        rows["_sdpa.sdpa_lse (cuDNN with the LSE)"] = lambda: _sdpa.sdpa_lse(q, k, v, False, q.shape[-1] ** -0.5)
    return rows


def _op_rows(q, k, v):
    """The sm90 function's two custom-op calls alone, with the arguments it passes for these
    inputs (HND, non-causal, per-thread scales, K smoothed), and the function with both ops
    replaced by stubs that return those calls' outputs: its Python part."""
    try:
        from sageattention import _cuda
        from sageattention._ops import ops

        op = ops(_cuda.SM90)
    except (ImportError, RuntimeError, AttributeError):
        return {}
    b, h, n, d = q.shape
    dp, npad = _cuda.padded_head_dim(d), -(-n // 128) * 128
    scale = d ** -0.5

    def quant():
        return op.quant_qkv(q, k, v, scale * _cuda.LOG2E, 8, 4, True, False, False, _cuda.FP8_MAX, npad, npad, dp,
                            False, 1)

    qo = quant()

    def attn():
        return op.attn(qo[0], qo[3], qo[6], qo[1], qo[4], qo[7], None, None, 8, 4, n, n, d, False,
                       _cuda.ACCUM["fp32+fp32"], False, False, scale, q.dtype)

    ao = attn()

    class Stub:
        def quant_qkv(self, *a):
            return qo

        def attn(self, *a):
            return ao

        def quant_attn(self, *a):
            return ao

    def python_part():
        real, _cuda.ops = _cuda.ops, lambda module: Stub()
        try:
            return sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v)
        finally:
            _cuda.ops = real

    rows = {"op quant_qkv alone": quant, "op attn alone": attn}
    if hasattr(op, "quant_attn"):  # both in one op, as the functions now call them
        rows["op quant_attn alone"] = lambda: op.quant_attn(q, k, v, scale, 8, 4, True, False, _cuda.FP8_MAX, 1, False,
                                                            _cuda.ACCUM["fp32+fp32"], False, False)
    rows["sm90 function, ops stubbed (its Python)"] = python_part
    return rows


SHAPES = [(4, 32, 1024, 128), (4, 32, 1024, 64), (1, 8, 512, 128), (2, 24, 1024, 128), (1, 16, 512, 128)]


def _fp16_rows(q, k, v):
    """The fp16-PV function (the sm80 family's kernels) and its op: as one call
    (quant_attn_fp16) and as the separate calls it replaced (K mean, quant_int8 of Q and of K,
    attn), on the same inputs (HND, non-causal, fp32 accumulation, K smoothed)."""
    try:
        from sageattention import _cuda
        from sageattention._ops import ops

        op = ops("sageattention._qattn_sm80")
    except (ImportError, RuntimeError, AttributeError):
        return {}
    b, h, n, d = q.shape
    dp, scale = _cuda.padded_head_dim(d), d ** -0.5
    npad, kpad = -(-n // _cuda.BLOCK_Q) * _cuda.BLOCK_Q, -(-n // _cuda.BLOCK_K) * _cuda.BLOCK_K

    def separate():
        km = k.mean(dim=2, dtype=torch.float32)
        q8, qs, _ = op.quant_int8(q, None, None, scale * _cuda.LOG2E, _cuda.WARP_Q, 8, npad, dp)
        k8, ks, _ = op.quant_int8(k, km, None, 1.0, _cuda.BLOCK_K, 4, kpad, dp)
        return op.attn(q8, k8, v, qs, ks, None, None, None, 8, 4, n, n, d, False, _cuda.ACCUM["fp32"], False, False,
                       scale, q.dtype)

    rows = {"fp16 function": lambda: sa.sageattn_qk_int8_pv_fp16_cuda(q, k, v, pv_accum_dtype="fp32"),
            "fp16 ops as separate calls (mean, quant_int8 x 2, attn)": separate}
    if hasattr(op, "quant_attn_fp16"):
        rows["op quant_attn_fp16 alone"] = lambda: op.quant_attn_fp16(q, k, v, scale, 8, 4, True, False,
                                                                      _cuda.ACCUM["fp32"], False, False)
    return rows


VARLEN_SETS = {
    "4 x 1024": [1024] * 4,
    "2048 + 20 x 64": [2048] + [64] * 20,
    # many sequences: the host work that grows with their number (grouping, row indices)
    "1000 x 1-512": [1 + (37 * i * i + 11 * i) % 512 for i in range(1000)],
    "4096 + 1000 x 32": [4096] + [32] * 1000,
}


def _varlen_rows(heads=16, d=128):
    """``sageattn_varlen`` (causal and not) on each of VARLEN_SETS, bf16, offsets on the CPU."""
    rows = {}
    for name, lens in VARLEN_SETS.items():
        q, k, v = (torch.randn(sum(lens), heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        for causal in (False, True):
            rows[f"sageattn_varlen {name}{' causal' if causal else ''}"] = (
                lambda q=q, k=k, v=v, cu=cu, m=max(lens), c=causal: sa.sageattn_varlen(q, k, v, cu, cu, m, m,
                                                                                         is_causal=c))
    return rows


def main() -> None:
    # HOST_SHAPES="4x32x1024x64,1x16x512x128" times only these (B x H x N x D)
    chosen = os.environ.get("HOST_SHAPES")
    shapes = [tuple(int(x) for x in s.split("x")) for s in chosen.split(",")] if chosen else SHAPES
    varlen = os.environ.get("HOST_VARLEN", "1")
    if varlen == "only":
        shapes = []
    for b, h, n, d in shapes:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        calls = {
            "sageattn": lambda: sa.sageattn(q, k, v),
            "sageattn causal": lambda: sa.sageattn(q, k, v, is_causal=True),
            "sageattn return_lse": lambda: sa.sageattn(q, k, v, return_lse=True),
            "sm90 function": lambda: sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v),
            "sm90 function return_lse": lambda: sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, return_lse=True),
            **_op_rows(q, k, v),
            **_fp16_rows(q, k, v),
            **_sdpa_rows(q, k, v),
        }
        for name, fn in calls.items():
            print(f"| {LABEL} | {b}x{h}x{n}x{d} | {name} | {host_us(fn, rounds=5):.1f} | {gpu_us(fn):.1f} |", flush=True)
    if varlen != "0":
        for name, fn in _varlen_rows().items():
            print(f"| {LABEL} | packed, 16 heads, D=128 | {name} | {host_us(fn, rounds=5):.1f} | {gpu_us(fn):.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
