"""HAMi's node lock, ``hami.io/mutex.lock`` on a Node: ``<RFC3339 time>,<namespace>,<pod>``.

HAMi's scheduler writes it before a Binding and its device plugin deletes it once the
pod's devices are handed out, so the plugin knows which pod an Allocate is for. A legacy
value holds the time alone (no owner). The operator writes and honours it only when asked
to (``--allocation-gate=hami-lock``), for clusters that keep HAMi's device plugin.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from vgpu_operator import names
from vgpu_operator.errors import CodecError
from vgpu_operator.timestamps import format_rfc3339, parse_rfc3339


@dataclass(frozen=True, slots=True)
class NodeLock:
    taken_at: float
    #: ``namespace/name`` of the pod holding it; empty for the legacy time-only form.
    owner: str = ""


def encode(taken_at: float, namespace: str, name: str) -> str:
    moment = datetime.datetime.fromtimestamp(taken_at, datetime.UTC)
    return f"{format_rfc3339(moment)},{namespace},{name}"


def decode(value: str) -> NodeLock:
    """Read the annotation; any other shape is an error (HAMi refuses it too)."""
    parts = value.split(",")
    if len(parts) not in (1, 3):
        raise CodecError(names.NODE_LOCK, "expected '<RFC3339>,<namespace>,<pod>'", value)
    moment = parse_rfc3339(parts[0])
    if moment is None:
        raise CodecError(names.NODE_LOCK, "the time is not RFC 3339", value)
    if len(parts) == 1:
        return NodeLock(moment.timestamp())
    namespace, name = parts[1], parts[2]
    if not namespace or not name:
        raise CodecError(names.NODE_LOCK, "the owner's namespace and name must not be empty", value)
    return NodeLock(moment.timestamp(), f"{namespace}/{name}")
