"""The two records of a pod's MIG instances: the seed's suffix and HAMi v2.10's JSON.

The seed names an instance by a suffix on the card's UUID in the allocation annotation
(``GPU-a[geometry-slot]``); HAMi v2.10 keeps the plain UUID there and describes the
instance in ``hami.io/vgpu-mig-allocations`` (profile and placement). This operator
writes both for a card described by the device config's geometries, so either device
plugin finds what it reads, and only the JSON for a card that publishes its own profiles
(HAMi v2.10's form, where no geometry exists). It reads both when it rebuilds its books:

- an entry whose instance the card's table names gets the engine's suffix for it
  (``[geometry-slot]``, or ``[profile-placement]`` on a card that publishes profiles);
- an entry the table does not name (HAMi v2.10 placed it by its own rules) still
  occupies its slices: it comes back as a *spot*, booked by ``placement.book``;
- a device of a card that publishes its profiles with no entry at all is an instance
  whose place nobody recorded: its card is closed (HAMi v2.10 fails closed the same way).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from vgpu_operator.devices import codec, mig_allocations, model
from vgpu_operator.devices.mig_allocations import MigAllocation
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.mig import mig

#: A MIG card's table by its UUID; None when the card is not a MIG card (or not known yet).
TableOf = Callable[[str], mig.MigTable | None]


@dataclass(frozen=True, slots=True)
class Spot:
    """An instance known only by where it sits: ``size`` slices from ``start``."""

    card: str
    start: int
    size: int


def records_for(single: model.PodSingleDevice, table_of: TableOf) -> list[MigAllocation]:
    """HAMi v2.10's entries for the MIG instances (engine suffixes) of one vendor's
    allocation; an instance whose place is unknown (a profile name outside NVIDIA's
    ``Ng.…`` form, on a geometry card) gets none: its suffix says it."""
    records = []
    for container_index, container in enumerate(single):
        for device_index, device in enumerate(container):
            base, instance = codec.split_mig_uuid(device.uuid)
            table = table_of(base)
            if instance is None or table is None:
                continue
            described = mig.describe(table, *instance)
            if described is None:
                continue
            profile, start, size = described
            records.append(MigAllocation(container_index, device_index, base, profile, start, size))
    return records


def to_wire(single: model.PodSingleDevice, table_of: TableOf) -> model.PodSingleDevice:
    """The allocation as the annotation carries it: a card that publishes its profiles
    is named plainly (its instance is in the JSON entry, as HAMi v2.10 writes it); a
    geometry card keeps the seed's suffix."""

    def wire(device: model.ContainerDevice) -> model.ContainerDevice:
        base, instance = codec.split_mig_uuid(device.uuid)
        table = table_of(base) if instance is not None else None
        if table is None or not table.published:
            return device
        return model.ContainerDevice(base, device.vendor, device.memory_mib, device.cores)

    return tuple(tuple(wire(d) for d in container) for container in single)


def read(annotations: Mapping[str, str]) -> tuple[MigAllocation, ...]:
    """A pod's HAMi v2.10 entries; an unreadable annotation counts as none."""
    try:
        return tuple(mig_allocations.decode(annotations.get(mig_allocations.FIELD, "")))
    except CodecError:
        return ()


def choose_geometries(records: Iterable[MigAllocation], table_of: TableOf) -> dict[str, int]:
    """Per geometry card, the first geometry that holds every instance the entries name
    there (none when no geometry holds them all: then slices decide, ``mig``).

    HAMi v2.10 has no geometries: its instances on one card (from all pods there) are
    read as slots of one geometry where they can be, so the card keeps the seed's rule.
    """
    by_card: dict[str, set[tuple[str, int, int]]] = {}
    for record in records:
        by_card.setdefault(record.gpu_uuid, set()).add((record.profile, record.start, record.size))
    chosen: dict[str, int] = {}
    for uuid, instances in by_card.items():
        table = table_of(uuid)
        if table is None or table.published:
            continue
        for geometry in range(len(table.geometries)):
            if all(
                (found := mig.find_instance(table, *instance, prefer=geometry)) is not None
                and found[0] == geometry
                for instance in instances
            ):
                chosen[uuid] = geometry
                break
    return chosen


def resolve(
    single: model.PodSingleDevice,
    records: Sequence[MigAllocation],
    table_of: TableOf,
    prefer: Mapping[str, int] | None = None,
) -> tuple[model.PodSingleDevice, list[Spot]]:
    """``single`` (as decoded from the annotation) in the engine's terms, and the spots
    of the instances no suffix can stand for (see the module docstring).

    ``prefer`` names each geometry card's geometry (``choose_geometries``). A suffix the
    annotation already carries on a geometry card is kept (this operator writes both
    records). A seed suffix on a card that publishes profiles is read by the device
    config's geometries and becomes a spot; one they do not place closes the card.
    """
    prefer = prefer or {}
    by_position = {(r.container_index, r.device_index): r for r in records}
    consumed: set[tuple[int, int]] = set()
    spots: list[Spot] = []
    containers = []
    for container_index, container in enumerate(single):
        devices = []
        for device_index, device in enumerate(container):
            base, instance = _split(device.uuid)
            table = table_of(base)
            record = by_position.get((container_index, device_index))
            if record is not None and record.gpu_uuid != base:
                record = None
            uuid = device.uuid
            if table is not None and record is not None:
                consumed.add((container_index, device_index))
                if instance is None or table.published:
                    found = mig.find_instance(
                        table, record.profile, record.start, record.size, prefer.get(base)
                    )
                    if found is None:
                        spots.append(Spot(base, record.start, record.size))
                        uuid = base
                    else:
                        uuid = _join(base, *found)
            elif table is not None and table.published:
                uuid = _unrecorded(base, instance, table, spots)
            devices.append(
                model.ContainerDevice(uuid, device.vendor, device.memory_mib, device.cores)
            )
        containers.append(tuple(devices))
    for position, record in by_position.items():
        if position not in consumed and table_of(record.gpu_uuid) is not None:
            # An entry with no device at its place (HAMi v2.10 restores these too).
            spots.append(Spot(record.gpu_uuid, record.start, record.size))
    return tuple(containers), spots


def _unrecorded(
    base: str, instance: tuple[int, int] | None, table: mig.MigTable, spots: list[Spot]
) -> str:
    """A device of a card that publishes profiles, without a JSON entry: a seed suffix
    the device config's geometries place becomes a spot, anything else closes the card
    (a suffix past the card's profiles, which ``mig.restore`` refuses)."""
    if instance is not None:
        described = mig.describe(mig.MigTable(table.geometries), *instance)
        if described is not None:
            spots.append(Spot(base, described[1], described[2]))
            return base
    return _join(base, len(table.profiles), 0)


def _split(uuid: str) -> tuple[str, tuple[int, int] | None]:
    try:
        return codec.split_mig_uuid(uuid)
    except CodecError:
        return uuid, None


def _join(base: str, first: int, second: int) -> str:
    # A card id that cannot carry a suffix is booked as it stands.
    with contextlib.suppress(CodecError):
        return codec.join_mig_uuid(base, first, second)
    return base
