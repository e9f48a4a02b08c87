"""Prepare of a MIG device on the DRA path, through NVML's calls on the simulated A100
machine: the instance is created, its UUID handed over through CDI, and Unprepare
destroys exactly it (read back from the CDI spec, as after an agent restart)."""

from __future__ import annotations

import pytest

from vgpu_operator.agent.dra import mig_prepare, prepare
from vgpu_operator.agent.simulated import SimulatedBackend, resolve_machine_path

MIG_CARD = "GPU-3a9d1f70-2b4c-4e55-8f10-a1000000d000"


@pytest.fixture
def backend() -> SimulatedBackend:
    opened = SimulatedBackend(resolve_machine_path("a100-mig"), "node-a")
    opened.open()
    return opened


def instance_uuids(backend: SimulatedBackend) -> set[str]:
    (card,) = [gpu for gpu in backend.read().gpus if gpu.uuid == MIG_CARD]
    return {m.uuid for m in card.mig_instances}


def test_prepare_creates_the_instance_and_unprepare_destroys_it(backend: SimulatedBackend) -> None:
    maker = mig_prepare.MigMaker(backend.nvml_module)
    before = instance_uuids(backend)
    created = maker.create(MIG_CARD, "1g.5gb", 6)
    assert created.uuid not in before
    assert instance_uuids(backend) == before | {created.uuid}
    device = mig_prepare.cdi_device("claim-uid", created)
    assert device["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={created.uuid}"]
    (recorded,) = mig_prepare.created_of({"devices": [device]})
    assert recorded == created
    assert maker.destroy(recorded)
    assert instance_uuids(backend) == before
    assert not maker.destroy(recorded)  # gone already: Unprepare may repeat


def test_a_profile_the_card_does_not_offer_is_a_clear_refusal(backend: SimulatedBackend) -> None:
    maker = mig_prepare.MigMaker(backend.nvml_module)
    with pytest.raises(prepare.PrepareError, match="offers no MIG profile 5g"):
        maker.create(MIG_CARD, "5g.30gb", 0)


def test_no_room_on_the_card_is_nvmls_refusal_said_plainly(backend: SimulatedBackend) -> None:
    maker = mig_prepare.MigMaker(backend.nvml_module)
    with pytest.raises(prepare.PrepareError, match="NVML refused MIG instance 7g"):
        maker.create(MIG_CARD, "7g.40gb", 0)  # the card runs 3g + 2g + 1g already
