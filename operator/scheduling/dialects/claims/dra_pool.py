"""A DRA node's cards as the engine sees them: read from the node's ResourceSlices.

The slice is what every allocator counts against (kube-scheduler included), so the engine
takes a DRA node's cards from it, not from the DeviceInventory: capacities, request
policies, taints and attributes exactly as published. Each device of this project's
driver becomes one engine card (``model.DeviceInfo``) named by its device name, with
``memory`` in MiB, ``cores``, ``shares`` as the card's slot count, the ``type``
attribute as HAMi's type and the NUMA node from ``resource.kubernetes.io/numaNode``; the
full device (``PoolDevice``) stays beside it for what only DRA knows: selectors,
request-policy rounding and taints (``capacity_consumed``).

Pure: slices in, cards out. The pool is the node's (one pool per node, named after it);
a pool whose slices disagree on the generation keeps only the newest generation's, as
upstream does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from vgpu_operator.devices import dra, model
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.cel.claim_cel import DeviceView
from vgpu_operator.wire import (
    DeviceAttribute,
    DeviceCapacity,
    ResourceSlice,
    SliceDevice,
    Toleration,
)


@dataclass(frozen=True, slots=True)
class CapacityPolicy:
    """One capacity of a device and its request policy (all amounts exact)."""

    value: Fraction
    default: Fraction | None = None
    minimum: Fraction | None = None
    maximum: Fraction | None = None
    step: Fraction | None = None
    valid_values: tuple[Fraction, ...] = ()
    has_policy: bool = False

    def consumed(self, requested: Fraction | None) -> Fraction | None:
        """What a request consumes (upstream's rounding: the default when nothing is
        asked, up to the range's step or the next valid value), or None where the
        result breaks the policy (above the maximum, off the step, not a valid value)."""
        if requested is None:
            amount = self.default if self.default is not None else self.value
        elif not self.has_policy:
            amount = requested
        elif self.minimum is not None:
            amount = max(requested, self.minimum)
            if self.step is not None and self.step > 0:
                steps = -(-(amount - self.minimum) // self.step)
                amount = self.minimum + steps * self.step
        elif self.valid_values:
            amount = next((v for v in self.valid_values if requested <= v), requested)
        else:
            amount = requested
        if self.has_policy and not (self.default is not None and amount == self.default):
            if self.maximum is not None and amount > self.maximum:
                return None
            if self.minimum is not None and self.step:
                if (amount - self.minimum) % self.step:
                    return None
            elif self.valid_values and amount not in self.valid_values:
                return None
        return amount


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class PoolDevice:
    """One device of the node's pool, as published."""

    driver: str
    pool: str
    name: str
    generation: int
    attributes: Mapping[str, tuple[str, Any]]
    #: Capacity name as the slice writes it -> its policy.
    capacity: Mapping[str, CapacityPolicy]
    allow_multiple: bool
    taints: tuple[Taint, ...] = ()
    #: The CEL view, built on first use: a node's Fit asks it of every device, every
    #: decision (the device is immutable, so one view serves them all).
    _view: DeviceView | None = field(default=None, init=False, repr=False, compare=False)
    _shape: int = field(default=-1, init=False, repr=False, compare=False)

    @property
    def view(self) -> DeviceView:
        if self._view is None:
            view = DeviceView(
                self.driver,
                self.allow_multiple,
                self.attributes,
                {_qualify(k, self.driver): str(v.value) for k, v in self.capacity.items()},
            )
            object.__setattr__(self, "_view", view)
            return view
        return self._view

    @property
    def capacity_shape(self) -> int:
        """A number shared by the devices whose capacities and request policies are
        equal (every card of one model, as published): what a request consumes of a
        device depends only on it (``claims.eligible``)."""
        if self._shape < 0:
            key = (self.driver, self.allow_multiple, tuple(sorted(self.capacity.items())))
            shape = _SHAPES.setdefault(key, len(_SHAPES))
            object.__setattr__(self, "_shape", shape)
            return shape
        return self._shape

    @property
    def key(self) -> tuple[str, str, int]:
        """Identifies the device as published (a selector's verdict holds for it)."""
        return (self.pool, self.name, self.generation)

    def attribute(self, qualified: str) -> Any:
        """An attribute's value by its qualified name (short names are the driver's)."""
        found = self.attributes.get(_qualify(qualified, self.driver))
        return None if found is None else found[1]

    def capacity_named(self, name: str) -> str | None:
        """The slice's key of a capacity named short or fully qualified."""
        if name in self.capacity:
            return name
        short = name.removeprefix(f"{self.driver}/")
        return short if short in self.capacity else None


#: Capacity shapes seen (driver, multiple allocations, capacities) -> their number; as
#: many as distinct card models and request policies published.
_SHAPES: dict[tuple[Any, ...], int] = {}


def _qualify(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


@dataclass(slots=True)
class Pool:
    """A node's pool of this driver's devices, and the engine cards made of them."""

    node: str
    devices: dict[str, PoolDevice] = field(default_factory=dict)
    cards: tuple[model.DeviceInfo, ...] = ()
    problems: tuple[str, ...] = ()


def _amount(raw: Any, where: str) -> Fraction:
    return parse_quantity(raw, where)


def _policy(entry: DeviceCapacity, where: str) -> CapacityPolicy:
    value = _amount(entry.get("value"), f"{where}.value")
    policy = entry.get("requestPolicy")
    if not isinstance(policy, Mapping):
        return CapacityPolicy(value)
    valid_range = policy.get("validRange") if isinstance(policy.get("validRange"), Mapping) else {}
    assert isinstance(valid_range, Mapping)

    def optional(raw: Any, name: str) -> Fraction | None:
        return None if raw is None else _amount(raw, f"{where}.requestPolicy.{name}")

    return CapacityPolicy(
        value=value,
        default=optional(policy.get("default"), "default"),
        minimum=optional(valid_range.get("min"), "validRange.min"),
        maximum=optional(valid_range.get("max"), "validRange.max"),
        step=optional(valid_range.get("step"), "validRange.step"),
        valid_values=tuple(
            sorted(
                _amount(v, f"{where}.requestPolicy.validValues")
                for v in policy.get("validValues") or ()
            )
        ),
        has_policy=True,
    )


def _attributes(raw: Mapping[str, DeviceAttribute], driver: str) -> dict[str, tuple[str, Any]]:
    out: dict[str, tuple[str, Any]] = {}
    for name, typed in raw.items():
        if not isinstance(typed, Mapping):
            continue
        for kind in ("int", "bool", "string", "version"):
            if kind in typed:
                out[_qualify(str(name), driver)] = (kind, typed[kind])
                break
    return out


def read_device(raw: SliceDevice, driver: str, pool: str, generation: int) -> PoolDevice:
    """Raises CodecError for a capacity that is not a quantity."""
    name = str(raw.get("name", ""))
    where = f"device {name}"
    capacity = {
        str(k): _policy(v, f"{where}.capacity.{k}")
        for k, v in (raw.get("capacity") or {}).items()
        if isinstance(v, Mapping)
    }
    taints = tuple(
        Taint(str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
        for t in raw.get("taints") or ()
        if isinstance(t, Mapping)
    )
    return PoolDevice(
        driver=driver,
        pool=pool,
        name=name,
        generation=generation,
        attributes=_attributes(raw.get("attributes") or {}, driver),
        capacity=capacity,
        allow_multiple=bool(raw.get("allowMultipleAllocations", False)),
        taints=taints,
    )


def read_pool(node: str, slices: Iterable[ResourceSlice]) -> Pool:
    """The node's pool of this driver from its slices (those of other drivers, nodes or
    pools are ignored; only the newest generation counts)."""
    mine = []
    for item in slices:
        spec = item.get("spec") or {}
        pool = spec.get("pool") or {}
        if spec.get("driver") != dra.DRIVER or spec.get("nodeName") != node:
            continue
        if pool.get("name") != node:
            continue
        mine.append((int(pool.get("generation") or 0), spec))
    if not mine:
        return Pool(node)
    newest = max(generation for generation, _ in mine)
    result = Pool(node)
    problems: list[str] = []
    for generation, spec in mine:
        if generation != newest:
            continue
        for raw in spec.get("devices") or ():
            if not isinstance(raw, Mapping):
                continue
            if raw.get("consumesCounters"):
                # A partition (a MIG instance placement) or a device sharing counters
                # with partitions: never an engine card. ``mig_partitions`` reads them
                # with their counters; left out here, nothing allocates them blind.
                continue
            try:
                device = read_device(raw, dra.DRIVER, node, generation)
            except CodecError as exc:
                problems.append(f"{node}: {exc}")
                continue
            result.devices[device.name] = device
    result.cards = tuple(_card(d) for d in result.devices.values())
    result.problems = tuple(problems)
    return result


def _whole(value: Fraction | None) -> int:
    return 0 if value is None else int(value)


def _card(device: PoolDevice) -> model.DeviceInfo:
    """The engine's card for one device: memory in MiB (rounded down: never more than the
    slice has), cores and shares as published; a device without ``shares`` takes one
    claim at a time unless it allows multiple allocations (then as many as it has MiB)."""
    memory = device.capacity.get(dra.MEMORY)
    cores = device.capacity.get(dra.CORES)
    shares = device.capacity.get(dra.SHARES)
    count = _whole(shares.value) if shares is not None else 1
    numa = device.attribute(dra.ATTR_NUMA_NODE)
    return model.DeviceInfo(
        id=device.name,
        index=int(device.attribute(dra.ATTR_INDEX) or 0),
        count=max(count, 1) if device.allow_multiple else 1,
        memory_mib=0 if memory is None else int(memory.value // dra.MIB),
        cores=dra.FULL_CORES if cores is None else _whole(cores.value),
        type=str(device.attribute(dra.ATTR_TYPE) or device.attribute(dra.ATTR_PRODUCT) or ""),
        numa=int(numa) if isinstance(numa, int) else 0,
        health=True,
        mode=str(device.attribute(dra.ATTR_MODE) or model.MODE_HAMI_CORE),
    )


def pair_scores(pool: Pool, inventory_scores: model.PairScores) -> dict[str, dict[str, int]]:
    """The inventory's link scores, keyed by device name; without them, the published
    ``nvlinkIsland`` (cards of one island score as linked)."""
    by_uuid = {str(d.attribute(dra.ATTR_UUID)): d.name for d in pool.devices.values()}
    scores: dict[str, dict[str, int]] = {}
    for uuid, peers in inventory_scores.items():
        name = by_uuid.get(uuid)
        if name is None:
            continue
        scores[name] = {by_uuid[p]: s for p, s in peers.items() if p in by_uuid}
    if scores:
        return scores
    islands: dict[int, list[str]] = {}
    for device in pool.devices.values():
        island = device.attribute(dra.ATTR_NVLINK_ISLAND)
        if isinstance(island, int):
            islands.setdefault(island, []).append(device.name)
    for names in islands.values():
        for name in names:
            scores[name] = {peer: 100 for peer in names if peer != name}
    return scores


def tolerated(taints: Sequence[Taint], tolerations: Sequence[Toleration]) -> bool:
    """Whether every NoSchedule/NoExecute taint of a device is tolerated (a request's
    tolerations, upstream's rules: an empty key with Exists tolerates all)."""
    for taint in taints:
        if taint.effect not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def _tolerates(toleration: Toleration, taint: Taint) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    if (toleration.get("operator") or "Equal") == "Exists":
        return not key or key == taint.key
    return key == taint.key and (toleration.get("value") or "") == taint.value
