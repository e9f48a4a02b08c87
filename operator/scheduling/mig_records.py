"""The two records of a pod's MIG instances: the seed's suffix and HAMi v2.10's JSON.

The seed names an instance by a suffix on the card's UUID in the allocation annotation
(``GPU-a[geometry-slot]``); HAMi v2.10 keeps the plain UUID there and describes the
instance in ``hami.io/vgpu-mig-allocations`` (profile and placement). This operator
writes both, so either device plugin finds what it reads, and reads both when it
rebuilds its books: a pod placed by HAMi v2.10 gets the suffix its JSON entry stands for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence

from vgpu_operator.devices import codec, mig_allocations, model
from vgpu_operator.devices.mig_allocations import MigAllocation
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling import mig

#: A card's MIG geometries by its UUID; None when the card is not known (yet).
GeometriesOf = Callable[[str], Sequence[model.Geometry] | None]


def records_for(single: model.PodSingleDevice, geometries_of: GeometriesOf) -> list[MigAllocation]:
    """HAMi v2.10's entries for the suffixed devices of one vendor's allocation."""
    records = []
    for container_index, container in enumerate(single):
        for device_index, device in enumerate(container):
            base, instance = codec.split_mig_uuid(device.uuid)
            geometries = geometries_of(base)
            if instance is None or geometries is None:
                continue
            described = mig.describe(geometries, *instance)
            if described is None:
                continue  # a profile without NVIDIA's placement rules: the suffix says it
            profile, start, size = described
            records.append(MigAllocation(container_index, device_index, base, profile, start, size))
    return records


def read(annotations: Mapping[str, str]) -> tuple[MigAllocation, ...]:
    """A pod's HAMi v2.10 entries; an unreadable annotation counts as none."""
    try:
        return tuple(mig_allocations.decode(annotations.get(mig_allocations.FIELD, "")))
    except CodecError:
        return ()


def choose_geometries(
    records: Iterable[MigAllocation], geometries_of: GeometriesOf
) -> dict[str, int]:
    """Per card, the first geometry that holds every instance the entries name there.

    HAMi v2.10 has no geometries: its instances on one card (from all pods there) must
    be read as slots of one geometry, or the card would be booked in two at once.
    """
    by_card: dict[str, set[tuple[str, int, int]]] = {}
    for record in records:
        by_card.setdefault(record.gpu_uuid, set()).add((record.profile, record.start, record.size))
    chosen: dict[str, int] = {}
    for uuid, instances in by_card.items():
        geometries = geometries_of(uuid)
        if geometries is None:
            continue
        for geometry in range(len(geometries)):
            if all(
                (found := mig.find_instance(geometries, *instance, prefer=geometry)) is not None
                and found[0] == geometry
                for instance in instances
            ):
                chosen[uuid] = geometry
                break
    return chosen


def with_suffixes(
    single: model.PodSingleDevice,
    records: Sequence[MigAllocation],
    geometries_of: GeometriesOf,
    prefer: Mapping[str, int] | None = None,
) -> model.PodSingleDevice:
    """``single`` with the seed suffix on each plain device a JSON entry describes, in
    the card's geometry from ``prefer`` (``choose_geometries``) where it has the instance.

    An entry whose instance no geometry of the card has gets a geometry index past the
    card's table: booking it then marks the card unhealthy (``mig.restore``), because
    the card's real partition is unknown and nothing new may be placed there.
    """
    prefer = prefer or {}
    by_position = {(r.container_index, r.device_index): r for r in records}
    containers = []
    for container_index, container in enumerate(single):
        devices = []
        for device_index, device in enumerate(container):
            record = by_position.get((container_index, device_index))
            uuid = device.uuid
            geometries = None if record is None else geometries_of(record.gpu_uuid)
            if record is not None and geometries is not None and uuid == record.gpu_uuid:
                found = mig.find_instance(
                    geometries,
                    record.profile,
                    record.start,
                    record.size,
                    prefer=prefer.get(record.gpu_uuid),
                )
                geometry, slot = found if found is not None else (len(geometries), 0)
                # A card id that cannot carry a suffix is booked as it stands.
                with contextlib.suppress(CodecError):
                    uuid = codec.join_mig_uuid(uuid, geometry, slot)
            devices.append(
                model.ContainerDevice(uuid, device.vendor, device.memory_mib, device.cores)
            )
        containers.append(tuple(devices))
    return tuple(containers)
