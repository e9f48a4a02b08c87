"""What each check ends with: pass, fail or skip, a one-line summary, and the details."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class Status(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's outcome. ``details`` are lines for the report; ``data`` is what the
    report's JSON carries (measurements, the settings returned, the inventory)."""

    name: str
    status: Status
    summary: str
    details: tuple[str, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def passed(name: str, summary: str, details: Sequence[str] = (), **data: Any) -> CheckResult:
    return CheckResult(name, Status.PASS, summary, tuple(details), data)


def failed(name: str, summary: str, details: Sequence[str] = (), **data: Any) -> CheckResult:
    return CheckResult(name, Status.FAIL, summary, tuple(details), data)


def skipped(name: str, reason: str, details: Sequence[str] = (), **data: Any) -> CheckResult:
    return CheckResult(name, Status.SKIP, reason, tuple(details), data)
