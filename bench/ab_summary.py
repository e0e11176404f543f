"""The table of an end to end A/B (bench/e2e_ab.sh): for each shape and backend, the median
over the rounds of each variant's bench.py median, the rounds' TOPS, and new's speed over old's.

    python bench/ab_summary.py <folder holding old-r1-s0/, new-r1-s0/, ...>

A backend that both variants run unchanged (SDPA's) shows how much the board moved between
the processes: its ratio should be ~1.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

RUN = re.compile(r"^(old|new)-r(\d+)-s(\d+)$")


def collect(folder: Path) -> dict:
    """{(d, causal, n, backend): {"old": [(round, ms, tops)], "new": [...]}} from the runs' JSONs."""
    table: dict = defaultdict(lambda: {"old": [], "new": []})
    for run in sorted(p for p in folder.iterdir() if p.is_dir() and RUN.match(p.name)):
        variant, rnd, _ = RUN.match(run.name).groups()
        for js in run.glob("*.json"):
            for row in json.loads(js.read_text())["rows"]:
                key = (row["d"], row["causal"], row["n"], row["backend"])
                table[key][variant].append((int(rnd), row["ms"], row["tops"]))
    return table


def render(table: dict) -> str:
    lines = [
        "| D | causal | N | backend | old ms | new ms | old TOPS (rounds) | new TOPS (rounds) | new ÷ old speed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (d, causal, n, backend), v in sorted(table.items()):
        if not v["old"] or not v["new"]:
            continue
        old_ms = statistics.median(ms for _, ms, _ in v["old"])
        new_ms = statistics.median(ms for _, ms, _ in v["new"])
        tops = {k: ", ".join(f"{t:.0f}" for _, _, t in sorted(v[k])) for k in ("old", "new")}
        lines.append(
            f"| {d} | {'yes' if causal else 'no'} | {n} | {backend} | {old_ms:.4f} | {new_ms:.4f} | "
            f"{tops['old']} | {tops['new']} | {old_ms / new_ms:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    table = collect(Path(argv[0]))
    if not table:
        print(f"no old-rN-sM/ runs with JSON under {argv[0]}", file=sys.stderr)
        return 1
    sys.stdout.write(render(table))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
