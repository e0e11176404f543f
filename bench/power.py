"""Energy, board power and SM clock of one GPU over a stretch of work, read from NVML (the
`pynvml` module of nvidia-ml-py): the numbers behind bench.py's ``--power``.

Why: the H100 runs these kernels at its board power cap and lowers the SM clock to stay under
it, so a kernel's TOPS move with the board's state (bench/NOTES.md), and for a power-bound
kernel the energy per call is the figure that says how efficient it is. ``PowerMeter.measure``
runs one call back to back (no cache flush between calls) while a thread polls the board's
cumulative energy counter and samples the SM clock and the clock-event reasons (power cap,
thermal slowdown).

The counter moves in steps: on the H100 about every 100 ms (measured, bench/results/
2026-11-24-NVIDIA_H100_80GB_HBM3-d40d033-power.md), i.e. ~70 J at 700 W, so the difference of
two reads taken at arbitrary times is ±5 % off over 2 s. The board power therefore comes from
the counter's own steps: the energy between the first and the last step seen inside the run,
over the time between them (each step timed to within one poll, a few ms).
"""

from __future__ import annotations

import math
import threading
import time

# NVML clock-event reason bits (nvmlClocksEventReason*): why the SM clock is below its maximum.
POWER_CAP = 0x4  # SwPowerCap: holding the board at its power limit
THERMAL = 0x20 | 0x40  # SwThermalSlowdown | HwThermalSlowdown
HW_SLOWDOWN = 0x8 | 0x80  # HwSlowdown | HwPowerBrakeSlowdown


class NvmlMissing(RuntimeError):
    pass


def calls_for(seconds: float, ms: float) -> int:
    """Calls of `ms` each that fill `seconds` of back-to-back work (at least 3)."""
    return max(3, math.ceil(seconds / (ms * 1e-3)))


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
        The run spans the last sync before the first call to the sync after the last."""
        if calls < 1:
            raise ValueError(f"calls must be >= 1, got {calls}")
        steps, clocks, stop = CounterSteps(), [], threading.Event()

        def poller():  # the energy counter as often as NVML answers; the clock every interval_s
            next_clock = 0.0
            while not stop.is_set():
                ta = clock()
                e = self._energy_j()
                steps.poll(ta, clock(), e)
                if ta >= next_clock:
                    clocks.append(self._sample())
                    next_clock = ta + self.interval_s
                time.sleep(5e-4)

        sync()
        e0, t0 = self._energy_j(), clock()
        thread = threading.Thread(target=poller, daemon=True)
        thread.start()
        try:
            for _ in range(calls):
                fn()
            sync()
        finally:
            t1 = clock()
            stop.set()
            thread.join()
        e1 = self._energy_j()
        seconds = t1 - t0
        if seconds <= 0:
            raise ValueError("the measured span is empty")
        watts = step_watts(steps.steps, t0, t1)
        source = "steps"
        if watts is None:  # a run too short for two steps: the two reads around it
            watts, source = (e1 - e0) / seconds, "ends"
        joules = watts * seconds
        return dict(calls=calls, seconds=seconds, joules=joules, watts=watts, j_per_call=joules / calls,
                    watts_from=source, **summarize(clocks or [self._sample()]))


def meter_for_current_gpu(**kw) -> "PowerMeter":
    """A PowerMeter on torch's current CUDA device (found by its UUID, so CUDA_VISIBLE_DEVICES
    does not matter; NVML's device 0 where torch gives no UUID)."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    return PowerMeter(str(uuid) if uuid else None, **kw)


class CounterSteps:
    """The (time, value) of each change of a polled counter. A change is placed halfway between
    the end of the last poll that saw the old value and the start of the first that saw the new."""

    def __init__(self):
        self.steps, self._end, self._value = [], None, None

    def poll(self, start: float, end: float, value):
        if self._end is not None and value != self._value:
            self.steps.append(((self._end + start) / 2, value))
        self._end, self._value = end, value


def step_watts(steps, t0: float, t1: float):
    """Mean power between the first and the last counter step inside (t0, t1], or None when
    fewer than two steps fall there."""
    inside = [s for s in steps if t0 < s[0] <= t1]
    if len(inside) < 2:
        return None
    (ta, ea), (tb, eb) = inside[0], inside[-1]
    return (eb - ea) / (tb - ta)
