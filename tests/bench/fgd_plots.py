"""Plots of the FGD replays for docs/benchmarks.md (matplotlib: the bench extra).

``python tests/bench/fgd_plots.py --replay A.json[,B.json] [--churn C.json]``: from the
JSON that ``bench_fgd_replay.py`` and ``bench_fgd_churn.py`` write (``--out``), the GPUs
left unallocated per seed and policy on the default list
(``docs/benchmarks/fgd-replay.png``), and the churn replay's allocation and idle GPUs
while a fitting request waits, over time (``docs/benchmarks/fgd-churn.png``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REPLAY_PNG = ROOT / "docs" / "benchmarks" / "fgd-replay.png"
CHURN_PNG = ROOT / "docs" / "benchmarks" / "fgd-churn.png"


def rows_of(paths: list[Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        rows.extend(json.loads(path.read_text())["rows"])
    return rows


def replay_plot(rows: list[dict[str, Any]], out: Path, mix: str = "default") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in rows if r["list"] == mix and r["unallocated_pct_at_100"] is not None]
    policies = list(dict.fromkeys(r["policy"] for r in mine))
    fig, ax = plt.subplots(figsize=(7, 4))
    for position, policy in enumerate(policies):
        figures = sorted(r["unallocated_pct_at_100"] for r in mine if r["policy"] == policy)
        ax.scatter([position] * len(figures), figures, alpha=0.7)
        ax.hlines(figures[len(figures) // 2], position - 0.3, position + 0.3)
    ax.set_xticks(range(len(policies)), policies)
    ax.set_ylabel("GPUs unallocated at 100 % arrived (%)")
    ax.set_title(f"FGD's replay, {mix} list: one dot per seed, bar at the median")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def churn_plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for row in rows:
        series = row["series"]
        hours = [t / 3600 for t, _a, _b in series]
        top.plot(hours, [a for _t, a, _b in series], label=row["policy"], linewidth=0.8)
        bottom.plot(hours, [b for _t, _a, b in series], label=row["policy"], linewidth=0.8)
    top.set_ylabel("GPUs allocated (%)")
    bottom.set_ylabel("idle while a fitting\nrequest waits (%)")
    bottom.set_xlabel("hours (compressed trace time)")
    top.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replay", default="")
    parser.add_argument("--churn", default="")
    args = parser.parse_args()
    if args.replay:
        replay_plot(rows_of([Path(p) for p in args.replay.split(",")]), REPLAY_PNG)
    if args.churn:
        churn_plot(rows_of([Path(args.churn)]), CHURN_PNG)


if __name__ == "__main__":
    main()
