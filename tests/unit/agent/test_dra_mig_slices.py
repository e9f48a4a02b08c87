"""A MIG card on the DRA path: a counter set per card (one counter per memory slice, and
the compute slices) and one device per profile placement consuming from it, in a pool of
several slices (upstream: counter sets and devices never in one slice)."""

from __future__ import annotations

import asyncio
from fractions import Fraction

from tests.unit.agent.test_dra_slices import FakeStore, gpu, status_of
from vgpu_operator import dra_shapes as shapes
from vgpu_operator.agent.dra.publisher import SlicePublisher
from vgpu_operator.agent.readings import MachineReading
from vgpu_operator.devices import dra, dra_mig
from vgpu_operator.scheduling.mig import mig_partitions as mp


def test_h100_profiles_are_nvidias_names_and_placements() -> None:
    profiles = dra_mig.profiles_for(81559)  # an "80 GB" H100 as NVML counts it
    assert [(p.name, p.starts) for p in profiles] == [
        ("1g.10gb", (0, 1, 2, 3, 4, 5, 6)),
        ("2g.20gb", (0, 2, 4)),
        ("3g.40gb", (0, 4)),
        ("4g.40gb", (0,)),
        ("7g.80gb", (0,)),
    ]
    assert next(p.name for p in dra_mig.profiles_for(40536)) == "1g.5gb"  # A100 40GB


def test_a_mig_card_is_published_as_counters_and_placements() -> None:
    reading = MachineReading(gpus=(gpu(0), gpu(1, mig_enabled=True)))
    status = status_of(reading)
    shared = shapes.card_shapes(status.devices, shapes.RequestDefaults())
    mig = shapes.mig_card_shapes(status.devices)
    assert [c.index for c in shared] == [0]
    assert [c.index for c in mig] == [1]
    slices = dra_mig.pool_slices("node-a", shared, mig, 3, None)
    assert [s["metadata"]["name"] for s in slices] == [
        dra.slice_name("node-a"),
        dra_mig.counters_slice_name("node-a"),
        dra_mig.mig_slice_name("node-a", 0),
    ]
    for slice_ in slices:
        assert slice_["spec"]["pool"] == {
            "name": "node-a",
            "generation": 3,
            "resourceSliceCount": 3,
        }
        # Upstream's rule: a slice holds devices or counter sets, never both.
        assert not ("devices" in slice_["spec"] and "sharedCounters" in slice_["spec"])
    (counter_set,) = slices[1]["spec"]["sharedCounters"]
    assert counter_set["name"] == dra_mig.counter_set_name(gpu(1).uuid)
    assert counter_set["counters"]["compute-slices"] == {"value": "7"}
    assert sum(1 for c in counter_set["counters"] if c.startswith("memory-slice-")) == 8
    devices = slices[2]["spec"]["devices"]
    assert len(devices) == 7 + 3 + 2 + 1 + 1
    three_g_at_4 = next(d for d in devices if d["name"].endswith("-mig-3g-40gb-4"))
    (consumes,) = three_g_at_4["consumesCounters"]
    assert consumes["counterSet"] == counter_set["name"]
    assert consumes["counters"] == {
        "memory-slice-4": {"value": "1"},
        "memory-slice-5": {"value": "1"},
        "memory-slice-6": {"value": "1"},
        "memory-slice-7": {"value": "1"},
        "compute-slices": {"value": "3"},
    }
    assert three_g_at_4["attributes"]["profile"] == {"string": "3g.40gb"}
    assert all(len(d["name"]) <= 63 for d in devices)


def test_without_mig_cards_the_pool_is_the_one_slice_as_before() -> None:
    status = status_of(MachineReading(gpus=(gpu(0),)))
    shared = shapes.card_shapes(status.devices, shapes.RequestDefaults())
    assert dra_mig.pool_slices("node-a", shared, [], 5, None) == [
        dra.slice_wire("node-a", shared, 5, None)
    ]


def test_instances_of_many_cards_are_split_at_upstreams_64_per_slice() -> None:
    gpus = tuple(gpu(i, mig_enabled=True) for i in range(8))
    mig = shapes.mig_card_shapes(status_of(MachineReading(gpus=gpus)).devices)
    slices = dra_mig.pool_slices("node-a", [], mig, 1, None)
    sizes = [len(s["spec"].get("devices") or []) for s in slices[2:]]
    assert sizes == [64, 48]
    pool = mp.read_mig_pool("node-a", slices)
    assert len(pool.devices) == 8 * 14
    assert not pool.problems
    assert pool.counters[dra_mig.counter_set_name(gpus[0].uuid)]["compute-slices"] == Fraction(7)


def test_the_publisher_writes_every_slice_of_the_pool_at_one_generation() -> None:
    store = FakeStore()
    publisher = SlicePublisher("node-a", store, shapes.RequestDefaults())

    async def scenario() -> None:
        publisher.set_status(status_of(MachineReading(gpus=(gpu(0), gpu(1, mig_enabled=True)))))
        assert await publisher.publish()
        assert not await publisher.publish()
        await publisher.check_server_copy()
        assert not await publisher.publish()  # the server holds all as written
        store.slices.pop(dra_mig.counters_slice_name("node-a"))
        await publisher.check_server_copy()
        assert await publisher.publish()  # one slice gone: the pool is written again
        # The MIG card leaves MIG mode: its slices go.
        publisher.set_status(status_of(MachineReading(gpus=(gpu(0), gpu(1)))))
        assert await publisher.publish()

    asyncio.run(scenario())
    assert [p["spec"]["pool"]["generation"] for p in store.puts] == [1, 1, 1, 2, 2, 2, 3]
    assert set(store.slices) == {dra.slice_name("node-a")}
    assert store.slices[dra.slice_name("node-a")]["spec"]["pool"]["resourceSliceCount"] == 1
