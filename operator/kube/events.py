"""Kubernetes Events (core/v1), aggregated the way kubectl shows them.

A pod retried many times for the same reason gets ONE Event whose ``count`` and
``lastTimestamp`` move, not one Event per attempt. A new message starts a new Event.
``EventAggregator`` decides (pure, clock passed in); ``EventRecorder`` writes.
"""

from __future__ import annotations

import datetime
import enum
import os
from dataclasses import dataclass
from typing import Final, TypedDict

from kubernetes_asyncio import client

from vgpu_operator.kube import requests
from vgpu_operator.timestamps import format_rfc3339
from vgpu_operator.wire import Event, KubeObject, ObjectReference, meta_of

COMPONENT: Final = "vgpu-scheduler"
TYPE_NORMAL: Final = "Normal"
TYPE_WARNING: Final = "Warning"
_CLUSTER_SCOPED: Final = frozenset({"Node"})
#: Kubernetes limits an Event message to 1 KiB; longer ones are cut, as kubelet does.
MAX_MESSAGE_CHARS: Final = 1024


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about."""

    kind: str
    namespace: str
    name: str
    uid: str = ""
    api_version: str = "v1"

    @classmethod
    def of(cls, obj: KubeObject, kind: str | None = None) -> ObjectRef:
        meta = meta_of(obj)
        return cls(
            kind=kind or str(obj.get("kind") or "Pod"),
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            api_version=str(obj.get("apiVersion") or "v1"),
        )

    def as_wire(self) -> ObjectReference:
        ref: ObjectReference = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
        }
        if self.kind not in _CLUSTER_SCOPED:
            # A Node's Events live in "default" but name no namespace, as kubelet's do
            # (``kubectl describe node`` looks for exactly that).
            ref["namespace"] = self.namespace
        if self.uid:
            ref["uid"] = self.uid
        return ref


class EventWriteAction(enum.Enum):
    CREATE = "create"
    UPDATE = "update"


class SeriesPatch(TypedDict):
    """What an Event's update changes: one more of the same."""

    count: int
    lastTimestamp: str


@dataclass(frozen=True, slots=True)
class EventWrite:
    """One write the recorder must make: a new Event, or a count bump of an old one."""

    action: EventWriteAction
    namespace: str
    name: str
    #: The new Event, or the merge patch that moves a series on.
    body: Event | SeriesPatch
    message: str
    event_type: str


@dataclass(slots=True)
class _Series:
    name: str
    message: str
    count: int
    first_timestamp: str


class EventAggregator:
    """Turns "this happened to that object" into Event writes, one series per
    (object, reason) and message."""

    def __init__(self, instance: str = "", component: str = COMPONENT) -> None:
        self._instance = instance or os.environ.get("HOSTNAME", "") or "vgpu-operator"
        #: Who reports (``source.component``): the scheduler, or a node's agent.
        self._component = component
        self._series: dict[tuple[str, str, str, str], _Series] = {}
        #: The series of each object (namespace, name): ``forget`` runs for every bound
        #: pod, and must not walk the series of thousands of waiting ones.
        self._by_object: dict[tuple[str, str], set[tuple[str, str, str, str]]] = {}
        self._serial = 0

    def __len__(self) -> int:
        return len(self._series)

    def record(
        self,
        ref: ObjectRef,
        reason: str,
        message: str,
        now: datetime.datetime,
        event_type: str = TYPE_WARNING,
    ) -> EventWrite:
        message = message[:MAX_MESSAGE_CHARS]
        key = (ref.namespace, ref.name, ref.uid, reason)
        stamp = format_rfc3339(now)
        series = self._series.get(key)
        if series is not None and series.message == message:
            series.count += 1
            patch: SeriesPatch = {"count": series.count, "lastTimestamp": stamp}
            return EventWrite(
                EventWriteAction.UPDATE, ref.namespace, series.name, patch, message, event_type
            )
        self._serial += 1
        name = f"{ref.name}.{int(now.timestamp() * 1e9):x}{self._serial:x}"[:253]
        self._series[key] = _Series(name=name, message=message, count=1, first_timestamp=stamp)
        self._by_object.setdefault((ref.namespace, ref.name), set()).add(key)
        body: Event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ref.namespace},
            "involvedObject": ref.as_wire(),
            "reason": reason,
            "message": message,
            "type": event_type,
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
        }
        return EventWrite(EventWriteAction.CREATE, ref.namespace, name, body, message, event_type)

    def recreate(self, write: EventWrite, ref: ObjectRef, reason: str) -> None:
        """Forget a series whose Event vanished (expired), so the next record creates."""
        key = (ref.namespace, ref.name, ref.uid, reason)
        series = self._series.get(key)
        if series is not None and series.name == write.name:
            del self._series[key]
            keys = self._by_object.get((ref.namespace, ref.name))
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_object[(ref.namespace, ref.name)]

    def forget(self, namespace: str, name: str) -> None:
        """Drop every series about an object (bound or deleted: no more repeats)."""
        for key in self._by_object.pop((namespace, name), ()):
            self._series.pop(key, None)


async def write_event(api: client.ApiClient, write: EventWrite) -> bool:
    """Apply one write; False when an Event to update no longer exists."""
    base = f"/api/v1/namespaces/{write.namespace}/events"
    try:
        if write.action is EventWriteAction.CREATE:
            await requests.request_json(api, "POST", base, body=write.body)
        else:
            await requests.request_json(
                api,
                "PATCH",
                f"{base}/{write.name}",
                body=write.body,
                content_type=requests.MERGE_PATCH,
            )
    except requests.ApiError as exc:
        if exc.status == 404 and write.action is EventWriteAction.UPDATE:
            return False
        raise
    return True
