"""The report: facts, a row per check, details, the run's own failures; spliced into
docs/hardware.md between its markers without touching the rest."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from gpu_check.outcome import failed, passed, skipped
from gpu_check.report import BEGIN, END, Report, render_json, render_markdown, splice

RESULTS = [
    passed("inventory", "2 card(s)", ["```yaml", "kind: DeviceInventory", "```"], count=2),
    failed("compare", "memoryMiB: agent 40960 | nvidia-smi 40536"),
    skipped("HAMi-core: memory limit", "simulated backend: no GPU"),
]


def report(cut_short: str | None = None) -> Report:
    return Report(
        started=datetime(2026, 11, 27, 9, 30, tzinfo=UTC),
        facts=[("machine", "node-1: Linux"), ("driver", "580.159.04"), ("CUDA (driver)", "13.0")],
        results=RESULTS,
        budget_s=540,
        spent_s=123.4,
        cut_short=cut_short,
    )


def test_markdown_says_when_what_ran_where_and_each_result() -> None:
    text = render_markdown(report())
    lines = text.splitlines()
    assert lines[0] == "### Run of 2026-11-27 09:30 UTC: 1 passed, 1 failed, 1 skipped"
    assert "| driver | 580.159.04 |" in lines
    assert "| time | 123 s of a 540 s budget |" in lines
    assert "| inventory | pass | 2 card(s) |" in lines
    # A failure stands out, and a pipe in a value cannot break the table.
    assert "| compare | **fail** | memoryMiB: agent 40960 \\| nvidia-smi 40536 |" in lines
    assert "| HAMi-core: memory limit | skip | simulated backend: no GPU |" in lines
    # Details follow, under their check; a check without details has no section.
    assert "#### inventory (pass, 0.0 s)" in lines
    assert lines[lines.index("#### inventory (pass, 0.0 s)") + 2 :][:3] == [
        "```yaml",
        "kind: DeviceInventory",
        "```",
    ]
    assert not any(line.startswith("#### compare") for line in lines)


def test_a_run_cut_short_says_so_and_is_not_ok() -> None:
    cut = report("still running 30 s past the 540 s budget")
    assert "**The run was cut short:** still running 30 s past the 540 s budget" in render_markdown(
        cut
    )
    assert not cut.ok
    assert not report().ok  # a failed check
    assert Report(report().started, [], RESULTS[::2], 1, 1).ok


def test_json_carries_statuses_and_measurements() -> None:
    body = json.loads(render_json(report()))
    assert body["summary"] == "1 passed, 1 failed, 1 skipped"
    assert [c["status"] for c in body["checks"]] == ["pass", "fail", "skip"]
    assert body["checks"][0]["data"] == {"count": 2}
    assert body["facts"]["driver"] == "580.159.04"


def test_splice_replaces_only_the_report_section() -> None:
    document = f"# Hardware\n\nHow to run it.\n\n{BEGIN}\nold run\n{END}\n\n## Afterwards\n"
    once = splice(document, "### new run\n")
    assert once == f"# Hardware\n\nHow to run it.\n\n{BEGIN}\n### new run\n{END}\n\n## Afterwards\n"
    assert splice(once, "### new run\n") == once


def test_splice_appends_the_section_to_a_document_without_markers() -> None:
    assert splice("# Hardware\n", "### run") == f"# Hardware\n\n{BEGIN}\n### run\n{END}\n"
