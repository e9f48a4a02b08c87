"""What the mutating webhook does to a pod (hami-semantics §3), through ClusterState.admit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from builders import (
    GPU,
    GPUCORES,
    GPUMEM,
    GPUMEM_PERCENTAGE,
    Json,
    cluster,
    make_pod,
    resource_quota,
)

from vgpu_operator import names
from vgpu_operator.config import load_config
from vgpu_operator.devices import nvidia
from vgpu_operator.scheduling.cycle.cluster import ClusterState

OURS = "vgpu-scheduler"


def state(**nvidia: Any) -> ClusterState:
    return cluster(config=load_config({"nvidia": nvidia}))


def limits(pod: Mapping[str, Any], position: int = 0) -> dict[str, Any]:
    return dict(pod["spec"]["containers"][position]["resources"].get("limits") or {})


def env(pod: Mapping[str, Any], position: int = 0) -> list[tuple[str, str]]:
    return [(e["name"], e["value"]) for e in pod["spec"]["containers"][position].get("env", [])]


# --- refusals -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        pytest.param(
            make_pod("p").container(gpu=1, percentage=101).obj(),
            GPUMEM_PERCENTAGE,
            id="percentage-above-100",
        ),
        pytest.param(
            make_pod("p").container(gpu=1, percentage=-1).obj(),
            GPUMEM_PERCENTAGE,
            id="percentage-negative",
        ),
        pytest.param(
            make_pod("p").container(gpu=1).privileged().obj(),
            "container c0 is privileged",
            id="privileged-gpu-container",
        ),
        pytest.param(
            make_pod("p").container(cpu=1).container(gpu=1).privileged(0).obj(),
            "container c0 is privileged",
            id="privileged-sidecar-of-gpu-pod",
        ),
    ],
)
def test_admit_impossible_pod_refused(pod: Json, message: str) -> None:
    result = state().admit(pod)
    assert not result.allowed
    assert result.handled
    assert message in result.message


def test_a_pod_bound_by_its_creator_is_passed_unchanged() -> None:
    """Nothing to route: the admission policy decides (by the namespace's labels, which
    the operator does not read), and the books and the device plugin give it nothing."""
    pod = make_pod("p").container(gpu=1).spec("nodeName", "node-a").obj()
    result = state().admit(pod)
    assert result.allowed
    assert not result.handled
    assert result.pod == pod


def test_a_refusal_quoting_a_huge_value_is_bounded() -> None:
    """A 200 kB annotation must not come back as a 200 kB answer, condition or log line."""
    huge = "slot=1," * 30_000
    pod = make_pod("p").container(gpu=1).annotate("hami.io/device-scoring-weights", huge).obj()
    result = state().admit(pod)
    assert not result.allowed
    assert len(result.message) < 1100
    assert result.message.startswith("annotation hami.io/device-scoring-weights=")
    assert "more characters" in result.message


def test_admit_pod_without_containers_refused() -> None:
    result = state().admit({"metadata": {"name": "p"}, "spec": {"containers": []}})
    assert not result.allowed
    assert result.message == "pod has no containers"


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(make_pod("p").container(cpu=1).privileged().obj(), id="privileged-no-gpu"),
        pytest.param(
            make_pod("p").container(cpu=1).spec("nodeName", "node-a").obj(), id="bound-no-gpu"
        ),
        pytest.param(make_pod("p").container(gpu=1, percentage=100).obj(), id="percentage-100"),
        pytest.param(make_pod("p").container(gpu=1, percentage=0).obj(), id="percentage-0"),
    ],
)
def test_admit_possible_pod_allowed(pod: Json) -> None:
    assert state().admit(pod).allowed


# --- routing --------------------------------------------------------------------------


def test_admit_pod_of_other_scheduler_untouched() -> None:
    pod = make_pod("p").container(gpu=1).spec("schedulerName", "volcano").obj()
    result = state().admit(pod)
    assert result.allowed
    assert not result.handled
    assert result.pod == pod


@pytest.mark.parametrize(
    "named",
    [pytest.param(None, id="unnamed"), pytest.param("default-scheduler", id="default")],
)
def test_admit_gpu_pod_routed_to_our_scheduler(named: str | None) -> None:
    builder = make_pod("p").container(gpu=1)
    if named is not None:
        builder.spec("schedulerName", named)
    result = state().admit(builder.obj())
    assert result.allowed
    assert result.handled
    assert result.pod["spec"]["schedulerName"] == OURS


def test_admit_pod_without_gpu_not_routed() -> None:
    result = state().admit(make_pod("p").container(cpu=1).obj())
    assert result.allowed
    assert not result.handled
    assert "schedulerName" not in result.pod["spec"]


def test_admit_does_not_change_the_callers_pod() -> None:
    pod = make_pod("p").container(gpumem=4096).obj()
    state().admit(pod)
    assert limits(pod) == {GPUMEM: 4096}


# --- defaults -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("container", "config", "expected"),
    [
        pytest.param({"gpu": 1}, {}, {GPU: 1, GPUCORES: 100}, id="count-only-exclusive"),
        pytest.param(
            {"gpu": 1, "percentage": 100},
            {},
            {GPU: 1, GPUMEM_PERCENTAGE: 100, GPUCORES: 100},
            id="percentage-100-exclusive",
        ),
        pytest.param(
            {"gpu": 1, "percentage": 50},
            {},
            {GPU: 1, GPUMEM_PERCENTAGE: 50},
            id="percentage-50-shared",
        ),
        pytest.param({"gpu": 1, "gpumem": 8192}, {}, {GPU: 1, GPUMEM: 8192}, id="memory-shared"),
        pytest.param({"gpu": 1, "cores": 30}, {}, {GPU: 1, GPUCORES: 30}, id="cores-given-kept"),
        pytest.param({"gpumem": 4096}, {}, {GPU: 1, GPUMEM: 4096}, id="memory-fills-count"),
        pytest.param({"cores": 20}, {}, {GPU: 1, GPUCORES: 20}, id="cores-fill-count"),
        pytest.param(
            {"percentage": 50},
            {},
            {GPU: 1, GPUMEM_PERCENTAGE: 50},
            id="percentage-fills-count",
        ),
        pytest.param(
            {"gpumem": 4096},
            {"defaultGPUNum": 2},
            {GPU: 2, GPUMEM: 4096},
            id="default-gpu-num-used",
        ),
        pytest.param(
            {"gpumem": 4096}, {"defaultGPUNum": 0}, {GPUMEM: 4096}, id="default-gpu-num-zero"
        ),
        pytest.param(
            {"gpu": 1},
            {"defaultMemory": 4096},
            {GPU: 1, GPUCORES: 100},
            id="default-memory-still-exclusive",
        ),
    ],
)
def test_admit_fills_defaults(
    container: dict[str, Any], config: dict[str, Any], expected: dict[str, Any]
) -> None:
    pod = make_pod("p").container(**container).obj()
    assert limits(state(**config).admit(pod).pod) == expected


def test_admit_count_in_requests_gets_exclusive_cores_in_limits() -> None:
    pod = make_pod("p").container(gpu=1, section="requests").obj()
    admitted = state().admit(pod).pod
    assert limits(admitted) == {GPUCORES: 100}


@pytest.mark.parametrize(
    ("config", "container", "expected"),
    [
        pytest.param(
            {},
            {"gpu": 1, "extra": {"nvidia.com/priority": 1}},
            [("CUDA_TASK_PRIORITY", "1")],
            id="priority",
        ),
        pytest.param(
            {"gpuCorePolicy": "force"},
            {"gpu": 1},
            [("GPU_CORE_UTILIZATION_POLICY", "force")],
            id="core-policy-force",
        ),
        pytest.param({"gpuCorePolicy": "default"}, {"gpu": 1}, [], id="core-policy-default"),
        pytest.param(
            {"overwriteEnv": True},
            {"cpu": 1},
            [("NVIDIA_VISIBLE_DEVICES", "none")],
            id="overwrite-env-no-gpu",
        ),
        pytest.param({"overwriteEnv": True}, {"gpu": 1}, [], id="overwrite-env-gpu-container"),
    ],
)
def test_admit_injects_env(
    config: dict[str, Any], container: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    pod = make_pod("p").container(**container).obj()
    assert env(state(**config).admit(pod).pod) == expected


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        pytest.param(None, "nvidia", id="set-when-absent"),
        pytest.param("kata", "kata", id="kept-when-present"),
    ],
)
def test_admit_runtime_class(preset: str | None, expected: str) -> None:
    builder = make_pod("p").container(gpu=1)
    if preset is not None:
        builder.spec("runtimeClassName", preset)
    admitted = state(runtimeClassName="nvidia").admit(builder.obj()).pod
    assert admitted["spec"]["runtimeClassName"] == expected


def test_admit_runtime_class_not_set_on_pod_without_gpu() -> None:
    admitted = state(runtimeClassName="nvidia").admit(make_pod("p").container(cpu=1).obj()).pod
    assert "runtimeClassName" not in admitted["spec"]


# --- idempotence ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "pod"),
    [
        pytest.param({}, make_pod("p").container(gpu=1).obj(), id="exclusive-default"),
        pytest.param({}, make_pod("p").container(gpumem=4096).obj(), id="count-default"),
        pytest.param(
            {}, make_pod("p").container(gpu=2, percentage=100).obj(), id="percentage-exclusive"
        ),
        pytest.param(
            {"runtimeClassName": "nvidia"},
            make_pod("p").container(gpu=1, cores=30).obj(),
            id="runtime-class",
        ),
        pytest.param(
            {},
            make_pod("p").init_container(gpu=1).container(gpu=1, gpumem=1024).obj(),
            id="init-container",
        ),
        pytest.param(
            {"gpuCorePolicy": "force", "overwriteEnv": True},
            make_pod("p").container(gpu=1, extra={"nvidia.com/priority": 1}).container(cpu=1).obj(),
            id="env-injection",
        ),
    ],
)
def test_admit_twice_changes_nothing(config: dict[str, Any], pod: Json) -> None:
    cluster_state = state(**config)
    once = cluster_state.admit(pod).pod
    assert cluster_state.admit(once).pod == once


# --- quota ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quota", "pod", "allowed"),
    [
        pytest.param(
            {"gpumem": 8192},
            make_pod("p", "team").container(gpu=2, gpumem=4096).obj(),
            True,
            id="memory-equal-to-limit",
        ),
        pytest.param(
            {"gpumem": 8192},
            make_pod("p", "team").container(gpu=3, gpumem=4096).obj(),
            False,
            id="memory-times-count-over-limit",
        ),
        pytest.param(
            {"gpumem": 8192},
            make_pod("p", "team").container(gpu=1, gpumem=4096).container(gpu=1, gpumem=5000).obj(),
            False,
            id="containers-summed",
        ),
        pytest.param(
            {"gpumem": 8192},
            make_pod("p", "team")
            .init_container(gpu=1, gpumem=8000)
            .init_container(gpu=1, gpumem=8000)
            .container(gpu=1, gpumem=1024)
            .obj(),
            True,
            id="init-containers-at-their-peak",
        ),
        pytest.param(
            {"gpumem": 8192},
            make_pod("p", "team").init_container(gpu=1, gpumem=9000).container(gpu=1).obj(),
            False,
            id="init-peak-over-limit",
        ),
        pytest.param(
            {"gpucores": 100},
            make_pod("p", "team").container(gpu=2, cores=60).obj(),
            False,
            id="cores-over-limit",
        ),
        pytest.param(
            {"gpumem": 1024},
            make_pod("p", "team").container(gpu=1, percentage=50).obj(),
            True,
            id="percentage-not-checked-at-admission",
        ),
        pytest.param(
            {"gpumem": 8192},
            make_pod("p", "other").container(gpu=1, gpumem=9000).obj(),
            True,
            id="other-namespace-unlimited",
        ),
        pytest.param(
            {"gpumem": 0},
            make_pod("p", "team").container(gpu=1, gpumem=9000).obj(),
            True,
            id="limit-zero-unlimited",
        ),
    ],
)
def test_admit_checks_pod_demand_against_quota(
    quota: dict[str, Any], pod: Json, allowed: bool
) -> None:
    cluster_state = state()
    cluster_state.set_quota(resource_quota("team", **quota))
    result = cluster_state.admit(pod)
    assert result.allowed is allowed
    if not allowed:
        assert "exceeding resource quota" in result.message


def test_admit_quota_memory_limit_scaled_by_memory_factor() -> None:
    cluster_state = state(memoryFactor=1024)
    cluster_state.set_quota(resource_quota("team", gpumem=8))
    assert cluster_state.admit(make_pod("a", "team").container(gpu=2, gpumem=4).obj()).allowed
    assert not cluster_state.admit(make_pod("b", "team").container(gpu=3, gpumem=4).obj()).allowed


def test_admit_pod_within_limit_allowed_although_others_hold_quota() -> None:
    # Deliberate difference from HAMi: only the pod's own demand is checked at admission;
    # what other pods hold is Fit's business (ResourceQuotaNotFit), so the pod waits.
    cluster_state = state()
    cluster_state.set_quota(resource_quota("team", gpumem=8192))
    running = (
        make_pod("running", "team")
        .container(gpu=1, gpumem=8192)
        .on_node("node-a", "GPU-a0,NVIDIA,8192,0:;")
        .obj()
    )
    cluster_state.set_pod(running)
    assert cluster_state.quota_usage()["team"][GPUMEM] == (8192, 8192)
    assert cluster_state.admit(make_pod("p", "team").container(gpu=1, gpumem=4096).obj()).allowed


def test_schedule_over_quota_pod_rejected_with_message() -> None:
    cluster_state = state()
    cluster_state.set_quota(resource_quota("team", gpumem=1024))
    decision = cluster_state.schedule(make_pod("p", "team").container(gpu=1, gpumem=4096).obj(), 0)
    assert not decision.scheduled
    assert decision.rejected is not None
    assert "exceeding resource quota" in decision.rejected
    assert names.ASSIGNED_NODE not in decision.annotations


# --- requests that cannot be honoured (issue 10) ----------------------------------------


@pytest.mark.parametrize("gpumem", ["4Gi", "16G", 2147483648, "1e30", "4.5", -1])
def test_memory_that_is_not_a_mib_count_is_refused_naming_the_unit(gpumem: Any) -> None:
    pod = make_pod("p").container(1, gpumem).obj()
    result = state().admit(pod)
    assert result.handled
    assert not result.allowed
    assert GPUMEM in result.message
    assert "MiB" in result.message


@pytest.mark.parametrize("count", ["1.5", "one", -2])
def test_unreadable_gpu_count_is_refused(count: Any) -> None:
    result = state().admit(make_pod("p").container(count, 1000).obj())
    assert not result.allowed
    assert GPU in result.message


def test_cores_above_100_are_admitted_with_a_warning_that_says_so() -> None:
    result = state().admit(make_pod("p").container(1, 1000, 150).obj())
    assert result.allowed
    assert len(result.warnings) == 1
    assert GPUCORES in result.warnings[0]
    assert "100" in result.warnings[0]


def test_ordinary_request_has_no_warning() -> None:
    result = state().admit(make_pod("p").container(1, 1000, 50).obj())
    assert result.allowed
    assert result.warnings == ()


def test_unreadable_scoring_weights_are_refused() -> None:
    pod = make_pod("p").container(1, 1000).annotate(names.DEVICE_SCORING_WEIGHTS, "x").obj()
    result = state().admit(pod)
    assert not result.allowed
    assert names.DEVICE_SCORING_WEIGHTS in result.message


# --- issue 44, N14: values HAMi reads as something else than written -----------------------


def test_a_count_of_zero_with_a_share_is_refused_naming_what_to_change() -> None:
    pod = make_pod("p").container(gpu=0, gpumem=1000).obj()
    result = state().admit(pod)
    assert not result.allowed
    assert "nvidia.com/gpu: is 0 while the container asks nvidia.com/gpumem" in result.message
    assert "ask at least one device (nvidia.com/gpu: 1) or remove nvidia.com/gpumem" in (
        result.message
    )


def test_a_count_of_zero_alone_asks_nothing_and_gets_no_default_share() -> None:
    pod = make_pod("p").container(gpu=0).obj()
    result = state().admit(pod)
    assert result.allowed
    assert GPUCORES not in limits(result.pod)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        (
            nvidia.NUMA_BIND_ANNOTATION,
            "maybe",
            "nvidia.com/numa-bind='maybe' is not a boolean: write",
        ),
        (nvidia.NUMA_BIND_ANNOTATION, "yes", "is not a boolean"),
        (nvidia.MODE_ANNOTATION, "quantum", "nvidia.com/vgpu-mode='quantum' names no card mode"),
    ],
)
def test_card_filter_annotations_that_read_as_something_else_are_refused(
    key: str, value: str, words: str
) -> None:
    pod = make_pod("p").container(gpu=1).annotate(key, value).obj()
    result = state().admit(pod)
    assert not result.allowed
    assert words in result.message
    if key == nvidia.MODE_ANNOTATION:
        assert "hami-core, mig, mps" in result.message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (nvidia.NUMA_BIND_ANNOTATION, "true"),
        (nvidia.NUMA_BIND_ANNOTATION, "0"),
        (nvidia.MODE_ANNOTATION, "hami-core"),
        (nvidia.MODE_ANNOTATION, "mig,mps"),
    ],
)
def test_card_filter_annotations_that_read_as_written_pass(key: str, value: str) -> None:
    pod = make_pod("p").container(gpu=1).annotate(key, value).obj()
    assert state().admit(pod).allowed
