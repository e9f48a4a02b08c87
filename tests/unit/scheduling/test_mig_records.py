"""Both MIG records: the seed's suffix from HAMi v2.10's JSON and back (issues 14, 29)."""

from __future__ import annotations

from vgpu_operator.devices import model
from vgpu_operator.devices.mig_allocations import MigAllocation
from vgpu_operator.scheduling.mig import mig, mig_records
from vgpu_operator.scheduling.mig.mig_records import Spot

GEOMETRIES = (
    (model.MigTemplate("1g.5gb", 5120, 14, 7),),
    (model.MigTemplate("1g.5gb", 5120, 14, 1), model.MigTemplate("2g.10gb", 10240, 28, 3)),
)
PROFILES = (
    model.MigProfile("1g.5gb", 5120, 14, 1, tuple((s, 1) for s in range(7))),
    model.MigProfile("2g.10gb", 10240, 28, 2, ((0, 2), (2, 2), (4, 2))),
)


def _table_of(uuid: str) -> mig.MigTable | None:
    """GPU-m* run the device config's geometries, GPU-p* publish profiles."""
    if uuid.startswith("GPU-m"):
        return mig.MigTable(GEOMETRIES)
    if uuid.startswith("GPU-p"):
        return mig.MigTable(GEOMETRIES, PROFILES)
    return None


def _device(uuid: str, memory: int = 10240) -> model.ContainerDevice:
    return model.ContainerDevice(uuid, "NVIDIA", memory, 28)


def _plain(single: model.PodSingleDevice) -> model.PodSingleDevice:
    return tuple(tuple(_device(d.uuid.split("[")[0], d.memory_mib) for d in c) for c in single)


def test_records_and_suffixes_are_inverse() -> None:
    single = ((_device("GPU-m[1-2]"),), (), (_device("GPU-m[1-0]", 5120), _device("GPU-x")))
    records = mig_records.records_for(single, _table_of)
    assert records == [
        MigAllocation(0, 0, "GPU-m", "2g.10gb", 2, 2),
        MigAllocation(2, 0, "GPU-m", "1g.5gb", 6, 1),
    ]
    # A 1g.5gb at 6 is slot 6 of geometry 0 and slot 0 of geometry 1; only geometry 1 also
    # has the 2g.10gb at 2, so both entries are read in geometry 1.
    prefer = mig_records.choose_geometries(records, _table_of)
    assert prefer == {"GPU-m": 1}
    assert mig_records.resolve(_plain(single), records, _table_of, prefer) == (single, [])
    resolved, _ = mig_records.resolve(_plain(single), records, _table_of)
    assert resolved[2][0].uuid == "GPU-m[0-6]"
    # The seed's suffix stays on the wire for a geometry card.
    assert mig_records.to_wire(single, _table_of) == single


def test_published_instances_travel_plain_with_their_record() -> None:
    single = ((_device("GPU-p[1-2]"), _device("GPU-p[0-6]", 5120)),)
    records = mig_records.records_for(single, _table_of)
    assert records == [
        MigAllocation(0, 0, "GPU-p", "2g.10gb", 4, 2),
        MigAllocation(0, 1, "GPU-p", "1g.5gb", 6, 1),
    ]
    wire = mig_records.to_wire(single, _table_of)
    assert [d.uuid for d in wire[0]] == ["GPU-p", "GPU-p"]
    assert mig_records.resolve(wire, records, _table_of) == (single, [])


def test_instances_no_table_names_come_back_as_spots() -> None:
    single = ((_device("GPU-q"), _device("GPU-m")), (_device("GPU-p"),))
    records = [
        MigAllocation(0, 0, "GPU-q", "2g.10gb", 0, 2),
        MigAllocation(0, 1, "GPU-m", "3g.20gb", 0, 4),
        MigAllocation(1, 0, "GPU-p", "2g.10gb", 1, 2),
        MigAllocation(3, 0, "GPU-m", "1g.5gb", 5, 1),
    ]
    resolved, spots = mig_records.resolve(single, records, _table_of)
    # GPU-q is not a known MIG card (yet): unchanged. The 3g.20gb (no geometry has one)
    # and the 2g.10gb at 1 (not a published place) keep their slices as spots, and so
    # does the entry with no device at its place.
    assert resolved == single
    assert spots == [Spot("GPU-m", 0, 4), Spot("GPU-p", 1, 2), Spot("GPU-m", 5, 1)]


def test_unrecorded_instances_of_a_publishing_card() -> None:
    single = ((_device("GPU-p"), _device("GPU-p[1-1]"), _device("GPU-p[7-0]")),)
    resolved, spots = mig_records.resolve(single, [], _table_of)
    # A plain device has no recorded place: a suffix past the profiles closes the card.
    # A seed suffix is read by the geometries: 2g.10gb at 0, a spot; one they do not
    # place closes the card too.
    assert [d.uuid for d in resolved[0]] == ["GPU-p[2-0]", "GPU-p", "GPU-p[2-0]"]
    assert spots == [Spot("GPU-p", 0, 2)]


def test_unreadable_json_counts_as_none() -> None:
    assert mig_records.read({"hami.io/vgpu-mig-allocations": "[{"}) == ()
