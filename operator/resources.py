"""The DeviceInventory custom resource: its models, its CRD, and what the operator reads.

One DeviceInventory per node, named after it and owned by the Node object. The node
agent writes ``status`` (what it saw on the machine); administrators write ``spec``
(intent, such as cordoned cards). On the wire the fields are camelCase with units in
the names (``memoryMiB``); in Python they are snake_case.

``render_crd()`` builds the CustomResourceDefinition from these models, so the schema
the API server enforces and the models the code validates with cannot drift apart
(``crds/`` holds the rendered copy; a unit test checks it is up to date).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Final

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vgpu_operator import names
from vgpu_operator.devices import links, model, nvidia, plausibility
from vgpu_operator.errors import CodecError

#: What ``kubectl`` prints for the (singular) resource; the plural is in names.py.
SINGULAR: Final = "deviceinventory"
LIST_KIND: Final = "DeviceInventoryList"
CRD_NAME: Final = f"{names.DEVICE_INVENTORY_PLURAL}.{names.CRD_GROUP}"
API_VERSION: Final = f"{names.CRD_GROUP}/{names.CRD_VERSION}"
#: The file ``vgpu-operator crds`` writes (committed under crds/).
CRD_FILE_NAME: Final = f"{CRD_NAME}.yaml"

# PCI bus ids as NVML prints them: an 8-digit domain (4 in sysfs), bus, device, function.
_PCI_BUS_ID_PATTERN: Final = r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$"


class DeviceHealth(enum.StrEnum):
    """Whether a card can take new work."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


class DeviceMode(enum.StrEnum):
    """How a card is shared (HAMi's register mode strings)."""

    HAMI_CORE = model.MODE_HAMI_CORE
    MIG = model.MODE_MIG
    MPS = model.MODE_MPS


class ConditionStatus(enum.StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class _Wire(BaseModel):
    # Unknown keys are ignored rather than rejected: an older operator must still read
    # a newer agent's report (the API server's schema does the strict checking).
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


class MigInstance(_Wire):
    """A MIG instance present on a card."""

    uuid: str = Field(min_length=1, description="The instance's UUID (MIG-...).")
    profile: str | None = Field(None, description="The profile name, e.g. 1g.10gb.")
    memory_mib: int | None = Field(None, alias="memoryMiB", ge=0)
    gpu_instance_id: int | None = Field(None, alias="gpuInstanceId", ge=0)
    compute_instance_id: int | None = Field(None, alias="computeInstanceId", ge=0)
    placement_start: int | None = Field(
        None,
        alias="placementStart",
        ge=0,
        le=7,
        description="The first memory slice its GPU instance holds (NVML's placement).",
    )
    placement_size: int | None = Field(
        None,
        alias="placementSize",
        ge=1,
        le=8,
        description="How many memory slices its GPU instance holds.",
    )


class Link(_Wire):
    """How this card reaches one peer, as seen from this card."""

    peer: str = Field(min_length=1, description="The peer card's UUID.")
    peer_index: int = Field(alias="peerIndex", ge=0)
    p2p_level: links.P2PLevel = Field(
        alias="p2pLevel", description="Closest PCIe common ancestor of the two cards."
    )
    nvlinks: int = Field(0, ge=0, description="NVLinks between the two cards (0 = none).")


class Device(_Wire):
    """One physical card as the agent saw it."""

    uuid: str = Field(min_length=1)
    index: int = Field(ge=0, description="NVML index.")
    vendor: str = Field(nvidia.COMMON_WORD, min_length=1, description="Vendor common word.")
    model: str = Field(min_length=1, description="Model name as the driver reports it.")
    type: str = Field(
        min_length=1, description="HAMi type string (NVIDIA-<model> unless it starts so)."
    )
    memory_mib: int = Field(
        alias="memoryMiB",
        ge=0,
        le=plausibility.MAX_MEMORY_MIB,
        description="Registered memory (total x memory scaling).",
    )
    cores: int = Field(
        ge=0, le=plausibility.MAX_CORES, description="Registered compute, 100 x core scaling."
    )
    split_count: int = Field(
        alias="splitCount",
        ge=1,
        le=plausibility.MAX_SPLIT_COUNT,
        description="Tasks that may share it.",
    )
    numa_node: int | None = Field(None, alias="numaNode", ge=0, description="null if unknown.")
    pci_bus_id: str | None = Field(None, alias="pciBusId", pattern=_PCI_BUS_ID_PATTERN)
    health: DeviceHealth
    health_reason: str | None = Field(None, alias="healthReason")
    mode: DeviceMode = DeviceMode.HAMI_CORE
    mig_instances: tuple[MigInstance, ...] = Field((), alias="migInstances")
    links: tuple[Link, ...] = Field((), description="One entry per peer card.")


class InventorySummary(_Wire):
    """Totals for kubectl get (printer columns need plain JSONPath)."""

    gpu_count: int = Field(alias="gpuCount", ge=0)
    healthy_count: int = Field(alias="healthyCount", ge=0)
    model: str = Field("", description="The model, or the models joined by ', '.")
    total_memory_mib: int = Field(alias="totalMemoryMiB", ge=0)


class Condition(_Wire):
    """A Kubernetes-style condition."""

    type: str = Field(min_length=1)
    status: ConditionStatus
    reason: str = Field("", description="CamelCase reason.")
    message: str = ""
    last_transition_time: datetime = Field(alias="lastTransitionTime")


class DeviceInventorySpec(_Wire):
    """The administrator's intent for the node's cards."""

    cordoned_devices: tuple[str, ...] = Field(
        (), alias="cordonedDevices", description="Card UUIDs not to place new pods on."
    )


class DeviceInventoryStatus(_Wire):
    """What the node agent saw."""

    node_name: str = Field(alias="nodeName", min_length=1)
    backend: str = Field("", description="Where the readings came from: nvml or sim:<file>.")
    driver_version: str | None = Field(None, alias="driverVersion")
    cuda_version: str | None = Field(None, alias="cudaVersion")
    # Named heartbeat since agents moved it on its own; now set on each report only (the
    # node's heartbeat is its Lease, node_leases). Kept: an older agent still works.
    heartbeat: datetime = Field(
        description="When the agent last wrote this report. The node's liveness is its Lease "
        "in vgpu-node-leases (kubectl get leases -n vgpu-node-leases); agents before Leases "
        "moved this forward as their heartbeat."
    )
    # Keyed by UUID: the API server refuses a report that lists one card twice.
    devices: tuple[Device, ...] = Field(
        (),
        max_length=plausibility.MAX_DEVICES,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["uuid"]},
    )
    summary: InventorySummary
    conditions: tuple[Condition, ...] = Field(
        (),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


class DeviceInventory(_Wire):
    """A whole object, for reading; the agent writes spec and status separately."""

    KIND: ClassVar[str] = names.DEVICE_INVENTORY_KIND
    API_VERSION: ClassVar[str] = API_VERSION

    name: str
    spec: DeviceInventorySpec = DeviceInventorySpec()
    status: DeviceInventoryStatus | None = None


def status_to_wire(status: DeviceInventoryStatus) -> dict[str, Any]:
    """The status as JSON for a merge patch.

    Absent optional fields are sent as ``null`` at the top level, because in a merge
    patch an omitted key keeps its old value; inside lists nothing is needed (a list
    is replaced whole).
    """
    body = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    for field_name, info in DeviceInventoryStatus.model_fields.items():
        key = info.alias or field_name
        body.setdefault(key, None)
    return body


def parse_inventory(obj: Mapping[str, Any]) -> DeviceInventory:
    """Validate a DeviceInventory object as the API returns it (plain dict).

    Raises ``CodecError`` naming the first bad field (dotted path) on malformed content.
    """
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise CodecError("metadata.name", "a DeviceInventory needs a name")
    try:
        return DeviceInventory.model_validate(
            {"name": name, "spec": obj.get("spec") or {}, "status": obj.get("status")}
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise CodecError(where or "status", first["msg"]) from None


def devices_from_status(
    status: DeviceInventoryStatus,
) -> tuple[list[model.DeviceInfo], dict[str, dict[str, int]]]:
    """The cards and pair scores a status describes, as the scheduler sees a node.

    Cards are what HAMi's register annotation would hold (unknown NUMA is 0, as HAMi
    registers it); pair scores follow HAMi's rules over the reported links (a pair
    whose two directions disagree scores 0).
    """
    return devices_from_cards(status.devices, "status.devices")


def devices_from_cards(
    cards: Sequence[Device], where: str = "devices"
) -> tuple[list[model.DeviceInfo], dict[str, dict[str, int]]]:
    """``devices_from_status`` for a list of devices (an instance type's cards, too);
    ``where`` names the list in an error."""
    devices = [
        model.DeviceInfo(
            id=d.uuid,
            index=d.index,
            count=d.split_count,
            memory_mib=d.memory_mib,
            cores=d.cores,
            type=d.type,
            numa=0 if d.numa_node is None else d.numa_node,
            health=d.health is DeviceHealth.HEALTHY,
            mode=d.mode.value,
            vendor=d.vendor,
        )
        for d in cards
    ]
    p2p: dict[tuple[str, str], links.P2PLevel] = {}
    nvlinks: dict[tuple[str, str], int] = {}
    for d in cards:
        for link in d.links:
            p2p[(d.uuid, link.peer)] = link.p2p_level
            nvlinks[(d.uuid, link.peer)] = link.nvlinks
    uuids = [d.uuid for d in cards]
    try:
        scores = links.build_pair_scores(uuids, p2p, nvlinks)
    except ValueError as exc:
        raise CodecError(where, str(exc)) from None
    return devices, scores


def devices_from_inventory(
    obj: Mapping[str, Any],
) -> tuple[list[model.DeviceInfo], dict[str, dict[str, int]]]:
    """A DeviceInventory object (plain dict) -> the node's cards and pair scores.

    Raises ``CodecError`` when the object is malformed or has no status yet. Cordoned
    cards are still listed; ask ``cordoned_devices`` for them.
    """
    inventory = parse_inventory(obj)
    if inventory.status is None:
        raise CodecError("status", "the agent has not reported yet")
    return devices_from_status(inventory.status)


@dataclass(frozen=True, slots=True)
class InventoryReading:
    """What the scheduler takes from one DeviceInventory event, validated once."""

    devices: list[model.DeviceInfo]
    pair_scores: dict[str, dict[str, int]]
    cordoned: frozenset[str]
    heartbeat: datetime | None


def read_inventory(obj: Mapping[str, Any]) -> InventoryReading:
    """A DeviceInventory object (plain dict) read in one validation: its cards, pair
    scores, cordoned cards and heartbeat. Raises ``CodecError`` like
    ``devices_from_inventory``."""
    inventory = parse_inventory(obj)
    if inventory.status is None:
        raise CodecError("status", "the agent has not reported yet")
    devices, scores = devices_from_status(inventory.status)
    return InventoryReading(
        devices, scores, frozenset(inventory.spec.cordoned_devices), inventory.status.heartbeat
    )


def cordoned_devices(obj: Mapping[str, Any]) -> frozenset[str]:
    """The card UUIDs the administrator cordoned in ``spec.cordonedDevices``."""
    return frozenset(parse_inventory(obj).spec.cordoned_devices)


def heartbeat_of(obj: Mapping[str, Any]) -> datetime | None:
    """The agent's last heartbeat (timezone-aware), or None before its first report."""
    status = parse_inventory(obj).status
    return None if status is None else status.heartbeat


# --- The CustomResourceDefinition ------------------------------------------------------

_PRINTER_COLUMNS: Final = (
    {"name": "Node", "type": "string", "jsonPath": ".status.nodeName"},
    {"name": "GPUs", "type": "integer", "jsonPath": ".status.summary.gpuCount"},
    {"name": "Healthy", "type": "integer", "jsonPath": ".status.summary.healthyCount"},
    {"name": "Model", "type": "string", "jsonPath": ".status.summary.model"},
    {"name": "Memory MiB", "type": "integer", "jsonPath": ".status.summary.totalMemoryMiB"},
    # A date column prints as an age ("12m"): the time since the last report, which no
    # longer moves with the heartbeat. Node freshness: kubectl get leases -n vgpu-node-leases.
    {
        "name": "Last Report",
        "type": "date",
        "jsonPath": ".status.heartbeat",
        "description": "When the agent last wrote this report (on a change, or to re-assert "
        "it); the node's heartbeat is its Lease: kubectl get leases -n vgpu-node-leases",
    },
    # `-o wide` only (priority 1): where the readings come from, and the cordoned cards.
    {"name": "Backend", "type": "string", "jsonPath": ".status.backend", "priority": 1},
    {"name": "Driver", "type": "string", "jsonPath": ".status.driverVersion", "priority": 1},
    {"name": "CUDA", "type": "string", "jsonPath": ".status.cudaVersion", "priority": 1},
    {"name": "Cordoned", "type": "string", "jsonPath": ".spec.cordonedDevices", "priority": 1},
)

# JSON-schema keys that a structural OpenAPI v3 schema in a CRD does not accept, or that
# only repeat what the model says (titles, Python-side defaults).
_DROPPED_KEYS: Final = frozenset({"title", "default", "$defs"})


def render_crd() -> dict[str, Any]:
    """The DeviceInventory CustomResourceDefinition, as a manifest dict."""
    schema = {
        "type": "object",
        "description": "The GPUs of one node and how they are connected.",
        "x-kubernetes-validations": [
            {
                "rule": "!has(self.status) || self.status.nodeName == self.metadata.name",
                "message": "status.nodeName must equal metadata.name: an inventory describes "
                "only the node it is named after",
            }
        ],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _structural_schema(DeviceInventorySpec),
            "status": _structural_schema(DeviceInventoryStatus),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": names.CRD_GROUP,
            "scope": "Cluster",
            "names": {
                "kind": names.DEVICE_INVENTORY_KIND,
                "listKind": LIST_KIND,
                "plural": names.DEVICE_INVENTORY_PLURAL,
                "singular": SINGULAR,
                "shortNames": [names.DEVICE_INVENTORY_SHORT],
            },
            "versions": [
                {
                    "name": names.CRD_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(c) for c in _PRINTER_COLUMNS],
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


_CRD_HEADER: Final = (
    "# Generated from operator/resources.py by `vgpu-operator crds --output crds`.\n"
    "# Do not edit; change the models and render again.\n"
)


def render_crd_yaml() -> str:
    """``render_crd()`` as the YAML file committed under crds/."""
    return _CRD_HEADER + yaml.safe_dump(render_crd(), sort_keys=False, width=100)


def _structural_schema(model_cls: type[BaseModel]) -> dict[str, Any]:
    raw = model_cls.model_json_schema(by_alias=True, mode="serialization")
    defs = raw.get("$defs", {})
    converted: dict[str, Any] = _convert(raw, defs)
    return converted


def _convert(node: Any, defs: Mapping[str, Any]) -> Any:
    """Turn pydantic's JSON schema into a structural schema: refs inlined, optional
    values as ``nullable``, no titles or defaults."""
    if isinstance(node, list):
        return [_convert(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _convert(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o != {"type": "null"}]
        if len(options) != 1:
            raise ValueError(f"cannot express {node['anyOf']} in a structural schema")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        merged = {**_convert(options[0], defs), **_convert(rest, defs)}
        if len(options) != len(node["anyOf"]):
            merged["nullable"] = True
        return merged
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        else:
            out[key] = _convert(value, defs)
    return out
