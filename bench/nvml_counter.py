"""Instrument check for bench.py --power: how often NVML's total-energy counter moves while the
GPU is busy, and the power it gives against NVML's (averaged) power reading. Needs a GPU and
nvidia-ml-py.

    python bench/nvml_counter.py
"""

import time

import pynvml as nv
import torch

nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(10):
    a @ a
torch.cuda.synchronize()
for _ in range(600):  # ~0.8 s of matmuls queued
    a @ a
polls = []
t0 = time.perf_counter()
while time.perf_counter() - t0 < 0.5:
    polls.append((time.perf_counter() - t0, nv.nvmlDeviceGetTotalEnergyConsumption(h), nv.nvmlDeviceGetPowerUsage(h)))
torch.cuda.synchronize()
changes = [polls[0]] + [b for a_, b in zip(polls, polls[1:]) if b[1] != a_[1]]
gaps = sorted(1e3 * (b[0] - a_[0]) for a_, b in zip(changes, changes[1:]))
print(f"polls {len(polls)}, counter changes {len(changes) - 1} in 0.5 s; ms between changes: "
      f"min {gaps[0]:.1f} median {gaps[len(gaps) // 2]:.1f} max {gaps[-1]:.1f}")
span = changes[-1][0] - changes[1][0]
print(f"power from the counter {(changes[-1][1] - changes[1][1]) / span / 1e3:.0f} W; nvmlDeviceGetPowerUsage "
      f"{polls[0][2] / 1e3:.0f}..{polls[-1][2] / 1e3:.0f} W; limit {nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3:.0f} W")
