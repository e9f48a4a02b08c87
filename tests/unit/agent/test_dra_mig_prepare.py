"""Prepare of a MIG device on the DRA path, through NVML's calls on the simulated A100
machine: the instance is created, its UUID handed over through CDI, and Unprepare
destroys exactly it (read back from the CDI spec, as after an agent restart)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from vgpu_operator.agent.deviceplugin.allocation import NodeSettings
from vgpu_operator.agent.dra import dra_pb2, mig_prepare, prepare
from vgpu_operator.agent.dra.plugin import DraPlugin
from vgpu_operator.agent.simulated import SimulatedBackend
from vgpu_operator.devices import dra, dra_mig

MIG_CARD = "GPU-3a9d1f70-2b4c-4e55-8f10-a1000000d000"


def instance_uuids(backend: SimulatedBackend) -> set[str]:
    (card,) = [gpu for gpu in backend.read().gpus if gpu.uuid == MIG_CARD]
    return {m.uuid for m in card.mig_instances}


def test_prepare_creates_the_instance_and_unprepare_destroys_it(backend: SimulatedBackend) -> None:
    maker = mig_prepare.MigMaker(backend.nvml_module)
    before = instance_uuids(backend)
    created = maker.create(MIG_CARD, "1g.5gb", 3)
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


def test_the_plugin_prepares_a_mig_claim_and_unprepares_it(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    card = dra_mig.MigCardShape(MIG_CARD, 0, "NVIDIA A100-SXM4-40GB", "NVIDIA-A100", 40960)
    published = mig_prepare.placements([card])
    device = dra_mig.instance_name(MIG_CARD, "1g.5gb", 3)
    assert device in published
    claim = {
        "metadata": {"namespace": "team-a", "name": "slice", "uid": "mig-uid"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": dra.DRIVER, "pool": "node-a", "device": device}
                    ]
                }
            }
        },
    }

    async def claims(namespace: str, name: str) -> Any:
        return claim

    maker = mig_prepare.MigMaker(backend.nvml_module)
    plugin = DraPlugin(
        "node-a", dict, claims, NodeSettings(), tmp_path / "cdi", mig=(lambda: published, maker)
    )
    told: list[str] = []
    plugin.on_mig_prepared = lambda: told.append("prepared")
    plugin.on_mig_unprepared = lambda: told.append("unprepared")
    ref = dra_pb2.Claim(namespace="team-a", name="slice", uid="mig-uid")
    before = instance_uuids(backend)

    async def scenario() -> None:
        request = dra_pb2.NodePrepareResourcesRequest(claims=[ref])
        first = await plugin.NodePrepareResources(request, cast(Any, None))
        answer = first.claims["mig-uid"]
        assert not answer.error
        (made,) = instance_uuids(backend) - before
        (spec_file,) = (tmp_path / "cdi").iterdir()
        assert f"NVIDIA_VISIBLE_DEVICES={made}" in spec_file.read_text()
        assert [d.device_name for d in answer.devices] == [device]
        again = await plugin.NodePrepareResources(request, cast(Any, None))
        assert again == first  # kubelet repeats: the instance is kept, not made twice
        assert len(instance_uuids(backend) - before) == 1
        gone = await plugin.NodeUnprepareResources(
            dra_pb2.NodeUnprepareResourcesRequest(claims=[ref]), cast(Any, None)
        )
        assert not gone.claims["mig-uid"].error

    asyncio.run(scenario())
    assert instance_uuids(backend) == before
    assert list((tmp_path / "cdi").iterdir()) == []
    # The publisher reads its own instances again once they are recorded; the machine is
    # read again once they are destroyed (the inventory lists them until then).
    assert told == ["prepared", "unprepared"]
