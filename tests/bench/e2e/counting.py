"""Counting what a run cost: API writes (the API server's counters and its audit log),
the operator's create-to-bound histogram, and percentiles."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

WRITE_VERBS: Final = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})
AUDIT_WRITES: Final = frozenset({"create", "update", "patch", "delete", "deletecollection"})
#: Write-only audit policy: reads and the nodes' lease renewals are left out of the log.
AUDIT_POLICY: Final = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  verbs: ["get", "list", "watch"]
- level: None
  resources: [{group: "coordination.k8s.io", resources: ["leases"]}]
- level: Metadata
"""
_SAMPLE: Final = re.compile(r"^(\w+)\{(.*)\}\s+(\S+)$")
_LABEL: Final = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str, metric: str) -> Iterable[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of ``metric`` in Prometheus text."""
    for line in text.splitlines():
        if not line.startswith(metric + "{"):
            continue
        match = _SAMPLE.match(line)
        if match and match.group(1) == metric:
            yield dict(_LABEL.findall(match.group(2))), float(match.group(3))


def apiserver_writes(text: str) -> Counter[str]:
    """``VERB resource[/subresource]`` -> requests, from ``apiserver_request_total``."""
    counts: Counter[str] = Counter()
    for labels, value in samples(text, "apiserver_request_total"):
        if labels.get("verb") not in WRITE_VERBS:
            continue
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        counts[f"{labels['verb']} {resource}"] += int(value)
    return counts


def watch_bytes(text: str) -> Counter[str]:
    """Resource -> bytes the API server has sent on watches, from the sum of
    ``apiserver_watch_events_sizes`` (labelled by resource, or by kind in older
    releases), every group and version together."""
    sent: Counter[str] = Counter()
    for labels, value in samples(text, "apiserver_watch_events_sizes_sum"):
        what = labels.get("resource") or labels.get("kind") or "?"
        sent[what] += int(value)
    return sent


def diff(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}


class AuditLog:
    """Reads the API server's audit log from where the last read stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def skip_to_end(self) -> None:
        self._offset = self.path.stat().st_size if self.path.exists() else 0

    def writes(self, namespaces: Sequence[str]) -> Counter[tuple[str, str]]:
        """(user, ``verb resource[/sub]``) -> writes in these namespaces since the last read."""
        counts: Counter[tuple[str, str]] = Counter()
        if not self.path.exists():
            return counts
        with self.path.open("rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        # Keep a half-written last line for the next read.
        end = data.rfind(b"\n") + 1
        self._offset += end
        wanted = set(namespaces)
        for raw in data[:end].splitlines():
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            ref = event.get("objectRef") or {}
            if event.get("verb") not in AUDIT_WRITES or ref.get("namespace") not in wanted:
                continue
            resource = str(ref.get("resource", ""))
            if ref.get("subresource"):
                resource += "/" + str(ref["subresource"])
            user = str((event.get("user") or {}).get("username", "?"))
            counts[(user, f"{event['verb']} {resource}")] += 1
        return counts


def histogram(text: str, metric: str) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) buckets of a histogram."""
    buckets = []
    for labels, value in samples(text, metric + "_bucket"):
        bound = labels.get("le", "")
        buckets.append((math.inf if bound == "+Inf" else float(bound), value))
    return sorted(buckets)


def histogram_quantile(
    after: Sequence[tuple[float, float]], before: Sequence[tuple[float, float]], q: float
) -> float | None:
    """The bucket bound under which a fraction ``q`` of the new observations fall."""
    earlier = dict(before)
    diffs = [(bound, count - earlier.get(bound, 0.0)) for bound, count in after]
    if not diffs or diffs[-1][1] <= 0:
        return None
    total = diffs[-1][1]
    for bound, count in diffs:
        if count >= q * total:
            return bound
    return None


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[rank]
