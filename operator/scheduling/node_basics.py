"""What kube-scheduler checks for every pod, which a scheduler of its own must honour too.

Unschedulable and NotReady nodes, taints against tolerations, nodeSelector, required
node affinity, and CPU, memory and pod-count capacity against the pods already there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final

from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling import node_annotations
from vgpu_operator.scheduling.status import Reason
from vgpu_operator.wire import (
    Container,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    PodSpec,
    Taint,
    Toleration,
)

_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class PodResources:
    """A pod's CPU (cores), memory (bytes) requests and a pod slot."""

    cpu: Fraction = Fraction(0)
    memory: Fraction = Fraction(0)

    def __add__(self, other: PodResources) -> PodResources:
        return PodResources(self.cpu + other.cpu, self.memory + other.memory)

    def __sub__(self, other: PodResources) -> PodResources:
        return PodResources(self.cpu - other.cpu, self.memory - other.memory)


def _quantity(values: Mapping[str, str], name: str) -> Fraction:
    if name not in values:
        return Fraction(0)
    try:
        return parse_quantity(values[name], name)
    except CodecError:
        return Fraction(0)


def _container_requests(container: Container) -> PodResources:
    resources = container.get("resources") or {}
    # The API server defaults requests to limits when only limits are given.
    values = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return PodResources(_quantity(values, "cpu"), _quantity(values, "memory"))


def pod_requests(pod: Pod) -> PodResources:
    """Effective requests: the larger of the app containers' sum and any init container."""
    spec = pod.get("spec") or {}
    total = PodResources()
    for container in spec.get("containers") or []:
        total = total + _container_requests(container)
    for container in spec.get("initContainers") or []:
        init = _container_requests(container)
        total = PodResources(max(total.cpu, init.cpu), max(total.memory, init.memory))
    return total


_DEFAULT_KEYS: Final = node_annotations.read_keys()


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """The parts of a Node object that scheduling reads, parsed once per update."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    ready: bool = True
    taints: tuple[Taint, ...] = ()
    allocatable_cpu: Fraction | None = None
    allocatable_memory: Fraction | None = None
    allocatable_pods: int | None = None
    allocatable: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_node(cls, node: Node, annotation_keys: frozenset[str] | None = None) -> NodeFacts:
        """``annotations`` keeps only the declared keys (``node_annotations``; the
        default vendor table's unless ``annotation_keys`` says otherwise)."""
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        ready = True
        for condition in status.get("conditions") or []:
            if condition.get("type") == "Ready":
                ready = condition.get("status") == "True"
        allocatable = status.get("allocatable") or {}
        pods = allocatable.get("pods")
        return cls(
            name=str(meta.get("name", "")),
            labels=dict(meta.get("labels") or {}),
            annotations=node_annotations.declared(
                meta.get("annotations") or {},
                _DEFAULT_KEYS if annotation_keys is None else annotation_keys,
            ),
            unschedulable=bool(spec.get("unschedulable", False)),
            ready=ready,
            taints=tuple(spec.get("taints") or ()),
            allocatable_cpu=_quantity(allocatable, "cpu") if "cpu" in allocatable else None,
            allocatable_memory=(
                _quantity(allocatable, "memory") if "memory" in allocatable else None
            ),
            allocatable_pods=int(_quantity(allocatable, "pods")) if pods is not None else None,
            allocatable=dict(allocatable),
        )


def _tolerates(tolerations: Sequence[Toleration], taint: Taint) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def _expression_matches(expr: NodeSelectorRequirement, labels: Mapping[str, str]) -> bool:
    key = expr.get("key", "")
    operator = expr.get("operator", "")
    values = [str(v) for v in expr.get("values") or []]
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _term_matches(term: NodeSelectorTerm, node: NodeFacts) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches nothing, as in kube-scheduler
    if not all(_expression_matches(e, node.labels) for e in expressions):
        return False
    return all(_expression_matches(f, {"metadata.name": node.name}) for f in fields)


def affinity_matches(pod_spec: PodSpec, node: NodeFacts) -> bool:
    """Whether the pod spec's required node affinity admits the node."""
    return PodNodeTerms.of({"spec": pod_spec}).affinity_matches(node)


@dataclass(frozen=True, slots=True)
class PodNodeTerms:
    """What a pod asks of any node (tolerations, node selector, required node affinity),
    read once per attempt and checked against every node."""

    tolerations: tuple[Toleration, ...] = ()
    selector: tuple[tuple[str, str], ...] = ()
    #: The required nodeSelectorTerms; None when the pod has none (every node passes).
    affinity_terms: tuple[NodeSelectorTerm, ...] | None = None

    @classmethod
    def of(cls, pod: Pod) -> PodNodeTerms:
        spec = pod.get("spec") or {}
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        terms = required.get("nodeSelectorTerms")
        return cls(
            tolerations=tuple(spec.get("tolerations") or ()),
            selector=tuple((k, str(v)) for k, v in (spec.get("nodeSelector") or {}).items()),
            affinity_terms=tuple(terms) if terms else None,
        )

    def affinity_matches(self, node: NodeFacts) -> bool:
        if self.affinity_terms is None:
            return True
        return any(_term_matches(term, node) for term in self.affinity_terms)


def check_node(
    pod: Pod,
    requests: PodResources,
    node: NodeFacts,
    used: PodResources,
    pod_count: int,
    terms: PodNodeTerms | None = None,
) -> Reason | None:
    """The first kube-scheduler rule the node breaks for this pod, or None (``terms``:
    the pod's node terms when already read, else they are read from ``pod``)."""
    terms = terms or PodNodeTerms.of(pod)
    tolerations = terms.tolerations
    if node.unschedulable and not _tolerates(
        tolerations, {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    ):
        return Reason.NODE_UNSCHEDULABLE
    if not node.ready and not _tolerates(
        tolerations, {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    ):
        return Reason.NODE_NOT_READY
    for taint in node.taints:
        if taint.get("effect") in _BLOCKING_EFFECTS and not _tolerates(tolerations, taint):
            return Reason.NODE_UNTOLERATED_TAINT
    if any(node.labels.get(k) != v for k, v in terms.selector):
        return Reason.NODE_SELECTOR_MISMATCH
    if not terms.affinity_matches(node):
        return Reason.NODE_AFFINITY_MISMATCH
    if node.allocatable_pods is not None and pod_count + 1 > node.allocatable_pods:
        return Reason.TOO_MANY_PODS
    if node.allocatable_cpu is not None and used.cpu + requests.cpu > node.allocatable_cpu:
        return Reason.INSUFFICIENT_CPU
    if (
        node.allocatable_memory is not None
        and used.memory + requests.memory > node.allocatable_memory
    ):
        return Reason.INSUFFICIENT_NODE_MEMORY
    return None
