"""Both MIG records: the seed's suffix from HAMi v2.10's JSON and back (issue 14)."""

from __future__ import annotations

from vgpu_operator.devices import model
from vgpu_operator.devices.mig_allocations import MigAllocation
from vgpu_operator.scheduling import mig_records

GEOMETRIES = (
    (model.MigTemplate("1g.5gb", 5120, 14, 7),),
    (model.MigTemplate("1g.5gb", 5120, 14, 1), model.MigTemplate("2g.10gb", 10240, 28, 3)),
)


def _geometries_of(uuid: str) -> tuple[model.Geometry, ...] | None:
    return GEOMETRIES if uuid.startswith("GPU-m") else None


def _device(uuid: str, memory: int = 10240) -> model.ContainerDevice:
    return model.ContainerDevice(uuid, "NVIDIA", memory, 28)


def test_records_and_suffixes_are_inverse() -> None:
    single = ((_device("GPU-m[1-2]"),), (), (_device("GPU-m[1-0]", 5120), _device("GPU-x")))
    records = mig_records.records_for(single, _geometries_of)
    assert records == [
        MigAllocation(0, 0, "GPU-m", "2g.10gb", 2, 2),
        MigAllocation(2, 0, "GPU-m", "1g.5gb", 6, 1),
    ]
    plain = tuple(tuple(_device(d.uuid.split("[")[0], d.memory_mib) for d in c) for c in single)
    # A 1g.5gb at 6 is slot 6 of geometry 0 and slot 0 of geometry 1; only geometry 1 also
    # has the 2g.10gb at 2, so both entries are read in geometry 1.
    prefer = mig_records.choose_geometries(records, _geometries_of)
    assert prefer == {"GPU-m": 1}
    assert mig_records.with_suffixes(plain, records, _geometries_of, prefer) == single
    assert mig_records.with_suffixes(plain, records, _geometries_of)[2][0].uuid == "GPU-m[0-6]"


def test_unknown_card_is_left_plain_and_unknown_instance_is_closed() -> None:
    single = ((_device("GPU-q"), _device("GPU-m")),)
    records = [
        MigAllocation(0, 0, "GPU-q", "2g.10gb", 0, 2),
        MigAllocation(0, 1, "GPU-m", "3g.20gb", 0, 4),
    ]
    resolved = mig_records.with_suffixes(single, records, _geometries_of)
    # GPU-q is not known (yet): unchanged. No geometry has a 3g.20gb: a geometry index
    # past the table, which booking turns into an unhealthy card.
    assert [d.uuid for d in resolved[0]] == ["GPU-q", f"GPU-m[{len(GEOMETRIES)}-0]"]


def test_unreadable_json_counts_as_none() -> None:
    assert mig_records.read({"hami.io/vgpu-mig-allocations": "[{"}) == ()
