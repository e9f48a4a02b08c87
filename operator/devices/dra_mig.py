"""A MIG card as DRA partitionable devices (KEP-4815, ``resource.k8s.io/v1``; pure).

A card in MIG mode is published as one counter set and one device per profile placement:

- the counter set (``<card>-counters``, in the pool's counters slice: upstream allows
  ``sharedCounters`` and ``devices`` in one slice never both) holds one counter per memory
  slice (``memory-slice-0`` .. ``memory-slice-7``, value 1 each) and ``compute-slices``
  (7 on A100/H100). Counting each memory slice apart is what makes two placements that
  overlap on the card exclude each other: a total of 8 would let ``3g`` at 0 and ``4g``
  at 0 both be allocated;
- each placement of each profile (HAMi v2.10's geometry: the profiles of NVML, each at
  every start NVML allows) is a device ``<card>-mig-<profile>-<start>`` that consumes its
  memory slices and its compute slices. Its ``memory`` capacity is the instance's, so a
  claim's selector can ask for one by size as well as by ``profile``.

The allocator (upstream's or the engine's) then never gives two overlapping instances,
nor more compute slices than the card has. A card offered both as MIG slices and as a
HAMi-core share device (``shared_device_counters``) consumes every counter with its share
device, so the two offers exclude each other: while any share is held no instance fits,
and the other way round.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from vgpu_operator.devices import dra
from vgpu_operator.errors import CodecError
from vgpu_operator.wire import OwnerReference, ResourceSlice

#: The DeviceClass of MIG instances (manifests/dra-deviceclasses.yaml).
MIG_CLASS: Final = dra.MIG_CLASS
#: Attribute names of a MIG device (the driver's domain).
ATTR_PROFILE: Final = "profile"
ATTR_MIG_START: Final = "migStart"
ATTR_MIG_SIZE: Final = "migSize"
ATTR_COMPUTE_SLICES: Final = "computeSlices"
ATTR_PARENT: Final = "parent"

COMPUTE_COUNTER: Final = "compute-slices"
MEMORY_SLICES: Final = 8
COMPUTE_SLICES: Final = 7

_PREFIX_RE: Final = re.compile(r"^([0-9]+)g\.([0-9]+)gb$")


def memory_counter(index: int) -> str:
    return f"memory-slice-{index}"


@dataclass(frozen=True, slots=True)
class Profile:
    """One MIG profile of a card model: its instance size and every start NVML allows."""

    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    starts: tuple[int, ...]


#: NVIDIA's GPU-instance geometry on A100 and H100 (NVML's possible placements), by
#: compute slices: (memory slices, starts). The same table ``scheduling.mig.mig`` lays the
#: seed's geometries out by.
_GEOMETRY: Final = {
    1: (1, (0, 1, 2, 3, 4, 5, 6)),
    2: (2, (0, 2, 4)),
    3: (4, (0, 4)),
    4: (4, (0,)),
    7: (8, (0,)),
}


def geometry_of(compute_slices: int) -> tuple[int, tuple[int, ...]] | None:
    """A profile's memory slices and the starts NVML allows it, by its compute slices
    (None: no such profile on these cards)."""
    return _GEOMETRY.get(compute_slices)


def profiles_for(card_memory_mib: int) -> tuple[Profile, ...]:
    """The MIG profiles of an A100/H100 card of this memory, smallest first (HAMi v2.10's
    order: memory, then slices). Memory per slice is the card's eighth, rounded down to
    the nearest GiB as NVIDIA names them (40 GB card: ``1g.5gb``; 80 GB: ``1g.10gb``)."""
    # Rounded to the nearest GiB: an "80 GB" H100 reports 81559 MiB, and NVIDIA still
    # names its smallest instance 1g.10gb.
    per_slice_gb = max(round(card_memory_mib / 1024 / MEMORY_SLICES), 1)
    out = []
    for compute, (memory_slices, starts) in _GEOMETRY.items():
        gb = per_slice_gb * memory_slices
        out.append(Profile(f"{compute}g.{gb}gb", compute, memory_slices, gb * 1024, starts))
    return tuple(sorted(out, key=lambda p: (p.memory_mib, p.compute_slices)))


#: Card models whose MIG geometry is the table above (NVML's placements on these).
MIG_MODELS: Final = ("A100", "A800", "H100", "H800", "H200")


def has_geometry(product: str) -> bool:
    """Whether the card's model has the geometry this module publishes."""
    return any(m in product for m in MIG_MODELS)


def parse_profile(name: str) -> tuple[int, int] | None:
    """``3g.40gb`` -> (3, 40); None for any other form."""
    match = _PREFIX_RE.match(name)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


@dataclass(frozen=True, slots=True)
class MigCardShape:
    """One MIG-mode card as the driver offers it."""

    uuid: str
    index: int
    product: str
    hami_type: str
    memory_mib: int
    healthy: bool = True
    numa_node: int | None = None
    #: Instances on the card that no claim of this driver holds (made before the agent
    #: started, or by someone else): (first memory slice, memory slices, compute slices).
    #: Their slices are taken out of the card's counters. None: one whose placement
    #: cannot be read is there, so the card offers nothing.
    taken: tuple[tuple[int, int, int], ...] | None = ()

    @property
    def name(self) -> str:
        return dra.device_name(self.uuid)

    @property
    def counter_set(self) -> str:
        return counter_set_name(self.uuid)

    def profiles(self) -> tuple[Profile, ...]:
        return profiles_for(self.memory_mib)


def counter_set_name(uuid: str) -> str:
    return f"{dra.device_name(uuid)}-counters"


def instance_name(card_uuid: str, profile: str, start: int) -> str:
    """``gpu-…-mig-3g-40gb-4``: a DNS label (the profile's dot becomes a dash)."""
    name = f"{dra.device_name(card_uuid)}-mig-{profile.replace('.', '-')}-{start}"
    if len(name) > 63:
        raise CodecError("device", f"MIG device name {name!r} is longer than a DNS label")
    return name


def counter_set_wire(card: MigCardShape) -> dict[str, Any]:
    """The card's ``sharedCounters`` entry: every memory slice and compute slice, less
    those of the instances no claim holds (``taken``), so that no allocator gives a
    placement over one."""
    if card.taken is None:
        held, compute = set(range(MEMORY_SLICES)), COMPUTE_SLICES
    else:
        held = {i for start, size, _ in card.taken for i in range(start, start + size)}
        compute = sum(c for _, _, c in card.taken)
    counters = {
        memory_counter(i): {"value": "0" if i in held else "1"} for i in range(MEMORY_SLICES)
    }
    counters[COMPUTE_COUNTER] = {"value": str(max(COMPUTE_SLICES - compute, 0))}
    return {"name": card.counter_set, "counters": counters}


def placement_counters(profile: Profile, start: int) -> dict[str, dict[str, str]]:
    """What one instance consumes: its memory slices and its compute slices."""
    counters = {
        memory_counter(i): {"value": "1"} for i in range(start, start + profile.memory_slices)
    }
    counters[COMPUTE_COUNTER] = {"value": str(profile.compute_slices)}
    return counters


def shared_device_counters(uuid: str) -> list[dict[str, Any]]:
    """The ``consumesCounters`` of a card's share device when the card is offered both
    ways: every counter, so shares and instances never hold the card at once."""
    counters = {memory_counter(i): {"value": "1"} for i in range(MEMORY_SLICES)}
    counters[COMPUTE_COUNTER] = {"value": str(COMPUTE_SLICES)}
    return [{"counterSet": counter_set_name(uuid), "counters": counters}]


def instance_devices(card: MigCardShape) -> list[dict[str, Any]]:
    """One ``spec.devices[]`` entry per profile placement, in profile order, then start."""
    devices = []
    for profile in card.profiles():
        for start in profile.starts:
            attributes: dict[str, dict[str, Any]] = {
                dra.ATTR_UUID: {"string": card.uuid},
                ATTR_PARENT: {"string": card.name},
                dra.ATTR_PRODUCT: {"string": card.product},
                dra.ATTR_TYPE: {"string": card.hami_type},
                dra.ATTR_INDEX: {"int": card.index},
                dra.ATTR_MODE: {"string": "mig"},
                ATTR_PROFILE: {"string": profile.name},
                ATTR_MIG_START: {"int": start},
                ATTR_MIG_SIZE: {"int": profile.memory_slices},
                ATTR_COMPUTE_SLICES: {"int": profile.compute_slices},
            }
            if card.numa_node is not None:
                attributes[dra.ATTR_NUMA_NODE] = {"int": card.numa_node}
            device: dict[str, Any] = {
                "name": instance_name(card.uuid, profile.name, start),
                "attributes": attributes,
                "capacity": {dra.MEMORY: {"value": f"{profile.memory_mib}Mi"}},
                "consumesCounters": [
                    {
                        "counterSet": card.counter_set,
                        "counters": placement_counters(profile, start),
                    }
                ],
            }
            if not card.healthy:
                device["taints"] = [
                    {
                        "key": dra.UNHEALTHY_TAINT_KEY,
                        "value": "unhealthy",
                        "effect": dra.UNHEALTHY_TAINT_EFFECT,
                    }
                ]
            devices.append(device)
    return devices


#: Upstream's limit on devices per slice when any consumes counters.
MAX_COUNTER_DEVICES_PER_SLICE: Final = 64


def counters_slice_name(node: str) -> str:
    return f"{node}-{dra.DRIVER}-counters"


def mig_slice_name(node: str, part: int) -> str:
    return f"{node}-{dra.DRIVER}-mig-{part}"


def pool_specs(
    node: str,
    shared: Sequence[Mapping[str, Any]],
    mig_cards: Sequence[MigCardShape],
) -> list[tuple[str, dict[str, Any]]]:
    """(slice name, the device list or counter sets) of a pool that holds MIG cards:
    the share devices' slice (``dra.slice_name``), one counters slice, and the MIG
    instances in slices of at most 64 devices. Without MIG cards: the one slice."""
    out: list[tuple[str, dict[str, Any]]] = [(dra.slice_name(node), {"devices": list(shared)})]
    if not mig_cards:
        return out
    out.append(
        (counters_slice_name(node), {"sharedCounters": [counter_set_wire(c) for c in mig_cards]})
    )
    instances = [d for card in mig_cards for d in instance_devices(card)]
    for part, begin in enumerate(range(0, len(instances), MAX_COUNTER_DEVICES_PER_SLICE)):
        chunk = instances[begin : begin + MAX_COUNTER_DEVICES_PER_SLICE]
        out.append((mig_slice_name(node, part), {"devices": chunk}))
    return out


def pool_slices(
    node: str,
    shared: Sequence[dra.CardShape],
    mig_cards: Sequence[MigCardShape],
    generation: int,
    owner: OwnerReference | None,
) -> list[ResourceSlice]:
    """Every ResourceSlice of ``node``'s pool, all of one generation and each counting
    the others (``resourceSliceCount``): upstream reads a pool only when it has them all.
    Without MIG cards this is ``dra.slice_wire``'s one slice."""
    first = dra.slice_wire(node, shared, generation, owner)
    specs = pool_specs(node, first["spec"].get("devices") or [], mig_cards)
    out: list[ResourceSlice] = []
    for name, body in specs:
        slice_ = copy.deepcopy(first)
        slice_["metadata"]["name"] = name
        spec = slice_["spec"]
        spec.pop("devices", None)
        spec["pool"]["resourceSliceCount"] = len(specs)
        if "devices" in body:
            spec["devices"] = body["devices"]
        if "sharedCounters" in body:
            spec["sharedCounters"] = body["sharedCounters"]
        out.append(slice_)
    return out
