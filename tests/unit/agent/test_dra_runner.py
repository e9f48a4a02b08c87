"""The DRA plugin's sockets: the registration kubelet's plugin watcher reads, and serving
again when a socket is removed from under the agent."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import grpc

from vgpu_operator.agent.deviceplugin.allocation import NodeSettings
from vgpu_operator.agent.dra import pluginregistration_pb2, pluginregistration_pb2_grpc
from vgpu_operator.agent.dra.plugin import DraPlugin
from vgpu_operator.agent.dra.runner import DraRunner
from vgpu_operator.devices import dra


async def _no_claim(namespace: str, name: str) -> None:
    return None


async def _info(socket: Path) -> pluginregistration_pb2.PluginInfo:
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        stub = pluginregistration_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        info: pluginregistration_pb2.PluginInfo = await stub.GetInfo(
            pluginregistration_pb2.InfoRequest(), timeout=5
        )
        await stub.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=5
        )
        return info


async def _until(check: object, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_kubelet_finds_a_dra_plugin_and_its_service_and_it_serves_again_when_removed() -> None:
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer.
    root = Path(tempfile.mkdtemp(prefix="dra-"))
    plugin = DraPlugin("node-a", dict, _no_claim, NodeSettings(), root / "cdi")
    runner = DraRunner(plugin, root / "plugins", root / "registry", poll_s=0.02)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        await _until(runner.registration_socket.exists)
        info = await _info(runner.registration_socket)
        assert info.type == "DRAPlugin"
        assert info.name == dra.DRIVER
        assert info.endpoint == str(root / "plugins" / dra.DRIVER / "dra.sock")
        assert list(info.supported_versions) == ["v1.DRAPlugin"]
        assert runner.registration.registered is True
        assert Path(info.endpoint).exists()
        runner.registration_socket.unlink()
        await _until(lambda: runner.serves == 2 and runner.registration_socket.exists())
        assert (await _info(runner.registration_socket)).name == dra.DRIVER
        stop.set()
        await task
        assert not runner.registration_socket.exists()
        assert not runner.dra_socket.exists()

    asyncio.run(scenario())
