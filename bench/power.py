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

``PowerMeter.trace`` runs a call back to back in batches and gives power, clock and GPU
temperature per batch, for watching work per joule as the board warms (bench/power_trace.py).
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
    """Statistics of (SM MHz, reason bits[, GPU °C]) samples: mean, min, max MHz, the share of
    samples in which the clock was held down by the power cap, by heat, or by a hardware
    slowdown, and, where the samples carry it, the mean, min and max GPU temperature."""
    if not samples:
        raise ValueError("no clock samples")
    mhz = [s[0] for s in samples]
    share = lambda bits: sum(1 for s in samples if s[1] & bits) / len(samples)  # noqa: E731
    out = dict(mhz_mean=sum(mhz) / len(mhz), mhz_min=min(mhz), mhz_max=max(mhz), power_cap_share=share(POWER_CAP),
               thermal_share=share(THERMAL), hw_slowdown_share=share(HW_SLOWDOWN), clock_samples=len(samples))
    temps = [s[2] for s in samples if len(s) > 2 and s[2] is not None]
    if temps:
        out.update(temp_c_mean=sum(temps) / len(temps), temp_c_min=min(temps), temp_c_max=max(temps))
    return out


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
        self._has_temp = True

    def _energy_j(self) -> float:
        return self.nv.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1e3  # NVML: mJ since driver load

    def _sample(self):
        nv = self.nv
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_SM), reasons(self.handle), self.temp_c()

    def temp_c(self):
        """The GPU die's temperature (°C), or None where the board does not report it."""
        if self._has_temp:
            try:
                return self.nv.nvmlDeviceGetTemperature(self.handle, self.nv.NVML_TEMPERATURE_GPU)
            except Exception:  # NVMLError_NotSupported and kin: stop asking
                self._has_temp = False
        return None

    def measure(self, fn, calls: int, sync, clock=time.perf_counter) -> dict:
        """Run `fn` `calls` times back to back; `sync` waits for the GPU (torch.cuda.synchronize).
        The run spans the last sync before the first call to the sync after the last."""
        if calls < 1:
            raise ValueError(f"calls must be >= 1, got {calls}")
        sync()
        e0, t0 = self._energy_j(), clock()
        with _Poller(self, clock) as poll:
            for _ in range(calls):
                fn()
            sync()
            t1 = clock()
        e1 = self._energy_j()
        seconds = t1 - t0
        if seconds <= 0:
            raise ValueError("the measured span is empty")
        watts = step_watts(poll.steps.steps, t0, t1)
        source = "steps"
        if watts is None:  # a run too short for two steps: the two reads around it
            watts, source = (e1 - e0) / seconds, "ends"
        joules = watts * seconds
        return dict(calls=calls, seconds=seconds, joules=joules, watts=watts, j_per_call=joules / calls,
                    watts_from=source, **summarize([s[1:] for s in poll.samples] or [self._sample()]))

    def trace(self, fn, calls: int, batches: int, sync, clock=time.perf_counter) -> list[dict]:
        """Run `fn` in `batches` batches of `calls` back-to-back calls, with a sync after each
        batch, under one poll of the counter. Per batch: its start (s after the first batch's),
        length, calls, board power from the counter's steps inside it (None when fewer than two
        fall there: make a batch several steps long) and the clock and temperature statistics."""
        if calls < 1 or batches < 1:
            raise ValueError(f"calls and batches must be >= 1, got {calls} and {batches}")
        sync()
        with _Poller(self, clock) as poll:
            bounds = [clock()]
            for _ in range(batches):
                for _ in range(calls):
                    fn()
                sync()
                bounds.append(clock())
        rows = []
        for a, b in zip(bounds, bounds[1:]):
            inside = [s[1:] for s in poll.samples if a <= s[0] < b]
            rows.append(dict(t_s=a - bounds[0], seconds=b - a, calls=calls, watts=step_watts(poll.steps.steps, a, b),
                             **summarize(inside or [self._sample()])))
        return rows


class _Poller:
    """A thread that, while the `with` block runs, polls the meter's energy counter as often as
    NVML answers (into `steps`) and takes a (time, SM MHz, reasons, °C) sample every interval_s."""

    def __init__(self, meter: PowerMeter, clock):
        self.meter, self.clock = meter, clock
        self.steps, self.samples, self._stop = CounterSteps(), [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        next_sample = 0.0
        while not self._stop.is_set():
            ta = self.clock()
            e = self.meter._energy_j()
            self.steps.poll(ta, self.clock(), e)
            if ta >= next_sample:
                self.samples.append((ta, *self.meter._sample()))
                next_sample = ta + self.meter.interval_s
            time.sleep(5e-4)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False


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
