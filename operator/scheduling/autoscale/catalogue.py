"""Instance types and NodePools as the autoscaling what-if reads them (pure).

An ``InstanceType`` is a machine the cloud can make: its offerings (price, zone, capacity
type), architecture, capacity, and its cards as the node's agent registers them (the
DeviceInventory's devices, read by ``control.autoscale_catalogue``) and, for a node on the
DRA path, publishes them (the card shapes of its ResourceSlices). A ``NodePool`` is
Karpenter's: the requirements its nodes meet, the labels and taints they carry, its
limits and what its nodes use now. A ``NodeOption`` is one node that may be added: an
instance type from one NodePool, in one offering (zone and capacity type), with the
labels the node will carry; the what-if adds nodes of options.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from vgpu_operator.devices import dra, dra_mig, model
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.errors import CodecError
from vgpu_operator.wire import Taint

INSTANCE_TYPE_LABEL: Final = "node.kubernetes.io/instance-type"
ARCH_LABEL: Final = "kubernetes.io/arch"
OS_LABEL: Final = "kubernetes.io/os"
ZONE_LABEL: Final = "topology.kubernetes.io/zone"
CAPACITY_TYPE_LABEL: Final = "karpenter.sh/capacity-type"
NODE_POOL_LABEL: Final = "karpenter.sh/nodepool"
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
#: A NodePool's limit on the count of its nodes.
NODES_LIMIT: Final = "nodes"
#: Requirement operators Karpenter accepts.
_OPERATORS: Final = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
#: The most requirements, labels, taints or limits read from one NodePool.
_MAX_ENTRIES: Final = 64


class NodePoolError(ValueError):
    """A NodePool the what-if cannot read; the message says what to change."""


@dataclass(frozen=True, slots=True)
class Offering:
    """Where and how an instance type may be bought, and at what price per hour."""

    price: float
    zone: str | None = None
    capacity_type: str | None = None


@dataclass(frozen=True, slots=True)
class InstanceType:
    """A machine the cloud can make, with the cards its node's agent would report."""

    name: str
    offerings: tuple[Offering, ...]
    capacity: Mapping[str, Fraction]
    devices: tuple[model.DeviceInfo, ...]
    pair_scores: model.PairScores = field(default_factory=dict)
    architecture: str = "amd64"
    operating_systems: tuple[str, ...] = ("linux",)
    #: The cards its agent would publish on the DRA path (``dra_shapes``, built by the
    #: catalogue from the same cards): shared cards, and cards in MIG mode.
    dra_cards: tuple[dra.CardShape, ...] = ()
    dra_mig_cards: tuple[dra_mig.MigCardShape, ...] = ()


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def allows(self, value: str | None) -> bool:
        """Whether a node whose label ``key`` is ``value`` (None: unset) meets it."""
        op = self.operator
        if op == "In":
            return value in self.values
        if op == "NotIn":
            return value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        try:
            number, bound = int(value or ""), int(self.values[0])
        except (ValueError, IndexError):
            return False
        return number > bound if op == "Gt" else number < bound


@dataclass(frozen=True, slots=True)
class NodePool:
    """What the what-if reads of a Karpenter NodePool."""

    name: str
    requirements: tuple[Requirement, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    limits: Mapping[str, Fraction] = field(default_factory=dict)
    #: What its nodes (and the claims for them) use now (``status.resources``).
    used: Mapping[str, Fraction] = field(default_factory=dict)
    weight: int = 0
    #: ``spec.template`` as written: a NodeClaim of the pool copies it.
    template: Mapping[str, Any] = field(default_factory=dict)

    def room(self, extra: Mapping[str, Fraction]) -> str | None:
        """Why ``extra`` more nodes' resources would pass a limit (None: they fit)."""
        for resource, limit in sorted(self.limits.items()):
            total = self.used.get(resource, Fraction(0)) + extra.get(resource, Fraction(0))
            if total > limit:
                used = self.used.get(resource, Fraction(0))
                return (
                    f"NodePool {self.name}'s limit on {resource} ({_text(limit)}) would be "
                    f"passed: {_text(used)} used, {_text(extra.get(resource, Fraction(0)))} more "
                    "wanted"
                )
        return None


@dataclass(frozen=True, slots=True)
class NodeOption:
    """One node that may be added: an instance type of a NodePool, in one offering."""

    pool: NodePool
    instance_type: InstanceType
    offering: Offering

    @property
    def key(self) -> tuple[str, str, str, str]:
        offering = self.offering
        return (
            self.pool.name,
            self.instance_type.name,
            offering.zone or "",
            offering.capacity_type or "",
        )

    @property
    def price(self) -> float:
        return self.offering.price

    def labels(self) -> dict[str, str]:
        """The labels a node of this option carries (as Karpenter labels its nodes)."""
        it, offering = self.instance_type, self.offering
        labels = {
            key: r.values[0]
            for r in self.pool.requirements
            if r.operator == "In" and len(r.values) == 1
            for key in (r.key,)
        }
        labels.update(self.pool.labels)
        labels[INSTANCE_TYPE_LABEL] = it.name
        labels[ARCH_LABEL] = it.architecture
        labels[OS_LABEL] = it.operating_systems[0] if it.operating_systems else "linux"
        labels[NODE_POOL_LABEL] = self.pool.name
        if offering.zone is not None:
            labels[ZONE_LABEL] = offering.zone
        if offering.capacity_type is not None:
            labels[CAPACITY_TYPE_LABEL] = offering.capacity_type
        return labels

    def usage(self) -> dict[str, Fraction]:
        """What one node of this option counts against its NodePool's limits."""
        return {**self.instance_type.capacity, NODES_LIMIT: Fraction(1)}


def _text(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


def options(pools: Iterable[NodePool], types: Iterable[InstanceType]) -> list[NodeOption]:
    """Every node the NodePools allow of the instance types: per pool, type and offering
    whose labels meet the pool's requirements, cheapest first (then by name)."""
    found: list[NodeOption] = []
    kinds = list(types)
    for pool in pools:
        for it in kinds:
            for offering in it.offerings:
                option = NodeOption(pool, it, offering)
                if _allowed(pool, option.labels()):
                    found.append(option)
    found.sort(key=lambda o: (o.price, -o.pool.weight, o.key))
    return found


def _allowed(pool: NodePool, labels: Mapping[str, str]) -> bool:
    return all(r.allows(labels.get(r.key)) for r in pool.requirements)


def read_node_pool(obj: Mapping[str, Any]) -> NodePool:
    """A NodePool object (plain dict) as the what-if reads it; ``NodePoolError`` names the
    field that cannot be read. A static pool (``spec.replicas``) is refused: its size is
    the administrator's, not the queue's."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise NodePoolError("a NodePool needs metadata.name")
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise NodePoolError(f"NodePool {name}: spec is not an object")
    if spec.get("replicas") is not None:
        raise NodePoolError(f"NodePool {name} is static (spec.replicas): not autoscaled")
    template = spec.get("template") or {}
    tspec = template.get("spec") or {} if isinstance(template, Mapping) else {}
    tmeta = template.get("metadata") or {} if isinstance(template, Mapping) else {}
    status = obj.get("status") or {}
    weight = spec.get("weight") or 0
    return NodePool(
        name=name,
        requirements=tuple(_requirements(name, tspec.get("requirements") or ())),
        labels=_strings(name, "template labels", tmeta.get("labels") or {}),
        taints=tuple(_taints(name, tspec.get("taints") or ())),
        limits=_quantities(name, "limits", spec.get("limits") or {}),
        used=_quantities(name, "status.resources", status.get("resources") or {}),
        weight=weight if isinstance(weight, int) and not isinstance(weight, bool) else 0,
        template=template if isinstance(template, Mapping) else {},
    )


def _requirements(pool: str, raw: Any) -> Iterable[Requirement]:
    if not isinstance(raw, Sequence) or len(raw) > _MAX_ENTRIES:
        raise NodePoolError(f"NodePool {pool}: requirements must be a list (at most 64)")
    for entry in raw:
        key = entry.get("key") if isinstance(entry, Mapping) else None
        op = entry.get("operator") if isinstance(entry, Mapping) else None
        values = entry.get("values") or () if isinstance(entry, Mapping) else ()
        if not isinstance(key, str) or op not in _OPERATORS or not isinstance(values, Sequence):
            raise NodePoolError(f"NodePool {pool}: a requirement cannot be read: {entry!r:.120}")
        yield Requirement(key, str(op), tuple(str(v) for v in values[:_MAX_ENTRIES]))


def _strings(pool: str, what: str, raw: Any) -> dict[str, str]:
    if not isinstance(raw, Mapping) or len(raw) > _MAX_ENTRIES:
        raise NodePoolError(f"NodePool {pool}: {what} must be a map of strings (at most 64)")
    return {str(k): str(v) for k, v in raw.items()}


def _taints(pool: str, raw: Any) -> Iterable[Taint]:
    if not isinstance(raw, Sequence) or len(raw) > _MAX_ENTRIES:
        raise NodePoolError(f"NodePool {pool}: taints must be a list (at most 64)")
    for taint in raw:
        if not isinstance(taint, Mapping) or not isinstance(taint.get("key"), str):
            raise NodePoolError(f"NodePool {pool}: a taint cannot be read: {taint!r:.120}")
        read: Taint = {"key": taint["key"]}
        if isinstance(value := taint.get("value"), str):
            read["value"] = value
        if isinstance(effect := taint.get("effect"), str):
            read["effect"] = effect
        yield read


def _quantities(pool: str, what: str, raw: Any) -> dict[str, Fraction]:
    if not isinstance(raw, Mapping) or len(raw) > _MAX_ENTRIES:
        raise NodePoolError(f"NodePool {pool}: {what} must be a map of quantities")
    out: dict[str, Fraction] = {}
    for key, value in raw.items():
        try:
            out[str(key)] = parse_quantity(value, f"{what}.{key}")
        except CodecError as exc:
            raise NodePoolError(f"NodePool {pool}: {exc}") from None
    return out
