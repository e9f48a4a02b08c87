"""The kubelet stand-in drives the real plugin (runner included) over unix sockets."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from test_deviceplugin_server import GPU, NODE, FakeApi, bound_pod, host_settings

from vgpu_operator import names
from vgpu_operator.agent.deviceplugin.kubelet_standin import KubeletStandIn, requested
from vgpu_operator.agent.deviceplugin.runner import PluginRunner
from vgpu_operator.agent.deviceplugin.server import Card, GpuDevicePlugin
from vgpu_operator.devices import nvidia

CARDS = [Card("GPU-a", 4, True), Card("GPU-b", 4, True)]


async def _eventually(check: Any, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _play(tmp_path: Path, api: FakeApi, body: Any) -> Any:
    async def scenario() -> Any:
        plugin = GpuDevicePlugin(NODE, GPU, CARDS, api.list, api.patch, host_settings(tmp_path))
        directory = tmp_path / "device-plugins"
        directory.mkdir()
        standin = KubeletStandIn(NODE, directory, api.list, poll_s=0.02)
        runner = PluginRunner(plugin, directory, poll_s=0.05, backoff_initial_s=0.05)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(standin.run(stop)), asyncio.create_task(runner.run(stop))]
        try:
            return await body(standin, api)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 10)

    return asyncio.run(scenario())


def test_each_pod_in_turn_gets_its_own_cards_and_is_settled(tmp_path: Path) -> None:
    first = bound_pod("first", [[("GPU-b", 3000, 30)]], "2026-01-01T00:00:01Z")
    second = bound_pod(
        "second", [[("GPU-a", 1000, 10)], [("GPU-b", 2000, 20)]], "2026-01-01T00:00:02Z"
    )

    async def body(standin: KubeletStandIn, api: FakeApi) -> Any:
        api.pods.append(first)
        await _eventually(lambda: len(standin.settings) == 1)
        api.pods.append(second)  # the gate lets the next pod in once the first is settled
        await _eventually(lambda: len(standin.settings) == 3)
        return standin.settings, standin.registrations

    settings, registrations = _play(tmp_path, FakeApi([]), body)
    assert registrations == 1
    by_container = {(s.pod, s.container): s for s in settings}
    assert all(s.error is None for s in settings)
    one = by_container[("ns/first", "c0")]
    assert one.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
    assert one.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert one.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert all(d.startswith("GPU-b-") for d in one.device_ids)  # the preference was taken
    assert by_container[("ns/second", "c0")].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    assert by_container[("ns/second", "c1")].envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"
    assert first["metadata"]["annotations"][names.BIND_PHASE] == "success"
    assert second["metadata"]["annotations"][names.BIND_PHASE] == "success"


def test_a_refused_allocate_is_recorded_and_fails_the_pod(tmp_path: Path) -> None:
    """The pod's entry names two cards but its container asks for one device."""
    odd = bound_pod("odd", [[("GPU-a", 1000, 10), ("GPU-b", 1000, 10)]], "2026-01-01T00:00:01Z")
    odd["spec"]["containers"][0]["resources"]["limits"][GPU] = 1

    async def body(standin: KubeletStandIn, api: FakeApi) -> Any:
        api.pods.append(odd)
        await _eventually(lambda: len(standin.settings) == 1)
        return standin.settings

    (result,) = _play(tmp_path, FakeApi([]), body)
    assert result.error
    assert result.envs == {}


def test_devices_of_an_ended_pod_are_free_again(tmp_path: Path) -> None:
    whole = [[("GPU-a", 1000, 10)]]
    pods = [bound_pod(f"p{i}", whole, f"2026-01-01T00:00:0{i}Z") for i in range(2)]

    async def body(standin: KubeletStandIn, api: FakeApi) -> Any:
        api.pods.append(pods[0])
        await _eventually(lambda: len(standin.settings) == 1)
        held = set(standin.in_use().values())
        pods[0]["status"]["phase"] = "Succeeded"
        await _eventually(lambda: not standin.in_use())
        api.pods.append(pods[1])
        await _eventually(lambda: len(standin.settings) == 2)
        return held, standin.settings, set(standin.in_use().values())

    held, settings, after = _play(tmp_path, FakeApi([]), body)
    assert held == {"uid-p0"}
    assert after == {"uid-p1"}
    assert [s.error for s in settings] == [None, None]


def test_requested_reads_limits_then_requests() -> None:
    assert requested({"resources": {"limits": {GPU: 2}}}, GPU) == 2
    assert requested({"resources": {"requests": {GPU: "1"}}}, GPU) == 1
    assert requested({"resources": {}}, GPU) == 0
    assert requested({"resources": {"limits": {GPU: "x"}}}, GPU) == 0


def test_an_init_containers_devices_are_handed_on_as_kubelet_does(tmp_path: Path) -> None:
    """kubelet gives the app container the finished init container's device first."""
    layout = [[("GPU-a", 1000, 10)], [("GPU-b", 2000, 20)]]
    pod = bound_pod("init", layout, "2026-01-01T00:00:01Z")
    annotations = pod["metadata"]["annotations"]
    annotations[nvidia.ALLOCATED_ANNOTATION] = annotations[nvidia.TO_ALLOCATE_ANNOTATION]
    init, app = pod["spec"]["containers"]
    init["name"], app["name"] = "setup", "main"
    pod["spec"]["initContainers"] = [init]
    pod["spec"]["containers"] = [app]

    async def body(standin: KubeletStandIn, api: FakeApi) -> Any:
        api.pods.append(pod)
        await _eventually(lambda: len(standin.settings) == 2)
        return standin.settings

    setup, main = _play(tmp_path, FakeApi([]), body)
    assert setup.error is None
    assert main.error is None, main.error
    assert main.device_ids[0] == setup.device_ids[0]  # reused
    assert main.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b"  # still its own card
