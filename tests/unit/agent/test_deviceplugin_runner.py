"""The plugin stays registered: serve, register, re-register when kubelet restarts."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import grpc

from vgpu_operator.agent.deviceplugin import api_pb2, api_pb2_grpc
from vgpu_operator.agent.deviceplugin.runner import KUBELET_SOCKET, PluginRunner
from vgpu_operator.agent.deviceplugin.server import Card, GpuDevicePlugin


class Kubelet(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.registered: list[str] = []

    async def Register(self, request: Any, context: Any) -> api_pb2.Empty:
        self.registered.append(request.endpoint)
        return api_pb2.Empty()


async def start_kubelet(directory: Path, kubelet: Kubelet) -> grpc.aio.Server:
    started = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(kubelet, started)
    started.add_insecure_port(f"unix://{directory / KUBELET_SOCKET}")
    await started.start()
    return started


async def no_pods() -> list[dict[str, Any]]:
    return []


async def no_patch(pod: Any, annotations: Any) -> None:
    return None


async def wait_for(check: Any, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_registers_then_re_registers_after_a_kubelet_restart_and_cleans_up(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        plugin = GpuDevicePlugin("n", "nvidia.com/gpu", [Card("GPU-a", 2, True)], no_pods, no_patch)
        runner = PluginRunner(plugin, tmp_path, poll_s=0.05, backoff_initial_s=0.05)
        stop = asyncio.Event()
        first = Kubelet()
        kubelet = await start_kubelet(tmp_path, first)
        task = asyncio.create_task(runner.run(stop))
        await wait_for(lambda: first.registered == ["vgpu-operator-nvidia.sock"])
        assert runner.socket.exists()
        # kubelet restarts: it wipes the directory and serves a new socket.
        await kubelet.stop(None)
        for entry in os.listdir(tmp_path):
            os.unlink(tmp_path / entry)
        second = Kubelet()
        kubelet = await start_kubelet(tmp_path, second)
        await wait_for(lambda: second.registered == ["vgpu-operator-nvidia.sock"])
        await wait_for(runner.socket.exists)
        stop.set()
        await asyncio.wait_for(task, 10)
        await kubelet.stop(None)
        assert not runner.socket.exists()
        assert runner.registrations == 2

    asyncio.run(scenario())
