"""RFC 3339 times as the Kubernetes API writes them, read and written in one place."""

from __future__ import annotations

import datetime


def format_rfc3339(moment: datetime.datetime, *, micro: bool = False) -> str:
    """``2026-11-24T19:11:07Z`` (``metav1.Time``), or with microseconds (``MicroTime``)."""
    utc = moment.astimezone(datetime.UTC)
    if micro:
        return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return utc.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: object) -> datetime.datetime | None:
    """An API time as an aware datetime (naive input is taken as UTC); None when the value
    is missing or unreadable, so a bad timestamp never raises out of a handler."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def unix_time(value: object) -> float | None:
    """An API time as a Unix time, or None (see ``parse_rfc3339``)."""
    parsed = parse_rfc3339(value)
    return None if parsed is None else parsed.timestamp()
