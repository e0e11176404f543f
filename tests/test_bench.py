"""bench/bench.py's timing order and bench/power.py's energy arithmetic (no GPU needed)."""

import importlib.util
import time
from collections import Counter
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_script", Path(__file__).resolve().parent.parent / "bench" / "bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.parametrize("names,repeats", [(["flash", "cudnn", "ours"], 3), (["flash", "cudnn", "ours"], 6),
                                           (["a", "b"], 4), (["a", "b", "c", "d"], 4)])
def test_rotated_rounds_put_every_backend_in_every_position(names, repeats):
    order = bench.rounds(names, repeats, "rotate")
    assert Counter(order) == {n: repeats for n in names}
    k = len(names)
    per_round = [order[i:i + k] for i in range(0, len(order), k)]
    assert all(sorted(r) == sorted(names) for r in per_round), "each round times every backend once"
    # across the rounds every backend takes every position equally often: none is always timed
    # last, right after the others (the power-capped GPU is hottest then)
    for pos in range(k):
        assert Counter(r[pos] for r in per_round) == {n: repeats // k for n in names}


def test_fixed_order_times_each_backend_back_to_back():
    assert bench.rounds(["a", "b", "c"], 2, "fixed") == ["a", "a", "b", "b", "c", "c"]


def test_one_repeat_is_one_round_in_the_given_order():
    assert bench.rounds(["a", "b", "c"], 1, "rotate") == ["a", "b", "c"]


class _Buffer:
    """Stands in for a CUDA tensor: records what is done to it."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def zero_(self):
        self.log.append(("write", self.name))

    def sum(self, dtype=None):
        self.log.append(("read", self.name))


@pytest.mark.parametrize("mode", ["write", "read"])
def test_read_flush_follows_do_bench_write_and_is_removed_after(monkeypatch, mode):
    import triton.testing
    from triton import runtime

    log = []

    class Driver:  # do_bench's view of the driver: clear_cache(cache) writes the cache buffer
        def clear_cache(self, cache):
            cache.zero_()

    fake = Driver()
    monkeypatch.setattr(type(runtime.driver), "active", property(lambda self: fake))

    def fake_do_bench(fn, **kw):
        runtime.driver.active.clear_cache(_Buffer("cache", log))  # as do_bench does before each call
        fn()
        return 1.0

    monkeypatch.setattr(triton.testing, "do_bench", fake_do_bench)
    monkeypatch.setattr(bench, "_read_flush", _Buffer("other", log) if mode == "read" else None)
    assert bench.time_ms(lambda: log.append(("call", None))) == 1.0
    want = [("write", "cache")] + ([("read", "other")] if mode == "read" else []) + [("call", None)]
    assert log == want
    assert "clear_cache" not in vars(fake), "the wrapper must not outlive the timing"


# ---- --power: bench/power.py against a stand-in for NVML (no GPU needed) ----
_pspec = importlib.util.spec_from_file_location("bench_power", Path(__file__).resolve().parent.parent / "bench" / "power.py")
power = importlib.util.module_from_spec(_pspec)
_pspec.loader.exec_module(power)


class _FakeNvml:
    """NVML's calls that PowerMeter makes, over a board whose energy counter (mJ), SM clock and
    clock-event reasons the test sets."""

    NVML_CLOCK_SM = 1

    def __init__(self):
        self.energy_mj, self.mhz, self.reasons, self.handles = 5_000_000, 1980, 0, []

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        self.handles.append(("index", i))
        return "h"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.handles.append(("uuid", uuid))
        return "h"

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self.energy_mj

    def nvmlDeviceGetClockInfo(self, h, which):
        assert which == self.NVML_CLOCK_SM
        return self.mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.reasons


class _SteppedBoard(_FakeNvml):
    """A board drawing `watts` whose energy counter, like the H100's, moves only every `step_s`
    (real time); the SM clock held at 1500 MHz by the power cap."""

    def __init__(self, watts=700.0, step_s=0.1):
        super().__init__()
        self.t_start, self.watts, self.step_s = time.perf_counter(), watts, step_s
        self.mhz, self.reasons = 1500, power.POWER_CAP

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        steps = int((time.perf_counter() - self.t_start) / self.step_s)
        return 5_000_000 + round(1e3 * self.watts * self.step_s * steps)


def test_power_meter_takes_the_board_power_from_the_counter_steps():
    # 100 ms steps of 70 J: two reads at arbitrary times would be up to ±70 J off over the run
    # (±6 % over 1.2 s); the steps' own times give the power to within the poll spacing
    board = _SteppedBoard()
    meter = power.PowerMeter("1234-abcd", nvml=board)
    assert board.handles == [("uuid", "GPU-1234-abcd")] and meter.limit_w == 700.0
    syncs = []
    m = meter.measure(lambda: time.sleep(0.06), 20, sync=lambda: syncs.append(1))
    assert len(syncs) == 2, "one sync before the first call, one after the last"
    assert m["watts_from"] == "steps" and m["watts"] == pytest.approx(700.0, rel=0.03)
    assert m["calls"] == 20 and m["seconds"] == pytest.approx(1.2, rel=0.25)
    assert m["joules"] == pytest.approx(m["watts"] * m["seconds"]) and m["j_per_call"] == pytest.approx(m["joules"] / 20)
    assert m["mhz_mean"] == 1500 and m["power_cap_share"] == 1.0 and m["clock_samples"] >= 10


def test_power_meter_falls_back_to_the_two_reads_on_a_run_shorter_than_two_steps():
    board = _SteppedBoard(step_s=0.5)
    m = power.PowerMeter(nvml=board).measure(lambda: time.sleep(0.01), 1, sync=lambda: None)
    assert m["watts_from"] == "ends" and m["clock_samples"] >= 1


def test_counter_steps_are_placed_between_the_polls_that_saw_the_old_and_the_new_value():
    c = power.CounterSteps()
    for start, end, value in [(0.0, 0.002, 10), (0.004, 0.006, 10), (0.010, 0.012, 17), (0.014, 0.016, 17), (0.020, 0.022, 24)]:
        c.poll(start, end, value)
    assert c.steps == [(pytest.approx(0.008), 17), (pytest.approx(0.018), 24)]


def test_step_watts_uses_the_first_and_last_step_inside_the_run():
    steps = [(0.05 + 0.1 * i, 70.0 * i) for i in range(30)]  # 700 W in 70 J steps
    assert power.step_watts(steps, 0.5, 2.0) == pytest.approx(700.0)
    assert power.step_watts(steps, 0.5, 0.6) is None, "one step inside: no power from steps"
    assert power.step_watts(steps + [(3.0, 5000.0)], 0.0, 2.96) == pytest.approx(700.0), "steps after the run are not used"


def test_power_meter_without_uuid_takes_nvml_device_0_and_refuses_no_calls():
    nv = _FakeNvml()
    meter = power.PowerMeter(nvml=nv)
    assert nv.handles == [("index", 0)]
    with pytest.raises(ValueError, match="calls must be >= 1, got 0"):
        meter.measure(lambda: None, 0, sync=lambda: None)


def test_clock_summary_shares_by_reason_bits():
    s = power.summarize([(1980, 0), (1600, power.POWER_CAP), (1500, power.POWER_CAP | 0x40), (1700, 0x8)])
    assert s["mhz_mean"] == pytest.approx(1695.0) and s["mhz_min"] == 1500 and s["mhz_max"] == 1980
    assert s["power_cap_share"] == 0.5 and s["thermal_share"] == 0.25 and s["hw_slowdown_share"] == 0.25
    with pytest.raises(ValueError):
        power.summarize([])


def test_missing_nvml_names_the_package(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml then raises ImportError
    with pytest.raises(power.NvmlMissing, match="pip install nvidia-ml-py"):
        power.PowerMeter()


@pytest.mark.parametrize("seconds,ms,want", [(2.0, 20.0, 100), (2.0, 0.19, 10527), (0.01, 20.0, 3)])
def test_power_calls_fill_the_requested_time(seconds, ms, want):
    assert power.calls_for(seconds, ms) == want


def test_power_table_cells():
    p = dict(tops_per_w=1.2345, watts=699.6, mhz_mean=1612.4, power_cap_share=0.93)
    rows = [dict(d=128, causal=False, n=16384, backend="ours", power=p),
            dict(d=128, causal=False, n=16384, backend="cudnn", tops=600.0)]
    text = bench.power_markdown(rows, ["cudnn", "ours"], 2.0, 700.0)
    assert "`--power 2`" in text and "board power limit 700 W" in text
    assert text.splitlines()[-1] == "| 128 | no | 16384 | n/a | 1.23 (700 W, 1612 MHz; cap 93 %) |"
    assert bench.power_markdown(rows[1:], ["cudnn"], 2.0) == "", "no --power rows: no table"
