"""kubelet's DRA health stream, read over the plugin's socket as kubelet reads it: the
whole pool on opening, a new report as soon as a card's health changes (a sick card
Unhealthy with its reason, a lost one saying it is lost), and again when nothing changes
before kubelet's timeout turns the cards Unknown."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import grpc

from vgpu_operator.agent.deviceplugin.allocation import NodeSettings
from vgpu_operator.agent.dra import drahealth_pb2, drahealth_pb2_grpc, pluginregistration_pb2
from vgpu_operator.agent.dra import pluginregistration_pb2_grpc as registration_grpc
from vgpu_operator.agent.dra.health_stream import HEALTH_SERVICE, HealthStream
from vgpu_operator.agent.dra.plugin import DraPlugin
from vgpu_operator.agent.dra.runner import DraRunner
from vgpu_operator.devices import dra


def card(index: int) -> dra.CardShape:
    return dra.CardShape(
        uuid=f"GPU-{index:08x}-aaaa-bbbb-cccc-{index:012x}",
        index=index,
        product="NVIDIA L4",
        hami_type="NVIDIA-L4",
        memory_mib=23034,
        cores=100,
        split_count=4,
        mode="hami-core",
    )


async def _no_claim(namespace: str, name: str) -> None:
    return None


Seen = list[tuple[str, int, str]]


def _entries(response: drahealth_pb2.NodeWatchResourcesResponse) -> Seen:
    return [
        (d.device.pool_name + "/" + d.device.device_name, d.health, d.message)
        for d in response.devices
    ]


def test_the_stream_reports_every_card_at_once_on_change_and_again_before_the_timeout() -> None:
    root = Path(tempfile.mkdtemp(prefix="drah-"))
    cards: dict[str, dra.CardShape] = {c.name: c for c in (card(0), card(1), card(2))}

    def published() -> Mapping[str, dra.CardShape]:
        return dict(cards)

    # No resend within the test's 5 s waits: a report then comes from a change.
    health = HealthStream("node-a", published, resend_s=60)
    plugin = DraPlugin("node-a", published, _no_claim, NodeSettings(), root / "cdi")
    runner = DraRunner(plugin, root / "plugins", root / "registry", poll_s=0.02, health=health)
    names = sorted(cards)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        while not runner.registration_socket.exists():
            await asyncio.sleep(0.02)
        async with grpc.aio.insecure_channel(f"unix://{runner.registration_socket}") as channel:
            info = await registration_grpc.RegistrationStub(channel).GetInfo(  # type: ignore[no-untyped-call]
                pluginregistration_pb2.InfoRequest(), timeout=5
            )
        # kubelet opens the stream only where the registration lists the service.
        assert list(info.supported_versions) == ["v1.DRAPlugin", HEALTH_SERVICE]
        async with grpc.aio.insecure_channel(f"unix://{runner.dra_socket}") as channel:
            stub = drahealth_pb2_grpc.DRAResourceHealthStub(channel)  # type: ignore[no-untyped-call]
            stream = stub.NodeWatchResources(drahealth_pb2.NodeWatchResourcesRequest())
            first = await asyncio.wait_for(stream.read(), 5)
            assert _entries(first) == [(f"node-a/{n}", drahealth_pb2.HEALTHY, "") for n in names]
            assert {d.health_check_timeout_seconds for d in first.devices} == {180}
            # A card turns sick and another is lost: reported at once, not at the resend.
            cards[names[1]] = replace(
                cards[names[1]], healthy=False, health_reason="critical XID 48"
            )
            cards[names[2]] = replace(
                cards[names[2]], healthy=False, health_reason="GPU is lost (fell off the bus)",
                lost=True,
            )  # fmt: skip
            health.changed()
            second = await asyncio.wait_for(stream.read(), 5)
            assert _entries(second) == [
                (f"node-a/{names[0]}", drahealth_pb2.HEALTHY, ""),
                (f"node-a/{names[1]}", drahealth_pb2.UNHEALTHY, "critical XID 48"),
                (
                    f"node-a/{names[2]}",
                    drahealth_pb2.UNHEALTHY,
                    "card lost: GPU is lost (fell off the bus)",
                ),
            ]
            # Nothing changes: the whole pool again, so kubelet's timeout does not expire.
            health.resend_s = 0.05
            health.changed()  # the stream waits with the new interval from here on
            assert _entries(await asyncio.wait_for(stream.read(), 5)) == _entries(second)
            resent = await asyncio.wait_for(stream.read(), 5)
            assert _entries(resent) == _entries(second)
            assert {d.health_check_timeout_seconds for d in resent.devices} == {1}
            stream.cancel()
        stop.set()
        await task

    asyncio.run(scenario())
