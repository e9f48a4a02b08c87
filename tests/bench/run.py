"""``make bench``: every benchmark's figures in one table, also saved to .bench/results.json.

Each benchmark module has ``run() -> list[dict]`` with the keys case, p50_ms, p99_ms,
max_ms and runs (optionally aim_p99_ms, and cpu_p50_ms and cpu_p99_ms: the same timings
in the thread's CPU time, which other processes on a shared machine do not inflate).
A module that is not there is skipped.
Figures are reported, never asserted: timings depend on the machine.
"""

from __future__ import annotations

import importlib
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent.parent / ".bench" / "results.json"
MODULES = (
    "bench_scheduling",
    "bench_topology",
    "bench_defrag",
    "bench_dra_preemption",
    "bench_gangs",
    "bench_fragmentation",
)

# With PYTHONSAFEPATH (the Makefile sets it) a script's own folder is not on sys.path.
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))


def collect() -> tuple[list[dict[str, Any]], list[str]]:
    """Rows of every benchmark present, and the names of those skipped."""
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            skipped.append(name)
            continue
        for row in module.run():
            rows.append({"benchmark": name.removeprefix("bench_"), **row})
    return rows, skipped


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table: the case left-aligned, the figures right-aligned."""
    columns = (
        "case",
        "runs",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "cpu_p50_ms",
        "cpu_p99_ms",
        "aim_p99_ms",
    )
    cells = [list(columns), *([_cell(row.get(c)) for c in columns] for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    cells.insert(1, ["-" * w for w in widths])

    def render(line: list[str]) -> str:
        first, *rest = line
        figures = (v.rjust(w) for v, w in zip(rest, widths[1:], strict=True))
        return "  ".join([first.ljust(widths[0]), *figures])

    return "\n".join(render(line) for line in cells)


def main() -> int:
    rows, skipped = collect()
    print(table(rows))
    for name in skipped:
        print(f"(skipped {name}: not present)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "machine": platform.platform(),
        "results": rows,
        "skipped": skipped,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
