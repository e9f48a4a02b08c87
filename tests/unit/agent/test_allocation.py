"""The device plugin's Allocate core: which container, which checks, what it receives."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu_operator import names
from vgpu_operator.agent.deviceplugin import allocation
from vgpu_operator.agent.deviceplugin.allocation import AllocationError, NodeSettings
from vgpu_operator.devices import codec, model, nvidia

GPU = "nvidia.com/gpu"


def container(name: str, gpus: int | None = 1, env: dict[str, str] | None = None) -> Any:
    limits = {} if gpus is None else {GPU: gpus}
    built: dict[str, Any] = {"name": name, "resources": {"limits": limits}}
    if env:
        built["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return built


def pod(
    entries: list[list[tuple[str, int, int]]],
    containers: list[Any],
    inits: list[Any] | None = None,
) -> dict[str, Any]:
    single = tuple(
        tuple(model.ContainerDevice(u, "NVIDIA", m, c) for u, m, c in entry) for entry in entries
    )
    value = codec.encode_pod_single_device(single, nvidia.TO_ALLOCATE_ANNOTATION)
    spec: dict[str, Any] = {"containers": containers}
    if inits:
        spec["initContainers"] = inits
    return {
        "metadata": {
            "namespace": "ns",
            "name": "p",
            "uid": "u1",
            "annotations": {nvidia.TO_ALLOCATE_ANNOTATION: value},
        },
        "spec": spec,
    }


def consume(current: dict[str, Any], grant: allocation.ContainerGrant) -> dict[str, Any]:
    current["metadata"]["annotations"].update(grant.patch)
    return current


def test_one_container_gets_its_cards_limits_and_mounts() -> None:
    p = pod([[("GPU-a", 4096, 30)]], [container("main")])
    grant = allocation.allocate(p, ["GPU-a-3"], GPU, NodeSettings())
    assert grant.container == "main"
    assert grant.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    assert grant.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert grant.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert "CUDA_OVERSUBSCRIBE" not in grant.envs
    paths = {m.container_path for m in grant.mounts}
    assert {"/usr/local/vgpu", "/usr/local/vgpu/libvgpu.so", "/tmp/vgpulock"} <= paths
    assert allocation.PRELOAD_FILE in paths
    assert grant.patch[names.BIND_PHASE] == "success"


def test_two_containers_are_served_in_order_and_success_comes_with_the_last() -> None:
    p = pod(
        [[("GPU-a", 1000, 10)], [("GPU-b", 2000, 20), ("GPU-c", 3000, 20)]],
        [container("first"), container("second", 2)],
    )
    first = allocation.allocate(p, ["GPU-a-0"], GPU, NodeSettings())
    assert first.container == "first"
    assert names.BIND_PHASE not in first.patch
    second = allocation.allocate(consume(p, first), ["GPU-c-1", "GPU-b-9"], GPU, NodeSettings())
    assert second.container == "second"
    assert second.envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == "3000m"
    assert second.patch[names.BIND_PHASE] == "success"
    with pytest.raises(AllocationError, match="already handed out"):
        allocation.allocate(consume(p, second), ["GPU-a-0"], GPU, NodeSettings())


def test_init_containers_come_first() -> None:
    p = pod([[("GPU-a", 1000, 10)], [("GPU-a", 500, 5)]], [container("app")], [container("init")])
    assert allocation.allocate(p, ["GPU-a-1"], GPU, NodeSettings()).container == "init"


def with_full_allocation(p: dict[str, Any]) -> dict[str, Any]:
    """The pod as the operator binds it: the full allocation beside the entries to hand out."""
    annotations = p["metadata"]["annotations"]
    annotations[nvidia.ALLOCATED_ANNOTATION] = annotations[nvidia.TO_ALLOCATE_ANNOTATION]
    return p


def test_kubelet_may_hand_an_app_container_its_init_containers_device() -> None:
    # kubelet reuses a finished init container's IDs for the next containers; the app
    # container still gets the cards the scheduler gave it.
    entries = [[("GPU-a", 1000, 10)], [("GPU-b", 2000, 20), ("GPU-c", 2000, 20)]]
    p = with_full_allocation(pod(entries, [container("app", 2)], [container("init")]))
    consume(p, allocation.allocate(p, ["GPU-a-0"], GPU, NodeSettings()))
    grant = allocation.allocate(p, ["GPU-a-0", "GPU-b-3"], GPU, NodeSettings())
    assert grant.container == "app"
    assert grant.envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-b,GPU-c"


@pytest.mark.parametrize(
    ("init", "ids"),
    [
        pytest.param(container("init"), ["GPU-z-0", "GPU-b-1"], id="card-no-init-had"),
        pytest.param(
            {**container("sidecar"), "restartPolicy": "Always"},
            ["GPU-a-0", "GPU-b-1"],
            id="sidecar-keeps-its-devices",
        ),
    ],
)
def test_only_an_init_containers_card_is_excused(init: dict[str, Any], ids: list[str]) -> None:
    entries = [[("GPU-a", 1000, 10)], [("GPU-b", 2000, 20), ("GPU-c", 2000, 20)]]
    p = with_full_allocation(pod(entries, [container("app", 2)], [init]))
    consume(p, allocation.allocate(p, ["GPU-a-0"], GPU, NodeSettings()))
    with pytest.raises(AllocationError, match="kubelet chose devices"):
        allocation.allocate(p, ids, GPU, NodeSettings())


def test_a_container_without_gpus_is_skipped_by_position() -> None:
    p = pod([[], [("GPU-a", 1000, 10)]], [container("sidecar", None), container("gpu")])
    assert allocation.allocate(p, ["GPU-a-1"], GPU, NodeSettings()).container == "gpu"


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        pytest.param(["GPU-a-0", "GPU-a-1"], "asks for 2 devices", id="count-mismatch"),
        pytest.param(["GPU-z-0"], "kubelet chose devices", id="other-card"),
        pytest.param(["no-index"], "not <GPU UUID>-<n>", id="bad-id"),
    ],
)
def test_kubelets_ids_must_match_the_allocation(ids: list[str], match: str) -> None:
    p = pod([[("GPU-a", 1000, 10)]], [container("main")])
    with pytest.raises(AllocationError, match=match):
        allocation.allocate(p, ids, GPU, NodeSettings())


def test_an_injected_container_is_refused_not_served_anothers_devices() -> None:
    p = pod([[("GPU-a", 1000, 10)]], [container("istio-proxy", None), container("main")])
    with pytest.raises(AllocationError, match=r"does not ask for nvidia\.com/gpu"):
        allocation.allocate(p, ["GPU-a-0"], GPU, NodeSettings())


def test_cuda_disable_control_skips_the_preload() -> None:
    p = pod([[("GPU-a", 1000, 10)]], [container("main", env={"CUDA_DISABLE_CONTROL": "true"})])
    grant = allocation.allocate(p, ["GPU-a-0"], GPU, NodeSettings())
    assert allocation.PRELOAD_FILE not in {m.container_path for m in grant.mounts}


def test_oversubscription_and_core_policy_reach_the_container() -> None:
    p = pod([[("GPU-a", 1000, 10)]], [container("main")])
    settings = NodeSettings(device_memory_scaling=2.0, core_policy="disable")
    grant = allocation.allocate(p, ["GPU-a-0"], GPU, settings)
    assert grant.envs["CUDA_OVERSUBSCRIBE"] == "true"
    assert grant.envs["GPU_CORE_UTILIZATION_POLICY"] == "disable"


def test_mig_entries_without_a_mig_backend_are_refused_with_a_clear_error() -> None:
    p = pod([[("GPU-a[0-1]", 5120, 14)]], [container("main")])
    with pytest.raises(AllocationError, match="MIG"):
        allocation.allocate(p, ["GPU-a-0"], GPU, NodeSettings())


class RecordingMig:
    def __init__(self) -> None:
        self.asked: list[tuple[str, int, int]] = []

    def device(self, card_uuid: str, geometry: int, slot: int) -> str:
        self.asked.append((card_uuid, geometry, slot))
        return f"MIG-{card_uuid}-{geometry}-{slot}"


def test_a_mig_entry_gets_its_instance_and_no_hami_core() -> None:
    """kubelet's IDs are on the card; the container sees the MIG device the backend made,
    and HAMi-core stays out (the hardware enforces the partition)."""
    p = pod([[("GPU-a[1-3]", 5120, 14)]], [container("main")])
    mig = RecordingMig()
    grant = allocation.allocate(p, ["GPU-a-4"], GPU, NodeSettings(), mig)
    assert mig.asked == [("GPU-a", 1, 3)]
    assert grant.envs == {"NVIDIA_VISIBLE_DEVICES": "MIG-GPU-a-1-3"}
    assert grant.mounts == ()
    assert grant.patch[names.BIND_PHASE] == "success"


def test_kubelet_ids_on_another_card_than_the_mig_entrys_are_refused() -> None:
    p = pod([[("GPU-a[0-0]", 5120, 14)]], [container("main")])
    mig = RecordingMig()
    with pytest.raises(AllocationError, match="kubelet chose devices"):
        allocation.allocate(p, ["GPU-b-0"], GPU, NodeSettings(), mig)
    assert mig.asked == []  # nothing is created for a call that is refused


def test_missing_or_garbage_annotation_is_an_error() -> None:
    p = pod([[("GPU-a", 1000, 10)]], [container("main")])
    p["metadata"]["annotations"][nvidia.TO_ALLOCATE_ANNOTATION] = "GPU-a,NVIDIA,x,y:;"
    with pytest.raises(AllocationError, match="unreadable"):
        allocation.allocate(p, ["GPU-a-0"], GPU, NodeSettings())
    del p["metadata"]["annotations"][nvidia.TO_ALLOCATE_ANNOTATION]
    with pytest.raises(AllocationError, match="has no"):
        allocation.allocate(p, ["GPU-a-0"], GPU, NodeSettings())


cards = st.sampled_from(["GPU-a", "GPU-b", "GPU-c", "GPU-d"])
entries = st.lists(
    st.lists(st.tuples(cards, st.integers(1, 80000), st.integers(0, 100)), max_size=3),
    min_size=1,
    max_size=5,
)


@given(entries)
def test_every_container_gets_exactly_its_own_entry_once(layout: list[Any]) -> None:
    """Served in kubelet's order, each GPU container receives its own entry, nothing is
    handed out twice, and success is written exactly when the last entry goes."""
    containers = [container(f"c{i}", len(e) if e else None) for i, e in enumerate(layout)]
    current = pod(layout, containers)
    for i, entry in enumerate(layout):
        if not entry:
            continue
        ids = [f"{uuid}-{n}" for n, (uuid, _, _) in enumerate(entry)]
        grant = allocation.allocate(current, ids, GPU, NodeSettings())
        assert grant.container == f"c{i}"
        assert [(d.uuid, d.memory_mib, d.cores) for d in grant.devices] == entry
        last = not any(layout[i + 1 :])
        assert (names.BIND_PHASE in grant.patch) == last
        current = consume(current, grant)
    with pytest.raises(AllocationError):
        allocation.allocate(current, ["GPU-a-0"], GPU, NodeSettings())
