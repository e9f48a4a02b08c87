"""The DRA shape of a shared card: one ResourceSlice device per card, and what a claim's
allocation says about it (pure; ``resource.k8s.io/v1`` with consumable capacity).

Both sides of DRA meet here, so that the node agent (which publishes the devices and
prepares claims) and a scheduler that allocates claims itself read the same vocabulary:

- ``CardShape`` -> ``device_wire``: a card as a ResourceSlice device. It may be allocated
  to many claims at once (``allowMultipleAllocations``), each consuming part of three
  capacities: ``memory`` (bytes, counted in MiB steps), ``cores`` (percent of the card's
  compute, HAMi-core's SM limit) and ``shares`` (HAMi's split count; one per claim). The
  request policies' defaults are what HAMi gives a request that names only a count:
  ``defaultMemory`` MiB, or the whole card when it is 0, and ``defaultCores``.
- ``read_allocation``: a ResourceClaim's ``status.allocation`` as the devices, consumed
  capacities and share IDs one driver was given on one node, checked as far as the claim
  alone allows (the card's own limits are checked by whoever holds the card).
- ``recount``: what all claims together consume of each device, for an over-commit check.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from vgpu_operator import names
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.errors import CodecError
from vgpu_operator.wire import (
    DeviceAttribute,
    DeviceTaint,
    ObjectMeta,
    OwnerReference,
    ResourceSlice,
    SliceDevice,
)

#: This project's DRA driver name (and the domain of its device attributes).
DRIVER: Final = "gpu.vgpu-operator.io"
API_VERSION: Final = "resource.k8s.io/v1"
#: The vendor whose cards the driver offers (its word in the vendor table): the engine's
#: DRA path books, fits and converts in this vendor's terms.
VENDOR: Final = "NVIDIA"

#: Capacity names (short names live in the driver's domain).
MEMORY: Final = "memory"
CORES: Final = "cores"
SHARES: Final = "shares"

#: Attribute names. Short ones are the driver's; the standard ones are Kubernetes'.
ATTR_UUID: Final = "uuid"
ATTR_PRODUCT: Final = "productName"
ATTR_TYPE: Final = "type"
ATTR_INDEX: Final = "index"
ATTR_MODE: Final = "mode"
ATTR_NVLINK_ISLAND: Final = "nvlinkIsland"
ATTR_NUMA_NODE: Final = "resource.kubernetes.io/numaNode"
ATTR_PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
ATTR_PCI_BUS_ID: Final = "resource.kubernetes.io/pciBusID"

#: The taint an unhealthy card carries: the scheduler leaves it alone, and claims already
#: on it keep running (NoSchedule, not NoExecute: a card that hiccups does not kill work).
UNHEALTHY_TAINT_KEY: Final = f"{DRIVER}/unhealthy"
UNHEALTHY_TAINT_EFFECT: Final = "NoSchedule"
#: The taint a lost card carries (fell off the bus, or NVML no longer counts it): nothing
#: new is allocated on it and the pods using it are evicted (kube-controller-manager's
#: device taint eviction, as for a node's NoExecute taint), since their work cannot go on.
LOST_TAINT_KEY: Final = f"{DRIVER}/lost"
LOST_TAINT_EFFECT: Final = "NoExecute"

#: Which path a node's cards are offered by (its label; the device plugin when absent).
#: One path per node: a card is never both a device-plugin slot and a DRA device.
NODE_PATH_LABEL: Final = f"{DRIVER}/path"
PATH_DRA: Final = "dra"
PATH_DEVICE_PLUGIN: Final = "device-plugin"
PATHS: Final = (PATH_DEVICE_PLUGIN, PATH_DRA)

#: DeviceClass names (manifests/dra-deviceclasses.yaml).
SHARED_CLASS: Final = DRIVER
EXCLUSIVE_CLASS: Final = f"exclusive.{DRIVER}"
#: MIG instances of cards in MIG mode (``dra_mig``): devices of mode ``mig``.
MIG_CLASS: Final = f"mig.{DRIVER}"

MIB: Final = 1024 * 1024
#: What one card's ``cores`` capacity is: percent of its compute.
FULL_CORES: Final = 100

_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class CardShape:
    """One card as the driver offers it: what the inventory reports, in DRA's terms."""

    uuid: str
    index: int
    product: str
    hami_type: str
    memory_mib: int
    cores: int
    split_count: int
    mode: str
    healthy: bool = True
    health_reason: str | None = None
    #: Unhealthy because it is gone (not merely sick): tainted NoExecute.
    lost: bool = False
    numa_node: int | None = None
    pci_bus_id: str | None = None
    pcie_root: str | None = None
    nvlink_island: int | None = None
    #: MiB a claim that names no memory consumes (HAMi's defaultMemory; 0: the whole card).
    default_memory_mib: int = 0
    #: Cores a claim that names no cores consumes (HAMi's defaultCores).
    default_cores: int = 0

    @property
    def name(self) -> str:
        return device_name(self.uuid)


def device_name(uuid: str) -> str:
    """The device's name in its slice: the card's UUID, lower-cased (a DNS label)."""
    name = uuid.lower()
    if not _DNS_LABEL.match(name):
        raise CodecError("device", f"card UUID {uuid!r} does not make a DRA device name")
    return name


def _mib(value: int) -> str:
    return f"{value}Mi"


def device_wire(card: CardShape) -> SliceDevice:
    """The ResourceSlice ``spec.devices[]`` entry of one card."""
    default_memory = card.memory_mib
    if 0 < card.default_memory_mib < card.memory_mib:
        default_memory = card.default_memory_mib
    attributes: dict[str, DeviceAttribute] = {
        ATTR_UUID: {"string": card.uuid},
        ATTR_PRODUCT: {"string": card.product},
        ATTR_TYPE: {"string": card.hami_type},
        ATTR_INDEX: {"int": card.index},
        ATTR_MODE: {"string": card.mode},
    }
    if card.numa_node is not None:
        attributes[ATTR_NUMA_NODE] = {"int": card.numa_node}
    if card.pci_bus_id is not None:
        attributes[ATTR_PCI_BUS_ID] = {"string": card.pci_bus_id}
    if card.pcie_root is not None:
        attributes[ATTR_PCIE_ROOT] = {"string": card.pcie_root}
    if card.nvlink_island is not None:
        attributes[ATTR_NVLINK_ISLAND] = {"int": card.nvlink_island}
    device: SliceDevice = {
        "name": card.name,
        "attributes": attributes,
        "allowMultipleAllocations": True,
        "capacity": {
            MEMORY: {
                "value": _mib(card.memory_mib),
                "requestPolicy": {
                    "default": _mib(default_memory),
                    "validRange": {"min": "1Mi", "max": _mib(card.memory_mib), "step": "1Mi"},
                },
            },
            CORES: {
                "value": str(card.cores),
                "requestPolicy": {
                    "default": str(min(card.default_cores, card.cores)),
                    "validRange": {"min": "0", "max": str(card.cores), "step": "1"},
                },
            },
            SHARES: {
                "value": str(card.split_count),
                "requestPolicy": {"default": "1", "validValues": ["1"]},
            },
        },
    }
    if not card.healthy:
        device["taints"] = [card_taint(card)]
    return device


def card_taint(card: CardShape) -> DeviceTaint:
    """The one taint of an unhealthy card: NoExecute when it is lost, else NoSchedule; the
    health reason as its value. Two keys, so that a request tolerating a sick card (to
    debug it) is still kept off a card that is gone."""
    lost = card.lost
    return {
        "key": LOST_TAINT_KEY if lost else UNHEALTHY_TAINT_KEY,
        "value": _taint_value(card.health_reason),
        "effect": LOST_TAINT_EFFECT if lost else UNHEALTHY_TAINT_EFFECT,
    }


def _taint_value(reason: str | None) -> str:
    """A taint value is a label value: 63 characters of ``[A-Za-z0-9_.-]``."""
    text = re.sub(r"[^A-Za-z0-9_.-]+", "-", reason or "unhealthy").strip("-_.")
    return (text[:63].rstrip("-_.")) or "unhealthy"


def slice_wire(
    node: str, cards: Sequence[CardShape], generation: int, owner: OwnerReference | None
) -> ResourceSlice:
    """The one ResourceSlice of ``node``'s pool (a pool per node, one slice per pool).
    ``owner``: an ownerReference, so the slice goes when its owner does."""
    metadata: ObjectMeta = {
        "name": slice_name(node),
        "labels": {names.MANAGED_BY_LABEL: names.MANAGED_BY_AGENT},
    }
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [device_wire(card) for card in cards],
        },
    }


def device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses of manifests/dra-deviceclasses.yaml: shared and exclusive use of
    this driver's cards that HAMi-core shares (both select the same devices; what an
    exclusive request holds is checked when it is prepared), and MIG instances of cards
    in MIG mode (the counter-consuming devices ``dra_mig`` publishes)."""

    def selecting(mode: str) -> dict[str, Any]:
        expression = (
            f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].{ATTR_MODE} == "{mode}"'
        )
        return {"selectors": [{"cel": {"expression": expression}}]}

    return [
        {
            "apiVersion": API_VERSION,
            "kind": "DeviceClass",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "vgpu-operator"}},
            "spec": selecting(mode),
        }
        for name, mode in (
            (SHARED_CLASS, "hami-core"),
            (EXCLUSIVE_CLASS, "hami-core"),
            (MIG_CLASS, "mig"),
        )
    ]


def slice_name(node: str) -> str:
    """The slice's object name: the node's, under the driver's."""
    return f"{node}-{DRIVER}"


# --- a claim's allocation ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Share:
    """One device a claim was allocated, and what it consumes of it."""

    request: str
    pool: str
    device: str
    share_id: str | None
    #: Consumed capacity, exact (bytes for memory); None where the allocation names none
    #: (a device allocated whole, without consumable capacity).
    memory_bytes: Fraction | None
    cores: Fraction | None
    shares: Fraction | None

    @property
    def memory_mib(self) -> int | None:
        """The memory in MiB, rounded up (the slice's step is 1 MiB, so it is exact)."""
        if self.memory_bytes is None:
            return None
        whole = -(-self.memory_bytes // MIB)
        return int(whole)


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    """What one claim was allocated by one driver on one node."""

    namespace: str
    name: str
    uid: str
    shares: tuple[Share, ...]
    #: The device class each request named (request name -> class), from the claim's spec.
    classes: Mapping[str, str] = field(default_factory=dict)


class AllocationUnreadable(Exception):
    """The claim's allocation is not one this driver can prepare; the message says why."""


def read_allocation(claim: Mapping[str, Any], driver: str, node: str) -> ClaimAllocation:
    """The results of ``claim`` that are ``driver``'s, checked to be for ``node`` (its pool
    is the node's name, and the allocation's node selector, if any, names the node).
    Raises AllocationUnreadable when the claim is not allocated, not to this node, or has
    no result for this driver."""
    meta = claim.get("metadata") or {}
    where = f"claim {meta.get('namespace')}/{meta.get('name')}"
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise AllocationUnreadable(f"{where} is not allocated")
    selected = selected_nodes(allocation.get("nodeSelector"))
    if selected is not None and node not in selected:
        raise AllocationUnreadable(
            f"{where} is allocated to node(s) {sorted(selected)}, not to {node}"
        )
    results = (allocation.get("devices") or {}).get("results") or []
    mine = [r for r in results if isinstance(r, Mapping) and r.get("driver") == driver]
    if not mine:
        raise AllocationUnreadable(f"{where} has no device allocated by driver {driver}")
    shares = []
    for result in mine:
        pool = str(result.get("pool", ""))
        if pool != node:
            raise AllocationUnreadable(
                f"{where}: request {result.get('request')!r} is allocated from pool "
                f"{pool!r}, not from this node's pool {node!r}"
            )
        shares.append(_share(result, where))
    return ClaimAllocation(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        shares=tuple(shares),
        classes=_request_classes(claim),
    )


def _share(result: Mapping[str, Any], where: str) -> Share:
    consumed = result.get("consumedCapacity") or {}
    if not isinstance(consumed, Mapping):
        raise AllocationUnreadable(f"{where}: consumedCapacity is not a map")

    def amount(key: str) -> Fraction | None:
        raw = consumed.get(key)
        if raw is None:
            return None
        try:
            value = parse_quantity(raw, f"consumedCapacity.{key}")
        except CodecError as exc:
            raise AllocationUnreadable(f"{where}: {exc}") from None
        if value < 0:
            raise AllocationUnreadable(f"{where}: consumedCapacity.{key} is negative")
        return value

    share_id = result.get("shareID")
    return Share(
        request=str(result.get("request", "")),
        pool=str(result.get("pool", "")),
        device=str(result.get("device", "")),
        share_id=None if share_id is None else str(share_id),
        memory_bytes=amount(MEMORY),
        cores=amount(CORES),
        shares=amount(SHARES),
    )


def _request_classes(claim: Mapping[str, Any]) -> dict[str, str]:
    """Request name (and ``request/subrequest`` for prioritized lists) -> device class."""
    classes: dict[str, str] = {}
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    for request in requests:
        if not isinstance(request, Mapping):
            continue
        name = str(request.get("name", ""))
        exactly = request.get("exactly")
        if isinstance(exactly, Mapping):
            classes[name] = str(exactly.get("deviceClassName", ""))
        for sub in request.get("firstAvailable") or []:
            if isinstance(sub, Mapping):
                classes[f"{name}/{sub.get('name', '')}"] = str(sub.get("deviceClassName", ""))
    return classes


def selected_nodes(selector: object) -> set[str] | None:
    """The node names an allocation's node selector pins it to (``metadata.name`` In or
    ``kubernetes.io/hostname`` In, the forms allocators write); None when it has none
    that names nodes."""
    if not isinstance(selector, Mapping):
        return None
    names: set[str] = set()
    found = False
    for term in selector.get("nodeSelectorTerms") or []:
        for key in ("matchFields", "matchExpressions"):
            for expression in (term or {}).get(key) or []:
                if expression.get("key") in ("metadata.name", "kubernetes.io/hostname") and (
                    expression.get("operator") == "In"
                ):
                    found = True
                    names.update(str(v) for v in expression.get("values") or [])
    return names if found else None


# --- counting what claims consume ----------------------------------------------------------


@dataclass(slots=True)
class Consumed:
    """What the claims allocated on one device consume together."""

    memory_bytes: Fraction = Fraction(0)
    cores: Fraction = Fraction(0)
    shares: Fraction = Fraction(0)
    claims: int = 0


def recount(
    claims: Iterable[Mapping[str, Any]], driver: str = DRIVER
) -> dict[tuple[str, str], Consumed]:
    """(pool, device) -> the sum of what every allocated claim consumes of it. Claims that
    are not allocated, or results of other drivers, count nothing."""
    totals: dict[tuple[str, str], Consumed] = {}
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation")
        if not isinstance(allocation, Mapping):
            continue
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") != driver:
                continue
            share = _share(result, "claim")
            key = (share.pool, share.device)
            total = totals.setdefault(key, Consumed())
            total.memory_bytes += share.memory_bytes or 0
            total.cores += share.cores or 0
            total.shares += share.shares or 0
            total.claims += 1
    return totals
