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
    restartPolicy: str
    resources: ResourceRequirements
    env: list[EnvVar]


class Toleration(TypedDict, total=False):
    key: str
    operator: str
    value: str
    effect: str
    tolerationSeconds: int


class NodeSelectorRequirement(TypedDict, total=False):
    key: str
    operator: str
    values: list[str]


class NodeSelectorTerm(TypedDict, total=False):
    matchExpressions: list[NodeSelectorRequirement]
    matchFields: list[NodeSelectorRequirement]


class NodeSelector(TypedDict, total=False):
    nodeSelectorTerms: list[NodeSelectorTerm]


class NodeAffinity(TypedDict, total=False):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector
    preferredDuringSchedulingIgnoredDuringExecution: list[dict[str, Any]]


class Affinity(TypedDict, total=False):
    nodeAffinity: NodeAffinity
    podAffinity: dict[str, Any]
    podAntiAffinity: dict[str, Any]


class PodSchedulingGroup(TypedDict, total=False):
    podGroupName: str  # the PodGroup the pod is a member of (gangs)


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
    preemptionPolicy: str
    affinity: Affinity
    tolerations: list[Toleration]
    containers: list[Container]
    initContainers: list[Container]
    resourceClaims: list[PodResourceClaim]
    schedulingGroup: PodSchedulingGroup


class PodCondition(TypedDict, total=False):
    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str


class PodClaimStatus(TypedDict, total=False):
    name: str
    resourceClaimName: str


class ContainerStateTerminated(TypedDict, total=False):
    exitCode: int
    reason: str


class ContainerState(TypedDict, total=False):
    terminated: ContainerStateTerminated
    running: dict[str, Any]
    waiting: dict[str, Any]


class ContainerStatus(TypedDict, total=False):
    name: str
    ready: bool
    state: ContainerState


class ContainerExtendedResourceRequest(TypedDict, total=False):
    containerName: str
    resourceName: str
    requestName: str


class PodExtendedResourceClaimStatus(TypedDict, total=False):
    """``status.extendedResourceClaimStatus``: the pod's special claim (KEP-5004)."""

    resourceClaimName: str
    requestMappings: list[ContainerExtendedResourceRequest]


class PodStatus(TypedDict, total=False):
    phase: str
    startTime: str
    conditions: list[PodCondition]
    nominatedNodeName: str
    resourceClaimStatuses: list[PodClaimStatus]
    initContainerStatuses: list[ContainerStatus]
    containerStatuses: list[ContainerStatus]
    extendedResourceClaimStatus: PodExtendedResourceClaimStatus


class Pod(KubeObject, total=False):
    spec: PodSpec
    status: PodStatus


class Binding(TypedDict):
    """What binds a pod to its node (``pods/binding``)."""

    apiVersion: Literal["v1"]
    kind: Literal["Binding"]
    metadata: ObjectMeta
    target: ObjectReference


class Taint(TypedDict, total=False):
    key: str
    value: str
    effect: str
    timeAdded: str


class NodeSpec(TypedDict, total=False):
    unschedulable: bool
    taints: list[Taint]
    providerID: str


class NodeCondition(TypedDict, total=False):
    type: str
    status: str
    reason: str
    message: str


class NodeStatus(TypedDict, total=False):
    #: Quantities by resource name (``cpu``, ``memory``, ``pods``, extended resources).
    allocatable: dict[str, str]
    capacity: dict[str, str]
    conditions: list[NodeCondition]


class Node(KubeObject, total=False):
    """A Node: its spec and status are read by the engine (``scheduling.node_basics``)."""

    spec: NodeSpec
    status: NodeStatus


class LabelSelector(TypedDict, total=False):
    matchLabels: dict[str, str]
    matchExpressions: list[NodeSelectorRequirement]


class ResourceQuotaSpec(TypedDict, total=False):
    hard: dict[str, str]
    scopes: list[str]


class ResourceQuotaStatus(TypedDict, total=False):
    hard: dict[str, str]
    used: dict[str, str]


class ResourceQuota(KubeObject, total=False):
    spec: ResourceQuotaSpec
    status: ResourceQuotaStatus


class PodDisruptionBudgetSpec(TypedDict, total=False):
    minAvailable: int | str
    maxUnavailable: int | str
    selector: LabelSelector


class PodDisruptionBudgetStatus(TypedDict, total=False):
    disruptionsAllowed: int
    currentHealthy: int
    desiredHealthy: int
    expectedPods: int
    #: Pods being evicted (name -> when), not yet counted out by the disruption controller.
    disruptedPods: dict[str, str]


class PodDisruptionBudget(KubeObject, total=False):
    spec: PodDisruptionBudgetSpec
    status: PodDisruptionBudgetStatus


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
    nodeSelector: NodeSelector
    allocationTimestamp: str


class ResourceClaimConsumer(TypedDict, total=False):
    apiGroup: str
    resource: str
    name: str
    uid: str


class ResourceClaimStatus(TypedDict, total=False):
    allocation: AllocationResult
    reservedFor: list[ResourceClaimConsumer]


class CELDeviceSelector(TypedDict, total=False):
    expression: str


class DeviceSelector(TypedDict, total=False):
    cel: CELDeviceSelector


class CapacityRequirements(TypedDict, total=False):
    #: Quantities by capacity name.
    requests: dict[str, str]


#: A request's toleration of device taints: the fields of a pod's.
DeviceToleration = Toleration


class ExactDeviceRequest(TypedDict, total=False):
    deviceClassName: str
    selectors: list[DeviceSelector]
    allocationMode: str
    count: int
    adminAccess: bool
    tolerations: list[DeviceToleration]
    capacity: CapacityRequirements


class DeviceSubRequest(ExactDeviceRequest, total=False):
    """One alternative of a ``firstAvailable`` request."""

    name: str


class DeviceRequest(TypedDict, total=False):
    name: str
    exactly: ExactDeviceRequest
    firstAvailable: list[DeviceSubRequest]


class DeviceConstraint(TypedDict, total=False):
    requests: list[str]
    matchAttribute: str
    distinctAttribute: str


class OpaqueDeviceConfiguration(TypedDict, total=False):
    driver: str
    #: The driver's own parameters: any JSON, read by the driver (``claim_configs``).
    parameters: dict[str, Any]


class DeviceClaimConfiguration(TypedDict, total=False):
    requests: list[str]
    opaque: OpaqueDeviceConfiguration


class DeviceClaim(TypedDict, total=False):
    requests: list[DeviceRequest]
    constraints: list[DeviceConstraint]
    config: list[DeviceClaimConfiguration]


class ResourceClaimSpec(TypedDict, total=False):
    devices: DeviceClaim


class ResourceClaim(KubeObject, total=False):
    spec: ResourceClaimSpec
    status: ResourceClaimStatus


class ResourceClaimTemplateSpec(TypedDict, total=False):
    metadata: ObjectMeta
    spec: ResourceClaimSpec


class ResourceClaimTemplate(KubeObject, total=False):
    spec: ResourceClaimTemplateSpec


class ResourcePool(TypedDict, total=False):
    name: str
    generation: int
    resourceSliceCount: int


class DeviceAttribute(TypedDict, total=False):
    """Exactly one of the four is set."""

    int: int
    bool: bool
    string: str
    version: str


class CapacityValidRange(TypedDict, total=False):
    min: str
    max: str
    step: str


class CapacityRequestPolicy(TypedDict, total=False):
    default: str
    validValues: list[str]
    validRange: CapacityValidRange


class DeviceCapacity(TypedDict, total=False):
    value: str
    requestPolicy: CapacityRequestPolicy


#: A device's taint: the fields of a node's.
DeviceTaint = Taint


class Counter(TypedDict, total=False):
    value: str


class DeviceCounterConsumption(TypedDict, total=False):
    counterSet: str
    counters: dict[str, Counter]


class CounterSet(TypedDict, total=False):
    name: str
    counters: dict[str, Counter]


class SliceDevice(TypedDict, total=False):
    name: str
    attributes: dict[str, DeviceAttribute]
    capacity: dict[str, DeviceCapacity]
    allowMultipleAllocations: bool
    taints: list[DeviceTaint]
    consumesCounters: list[DeviceCounterConsumption]


class ResourceSliceSpec(TypedDict, total=False):
    driver: str
    nodeName: str
    pool: ResourcePool
    devices: list[SliceDevice]
    sharedCounters: list[CounterSet]


class ResourceSlice(KubeObject, total=False):
    spec: ResourceSliceSpec


class DeviceClassConfiguration(TypedDict, total=False):
    opaque: OpaqueDeviceConfiguration


class DeviceClassSpec(TypedDict, total=False):
    selectors: list[DeviceSelector]
    config: list[DeviceClassConfiguration]
    extendedResourceName: str


class DeviceClass(KubeObject, total=False):
    spec: DeviceClassSpec


class DeviceTaintSelector(TypedDict, total=False):
    deviceClassName: str
    driver: str
    pool: str
    device: str


class DeviceTaintRuleSpec(TypedDict, total=False):
    deviceSelector: DeviceTaintSelector
    taint: DeviceTaint


class DeviceTaintRule(KubeObject, total=False):
    spec: DeviceTaintRuleSpec


# --- gangs (scheduling.k8s.io PodGroup, ../docs/gangs.md) ----------------------------------------
class GangSchedulingPolicy(TypedDict, total=False):
    minCount: int


class PodGroupSchedulingPolicy(TypedDict, total=False):
    """Exactly one of ``basic`` and ``gang``."""

    basic: dict[str, Any]
    gang: GangSchedulingPolicy


class TopologyConstraint(TypedDict, total=False):
    key: str


class PodGroupSchedulingConstraints(TypedDict, total=False):
    topology: list[TopologyConstraint]


class PodGroupSpec(TypedDict, total=False):
    schedulingPolicy: PodGroupSchedulingPolicy
    schedulingConstraints: PodGroupSchedulingConstraints
    #: ``{"single": {}}`` or ``{"all": {}}``.
    disruptionMode: dict[str, Any]
    priorityClassName: str
    priority: int
    preemptionPolicy: str
    resourceClaims: list[PodResourceClaim]


class PodGroup(KubeObject, total=False):
    spec: PodGroupSpec


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
