"""bench/bench.py's timing order (no GPU needed)."""

import importlib.util
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
