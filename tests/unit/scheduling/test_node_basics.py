"""The kube-scheduler rules every node must pass before its cards are looked at."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from builders import NodeBuilder, PodBuilder, cluster, make_node, make_pod

from vgpu_operator.scheduling import node_basics
from vgpu_operator.scheduling.status import Reason

R = Reason


def check(
    node: NodeBuilder,
    pod: PodBuilder,
    used: node_basics.PodResources | None = None,
    pod_count: int = 0,
) -> Reason | None:
    pod_obj = pod.obj()
    return node_basics.check_node(
        pod_obj,
        node_basics.pod_requests(pod_obj),
        node_basics.NodeFacts.from_node(node.obj()[0]),
        used or node_basics.PodResources(),
        pod_count,
    )


def tolerate(*tolerations: dict[str, Any]) -> PodBuilder:
    return make_pod("p").container(gpu=1).spec("tolerations", list(tolerations))


def affinity(*expressions: dict[str, Any]) -> PodBuilder:
    term = {"matchExpressions": list(expressions)}
    required = {"nodeSelectorTerms": [term]}
    spec = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    return make_pod("p").container(gpu=1).spec("affinity", spec)


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


PLAIN = make_pod("p").container(gpu=1)


@pytest.mark.parametrize(
    ("node", "pod", "expected"),
    [
        pytest.param(make_node("n"), PLAIN, None, id="plain-node-fits"),
        pytest.param(make_node("n").unschedulable(), PLAIN, R.NODE_UNSCHEDULABLE, id="cordoned"),
        pytest.param(
            make_node("n").unschedulable(),
            tolerate({"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}),
            None,
            id="cordoned-tolerated",
        ),
        pytest.param(make_node("n").not_ready(), PLAIN, R.NODE_NOT_READY, id="not-ready"),
        pytest.param(
            make_node("n").not_ready(),
            tolerate({"key": "node.kubernetes.io/not-ready", "operator": "Exists"}),
            None,
            id="not-ready-tolerated",
        ),
        pytest.param(
            make_node("n").unschedulable().not_ready(),
            PLAIN,
            R.NODE_UNSCHEDULABLE,
            id="unschedulable-before-not-ready",
        ),
    ],
)
def test_node_state(node: NodeBuilder, pod: PodBuilder, expected: Reason | None) -> None:
    assert check(node, pod) is expected


GPU_TAINT = make_node("n").taint("gpu", "true", "NoSchedule")


@pytest.mark.parametrize(
    ("node", "pod", "expected"),
    [
        pytest.param(GPU_TAINT, PLAIN, R.NODE_UNTOLERATED_TAINT, id="no-schedule-untolerated"),
        pytest.param(
            make_node("n").taint("gpu", "true", "NoExecute"),
            PLAIN,
            R.NODE_UNTOLERATED_TAINT,
            id="no-execute-untolerated",
        ),
        pytest.param(
            make_node("n").taint("gpu", "true", "PreferNoSchedule"),
            PLAIN,
            None,
            id="prefer-no-schedule-ignored",
        ),
        pytest.param(
            GPU_TAINT,
            tolerate({"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}),
            None,
            id="equal-tolerated",
        ),
        pytest.param(
            GPU_TAINT,
            tolerate({"key": "gpu", "value": "true"}),
            None,
            id="operator-defaults-to-equal-effect-any",
        ),
        pytest.param(
            GPU_TAINT,
            tolerate({"key": "gpu", "operator": "Equal", "value": "false"}),
            R.NODE_UNTOLERATED_TAINT,
            id="equal-other-value",
        ),
        pytest.param(
            GPU_TAINT,
            tolerate({"key": "gpu", "operator": "Exists"}),
            None,
            id="exists-any-value",
        ),
        pytest.param(
            GPU_TAINT, tolerate({"operator": "Exists"}), None, id="exists-empty-key-all-taints"
        ),
        pytest.param(
            GPU_TAINT,
            tolerate({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}),
            R.NODE_UNTOLERATED_TAINT,
            id="exists-other-effect",
        ),
        pytest.param(
            GPU_TAINT,
            tolerate({"key": "other", "operator": "Exists"}),
            R.NODE_UNTOLERATED_TAINT,
            id="exists-other-key",
        ),
        pytest.param(
            make_node("n").taint("gpu", "true").taint("ssd", "", "NoExecute"),
            tolerate({"key": "gpu", "operator": "Exists"}),
            R.NODE_UNTOLERATED_TAINT,
            id="every-taint-must-be-tolerated",
        ),
    ],
)
def test_taints(node: NodeBuilder, pod: PodBuilder, expected: Reason | None) -> None:
    assert check(node, pod) is expected


LABELLED = make_node("n").label("gpu", "a100").label("generation", "8")


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(
            make_pod("p").container(gpu=1).spec("nodeSelector", {"gpu": "a100"}),
            None,
            id="selector-match",
        ),
        pytest.param(
            make_pod("p").container(gpu=1).spec("nodeSelector", {"gpu": "t4"}),
            R.NODE_SELECTOR_MISMATCH,
            id="selector-other-value",
        ),
        pytest.param(
            make_pod("p").container(gpu=1).spec("nodeSelector", {"zone": "a"}),
            R.NODE_SELECTOR_MISMATCH,
            id="selector-missing-label",
        ),
        pytest.param(affinity(expr("gpu", "In", "t4", "a100")), None, id="in"),
        pytest.param(affinity(expr("gpu", "In", "t4")), R.NODE_AFFINITY_MISMATCH, id="in-miss"),
        pytest.param(affinity(expr("gpu", "NotIn", "t4")), None, id="not-in"),
        pytest.param(
            affinity(expr("gpu", "NotIn", "a100")), R.NODE_AFFINITY_MISMATCH, id="not-in-miss"
        ),
        pytest.param(affinity(expr("zone", "NotIn", "a")), None, id="not-in-absent-label"),
        pytest.param(affinity(expr("gpu", "Exists")), None, id="exists"),
        pytest.param(affinity(expr("zone", "Exists")), R.NODE_AFFINITY_MISMATCH, id="exists-miss"),
        pytest.param(affinity(expr("zone", "DoesNotExist")), None, id="does-not-exist"),
        pytest.param(
            affinity(expr("gpu", "DoesNotExist")),
            R.NODE_AFFINITY_MISMATCH,
            id="does-not-exist-miss",
        ),
        pytest.param(affinity(expr("generation", "Gt", "7")), None, id="gt"),
        pytest.param(
            affinity(expr("generation", "Gt", "8")), R.NODE_AFFINITY_MISMATCH, id="gt-equal"
        ),
        pytest.param(affinity(expr("generation", "Lt", "9")), None, id="lt"),
        pytest.param(
            affinity(expr("generation", "Lt", "8")), R.NODE_AFFINITY_MISMATCH, id="lt-equal"
        ),
        pytest.param(
            affinity(expr("gpu", "Gt", "7")), R.NODE_AFFINITY_MISMATCH, id="gt-non-integer-label"
        ),
        pytest.param(
            affinity(expr("gpu", "In", "a100"), expr("zone", "Exists")),
            R.NODE_AFFINITY_MISMATCH,
            id="expressions-anded",
        ),
        pytest.param(
            make_pod("p")
            .container(gpu=1)
            .spec(
                "affinity",
                {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [expr("gpu", "In", "t4")]},
                                {"matchExpressions": [expr("gpu", "In", "a100")]},
                            ]
                        }
                    }
                },
            ),
            None,
            id="terms-ored",
        ),
        pytest.param(
            make_pod("p")
            .container(gpu=1)
            .spec("nodeSelector", {"gpu": "t4"})
            .spec("affinity", {"nodeAffinity": {}}),
            R.NODE_SELECTOR_MISMATCH,
            id="selector-before-affinity",
        ),
    ],
)
def test_selector_and_affinity(pod: PodBuilder, expected: Reason | None) -> None:
    assert check(LABELLED, pod) is expected


SMALL = make_node("n").allocatable(cpu="4", memory="8Gi", pods="3")


@pytest.mark.parametrize(
    ("pod", "used", "pod_count", "expected"),
    [
        pytest.param(make_pod("p").container(cpu="4", memory="8Gi"), None, 0, None, id="exact"),
        pytest.param(
            make_pod("p").container(cpu="4100m"), None, 0, R.INSUFFICIENT_CPU, id="cpu-over"
        ),
        pytest.param(
            make_pod("p").container(memory="9Gi"),
            None,
            0,
            R.INSUFFICIENT_NODE_MEMORY,
            id="memory-over",
        ),
        pytest.param(
            make_pod("p").container(cpu="2"),
            node_basics.PodResources(cpu=Fraction(3)),
            1,
            R.INSUFFICIENT_CPU,
            id="cpu-with-running-pods",
        ),
        pytest.param(
            make_pod("p").container(cpu="1"),
            node_basics.PodResources(cpu=Fraction(3)),
            1,
            None,
            id="cpu-fills-exactly",
        ),
        pytest.param(make_pod("p").container(cpu="1"), None, 3, R.TOO_MANY_PODS, id="pods-full"),
        pytest.param(make_pod("p").container(cpu="1"), None, 2, None, id="last-pod-slot"),
        pytest.param(
            make_pod("p").container(cpu="5", memory="9Gi"),
            None,
            3,
            R.TOO_MANY_PODS,
            id="pods-before-cpu-before-memory",
        ),
        pytest.param(
            make_pod("p").container(cpu="1", section="requests", extra={}).container(cpu="3500m"),
            None,
            0,
            R.INSUFFICIENT_CPU,
            id="containers-summed",
        ),
    ],
)
def test_capacity(
    pod: PodBuilder,
    used: node_basics.PodResources | None,
    pod_count: int,
    expected: Reason | None,
) -> None:
    assert check(SMALL, pod, used, pod_count) is expected


@pytest.mark.parametrize(
    ("pod", "cpu", "memory"),
    [
        pytest.param(make_pod("p").container(cpu="500m", memory="1Gi"), "1/2", 2**30, id="limits"),
        pytest.param(
            make_pod("p").container(cpu="1", memory="1Gi").container(cpu="250m"),
            "5/4",
            2**30,
            id="app-containers-summed",
        ),
        pytest.param(
            make_pod("p").init_container(cpu="2").container(cpu="1", memory="1Gi"),
            "2",
            2**30,
            id="init-peak-wins",
        ),
        pytest.param(
            make_pod("p").init_container(cpu="500m").container(cpu="1"), "1", 0, id="app-sum-wins"
        ),
    ],
)
def test_pod_requests(pod: PodBuilder, cpu: str, memory: int) -> None:
    assert node_basics.pod_requests(pod.obj()) == node_basics.PodResources(
        Fraction(cpu), Fraction(memory)
    )


def test_requests_win_over_limits_for_node_capacity() -> None:
    pod = {
        "spec": {
            "containers": [
                {"resources": {"limits": {"cpu": "4"}, "requests": {"cpu": "1"}}},
            ]
        }
    }
    assert node_basics.pod_requests(pod).cpu == 1


# --- through the cluster state: pods already on the node count ---------------------------


def test_running_pods_use_node_cpu() -> None:
    state = cluster(make_node("n").gpu("GPU-0").allocatable(cpu="4", pods="10"))
    state.set_pod(make_pod("running").container(cpu="3").on_node("n").obj())
    decision = state.schedule(make_pod("p").container(gpu=1, gpumem=1024, cpu="2").obj(), 0)
    assert decision.diagnosis is not None
    assert decision.diagnosis.to_json() == {"n": {"InsufficientCPU": 1}}


def test_running_pods_use_pod_slots() -> None:
    state = cluster(make_node("n").gpu("GPU-0").allocatable(pods="1"))
    state.set_pod(make_pod("running").container(cpu="1").on_node("n").obj())
    decision = state.schedule(make_pod("p").container(gpu=1, gpumem=1024).obj(), 0)
    assert decision.diagnosis is not None
    assert decision.diagnosis.to_json() == {"n": {"TooManyPods": 1}}


def test_finished_pod_frees_node_capacity() -> None:
    state = cluster(make_node("n").gpu("GPU-0").allocatable(pods="1"))
    running = make_pod("running").container(cpu="1").on_node("n")
    state.set_pod(running.obj())
    state.set_pod(running.phase("Succeeded").obj())
    assert state.schedule(make_pod("p").container(gpu=1, gpumem=1024).obj(), 0).node == "n"


def test_node_reason_counts_one_per_node() -> None:
    state = cluster(
        make_node("a").gpu("GPU-a0").gpu("GPU-a1").unschedulable(),
        make_node("b").gpu("GPU-b0").taint("gpu", "x"),
    )
    decision = state.schedule(make_pod("p").container(gpu=1, gpumem=1024).obj(), 0)
    assert decision.diagnosis is not None
    assert decision.diagnosis.to_json() == {
        "a": {"NodeUnschedulable": 1},
        "b": {"NodeUntoleratedTaint": 1},
    }
