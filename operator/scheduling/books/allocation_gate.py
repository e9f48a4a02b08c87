"""The per-node allocation gate: at most one GPU pod per node between its Binding and the
device plugin's answer (``hami.io/bind-phase`` ``success`` or ``failed``).

kubelet tells a device plugin's Allocate only device IDs, never the pod. With one pod
per node in that window the plugin's lookup has exactly one candidate, so a container
can never be handed another pod's devices. The gate is kept in the books: a pod holds it
while its bind phase says ``allocating`` (so a restarted operator rebuilds it from the
API server), and it opens when the holder's phase moves on, when it is deleted or ends,
or after a timeout (a node whose kubelet never answers must not stop scheduling there
for good).

The timeout runs on the operator's own clock, from the Binding (or, for a pod found
already allocating after a restart, from the first time the operator looks at the gate):
``hami.io/bind-time`` is written for HAMi's sake and never read, since a time on a pod
is whatever its writer wanted (one in the future held a node shut). A pod holds the gate
once: once answered or timed out, a later ``allocating`` on it is not believed (the books
keep each pod's first answer; a ``failed`` after a ``success`` is not believed either).

``hami-lock`` also honours HAMi's node lock annotation (``devices.node_lock``): held by
another pod that still exists and younger than the timeout, it closes the node too.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from vgpu_operator import names
from vgpu_operator.devices import codec, node_lock
from vgpu_operator.errors import CodecError

#: HAMi's node lock expires after 5 minutes; a plugin answers within seconds of kubelet
#: admitting the pod, so one minute only matters when the node's kubelet is away.
DEFAULT_TIMEOUT_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class GateHolder:
    """The bound pod that keeps a node's gate shut: how long it has held it, and in how
    long the gate opens without its answer (the timeout)."""

    pod: str
    held_s: float
    opens_in_s: float


class GateMode(enum.StrEnum):
    OFF = "off"
    BOOKS = "books"
    HAMI_LOCK = "hami-lock"


#: A holder whose clock has not started: the gate's next look stamps it with its "now".
UNTIMED: Final = math.inf


def claims_gate(annotations: Mapping[str, str], holds_devices: bool) -> bool:
    """Whether a bound pod says it waits for its device plugin (``allocating``), with
    devices to hand out."""
    return holds_devices and annotations.get(names.BIND_PHASE) == codec.BindPhase.ALLOCATING


def answer(annotations: Mapping[str, str]) -> str | None:
    """The device plugin's answer for the pod (``success`` or ``failed``), if any."""
    phase = annotations.get(names.BIND_PHASE)
    if phase in (codec.BindPhase.SUCCESS.value, codec.BindPhase.FAILED.value):
        return str(phase)
    return None


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
