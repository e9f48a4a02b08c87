"""The defragmentation bench's section of docs/benchmarks.md: written between its
markers, and kept by the end-to-end bench when that rewrites the file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if _BENCH not in sys.path:
    sys.path.append(_BENCH)

import bench_defrag  # noqa: E402  (needs the path above)
from e2e import report  # noqa: E402


def test_the_section_is_appended_once_then_replaced_in_place(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nbefore\n")
    bench_defrag.write_section("## Defragmentation under churn\n\nfirst", docs)
    docs.write_text(docs.read_text() + "\nafter\n")
    bench_defrag.write_section("## Defragmentation under churn\n\nsecond", docs)
    text = docs.read_text()
    assert text.count(bench_defrag.BEGIN) == 1
    assert "first" not in text
    assert text.index("before") < text.index("second") < text.index("after")


def test_the_end_to_end_report_keeps_the_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(report, "plots", lambda clusters, folder: [])  # no matplotlib here
    docs = tmp_path / "benchmarks.md"
    bench_defrag.write_section("## Defragmentation under churn\n\nfigures", docs)
    report.write(docs, [], {})
    text = docs.read_text()
    assert f"{report.DEFRAG_BEGIN}\n## Defragmentation under churn\n\nfigures\n" in text
    assert report.DEFRAG_BEGIN == bench_defrag.BEGIN
    assert report.DEFRAG_END == bench_defrag.END


def test_each_aim_is_said_met_or_not_from_the_figures() -> None:
    figures = bench_defrag.Figures(planner=True, violations=0)
    text = bench_defrag._aims(1 - 64 / 1606, "0.013", figures, 667.0, 2873.0)
    assert text == (
        "Against the aims: requests blocked by fragmentation 96% fewer (met); 0.013 "
        "evictions per admitted pod (met); 0 budget violations (met); planner time per call "
        "667 ms at the median (met) and 2873 ms at the 99th percentile (not met)."
    )
    missed = bench_defrag.Figures(planner=True, violations=2)
    text = bench_defrag._aims(0.4, "0.200", missed, None, None)
    assert text.count("(not met)") == 5
