"""Every object's metadata, pods, nodes, quotas, budgets, PodGroups, the device config and
our own kinds (the package's docstring says why TypedDicts)."""

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
    securityContext: dict[str, Any]
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
    schedulingGates: list[dict[str, str]]


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


#: A label selector's requirement: the fields of a node selector's.
LabelSelectorRequirement = NodeSelectorRequirement


class LabelSelector(TypedDict, total=False):
    matchLabels: dict[str, str]
    matchExpressions: list[LabelSelectorRequirement]


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
