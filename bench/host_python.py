"""The Python part of a ``sageattn`` call handed to SDPA, timed without a GPU.

    python bench/host_python.py [ROOT] [LABEL]    ROOT: the directory holding sageattention/
                                                  (default: this checkout)

A call that ``sageattn`` hands to cuDNN costs its checks, the hand-over's decision and the SDPA
call's preparation on the host, then SDPA's own host path; on short calls that sum can exceed
cuDNN's GPU time (bench/results/2026-11-29-NVIDIA_H200-a1b6316-session.md: D=64 causal 1k, 61 µs
of GPU, 60-95 µs of host). This times the first three on CPU tensors: the device check is
skipped, ``dispatch``'s cache holds the H200's choice (``cuda_sm90`` and its hand-over limits), and
``torch.nn.functional.scaled_dot_product_attention`` is replaced by a function that returns a
preallocated tensor. So the numbers are this package's Python, not SDPA's, and not a GPU
machine's CPU: compare versions in one run on one machine (``bench/host_overhead.py`` measures
the whole call on a GPU). Prints Markdown rows: label, step, µs per call (best of 25 rounds).
"""

import sys
import timeit
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent).resolve()
LABEL = sys.argv[2] if len(sys.argv) > 2 else "this checkout"
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import sageattention as sa  # noqa: E402
from sageattention import _checks, _sdpa, core, dispatch  # noqa: E402

if not Path(sa.__file__).resolve().is_relative_to(ROOT):
    sys.exit(f"imported {sa.__file__}, not the package under {ROOT}")

SHAPE = (4, 32, 1024, 64)  # the hand-over cell that went host-bound (D=64 causal 1k)


def _stub(out):
    """No device check, the H200's choice for the CPU device (in dispatch's cache, so that
    ``dispatch.chosen`` runs as on a GPU), SDPA returning ``out``."""
    _checks.check_device = lambda *a, **kw: None
    dispatch._cache[("device", "cpu", None)] = dispatch.Choice("cuda_sm90", {}, dispatch.H200_SM90)
    torch.nn.functional.scaled_dot_product_attention = lambda q, k, v, **kw: out
    return tuple(dispatch.H200_SM90)


def _us(fn, number=5000, rounds=25) -> float:
    return min(timeit.repeat(fn, number=number, repeat=rounds)) / number * 1e6


def main() -> None:
    q, k, v = (torch.empty(SHAPE, dtype=torch.bfloat16) for _ in range(3))
    limits = _stub(torch.empty(SHAPE, dtype=torch.bfloat16))
    dims = _checks.check_qkv("sageattn", q, k, v, "HND")
    if not dispatch.goes_to_sdpa(limits, dims, True, False):
        sys.exit(f"{SHAPE} causal is not handed over by the H200's limits: nothing to time")
    steps = {
        "sageattn causal": lambda: sa.sageattn(q, k, v, is_causal=True),
        "checks (core._common)": lambda: core._common("sageattn", q, k, v, "HND", True, None, False, {}),
        "choice (dispatch.chosen)": lambda: dispatch.chosen(q.device),
        "decision (dispatch.goes_to_sdpa)": lambda: dispatch.goes_to_sdpa(limits, dims, True, False),
        "hand-over (core._run_sdpa)": lambda: core._run_sdpa(q, k, v, "HND", dims, True, 0.125, False),
        "  of which _sdpa.cudnn_ready x 3": lambda: [_sdpa.cudnn_ready(t) for t in (q, k, v)],
        "  of which _sdpa._cudnn_first": lambda: _sdpa._cudnn_first(lambda: None),
    }
    _us(steps["sageattn causal"], number=20000, rounds=1)  # warm up (the first round in a process runs slow)
    for name, fn in steps.items():
        print(f"| {LABEL} | {name} | {_us(fn):.2f} |", flush=True)


if __name__ == "__main__":
    main()
