"""Energy, board power and SM clock of one GPU over a stretch of work, read from NVML (the
`pynvml` module of nvidia-ml-py): the numbers behind bench.py's ``--power``.

Why: the H100 runs these kernels at its board power cap and lowers the SM clock to stay under
it, so a kernel's TOPS move with the board's state (bench/NOTES.md), and for a power-bound
kernel the energy per call is the figure that says how efficient it is. ``PowerMeter.measure``
runs one call back to back (no cache flush between calls) and reads the board's cumulative
energy counter before and after; a thread samples the SM clock and the clock-event reasons
(power cap, thermal slowdown) meanwhile.
"""

from __future__ import annotations

import threading
import time

# NVML clock-event reason bits (nvmlClocksEventReason*): why the SM clock is below its maximum.
POWER_CAP = 0x4  # SwPowerCap: holding the board at its power limit
THERMAL = 0x20 | 0x40  # SwThermalSlowdown | HwThermalSlowdown
HW_SLOWDOWN = 0x8 | 0x80  # HwSlowdown | HwPowerBrakeSlowdown


class NvmlMissing(RuntimeError):
    pass


def load_nvml():
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlMissing("--power reads the GPU's energy counter through NVML: pip install nvidia-ml-py "
                          "(or the bench extra: pip install -e '.[bench]')") from exc
    return pynvml


def summarize(samples) -> dict:
    """Clock statistics of (SM MHz, reason bits) samples: mean, min, max MHz and the share of
    samples in which the clock was held down by the power cap, by heat, or by a hardware slowdown."""
    if not samples:
        raise ValueError("no clock samples")
    mhz = [s[0] for s in samples]
    share = lambda bits: sum(1 for s in samples if s[1] & bits) / len(samples)  # noqa: E731
    return dict(mhz_mean=sum(mhz) / len(mhz), mhz_min=min(mhz), mhz_max=max(mhz), power_cap_share=share(POWER_CAP),
                thermal_share=share(THERMAL), hw_slowdown_share=share(HW_SLOWDOWN), clock_samples=len(samples))


class PowerMeter:
    """One GPU's NVML handle. `uuid`: the GPU's UUID as torch gives it (with or without the
    "GPU-" prefix NVML uses); without it, NVML's device 0."""

    def __init__(self, uuid: str | None = None, nvml=None, interval_s: float = 0.01):
        self.nv = nvml if nvml is not None else load_nvml()
        self.nv.nvmlInit()
        if uuid:
            uuid = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
            self.handle = self.nv.nvmlDeviceGetHandleByUUID(uuid)
        else:
            self.handle = self.nv.nvmlDeviceGetHandleByIndex(0)
        self.limit_w = self.nv.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1e3  # NVML: mW
        self.interval_s = interval_s

    def _energy_j(self) -> float:
        return self.nv.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3  # NVML: mJ since driver load

    def _sample(self):
        nv = self.nv
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_SM), reasons(self.handle)

    def measure(self, fn, calls: int, sync, clock=time.perf_counter) -> dict:
        """Run `fn` `calls` times back to back; `sync` waits for the GPU (torch.cuda.synchronize).
        Energy and time span from the last sync before the first call to the sync after the last."""
        if calls < 1:
            raise ValueError(f"calls must be >= 1, got {calls}")
        samples, stop = [], threading.Event()

        def sampler():
            while not stop.wait(self.interval_s):
                samples.append(self._sample())

        sync()
        e0, t0 = self._energy_j(), clock()
        samples.append(self._sample())
        thread = threading.Thread(target=sampler, daemon=True)
        thread.start()
        try:
            for _ in range(calls):
                fn()
            sync()
        finally:
            stop.set()
            thread.join()
        samples.append(self._sample())
        e1, t1 = self._energy_j(), clock()
        joules, seconds = e1 - e0, t1 - t0
        if seconds <= 0:
            raise ValueError("the measured span is empty")
        return dict(calls=calls, seconds=seconds, joules=joules, watts=joules / seconds, j_per_call=joules / calls,
                    **summarize(samples))
