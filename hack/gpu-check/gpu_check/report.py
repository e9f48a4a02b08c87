"""The report: what machine, driver and CUDA, then each check with its result and reason.

Markdown for docs/hardware.md (``--update-doc`` replaces the part between its markers, so
the how-to above them stays), and JSON with the measurements for anyone comparing runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from gpu_check.outcome import CheckResult, Status

BEGIN: Final = "<!-- gpu-check:report:begin -->"
END: Final = "<!-- gpu-check:report:end -->"


@dataclass(frozen=True, slots=True)
class Report:
    started: datetime
    #: (what, value): machine, GPUs, driver, CUDA, the backend, HAMi-core's commit...
    facts: Sequence[tuple[str, str]]
    results: Sequence[CheckResult]
    budget_s: float
    spent_s: float
    #: Why the run stopped early (the budget's watchdog), or None.
    cut_short: str | None = None

    def count(self, status: Status) -> int:
        return sum(1 for r in self.results if r.status is status)

    @property
    def ok(self) -> bool:
        return self.count(Status.FAIL) == 0 and self.cut_short is None


def _cell(text: str) -> str:
    """Text for one table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def headline(report: Report) -> str:
    return (
        f"{report.count(Status.PASS)} passed, {report.count(Status.FAIL)} failed, "
        f"{report.count(Status.SKIP)} skipped"
    )


def render_markdown(report: Report) -> str:
    lines = [
        f"### Run of {report.started:%Y-%m-%d %H:%M} UTC: {headline(report)}",
        "",
    ]
    if report.cut_short:
        lines += [f"**The run was cut short:** {report.cut_short}", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {_cell(what)} | {_cell(value)} |" for what, value in report.facts]
    lines.append(f"| time | {report.spent_s:.0f} s of a {report.budget_s:.0f} s budget |")
    lines += ["", "| check | result | why |", "|---|---|---|"]
    for result in report.results:
        mark = f"**{result.status}**" if result.status is Status.FAIL else str(result.status)
        lines.append(f"| {_cell(result.name)} | {mark} | {_cell(result.summary)} |")
    for result in report.results:
        if not result.details:
            continue
        lines += ["", f"#### {result.name} ({result.status}, {result.seconds:.1f} s)", ""]
        lines += list(result.details)
    return "\n".join(lines).rstrip() + "\n"


def render_json(report: Report) -> str:
    body: dict[str, Any] = {
        "started": report.started.isoformat(),
        "facts": dict(report.facts),
        "budgetSeconds": report.budget_s,
        "spentSeconds": round(report.spent_s, 1),
        "cutShort": report.cut_short,
        "summary": headline(report),
        "checks": [
            {
                "name": r.name,
                "status": str(r.status),
                "summary": r.summary,
                "seconds": round(r.seconds, 2),
                "data": r.data,
            }
            for r in report.results
        ],
    }
    return json.dumps(body, indent=2, default=str) + "\n"


def splice(document: str, section: str) -> str:
    """``document`` with the text between the report markers replaced by ``section``;
    the markers and ``section`` are appended when the document has none."""
    block = f"{BEGIN}\n{section.rstrip()}\n{END}"
    start = document.find(BEGIN)
    end = document.find(END, start + len(BEGIN)) if start >= 0 else -1
    if start < 0 or end < 0:
        return document.rstrip() + "\n\n" + block + "\n"
    return document[:start] + block + document[end + len(END) :]
