"""GPU and host time of one call, shared by the short-call profilers (prof_short.py,
host_overhead.py). Imports torch and triton only, never sageattention, so a caller can choose
which sageattention it imports."""

import statistics
import time

import torch


def gpu_us(fn) -> float:
    """do_bench median of three (µs). A host-bound call measures its host time here."""
    from triton.testing import do_bench

    fn()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(do_bench(fn, warmup=25, rep=100, return_mode="median") for _ in range(3))


def host_us(fn, calls: int = 50, rounds: int = 3) -> float:
    """What the CPU spends per call (µs): the GPU is held busy by a sleep kernel while `calls`
    calls are queued, so the wall time per call is the host's; best of `rounds`."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda._sleep(400_000_000)  # ~0.2 s of GPU work queued ahead of the calls
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return best
