"""MIG instances for Allocate, made through NVML's calls on the simulated A100 machine:
reuse when the card already runs the geometry, rebuild when it does not, the same slot
always the same instance, and clear refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpu_operator.agent.deviceplugin.allocation import AllocationError
from vgpu_operator.agent.mig import Instance, MigInstances, instance_for_slot
from vgpu_operator.agent.simulated import SimulatedBackend
from vgpu_operator.devices import model

MIG_CARD = "GPU-3a9d1f70-2b4c-4e55-8f10-a1000000d000"
WHOLE_CARD = "GPU-3a9d1f70-2b4c-4e55-8f10-a1000000d001"
# Geometry 0 is what the bundled card runs; geometry 1 is seven small instances.
A100 = (
    (
        model.MigTemplate("3g.20gb", 20480, 42, 1),
        model.MigTemplate("2g.10gb", 10240, 28, 1),
        model.MigTemplate("1g.5gb", 5120, 14, 1),
    ),
    (model.MigTemplate("1g.5gb", 5120, 14, 7),),
)


def instances(backend: SimulatedBackend) -> MigInstances:
    return MigInstances(backend.nvml_module, lambda card_type: A100 if "A100" in card_type else ())


def profiles_on_card(backend: SimulatedBackend) -> list[str]:
    (card,) = [gpu for gpu in backend.read().gpus if gpu.uuid == MIG_CARD]
    return sorted(m.profile or "" for m in card.mig_instances)


def test_the_geometry_the_card_runs_is_reused(backend: SimulatedBackend) -> None:
    assert instances(backend).device(MIG_CARD, 0, 1) == "MIG-7c1b2d3e-0000-4a5b-9c8d-a10000000003"
    assert profiles_on_card(backend) == ["1g.5gb", "2g.10gb", "3g.20gb"]


def test_another_geometry_is_created_and_reported(backend: SimulatedBackend) -> None:
    mig = instances(backend)
    chosen = mig.device(MIG_CARD, 1, 3)
    assert chosen.startswith("MIG-")
    # The agent's next reading (the inventory) shows what was made.
    assert profiles_on_card(backend) == ["1g.5gb"] * 7
    # The same slot is the same instance; another slot another one.
    assert mig.device(MIG_CARD, 1, 3) == chosen
    others = {mig.device(MIG_CARD, 1, s) for s in range(7) if s != 3}
    assert len(others) == 6
    assert chosen not in others


def test_a_card_not_in_mig_mode_is_refused(backend: SimulatedBackend) -> None:
    with pytest.raises(AllocationError, match="not in MIG mode"):
        instances(backend).device(WHOLE_CARD, 0, 0)


@pytest.mark.parametrize(("geometry", "slot", "says"), [(2, 0, "2 geometries"), (0, 3, "slot 3")])
def test_an_entry_outside_the_config_is_refused(
    backend: SimulatedBackend, geometry: int, slot: int, says: str
) -> None:
    with pytest.raises(AllocationError, match=says):
        instances(backend).device(MIG_CARD, geometry, slot)
    assert profiles_on_card(backend) == ["1g.5gb", "2g.10gb", "3g.20gb"]  # nothing destroyed


def test_a_geometry_the_card_cannot_hold_is_refused_by_nvml(backend: SimulatedBackend) -> None:
    too_big = ((model.MigTemplate("3g.20gb", 20480, 42, 3),),)
    mig = MigInstances(backend.nvml_module, lambda card_type: too_big)
    with pytest.raises(AllocationError, match="NVML refused"):
        mig.device(MIG_CARD, 0, 0)


def test_slots_of_one_profile_map_to_its_instances_in_instance_id_order() -> None:
    current = [
        Instance(9, 0, "1g.5gb", "MIG-c"),
        Instance(2, 0, "2g.10gb", "MIG-a"),
        Instance(7, 0, "1g.5gb", "MIG-b"),
    ]
    profiles = ["2g.10gb", "1g.5gb", "1g.5gb"]
    assert [instance_for_slot(current, profiles, s).uuid for s in range(3)] == [
        "MIG-a",
        "MIG-b",
        "MIG-c",
    ]


def test_allocate_hands_a_mig_pod_its_instance_through_the_plugin(
    backend: SimulatedBackend, tmp_path: Path
) -> None:
    import asyncio

    import grpc
    from test_deviceplugin_server import FakeApi, bound_pod, host_settings

    from vgpu_operator import names
    from vgpu_operator.agent.deviceplugin import api_pb2, api_pb2_grpc, server
    from vgpu_operator.agent.deviceplugin.server import Card, GpuDevicePlugin

    api = FakeApi([bound_pod("p", [[(f"{MIG_CARD}[1-0]", 5120, 14)]], "2026-01-01T00:00:00Z")])

    async def scenario() -> api_pb2.AllocateResponse:
        plugin = GpuDevicePlugin(
            "node-a",
            "nvidia.com/gpu",
            [Card(MIG_CARD, 7, True)],
            api.list,
            api.patch,
            host_settings(tmp_path),
            api.report,
            instances(backend),
        )
        socket = str(tmp_path / "p.sock")
        grpc_server = await server.serve(plugin, socket)
        try:
            async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                request = api_pb2.AllocateRequest(
                    container_requests=[
                        api_pb2.ContainerAllocateRequest(devices_ids=[f"{MIG_CARD}-5"])
                    ]
                )
                answer: api_pb2.AllocateResponse = await stub.Allocate(request)
                return answer
        finally:
            await grpc_server.stop(None)

    answer = asyncio.run(scenario())
    (created,) = [
        m.uuid
        for gpu in backend.read().gpus
        if gpu.uuid == MIG_CARD
        for m in gpu.mig_instances
        if m.gpu_instance_id == 1
    ]
    assert dict(answer.container_responses[0].envs) == {"NVIDIA_VISIBLE_DEVICES": created}
    assert api.patches[-1][1][names.BIND_PHASE] == "success"
