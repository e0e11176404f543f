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
