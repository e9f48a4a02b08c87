"""The per-node allocation gate: at most one GPU pod per node between its Binding and the
device plugin's answer (``hami.io/bind-phase`` ``success`` or ``failed``).

kubelet tells a device plugin's Allocate only device IDs, never the pod. With one pod
per node in that window the plugin's lookup has exactly one candidate, so a container
can never be handed another pod's devices. The gate is kept in the books, derived from
the pods' own annotations (so a restarted operator rebuilds it from the API server), and
opens when the holder's phase moves on, when it is deleted or ends, or after a timeout
(a node whose kubelet never answers must not stop scheduling there for good).

``hami-lock`` also honours HAMi's node lock annotation (``devices.node_lock``): held by
another pod that still exists and younger than the timeout, it closes the node too.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

from vgpu_operator import names
from vgpu_operator.devices import codec, node_lock
from vgpu_operator.errors import CodecError

#: HAMi's node lock expires after 5 minutes; a plugin answers within seconds of kubelet
#: admitting the pod, so one minute only matters when the node's kubelet is away.
DEFAULT_TIMEOUT_S: Final = 60.0


class GateMode(enum.StrEnum):
    OFF = "off"
    BOOKS = "books"
    HAMI_LOCK = "hami-lock"


def holding_since(annotations: Mapping[str, str], holds_devices: bool) -> float | None:
    """When a bound pod took its node's gate, or None when it does not hold it.

    A pod holds the gate while its phase is ``allocating`` and it has devices to hand
    out. An unreadable bind time counts as long ago: the gate must not stay shut on a
    value nobody can read.
    """
    if not holds_devices or annotations.get(names.BIND_PHASE) != codec.BindPhase.ALLOCATING:
        return None
    raw = annotations.get(names.BIND_TIME) or annotations.get(names.ASSIGNED_TIME) or ""
    try:
        return float(codec.decode_vgpu_time(raw, names.BIND_TIME))
    except CodecError:
        return 0.0


def allocation_failed(annotations: Mapping[str, str]) -> bool:
    """The device plugin gave up on the pod: kubelet will not start it with devices."""
    return annotations.get(names.BIND_PHASE) == codec.BindPhase.FAILED


def lock_holder(
    annotations: Mapping[str, str], now: float, timeout_s: float, exists: set[str] | None = None
) -> str | None:
    """The owner of a live HAMi node lock (``""`` for a legacy owner-less one), or None
    when the node is not locked, the lock expired, its owner is gone (``exists`` lists the
    pods known to exist) or the value cannot be read (HAMi then retakes it)."""
    raw = annotations.get(names.NODE_LOCK)
    if not raw:
        return None
    try:
        lock = node_lock.decode(raw)
    except CodecError:
        return None
    if now - lock.taken_at > timeout_s:
        return None
    if lock.owner and exists is not None and lock.owner not in exists:
        return None
    return lock.owner
