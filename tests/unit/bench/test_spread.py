"""The bench's repeats: medians, ranges and ratios paired by repeat (issue 38)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if _BENCH not in sys.path:
    sys.path.append(_BENCH)

from e2e import memory, report, spread  # noqa: E402  (needs the path above)
from e2e.runs import Result  # noqa: E402


def _run(name: str, pods_per_s: float, repeat: int, seconds: float = 20.0) -> Result:
    result = Result(
        name=name,
        scheduler="s",
        kind="burst",
        what="w",
        pods=100,
        placed=100,
        duration_s=seconds,
        pods_per_s=pods_per_s,
    )
    result.extra["repeat"] = repeat
    return result


def test_a_ratio_pairs_the_runs_by_repeat_and_reports_their_median_and_range() -> None:
    results = [
        _run("ks-raised", 100.0, 0),
        _run("ks-raised", 200.0, 1),
        _run("ks-raised", 100.0, 2),
        _run("whole", 150.0, 0),
        _run("whole", 220.0, 1),
        _run("whole", 160.0, 2),
    ]
    found = spread.ratio(results, "whole", "ks-raised")
    assert found is not None
    # Pairs 1.5, 1.1, 1.6: not the ratio of the medians (160 / 100 = 1.6).
    assert found.values == pytest.approx((1.5, 1.1, 1.6))
    assert found.median == pytest.approx(1.5)
    assert found.relative == pytest.approx(0.5 / 1.5)
    assert found.text() == "1.50 (1.10-1.60, 33 %, 3 runs)"


def test_the_table_flags_short_runs_and_untrusted_ratios() -> None:
    results = [_run("ceiling", 1000.0, r, seconds=2.0) for r in range(3)]
    results += [_run("whole-backlog", v, r) for r, v in enumerate((900.0, 905.0, 910.0))]
    lines = spread.table(results)
    ceiling = next(line for line in lines if line.startswith("| ceiling |"))
    assert "short" in ceiling
    backlog = next(line for line in lines if line.startswith("| whole-backlog |"))
    assert "short" not in backlog
    ratio = next(line for line in lines if line.startswith("| whole-backlog ÷ ceiling |"))
    assert ratio.endswith("| yes |")
    results[1].pods_per_s = 800.0  # the ceiling's second repeat: a spread of 11 %
    ratio = next(
        line for line in spread.table(results) if line.startswith("| whole-backlog ÷ ceiling |")
    )
    assert ratio.endswith("| no |")


def test_the_report_takes_the_median_of_a_repeated_baseline() -> None:
    results = [_run("ks-raised", v, r) for r, v in enumerate((100.0, 300.0, 200.0))]
    results.append(_run("whole", 400.0, 0))
    table = report.throughput_table(report.Cluster(10, 80, {}, 1.0, results))
    row = next(line for line in table.splitlines() if line.startswith("| whole #1 |"))
    assert "| 2.00 |" in row  # 400 ÷ the median 200, not ÷ the first run's 100


def test_memory_slopes_per_thousand_nodes_and_ten_thousand_pods() -> None:
    footprint = memory.Footprint(
        nodes=2000, empty_mib=100.0, with_nodes_mib=160.0, pods=20000, with_pods_mib=200.0
    )
    assert footprint.per_1000_nodes() == pytest.approx(30.0)
    assert footprint.per_10000_pods() == pytest.approx(20.0)
    facts = footprint.facts()
    assert facts["operator RSS per 1,000 nodes"] == "30.0 MiB"
    assert facts["operator RSS per 10,000 bound pods"] == "20.0 MiB"
    assert "operator RSS per 1,000 nodes" not in memory.Footprint(nodes=10).facts()


def test_runs_that_are_not_repeated_are_left_out_of_the_spread_table() -> None:
    once = Result(name="multi", scheduler="s", kind="burst", what="w", pods=10, placed=10)
    once.pods_per_s, once.duration_s = 50.0, 0.2
    lines = spread.table([once, _run("whole", 100.0, 0)])
    assert not any(line.startswith("| multi |") for line in lines)
    assert any(line.startswith("| whole |") for line in lines)
