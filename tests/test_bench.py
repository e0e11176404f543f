"""bench/bench.py's timing order, bench/power.py's energy arithmetic, the test suite's
``--shard`` option for device calls and bench/route_check.py's costs (no GPU needed)."""

import os
import time
from collections import Counter

import pytest

from helpers import bench_script

bench = bench_script("bench", "bench_script")


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
power = bench_script("power", "bench_power")


class _FakeNvml:
    """NVML's calls that PowerMeter makes, over a board whose energy counter (mJ), SM clock and
    clock-event reasons the test sets."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self):
        self.energy_mj, self.mhz, self.reasons, self.handles = 5_000_000, 1980, 0, []
        self.temp_c = 45  # None: the board reports no temperature (NVML raises)

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

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        if self.temp_c is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return self.temp_c


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
    assert m["temp_c_mean"] == 45 and m["temp_c_min"] == 45 and m["temp_c_max"] == 45


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
    assert "temp_c_mean" not in s, "no temperatures sampled: none reported"
    with pytest.raises(ValueError):
        power.summarize([])


def test_summary_temperatures_skip_samples_without_one():
    s = power.summarize([(1600, 0, 50), (1600, 0, None), (1600, 0, 62), (1600, 0, 56)])
    assert s["temp_c_mean"] == pytest.approx(56.0) and s["temp_c_min"] == 50 and s["temp_c_max"] == 62


def test_a_board_without_temperature_is_asked_once_and_reports_none():
    class Counting(_FakeNvml):
        asked = 0

        def nvmlDeviceGetTemperature(self, h, sensor):
            Counting.asked += 1
            return super().nvmlDeviceGetTemperature(h, sensor)

    nv = Counting()
    nv.temp_c = None
    meter = power.PowerMeter(nvml=nv)
    assert [meter.temp_c() for _ in range(3)] == [None, None, None] and Counting.asked == 1
    m = meter.measure(lambda: None, 2, sync=lambda: None)
    assert "temp_c_mean" not in m and m["mhz_mean"] == 1980


class _WarmingBoard(_SteppedBoard):
    """A stepped board whose temperature rises 10 °C per second of real time."""

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 40 + int(10 * (time.perf_counter() - self.t_start))


def test_trace_gives_power_clock_and_temperature_per_batch():
    board = _WarmingBoard(watts=650.0, step_s=0.05)
    syncs = []
    rows = power.PowerMeter(nvml=board).trace(lambda: time.sleep(0.1), 4, 3, sync=lambda: syncs.append(1))
    assert len(rows) == 3 and len(syncs) == 4, "one sync before the first batch, one after each"
    for i, r in enumerate(rows):
        assert r["calls"] == 4 and r["seconds"] == pytest.approx(0.4, rel=0.3)
        assert r["watts"] == pytest.approx(650.0, rel=0.05), "power from the counter's steps inside the batch"
        assert r["mhz_mean"] == 1500 and r["power_cap_share"] == 1.0
        if i:
            assert r["t_s"] == pytest.approx(sum(x["seconds"] for x in rows[:i]), abs=0.02)
    assert rows[0]["t_s"] == 0.0
    temps = [r["temp_c_mean"] for r in rows]
    assert temps[0] < temps[1] < temps[2] and temps[2] - temps[0] == pytest.approx(8, abs=2.5), "~4 °C per 0.4 s batch"
    with pytest.raises(ValueError, match="got 0 and 3"):
        power.PowerMeter(nvml=board).trace(lambda: None, 0, 3, sync=lambda: None)


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
    p["temp_c_mean"] = 61.6
    assert bench.power_markdown(rows, ["cudnn", "ours"], 2.0).splitlines()[-1] == \
        "| 128 | no | 16384 | n/a | 1.23 (700 W, 1612 MHz, 62 °C; cap 93 %) |"


# ---- bench/power_trace.py's table and fit ----


def _power_trace(monkeypatch):
    import sys

    # power_trace imports bench/ modules by their plain names, as when run as a script
    monkeypatch.setitem(sys.modules, "bench", bench)
    monkeypatch.setitem(sys.modules, "power", power)
    return bench_script("power_trace", "bench_power_trace")


def test_slope_is_least_squares(monkeypatch):
    import random

    mod = _power_trace(monkeypatch)
    rng = random.Random(3)
    xs = [40 + i for i in range(30)]
    ys = [2.0 - 0.01 * x + rng.uniform(-1e-3, 1e-3) for x in xs]
    assert mod.slope(xs, ys) == pytest.approx(-0.01, rel=0.02)
    assert mod.slope([50, 50, 50], [1.0, 1.1, 1.2]) is None and mod.slope([1], [1.0]) is None


def test_trace_table_rows_and_temperature_fit(monkeypatch):
    mod = _power_trace(monkeypatch)
    ops = 1e12  # one tera-operation per call
    base = dict(calls=100, seconds=1.0, mhz_mean=1600, power_cap_share=1.0)
    rows = [dict(base, t_s=float(i), watts=700.0, temp_c_mean=50.0 + 5 * i) for i in range(3)]
    rows[1]["calls"], rows[2]["calls"] = 98, 96  # work per joule falls 2 % per 5 °C
    text = mod.trace_markdown(rows, ops)
    lines = text.splitlines()
    assert lines[2] == "| 0.0 | 50.0 | 1600 | 700 | 100.0 | 0.1429 | 100 % |"
    assert lines[4] == "| 2.0 | 60.0 | 1600 | 700 | 96.0 | 0.1371 | 100 % |"
    # slope 0.4 TOPS / 700 W per °C, against the mean 98 / 700: -4.08 % per 10 °C
    assert "3 batches, 50-60 °C" in text and "-4.08 % per 10 °C" in text
    rows[1]["watts"] = None  # a batch too short for two counter steps: shown, not fitted
    text = mod.trace_markdown(rows, ops)
    assert "| 1.0 | 55.0 | 1600 | n/a | 98.0 | n/a | 100 % |" in text and "2 batches" in text
    same = [dict(r, temp_c_mean=50.0, watts=700.0) for r in rows]
    assert "no fit" in mod.trace_markdown(same, ops)


def test_trace_fit_leaves_out_the_settling_batches(monkeypatch):
    mod = _power_trace(monkeypatch)
    base = dict(calls=100, seconds=1.0, mhz_mean=1600, power_cap_share=1.0)
    # an overshooting first batch (cool, 760 W) and then flat work per joule as the board warms
    rows = [dict(base, t_s=0.0, watts=760.0, temp_c_mean=50.0)]
    rows += [dict(base, t_s=float(i), watts=700.0, temp_c_mean=54.0 + i) for i in range(1, 6)]
    assert "+0.00 % per 10 °C" not in mod.trace_markdown(rows, 1e12), "the overshoot tilts a fit over all batches"
    assert "no fit (fewer than two batches from 9 s on" in mod.trace_markdown(rows, 1e12, settle_s=9.0)
    text = mod.trace_markdown(rows, 1e12, settle_s=1.0)
    assert "5 batches, from 1 s on, 55-59 °C" in text and "+0.00 % per 10 °C" in text
    assert "| 0.0 | 50.0 | 1600 | 760 | 100.0 | 0.1316 | 100 % |" in text, "the settling batch is still shown"


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_sdpa_call_reads_the_layout_and_repeats_kv_heads(layout, kv_heads):
    import torch

    torch.manual_seed(0)
    q, k, v = (t.float() for t in bench.inputs(2, 4, kv_heads, 8, 16, layout, device="cpu"))
    assert q.shape == ((2, 8, 4, 16) if layout == "NHD" else (2, 4, 8, 16))
    assert k.shape[1 if layout == "HND" else 2] == kv_heads
    out = bench.sdpa_call(q, k, v, True, layout)
    # by hand: HND, every K/V head serving 4 // kv_heads query heads in a row, causal softmax
    if layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k, v = (t.repeat_interleave(4 // kv_heads, dim=1) for t in (k, v))
    s = q @ k.transpose(-1, -2) / 16 ** 0.5
    s = s.masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf"))
    assert out.shape == (2, 4, 8, 16)
    assert torch.allclose(out, s.softmax(-1) @ v, atol=1e-5)


def test_our_backends_get_the_layout(monkeypatch):
    seen = {}

    def fake(name):
        return lambda q, k, v, **kw: seen.setdefault(name, kw)

    monkeypatch.setattr(bench.sa, "sageattn", fake("sageattn"))
    monkeypatch.setattr(bench.sa, "sageattn_qk_int8_pv_fp8_cuda_sm90", fake("sm90"))
    monkeypatch.setattr(bench.sa, "available_backends", lambda: ["cuda_sm90"])
    table = bench.backends(["sageattn", "cuda_sm90", "cuda_sm90_v2"], "NHD")
    assert sorted(table) == ["cuda_sm90", "cuda_sm90_v2", "sageattn"]
    table["sageattn"](None, None, None, True)
    table["cuda_sm90"](None, None, None, False)
    assert seen["sageattn"] == {"is_causal": True, "tensor_layout": "NHD"}
    assert seen["sm90"] == {"is_causal": False, "tensor_layout": "NHD"}


def test_shapes_in_words():
    assert bench.shapes([{"h": 32}]) == "bf16, B=4, H=32 (B=1 at 32k)"  # a run recorded before the flags
    assert bench.shapes([{"h": 32, "hkv": 32, "layout": "HND"}]) == "bf16, B=4, H=32 (B=1 at 32k)"
    assert bench.shapes([{"h": 32, "hkv": 8, "layout": "NHD"}]) == "bf16, NHD, B=4, H=32, 8 K/V heads (B=1 at 32k)"


def test_recorded_commands_name_the_kernel_switches(monkeypatch):
    """A run made with a kernel switch set (an A/B side) records it in front of its command;
    SAGEATTN_COMMIT only names the run and is left out."""
    for k in [k for k in os.environ if k.startswith("SAGEATTN_")]:
        monkeypatch.delenv(k)
    assert bench.switches() == ""
    monkeypatch.setenv("SAGEATTN_COMMIT", "abc1234")
    monkeypatch.setenv("SAGEATTN_SM90_NARROW", "0")
    monkeypatch.setenv("SAGEATTN_NO_PDL", "1")
    monkeypatch.setenv("OTHER_SETTING", "x")
    assert bench.switches() == "SAGEATTN_NO_PDL=1 SAGEATTN_SM90_NARROW=0 "


def test_shards_split_the_suite_into_disjoint_parts_that_cover_it():
    """``--shard I/N`` (tests/conftest.py) keeps every N-th collected test from the I-th; the N
    parts are disjoint and together the whole collection; the rest is reported deselected; a bad
    spec is a usage error."""
    import conftest

    class Config:
        def __init__(self, spec):
            self.spec, self.dropped = spec, []
            self.hook = self

        def getoption(self, name):
            assert name == "--shard"
            return self.spec

        def pytest_deselected(self, items):
            self.dropped += items

    names = [f"t{j}" for j in range(11)]
    parts = []
    for i in range(3):
        items, config = list(names), Config(f"{i}/3")
        conftest._shard(config, items)
        assert sorted(items + config.dropped) == sorted(names)
        parts.append(items)
    assert sorted(sum(parts, [])) == sorted(names) and [len(p) for p in parts] == [4, 4, 3]
    items = list(names)
    conftest._shard(Config(None), items)
    assert items == names
    for bad in ("3/3", "1", "a/b", "-1/2", "0/0"):
        with pytest.raises(pytest.UsageError, match="--shard must be I/N"):
            conftest._shard(Config(bad), list(names))


def test_a_bad_shard_is_a_usage_error_before_any_worker_starts():
    """Under xdist a ``--shard`` past the last part was reported as a worker crash (INTERNALERROR,
    "no tests ran", exit status 3); it is checked in pytest_configure, so the run stops with the
    option's message and pytest's usage-error status (4), with or without workers (.ci/run installs
    pytest-xdist, so CI takes the path through workers, which failed before)."""
    import importlib.util
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    workers = ["-n", "2"] if importlib.util.find_spec("xdist") else []
    # (not --collect-only: xdist collects in the controller then, where the old check worked too)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, "--shard", "4/4",
           "-k", "shards_split", os.path.join(here, "test_bench.py")]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=os.path.dirname(here), timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 4, out[-2000:]
    assert "--shard must be I/N with 0 <= I < N, got '4/4'" in out and "INTERNALERROR" not in out, out[-2000:]


route_check = bench_script("route_check", "route_check")


def _crossover_run(tmp_path, monkeypatch, rows, device="NVIDIA H100 80GB HBM3"):
    """A crossover.py JSON in a stand-in results folder: rows of (b, h, n, d, causal, lse, kernel,
    cudnn, flash) µs."""
    import json

    recs = [{"b": b, "h": h, "hkv": h, "nq": n, "nk": n, "d": d, "causal": c, "lse": lse,
             "us": {"kernel": k, "sdpa_cudnn": cu, "sdpa_flash": fl}} for b, h, n, d, c, lse, k, cu, fl in rows]
    (tmp_path / "run-crossover-x.json").write_text(json.dumps({"device": device, "date": "", "commit": "", "rows": recs}))
    monkeypatch.setattr(route_check, "RESULTS", tmp_path)


def test_route_check_costs_each_call_on_its_route(tmp_path, monkeypatch, capsys):
    # 4 x 32 x 1024^2 is short on the H100 (L < 2048): SDPA's faster backend (flash here, 90 µs)
    # against the kernel's 60 is a cost of 1.5; 4 x 32 x 4096^2 runs the kernel, 100 against
    # cuDNN's 103: the faster side, cost 1; with the LSE only cuDNN counts (the kernel is kept)
    _crossover_run(tmp_path, monkeypatch, [(4, 32, 1024, 128, False, False, 60.0, 95.0, 90.0),
                                           (4, 32, 4096, 128, False, False, 100.0, 103.0, 300.0),
                                           (4, 32, 4096, 128, False, True, 100.0, 97.0, 50.0)])
    route_check.main(["run-crossover-*", "--list"])
    out = capsys.readouterr().out
    assert "x 1024 x 1024 D=128 causal=0 -> SDPA, kernel / SDPA 0.667, cost 1.500" in out
    assert "all: 3 calls, 1 more than 6 % off, worst 1.500, mean excess 17.70 %" in out
    # --set replaces limits (a value may be an expression); --only keeps some rows. The length
    # alone does not keep the 1024 call: 2^27 pairs is under the pair limit too
    route_check.main(["run-crossover-x", "--set", "length=1024", "--only", "not lse"])
    assert "all: 2 calls, 1 more than 6 % off, worst 1.500, mean excess 25.00 %" in capsys.readouterr().out
    route_check.main(["run-crossover-x", "--set", "length=1024", "pairs=2**27", "--only", "not lse"])
    assert "all: 2 calls, 0 more than 6 % off, worst 1.000, mean excess 0.00 %" in capsys.readouterr().out


def test_route_check_by_length_marks_cudnn_tile_lengths(tmp_path, monkeypatch, capsys):
    # kernel / SDPA per key length, whatever the route: 1024 (a multiple of 128) twice, 0.5 and
    # 1.0 (median of two: the upper), 1088 (not a multiple) once; --only applies
    _crossover_run(tmp_path, monkeypatch, [(4, 32, 1024, 128, False, False, 45.0, 95.0, 90.0),
                                           (1, 16, 1024, 128, False, False, 20.0, 25.0, 20.0),
                                           (4, 32, 1088, 128, False, False, 80.0, 100.0, 110.0),
                                           (4, 32, 1088, 128, False, True, 80.0, 40.0, 110.0)])
    route_check.main(["run-crossover-x", "--by-length", "--only", "not lse"])
    out = capsys.readouterr().out
    # (the LSE row at 1088, 80 against cuDNN's 40, left out: one call there)
    assert "    1024*    2  0.50  1.00  1.00" in out and "    1088     1  0.80  0.80  0.80" in out


def test_route_check_refuses_an_unknown_limit_and_a_missing_run(tmp_path, monkeypatch):
    _crossover_run(tmp_path, monkeypatch, [(4, 32, 1024, 128, False, False, 60.0, 95.0, 90.0)])
    with pytest.raises(SystemExit, match="FIELD one of head_dim_above"):
        route_check.main(["run-crossover-x", "--set", "lenght=1024"])
    with pytest.raises(SystemExit, match="no run matches"):
        route_check.main(["nothing-*"])
    _crossover_run(tmp_path, monkeypatch, [(4, 32, 1024, 128, False, False, 60.0, 95.0, 90.0)], device="Tesla T4")
    with pytest.raises(SystemExit, match="no sm90 hand-over row"):
        route_check.main(["run-crossover-x"])


def test_pairs_ab_shapes_and_tiles():
    """bench/pairs_ab.py: BxHxN[/G] shapes, and its default shapes' 192-row tile counts per head
    (odd ones are the point of the A/B; 16384 is the even control)."""
    pairs_ab = bench_script("pairs_ab", "bench_pairs_ab")
    assert pairs_ab.parse("4x32x8192/8") == (4, 32, 8192, 8)
    assert pairs_ab.parse("1x40x8192") == (1, 40, 8192, 40)
    counts = {s: pairs_ab.tiles_per_head(pairs_ab.parse(s)[2]) for s in pairs_ab.SHAPES}
    assert counts["4x32x2048"] == 11 and counts["4x32x8192"] == 43 and counts["1x32x32768"] == 171
    assert counts["4x32x5000"] == 27 and counts["4x32x16384"] == 86
    assert pairs_ab.tiles_per_head(8200) == 43 and pairs_ab.tiles_per_head(150) == 1  # not over the padding


def test_pairs_ab_sets_the_switch_only_for_the_measurement(monkeypatch):
    """pairs_ab.under: SAGEATTN_SM90_CLUSTER as the setting has it while the measurement runs
    (the op reads it per call), and as it was afterwards."""
    pairs_ab = bench_script("pairs_ab", "bench_pairs_ab")
    monkeypatch.delenv("SAGEATTN_SM90_CLUSTER", raising=False)
    seen = lambda: os.environ.get("SAGEATTN_SM90_CLUSTER")  # noqa: E731
    assert pairs_ab.under("off", seen) == "0" and pairs_ab.under("shipped", seen) is None
    assert seen() is None
    monkeypatch.setenv("SAGEATTN_SM90_CLUSTER", "1")
    assert pairs_ab.under("off", seen) == "0" and seen() == "1"


def test_pairs_ab_switch_takes_another_variable(monkeypatch):
    """pairs_ab --switch VAR=VALUE: "off" then sets that variable (SAGEATTN_SM90_TAIL=0 for the D=64
    tail A/B) and leaves SAGEATTN_SM90_CLUSTER alone; a malformed switch is refused."""
    pairs_ab = bench_script("pairs_ab", "bench_pairs_ab_switch")
    monkeypatch.delenv("SAGEATTN_SM90_TAIL", raising=False)
    monkeypatch.setenv("SAGEATTN_SM90_CLUSTER", "1")
    pairs_ab.use_switch("SAGEATTN_SM90_TAIL=0")
    seen = lambda: (os.environ.get("SAGEATTN_SM90_TAIL"), os.environ.get("SAGEATTN_SM90_CLUSTER"))  # noqa: E731
    assert pairs_ab.under("off", seen) == ("0", "1") and pairs_ab.under("shipped", seen) == (None, "1")
    for bad in ("SAGEATTN_SM90_TAIL", "SAGEATTN_SM90_TAIL=", "PATH=/tmp"):
        with pytest.raises(SystemExit, match="--switch"):
            pairs_ab.use_switch(bad)


def test_ab_runs_are_written_under_date_gpu_commit_kind_tag(tmp_path):
    """bench/ab_run.write_run (waves.py, pairs_ab.py): <date>-<gpu>-<commit>-<kind>[-<tag>] .md
    holding the table and .json holding the rows with device and commit."""
    import datetime
    import json
    ab_run = bench_script("ab_run", "bench_ab_run")
    when = datetime.datetime(2026, 11, 28, 9, 0)
    stem = ab_run.write_run(tmp_path / "r", when, "NVIDIA H200", "abc1234", "pairs", "power", "| t |\n", [{"n": 1}])
    assert stem.name == "2026-11-28-NVIDIA_H200-abc1234-pairs-power"
    assert stem.with_suffix(".md").read_text() == "| t |\n"
    assert json.loads(stem.with_suffix(".json").read_text()) == {"device": "NVIDIA H200", "commit": "abc1234",
                                                                 "rows": [{"n": 1}]}
    assert ab_run.write_run(tmp_path, when, "X", "c", "waves", "", "", []).name == "2026-11-28-X-c-waves"


def test_ab_summary_takes_the_median_over_rounds_per_variant(tmp_path):
    """bench/ab_summary.py (bench/e2e_ab.sh's table): each variant's median over its rounds,
    the rounds' TOPS in round order, new's speed as old ms over new ms; a shape only one
    variant ran is left out, and a folder without runs is an error."""
    import json
    ab = bench_script("ab_summary", "bench_ab_summary")

    def run(name, rows):
        d = tmp_path / name
        d.mkdir()
        (d / "x.json").write_text(json.dumps({"meta": {}, "rows": [
            {"d": 128, "causal": c, "n": n, "backend": b, "ms": ms, "tops": 1000 / ms} for c, n, b, ms in rows]}))

    run("old-r1-s0", [(False, 4096, "cuda_sm90", 2.0), (False, 4096, "sdpa_cudnn", 3.0), (True, 16384, "cuda_sm90", 9.0)])
    run("new-r1-s0", [(False, 4096, "cuda_sm90", 1.0), (False, 4096, "sdpa_cudnn", 3.0)])
    run("new-r2-s0", [(False, 4096, "cuda_sm90", 1.5), (False, 4096, "sdpa_cudnn", 3.3)])
    run("old-r2-s0", [(False, 4096, "cuda_sm90", 2.2), (False, 4096, "sdpa_cudnn", 3.3)])
    (tmp_path / "notes").mkdir()  # not a run: ignored
    text = ab.render(ab.collect(tmp_path))
    rows = [line for line in text.splitlines() if line.startswith("| 128")]
    assert rows == [
        "| 128 | no | 4096 | cuda_sm90 | 2.1000 | 1.2500 | 500, 455 | 1000, 667 | 1.680 |",
        "| 128 | no | 4096 | sdpa_cudnn | 3.1500 | 3.1500 | 333, 303 | 333, 303 | 1.000 |",
    ]
    assert ab.main([str(tmp_path / "notes")]) == 1


def test_loop_spill_counts_the_innermost_loop_that_issues_wgmma():
    """bench/loop_spill.py: of the backward branches, the smallest body holding a wgmma is the
    key loop; its local loads and stores are counted (predicated ones too), the outer loop's not."""
    ls = bench_script("loop_spill", "bench_loop_spill")
    sass = """
        Function : _ZN4sage16attn_sm90_kernelILi128ELi3E13__nv_bfloat16Li2ELi1ELb0ELi128EEEvNS_8Sm90ArgsEi
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1], R2 ;
        /*0020*/                   IGMMA.64x128x32.S8.S8 R24, gdesc[UR4], RZ ;
        /*0030*/               @P0 LDL R3, [R1] ;
        /*0040*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R88, R4, gdesc[UR8], R88 ;
        /*0050*/                   STL [R1+0x4], R5 ;
        /*0060*/              @!P1 BRA 0x20 ;
        /*0070*/                   LDL R6, [R1+0x8] ;
        /*0080*/                   BRA 0x10 ;
        /*0090*/                   BRA 0x90 ;
        Function : other
        /*0000*/                   LDL R1, [R2] ;
        /*0010*/                   BRA 0x0 ;
    """
    funcs = ls.functions(sass)
    name = next(iter(funcs))
    assert ls.key_loop(funcs[name]) == (5, 1, 1)  # 0x20..0x60: IGMMA, LDL, QGMMA, STL, BRA
    assert ls.key_loop(funcs["other"]) is None  # a loop without wgmma is not the key loop
    assert ls.demangled_args(name) == "<128,3,bf16,2,1,0,128>"


class _FakeCuda:
    """Stands in for torch.cuda in bench/timing.py: the sleep "ends" (its event reports done)
    once more than `queue` calls were made after it, as when a filled launch queue or a syncing
    call makes the host wait for the GPU."""

    def __init__(self, queue):
        self.queue, self.since_sleep, self.rounds = queue, 0, []

    def _sleep(self, cycles):
        self.since_sleep = 0

    def synchronize(self):
        pass

    def call(self):
        self.since_sleep += 1

    def Event(self):  # noqa: N802 (torch's name)
        fake = self

        class _Event:
            def record(self):
                fake.rounds.append(0)

            def query(self):
                fake.rounds[-1] = fake.since_sleep
                return fake.since_sleep > fake.queue

        return _Event()


@pytest.mark.parametrize("queue,want_calls", [(1000, 50), (20, 12), (3, 3)])
def test_host_time_counts_only_rounds_the_gpu_stayed_busy_through(monkeypatch, queue, want_calls):
    """timing.host_us halves the calls of a round in which the sleep ended before the calls
    returned, and keeps only rounds in which it did not: 50, then 25, 12, ... until they fit."""
    timing = bench_script("timing", "timing_script")
    fake = _FakeCuda(queue)
    monkeypatch.setattr(timing.torch, "cuda", fake)
    host = timing.host_us(fake.call, calls=50, rounds=3)
    assert host == host and host > 0  # not NaN
    kept = [n for n in fake.rounds if n <= queue]
    assert kept == [want_calls] * 3 and len(fake.rounds) - 3 == [50, 25, 12, 6, 3].index(want_calls)


def test_host_time_of_a_call_that_waits_for_the_gpu_is_nan(monkeypatch):
    timing = bench_script("timing", "timing_script")
    fake = _FakeCuda(0)  # every call outlasts the sleep
    monkeypatch.setattr(timing.torch, "cuda", fake)
    host = timing.host_us(fake.call, calls=50, rounds=3)
    assert host != host
    assert fake.rounds == [50, 25, 12, 6, 3, 1]
