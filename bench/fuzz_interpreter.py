"""The fuzz cases of tests/test_fuzz.py on the CPU, through Triton's interpreter: the `triton`
and `sageattn` calls of each small case and the small packed (`sageattn_varlen`) calls, checked
as the GPU run checks them. For machines without a GPU (CONTRIBUTING.md, "Fuzzing").

    python bench/fuzz_interpreter.py SEED [SEED ...] [--cases 80] [--varlen 40] [--max-work 3e6]

A case runs when B * Hq * Nq * Nk * D (packed: the sum over sequences of Nq * Nk, times Hq * D)
is under --max-work; at 3e6 a seed takes 5-40 s on two cores, at 2e7 25-100 s. Prints each
failure with its case and one line per seed; exits 1 if any call failed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_seed(seed: int, cases: int, varlen: int, max_work: float) -> tuple:
    """(calls, failures) of one seed; test_fuzz reads its seed when imported, so each seed runs
    in a process of its own (main)."""
    import test_fuzz as tf

    device, tf.DEVICE = tf.DEVICE, "cpu"
    try:
        return _run_cases(tf, seed, cases, varlen, max_work)
    finally:
        tf.DEVICE = device


def _run_cases(tf, seed: int, cases: int, varlen: int, max_work: float) -> tuple:
    calls, failed = 0, 0
    for i in range(cases):
        c = tf.make_case(i)
        if c.b * c.hq * c.nq * c.nk * c.d >= max_work:
            continue
        for name in ("triton", "sageattn"):
            calls += 1
            try:
                tf.test_random_call(name, c)
            except Exception as exc:  # an assertion or an error: both are the case's failure
                failed += 1
                print(f"FAIL seed {seed} {name} {c}: {exc!r}"[:600], flush=True)
    for i in range(varlen):
        c = tf.make_varlen_case(i)
        if sum(a * b for a, b in zip(c.lens_q, c.lens_k)) * c.hq * c.d >= max_work:
            continue
        calls += 1
        try:
            tf.test_random_varlen_call(c)
        except Exception as exc:
            failed += 1
            print(f"FAIL seed {seed} varlen {c}: {exc!r}"[:600], flush=True)
    return calls, failed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("seeds", nargs="+", type=int)
    ap.add_argument("--cases", type=int, default=80, help="dense cases drawn per seed")
    ap.add_argument("--varlen", type=int, default=40, help="packed cases drawn per seed")
    ap.add_argument("--max-work", type=float, default=3e6, help="skip cases with more work than this")
    args = ap.parse_args(argv)
    if len(args.seeds) > 1:  # one process per seed
        import subprocess

        opts = ["--cases", str(args.cases), "--varlen", str(args.varlen), "--max-work", str(args.max_work)]
        codes = [subprocess.call([sys.executable, __file__, str(s)] + opts) for s in args.seeds]
        return int(any(codes))
    seed = args.seeds[0]
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["SAGEATTN_FUZZ_SEED"] = str(seed)
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    t0 = time.time()
    calls, failed = run_seed(seed, args.cases, args.varlen, args.max_work)
    print(f"seed {seed}: {calls} calls, {failed} failed, {time.time() - t0:.0f} s", flush=True)
    return int(failed > 0)


if __name__ == "__main__":
    sys.exit(main())
