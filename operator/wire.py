"""The shapes of what the operator and the agent read from and write to the API server.

TypedDicts, not classes: the objects stay the plain dicts the API server sends (a watch
event is decoded once and handed on, never copied into models), and mypy checks every
field we read or write against these declarations. Only the fields this project uses
are declared; ``total=False`` because the API server leaves out empty fields, so every
read of an optional field still says what it does when the field is missing.

At the bottom of the layers (``.importlinter``): the engine may import these shapes
without depending on the API adapters (``kube/``).
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

#: A watch event's type; ``BOOKMARK`` only moves the resourceVersion on.
WatchEventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]


# --- every object -----------------------------------------------------------------------
class OwnerReference(TypedDict, total=False):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


class ObjectMeta(TypedDict, total=False):
    name: str
    generateName: str
    namespace: str
    uid: str
    resourceVersion: str
    generation: int
    creationTimestamp: str
    deletionTimestamp: str
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[OwnerReference]
    finalizers: list[str]


class KubeObject(TypedDict, total=False):
    """Any object: what a listing or a watch hands over before its kind is known."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta


class ObjectReference(TypedDict, total=False):
    apiVersion: str
    kind: str
    namespace: str
    name: str
    uid: str
    resourceVersion: str


# --- pods (the fields the operator reads and writes) --------------------------------------
class ResourceRequirements(TypedDict, total=False):
    limits: dict[str, str]
    requests: dict[str, str]
    claims: list[dict[str, str]]


class EnvVar(TypedDict, total=False):
    name: str
    value: str


class Container(TypedDict, total=False):
    name: str
    image: str
    resources: ResourceRequirements
    env: list[EnvVar]


class PodResourceClaim(TypedDict, total=False):
    name: str
    resourceClaimName: str
    resourceClaimTemplateName: str


class PodSpec(TypedDict, total=False):
    nodeName: str
    schedulerName: str
    priority: int
    priorityClassName: str
    nodeSelector: dict[str, str]
    affinity: dict[str, Any]
    tolerations: list[dict[str, Any]]
    containers: list[Container]
    initContainers: list[Container]
    resourceClaims: list[PodResourceClaim]


class PodCondition(TypedDict, total=False):
    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str


class PodClaimStatus(TypedDict, total=False):
    name: str
    resourceClaimName: str


class PodStatus(TypedDict, total=False):
    phase: str
    conditions: list[PodCondition]
    nominatedNodeName: str
    resourceClaimStatuses: list[PodClaimStatus]


class Pod(KubeObject, total=False):
    spec: PodSpec
    status: PodStatus


class Binding(TypedDict):
    """What binds a pod to its node (``pods/binding``)."""

    apiVersion: Literal["v1"]
    kind: Literal["Binding"]
    metadata: ObjectMeta
    target: ObjectReference


class Node(KubeObject, total=False):
    """A Node: its spec and status are read by the engine (``scheduling.node_basics``)."""

    spec: dict[str, Any]
    status: dict[str, Any]


# --- the device config ----------------------------------------------------------------------
class ConfigMap(KubeObject, total=False):
    data: dict[str, str]


# --- DRA (resource.k8s.io/v1) -----------------------------------------------------------------
class DeviceRequestAllocationResult(TypedDict, total=False):
    request: str
    driver: str
    pool: str
    device: str
    adminAccess: bool
    consumedCapacity: dict[str, str]
    shareID: str


class DeviceAllocationConfiguration(TypedDict, total=False):
    source: str
    requests: list[str]
    opaque: dict[str, Any]


class DeviceAllocation(TypedDict, total=False):
    results: list[DeviceRequestAllocationResult]
    config: list[DeviceAllocationConfiguration]


class AllocationResult(TypedDict, total=False):
    devices: DeviceAllocation
    nodeSelector: dict[str, Any]
    allocationTimestamp: str


class ResourceClaimConsumer(TypedDict, total=False):
    apiGroup: str
    resource: str
    name: str
    uid: str


class ResourceClaimStatus(TypedDict, total=False):
    allocation: AllocationResult
    reservedFor: list[ResourceClaimConsumer]


class ResourceClaimSpec(TypedDict, total=False):
    devices: dict[str, Any]


class ResourceClaim(KubeObject, total=False):
    spec: ResourceClaimSpec
    status: ResourceClaimStatus


class ResourceClaimTemplate(KubeObject, total=False):
    spec: dict[str, Any]


class ResourcePool(TypedDict, total=False):
    name: str
    generation: int
    resourceSliceCount: int


class SliceDevice(TypedDict, total=False):
    name: str
    attributes: dict[str, dict[str, Any]]
    capacity: dict[str, dict[str, Any]]
    allowMultipleAllocations: bool
    taints: list[dict[str, Any]]
    consumesCounters: list[dict[str, Any]]


class ResourceSliceSpec(TypedDict, total=False):
    driver: str
    nodeName: str
    pool: ResourcePool
    devices: list[SliceDevice]
    sharedCounters: list[dict[str, Any]]


class ResourceSlice(KubeObject, total=False):
    spec: ResourceSliceSpec


class DeviceClass(KubeObject, total=False):
    spec: dict[str, Any]


# --- our own kind -------------------------------------------------------------------------------
class DeviceInventoryStatus(TypedDict, total=False):
    nodeName: str
    heartbeat: str
    devices: list[dict[str, Any]]
    pairScores: list[dict[str, Any]]
    cordoned: list[str]


class DeviceInventory(KubeObject, total=False):
    spec: dict[str, Any]  # empty: everything is reported in status
    status: DeviceInventoryStatus


# --- what we report -------------------------------------------------------------------------------
class EventSource(TypedDict, total=False):
    component: str
    host: str


class Event(KubeObject, total=False):
    """A core/v1 Event as the reporter writes it."""

    involvedObject: ObjectReference
    reason: str
    message: str
    type: str
    count: int
    firstTimestamp: str
    lastTimestamp: str
    source: EventSource
    reportingComponent: str
    reportingInstance: str


class Lease(KubeObject, total=False):
    spec: dict[str, Any]


def meta_of(obj: KubeObject) -> ObjectMeta:
    """The object's metadata ({} when the object carries none)."""
    return obj.get("metadata") or {}


def name_of(obj: KubeObject) -> str:
    return meta_of(obj).get("name") or ""


def namespaced_name_of(obj: KubeObject) -> str:
    """``namespace/name``; a namespaced object the server sent without its namespace is
    in ``default``."""
    meta = meta_of(obj)
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def version_of(obj: KubeObject) -> str | None:
    return meta_of(obj).get("resourceVersion")
