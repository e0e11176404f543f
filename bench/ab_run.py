"""What the A/B scripts that flip a kernel switch per measurement share (waves.py: the consumer
count, pairs_ab.py: CTA pairs): setting the switch for one measurement, and writing the run's
table and JSON into bench/results/ under <date>-<gpu>-<commit>-<kind>[-<tag>]."""

from __future__ import annotations

import json
import os
from pathlib import Path


def with_env(var: str, value: str | None, measure):
    """`measure()` with the environment variable `var` set to `value` (None: unset), which the
    ops read per call; `var` is as it was afterwards."""
    old = os.environ.pop(var, None)
    if value is not None:
        os.environ[var] = value
    try:
        return measure()
    finally:
        os.environ.pop(var, None)
        if old is not None:
            os.environ[var] = old


def write_run(out: Path, when, device: str, commit: str, kind: str, tag: str, text: str, rows: list) -> Path:
    """The Markdown `text` and the JSON of `rows` as <stem>.md / <stem>.json in `out`; the stem."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{when:%Y-%m-%d}-{device.replace(' ', '_')}-{commit}-{kind}{'-' + tag if tag else ''}"
    stem.with_suffix(".md").write_text(text)
    stem.with_suffix(".json").write_text(json.dumps({"device": device, "commit": commit, "rows": rows}, indent=1))
    return stem
