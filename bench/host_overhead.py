"""Host time of one call, next to its GPU time, for the sageattention package under a given root
(to compare two versions of the Python code in one process-per-version run on one machine).

    python bench/host_overhead.py [ROOT] [LABEL]     ROOT: the directory holding sageattention/
                                                     (default: this checkout); LABEL: the first column

Host µs/call: the GPU is held busy by a sleep kernel while 50 calls are queued; the wall time per
call is then what the CPU spends (checks, dispatch, the op calls, the launches); best of 5. GPU µs:
do_bench median of three (a call whose host time exceeds its GPU time is host-bound, and do_bench
then measures the host). Prints Markdown rows: label, B x H x N x D, call, host µs, GPU µs.
On an H100 sageattn hands these shapes to SDPA (dispatch.HAND_OVER), so its rows time that route,
beside SDPA called bare and inside sdpa_kernel, the hand-over through sdpa_kernel (_sdpa.py), the
hand-over's own SDPA call (_sdpa.sdpa: what sageattn adds to it is its checks and decision), and
with return_lse the cuDNN operator that gives the LSE (_sdpa.sdpa_lse).
"""

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


def main() -> None:
    for b, h, n, d in [(4, 32, 1024, 128), (4, 32, 1024, 64), (1, 8, 512, 128), (2, 24, 1024, 128), (1, 16, 512, 128)]:
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        calls = {
            "sageattn": lambda: sa.sageattn(q, k, v),
            "sageattn causal": lambda: sa.sageattn(q, k, v, is_causal=True),
            "sageattn return_lse": lambda: sa.sageattn(q, k, v, return_lse=True),
            "sm90 function": lambda: sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v),
            "sm90 function return_lse": lambda: sa.sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, return_lse=True),
            **_sdpa_rows(q, k, v),
        }
        for name, fn in calls.items():
            print(f"| {LABEL} | {b}x{h}x{n}x{d} | {name} | {host_us(fn, rounds=5):.1f} | {gpu_us(fn):.1f} |", flush=True)


if __name__ == "__main__":
    main()
