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


def host_us(fn, calls: int = 50, rounds: int = 3, sleep_cycles: int = 400_000_000) -> float:
    """What the CPU spends per call (µs): the GPU is held busy by a sleep kernel while `calls`
    calls are queued, so the wall time per call is the host's; best of `rounds`.

    A round counts only if the sleep was still running when the calls returned: otherwise the
    host may have waited for the GPU (a call that syncs, a large copy from pageable memory, or
    a launch queue filled by many queued launches; 50 calls of ~20 launches each timed 4 ms per
    call that way, bench/results/2026-11-29-NVIDIA_H200-557d942-varlen-many-sequences.md), and
    the round is run again with half as many calls. NaN when even one call outlasts the sleep:
    that call waits for the GPU (or takes ~0.2 s of host time)."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    counted = 0
    while counted < rounds:
        torch.cuda._sleep(sleep_cycles)  # ~0.2 s of GPU work queued ahead of the calls
        slept = torch.cuda.Event()
        slept.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call = (time.perf_counter() - t0) / calls * 1e6
        waited = slept.query()  # the sleep is over: the GPU caught up with the host
        torch.cuda.synchronize()
        if waited:
            if calls == 1:
                return float("nan")
            calls //= 2
            continue
        best = min(best, per_call)
        counted += 1
    return best
