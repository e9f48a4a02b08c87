"""MIG instances on a card before the agent starts (issue 47 item 7): their placements are
read from NVML into the inventory, and the DRA driver publishes the card's counters
without the slices they hold, so no allocator gives a placement over one. The driver's
own instances (recorded in its claims' CDI specs) are held by their claims' allocations
and are not taken twice; an instance whose placement cannot be read keeps the card from
offering anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from unit.agent.test_simulated_machines import read_machine, status_of

from vgpu_operator import dra_shapes as shapes
from vgpu_operator import resources
from vgpu_operator.agent.dra import cdi, mig_prepare, prepare
from vgpu_operator.agent.simulated import SimulatedBackend
from vgpu_operator.devices import dra_mig

MIG_CARD = "GPU-3a9d1f70-2b4c-4e55-8f10-a1000000d000"
OURS = "MIG-7c1b2d3e-0000-4a5b-9c8d-a10000000009"  # the 1g.5gb at slice 2


def _mig_device(status: resources.DeviceInventoryStatus) -> resources.Device:
    (device,) = [d for d in status.devices if d.mode is resources.DeviceMode.MIG]
    return device


def test_the_inventory_holds_each_instances_placement() -> None:
    device = _mig_device(status_of(read_machine("a100-mig")))
    placements = {m.profile: (m.placement_start, m.placement_size) for m in device.mig_instances}
    assert placements == {"3g.20gb": (4, 4), "2g.10gb": (0, 2), "1g.5gb": (2, 1)}
    wire = device.model_dump(by_alias=True, exclude_none=True)
    assert wire["migInstances"][0]["placementStart"] == 4


def _counters(card: dra_mig.MigCardShape) -> dict[str, str]:
    return {k: v["value"] for k, v in dra_mig.counter_set_wire(card)["counters"].items()}


def test_the_counters_leave_out_the_slices_of_instances_no_claim_holds() -> None:
    status = status_of(read_machine("a100-mig"))
    (card,) = shapes.mig_card_shapes(status.devices)
    assert card.taken == ((4, 4, 3), (0, 2, 2), (2, 1, 1))
    counters = _counters(card)
    assert counters["compute-slices"] == "1"
    assert [k for k, v in counters.items() if k.startswith("memory") and v == "1"] == [
        "memory-slice-3"
    ]
    # The 1g is the driver's own (a claim's CDI spec records it): its claim's allocation
    # holds its counters, so it is not taken out a second time.
    (mine,) = shapes.mig_card_shapes(status.devices, frozenset({OURS}))
    counters = _counters(mine)
    assert counters["compute-slices"] == "2"
    assert counters["memory-slice-2"] == "1"


def test_an_instance_of_unknown_placement_keeps_the_whole_card_from_being_offered() -> None:
    status = status_of(read_machine("a100-mig"))
    device = _mig_device(status)
    blind = device.model_copy(
        update={
            "mig_instances": tuple(
                m.model_copy(update={"placement_start": None}) for m in device.mig_instances
            )
        }
    )
    (card,) = shapes.mig_card_shapes(status.model_copy(update={"devices": (blind,)}).devices)
    assert card.taken is None
    assert set(_counters(card).values()) == {"0"}


def test_an_empty_card_offers_every_slice() -> None:
    card = dra_mig.MigCardShape(MIG_CARD, 0, "NVIDIA A100-SXM4-40GB", "NVIDIA-A100", 40960)
    counters = _counters(card)
    assert counters["compute-slices"] == "7"
    assert set(counters.values()) == {"1", "7"}


def test_the_driver_knows_its_own_instances_from_the_cdi_specs(tmp_path: Path) -> None:
    created = mig_prepare.Created(MIG_CARD, 9, OURS, "1g.5gb", 2)
    spec = {"devices": [mig_prepare.cdi_device("claim-uid", created)]}
    cdi.write_spec(tmp_path, prepare.spec_file_name("claim-uid"), spec)
    (tmp_path / f"{prepare.SPEC_FILE_PREFIX}broken.json").write_text(json.dumps([1]))
    assert mig_prepare.recorded_instances(tmp_path) == frozenset({OURS})
    assert mig_prepare.recorded_instances(tmp_path / "missing") == frozenset()


def test_the_simulated_card_places_instances_where_nvml_would(backend: SimulatedBackend) -> None:
    maker = mig_prepare.MigMaker(backend.nvml_module)
    made = maker.create(MIG_CARD, "1g.5gb", 3)  # the one free slice
    (card,) = [g for g in backend.read().gpus if g.uuid == MIG_CARD]
    placed = {m.uuid: (m.placement_start, m.placement_size) for m in card.mig_instances}
    assert placed[made.uuid] == (3, 1)
    with pytest.raises(prepare.PrepareError, match="NVML refused"):
        maker.create(MIG_CARD, "1g.5gb", 6)  # slice 6 is the 3g's
