"""The device plugin over real unix sockets: kubelet's calls, as kubelet makes them."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from builders import pod_awaiting_devices

from vgpu_operator import names
from vgpu_operator.agent.deviceplugin import api_pb2, api_pb2_grpc, server
from vgpu_operator.agent.deviceplugin.allocation import HostPaths, NodeSettings
from vgpu_operator.agent.deviceplugin.server import Card, GpuDevicePlugin

NODE = "node-a"
GPU = "nvidia.com/gpu"


def bound_pod(name: str, entries: list[list[tuple[str, int, int]]], created: str) -> dict[str, Any]:
    return pod_awaiting_devices(name, entries, created, NODE)


class FakeApi:
    """The pods bound to the node; patches are applied as the API server would."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.patches: list[tuple[str, dict[str, str]]] = []
        self.events: list[tuple[str, str, str]] = []
        #: Patches still to refuse as the API server does when the pod changed (409).
        self.conflicts = 0

    async def report(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        self.events.append((pod["metadata"]["name"], reason, message))

    async def list(self) -> Sequence[Mapping[str, Any]]:
        return self.pods

    async def patch(self, pod: Mapping[str, Any], annotations: Mapping[str, str]) -> None:
        name = pod["metadata"]["name"]
        if self.conflicts:
            self.conflicts -= 1
            raise server.StaleRead(f"{name} changed")
        self.patches.append((name, dict(annotations)))
        for held in self.pods:
            if held["metadata"]["name"] == name:
                held["metadata"]["annotations"].update(annotations)


class FakeKubelet(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.registered: list[api_pb2.RegisterRequest] = []

    async def Register(self, request: Any, context: Any) -> api_pb2.Empty:
        self.registered.append(request)
        return api_pb2.Empty()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


CARDS = [Card("GPU-a", 4, True, numa=0), Card("GPU-b", 4, False, numa=1)]


def host_settings(tmp_path: Path) -> NodeSettings:
    """HAMi-core's host directories under the test's own folder."""
    return NodeSettings(
        host=HostPaths(hook_dir=str(tmp_path / "vgpu"), lock_dir=str(tmp_path / "vgpulock"))
    )


async def _with_plugin(tmp_path: Path, api: FakeApi, body: Any) -> Any:
    plugin = GpuDevicePlugin(
        NODE, GPU, CARDS, api.list, api.patch, host_settings(tmp_path), api.report
    )
    socket = str(tmp_path / "vgpu-operator-nvidia.sock")
    grpc_server = await server.serve(plugin, socket)
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            return await body(api_pb2_grpc.DevicePluginStub(channel), plugin)
    finally:
        await grpc_server.stop(None)


def allocate_request(device_id: str) -> api_pb2.AllocateRequest:
    """kubelet's Allocate for one container given one device."""
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=[device_id])]
    )


def _allocate(tmp_path: Path, api: FakeApi, device_id: str) -> Any:
    """The plugin's answer to kubelet's Allocate of ``device_id`` for one container."""

    async def body(stub: Any, plugin: GpuDevicePlugin) -> Any:
        return await stub.Allocate(allocate_request(device_id))

    return run(_with_plugin(tmp_path, api, body))


def test_registration_names_the_resource_and_our_socket(tmp_path: Path) -> None:
    async def scenario() -> list[Any]:
        kubelet = FakeKubelet()
        kubelet_server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(kubelet, kubelet_server)
        socket = str(tmp_path / "kubelet.sock")
        kubelet_server.add_insecure_port(f"unix://{socket}")
        await kubelet_server.start()
        try:
            await server.register(socket, "vgpu-operator-nvidia.sock", GPU)
        finally:
            await kubelet_server.stop(None)
        return kubelet.registered

    (request,) = run(scenario())
    assert (request.version, request.endpoint, request.resource_name) == (
        "v1beta1",
        "vgpu-operator-nvidia.sock",
        GPU,
    )
    assert request.options.get_preferred_allocation_available


def test_list_and_watch_advertises_split_devices_with_health_and_numa(tmp_path: Path) -> None:
    async def body(stub: Any, plugin: GpuDevicePlugin) -> Any:
        options = await stub.GetDevicePluginOptions(api_pb2.Empty())
        stream = stub.ListAndWatch(api_pb2.Empty())
        first = await stream.read()
        plugin.set_cards([Card("GPU-a", 2, False)])
        second = await stream.read()
        stream.cancel()
        return options, first, second

    options, first, second = run(_with_plugin(tmp_path, FakeApi([]), body))
    assert options.get_preferred_allocation_available
    ids = {d.ID: d for d in first.devices}
    assert set(ids) == {f"GPU-a-{i}" for i in range(4)} | {f"GPU-b-{i}" for i in range(4)}
    assert ids["GPU-a-0"].health == "Healthy"
    assert ids["GPU-b-3"].health == "Unhealthy"
    assert ids["GPU-b-3"].topology.nodes[0].ID == 1
    assert [(d.ID, d.health) for d in second.devices] == [
        ("GPU-a-0", "Unhealthy"),
        ("GPU-a-1", "Unhealthy"),
    ]


def test_preferred_allocation_steers_kubelet_to_the_annotated_cards(tmp_path: Path) -> None:
    api = FakeApi([bound_pod("p", [[("GPU-b", 1000, 10)]], "2026-01-01T00:00:00Z")])

    async def body(stub: Any, plugin: GpuDevicePlugin) -> Any:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=["GPU-a-0", "GPU-a-1", "GPU-b-2", "GPU-b-3"],
                    allocation_size=1,
                )
            ]
        )
        return await stub.GetPreferredAllocation(request)

    answer = run(_with_plugin(tmp_path, api, body))
    assert list(answer.container_responses[0].deviceIDs) == ["GPU-b-2"]


def test_allocate_hands_the_container_its_share_and_consumes_the_entry(tmp_path: Path) -> None:
    api = FakeApi([bound_pod("p", [[("GPU-a", 4096, 30)]], "2026-01-01T00:00:00Z")])

    answer = _allocate(tmp_path, api, "GPU-a-2")
    envs = dict(answer.container_responses[0].envs)
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    first_mount = next(iter(answer.container_responses[0].mounts))
    assert first_mount.container_path == "/usr/local/vgpu"
    # The cache directory the first mount names exists on the host, writable by any user
    # the container runs as, before kubelet hands the mount to the runtime.
    cache = Path(first_mount.host_path)
    assert cache == tmp_path / "vgpu" / "containers" / "uid-p_c0"
    assert cache.is_dir()
    assert cache.stat().st_mode & 0o777 == 0o777
    assert (tmp_path / "vgpulock").stat().st_mode & 0o777 == 0o777
    ((name, patch),) = api.patches
    assert name == "p"
    assert patch[names.BIND_PHASE] == "success"


def test_an_ambiguous_allocate_is_refused_and_nobody_is_served(tmp_path: Path) -> None:
    """Two pods wait on this node for one device each, on different cards: kubelet's IDs
    alone cannot say which container this is, so the plugin refuses instead of guessing,
    and marks both failed with an Event each (a decoy must not leave a pod hanging)."""
    api = FakeApi(
        [
            bound_pod("first", [[("GPU-a", 1000, 10)]], "2026-01-01T00:00:00Z"),
            bound_pod("second", [[("GPU-b", 1000, 10)]], "2026-01-01T00:00:01Z"),
        ]
    )

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        _allocate(tmp_path, api, "GPU-a-0")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "refusing to guess" in (refused.value.details() or "")
    assert sorted(api.patches) == [
        ("first", {names.BIND_PHASE: "failed"}),
        ("second", {names.BIND_PHASE: "failed"}),
    ]
    assert sorted((name, reason) for name, reason, _ in api.events) == [
        ("first", "GpuAllocateFailed"),
        ("second", "GpuAllocateFailed"),
    ]
    assert all("ns/first, ns/second" in message for _, _, message in api.events)


@pytest.mark.parametrize(
    "forge",
    [
        pytest.param(lambda p: p["spec"].__setitem__("schedulerName", "other"), id="other"),
        pytest.param(lambda p: p["spec"].pop("schedulerName"), id="default-scheduler"),
        pytest.param(
            lambda p: p["metadata"]["annotations"].pop(names.ASSIGNED_NODE), id="no-vgpu-node"
        ),
        pytest.param(
            lambda p: p["metadata"]["annotations"].__setitem__(names.ASSIGNED_NODE, "elsewhere"),
            id="another-vgpu-node",
        ),
    ],
)
def test_a_pod_no_trusted_scheduler_placed_is_not_served(tmp_path: Path, forge: Any) -> None:
    """A pod its creator bound here with hand-written annotations (or another scheduler
    placed) is no candidate: the pod this scheduler bound is served, alone."""
    decoy = bound_pod("decoy", [[("GPU-a", 46068, 100)]], "2026-01-01T00:00:00Z")
    forge(decoy)
    api = FakeApi([decoy, bound_pod("real", [[("GPU-a", 1000, 10)]], "2026-01-01T00:00:01Z")])
    response = _allocate(tmp_path, api, "GPU-a-0")
    envs = response.container_responses[0].envs
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    assert [name for name, _ in api.patches] == ["real"]


def test_a_decoy_alone_is_refused_saying_why(tmp_path: Path) -> None:
    decoy = bound_pod("decoy", [[("GPU-a", 46068, 100)]], "2026-01-01T00:00:00Z")
    decoy["spec"]["schedulerName"] = "other"
    api = FakeApi([decoy])
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        _allocate(tmp_path, api, "GPU-a-0")
    assert "were not placed by vgpu-scheduler and are not served" in (refused.value.details() or "")
    assert api.patches == []


def test_a_pod_that_changed_under_the_patch_is_read_again_and_served_once(
    tmp_path: Path,
) -> None:
    api = FakeApi([bound_pod("p", [[("GPU-a", 1000, 10)]], "2026-01-01T00:00:00Z")])
    api.conflicts = 2
    answer = _allocate(tmp_path, api, "GPU-a-0")
    assert dict(answer.container_responses[0].envs)["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    ((_name, patch),) = api.patches  # consumed exactly once
    assert patch[names.BIND_PHASE] == "success"


def test_a_pod_that_keeps_changing_is_failed_not_served_twice(tmp_path: Path) -> None:
    api = FakeApi([bound_pod("p", [[("GPU-a", 1000, 10)]], "2026-01-01T00:00:00Z")])
    api.conflicts = 3
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        _allocate(tmp_path, api, "GPU-a-0")
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    assert api.patches == [("p", {names.BIND_PHASE: "failed"})]


def test_a_mismatched_allocate_marks_the_pod_failed(tmp_path: Path) -> None:
    api = FakeApi([bound_pod("p", [[("GPU-a", 1000, 10)]], "2026-01-01T00:00:00Z")])

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        _allocate(tmp_path, api, "GPU-b-0")
    details = refused.value.details() or ""
    assert "kubelet chose devices" in details
    assert api.patches == [("p", {names.BIND_PHASE: "failed"})]
    # The pod's owner reads why in its Events: kubelet's UnexpectedAdmissionError does not say.
    assert api.events == [("p", "GpuAllocateFailed", details)]


def test_a_failed_allocate_still_answers_when_the_pod_cannot_be_marked(tmp_path: Path) -> None:
    api = FakeApi([bound_pod("p", [[("GPU-a", 1000, 10)]], "2026-01-01T00:00:00Z")])

    async def broken_patch(pod: Mapping[str, Any], annotations: Mapping[str, str]) -> None:
        raise RuntimeError("API server away")

    async def scenario() -> Any:
        plugin = GpuDevicePlugin(
            NODE, GPU, CARDS, api.list, broken_patch, host_settings(tmp_path), api.report
        )
        socket = str(tmp_path / "p.sock")
        grpc_server = await server.serve(plugin, socket)
        try:
            async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                return await stub.Allocate(allocate_request("GPU-b-0"))
        finally:
            await grpc_server.stop(None)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        run(scenario())
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert [reason for _, reason, _ in api.events] == ["GpuAllocateFailed"]


def test_a_container_restarted_under_the_same_name_gets_an_empty_cache(tmp_path: Path) -> None:
    stale = tmp_path / "vgpu" / "containers" / "uid-p_c0"
    stale.mkdir(parents=True)
    (stale / "old.cache").write_text("usage of the previous container")
    api = FakeApi([bound_pod("p", [[("GPU-a", 4096, 30)]], "2026-01-01T00:00:00Z")])

    _allocate(tmp_path, api, "GPU-a-0")
    assert stale.is_dir()
    assert list(stale.iterdir()) == []


def test_an_unwritable_host_directory_fails_the_pod_and_says_where(tmp_path: Path) -> None:
    (tmp_path / "vgpu").write_text("a file where the directory should be")
    api = FakeApi([bound_pod("p", [[("GPU-a", 4096, 30)]], "2026-01-01T00:00:00Z")])

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        _allocate(tmp_path, api, "GPU-a-0")
    assert "HAMi-core's directories" in (refused.value.details() or "")
    assert api.patches == [("p", {names.BIND_PHASE: "failed"})]
