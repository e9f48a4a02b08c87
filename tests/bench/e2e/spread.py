"""Repeated runs and how far they spread (issue 38): one figure from one run of two
seconds swings by a quarter from run to run, so every run whose ratio an aim uses is run
``--repeats`` times and reported as the median with its range.

A ratio pairs the runs by their repeat (repeat 1 of the operator against repeat 1 of
kube-scheduler, and so on): each pair was taken in the same cluster at about the same
load, which pairs of medians are not. The ratio reported is the median of the pairs, with
the smallest and the largest pair beside it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from e2e.runs import Result

#: The kinds of run the table lists (``split``: the ceiling pair on separate cores).
THROUGHPUT_KINDS: Final = ("burst", "ceiling", "backlog", "split")
#: A run shorter than this (its median, seconds) is flagged: its figure swings too much.
SHORT_RUN_S: Final = 10.0
#: Spread (max - min over the median) over which a ratio's repeats are not trusted.
TRUSTED_SPREAD: Final = 0.10
#: The ratios the aims of issues 24 and 38 use, as (label, numerator run, denominator run).
AIM_RATIOS: Final = (
    ("whole-GPU burst ÷ kube-scheduler (raised QPS)", "whole", "ks-raised"),
    ("whole-GPU, 1 in 10 unfittable ÷ all fittable (operator)", "whole-unfit", "whole"),
    ("whole-GPU, 1 in 10 unfittable ÷ all fittable (kube-scheduler)", "ks-unfit", "ks-raised"),
    ("fractional, 1 in 10 unfittable ÷ all fittable", "unfit", "fractional"),
    ("fractional beside the backlog ÷ fractional alone", "fractional-beside-backlog", "fractional"),
    ("fractional ÷ whole-GPU (operator)", "fractional", "whole"),
    ("whole-backlog ÷ ceiling", "whole-backlog", "ceiling"),
    ("ceiling-watched ÷ ceiling", "ceiling-watched", "ceiling"),
    ("whole-backlog ÷ ceiling-watched", "whole-backlog", "ceiling-watched"),
    ("whole-backlog-split ÷ ceiling-split", "whole-backlog-split", "ceiling-split"),
)


@dataclass(frozen=True)
class Spread:
    """Figures of repeated runs: their median and range."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def relative(self) -> float:
        """(max - min) ÷ median: 0.1 is a range of ten per cent of the figure."""
        return (self.high - self.low) / self.median if self.median else 0.0

    def text(self, digits: int = 2) -> str:
        if len(self.values) == 1:
            return f"{self.median:.{digits}f} (one run)"
        return (
            f"{self.median:.{digits}f} ({self.low:.{digits}f}-{self.high:.{digits}f}, "
            f"{100 * self.relative:.0f} %, {len(self.values)} runs)"
        )


def of(values: Iterable[float | None]) -> Spread | None:
    real = tuple(v for v in values if v is not None)
    return Spread(real) if real else None


def repeats(results: Sequence[Result], name: str) -> list[Result]:
    """Every run of that name, in the order they ran."""
    return [r for r in results if r.name == name]


def rate(results: Sequence[Result], name: str) -> Spread | None:
    """pods/s of every run of that name (those that placed a pod)."""
    return of(r.pods_per_s for r in repeats(results, name) if r.placed)


def ratio(results: Sequence[Result], ours: str, theirs: str) -> Spread | None:
    """``ours`` ÷ ``theirs`` pods/s, paired by repeat."""
    mine = [r.pods_per_s for r in repeats(results, ours)]
    other = [r.pods_per_s for r in repeats(results, theirs)]
    return of(a / b for a, b in zip(mine, other, strict=False) if a and b)


def table(results: Sequence[Result]) -> list[str]:
    """Markdown: each repeated run's pods/s and seconds, then the aims' ratios."""
    names = list(dict.fromkeys(r.name for r in results))
    lines = [
        "| run | runs | pods | pods/s: median (min-max, spread) | seconds: median | note |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        runs = repeats(results, name)
        speeds = rate(results, name)
        repeated = any(isinstance(r.extra.get("repeat"), int) for r in runs)
        if speeds is None or not repeated or runs[0].kind not in THROUGHPUT_KINDS:
            continue
        seconds = of(r.duration_s for r in runs)
        note = ""
        if seconds is not None and seconds.median < SHORT_RUN_S:
            note = f"short (< {SHORT_RUN_S:.0f} s): raise BENCH_BURST or BENCH_NODES"
        lines.append(
            f"| {name} | {len(runs)} | {runs[0].pods} | {speeds.text(1)} | "
            f"{seconds.median if seconds else 0:.1f} | {note} |"
        )
    lines += ["", "| ratio | median of the paired runs (min-max, spread) | trusted |"]
    lines.append("|---|---|---|")
    for label, ours, theirs in AIM_RATIOS:
        found = ratio(results, ours, theirs)
        if found is None:
            continue
        trusted = "yes" if len(found.values) >= 3 and found.relative < TRUSTED_SPREAD else "no"
        lines.append(f"| {label} | {found.text()} | {trusted} |")
    return lines
