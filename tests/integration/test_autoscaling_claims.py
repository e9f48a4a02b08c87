"""Autoscaling with Karpenter for pods with ResourceClaims on our classes, an operator
restarted while the NodeClaims it asked for are on their way, and pods that come while
their siblings' node is on its way (``make karpenter``; docs/autoscaling.md).

The harness of ``test_autoscaling`` (Karpenter's controller with its KWOK provider, an
agent on every node it makes), here with the DRA device classes: a NodePool whose template
labels its nodes for the DRA path gets nodes whose agent is also their DRA driver, so each
new node publishes its ResourceSlice as on a real node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from typing import Any

import pytest
import yaml
from integration import operator_env as env
from integration.dra_env import RESOURCE, claim_pod, create_claim_template
from integration.test_autoscaling import (  # noqa: F401 (fixtures)
    Harness,
    _clean,
    _operator_options,
    _pool,
    _pool_claims,
    _running,
    _scheduler,
    harness,
    replica_set_of,
)

from vgpu_operator.control import autoscale_claims
from vgpu_operator.devices import dra
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing import karpenter

pytestmark = pytest.mark.integration

CLAIMS = f"{RESOURCE}/resourceclaims"


@pytest.fixture(scope="module", autouse=True)
def _device_classes(harness: Harness) -> None:  # noqa: F811
    """The DRA device classes, and kube-controller-manager's claim controller (pods'
    template claims are made by it, as in a cluster) and ReplicaSet controller."""
    for doc in yaml.safe_load_all((env.REPO / "manifests" / "dra-deviceclasses.yaml").read_text()):
        harness.cp.create(f"{RESOURCE}/deviceclasses", doc)
    harness.cp.start_controller_manager(["resourceclaim-controller", "replicaset-controller"])


def _claim_pod(
    cp: Any, namespace: str, name: str, scheduler: str, memory_mib: int, group: str | None = None
) -> None:
    """A ResourceClaim of one share of ``memory_mib`` of our shared class, and a pod of
    ``scheduler`` that uses it, kept to the test's NodePool (a member of PodGroup ``group``
    if one is given)."""
    exactly = {
        "deviceClassName": dra.SHARED_CLASS,
        "capacity": {"requests": {"memory": f"{memory_mib}Mi"}},
    }
    cp.create(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        },
    )
    pod = claim_pod(name, claim=name, scheduler=scheduler)
    pod["metadata"]["namespace"] = namespace
    pod["spec"]["nodeSelector"] = {env.TEST_LABEL: namespace}
    if group is not None:
        pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    env.create_pod(cp, pod)


def _allocated_on(cp: Any, namespace: str, name: str) -> set[str]:
    claim = cp.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
        "results"
    ) or ()
    return {str(r["pool"]) for r in results}


def test_pods_with_claims_get_exactly_the_nodes_the_engine_plans(
    harness: Harness,  # noqa: F811
) -> None:
    """Six claims of 40 GB each on a NodePool of DRA nodes: no node holds them, one
    8xH100 holds all six (Karpenter's own simulation passes over pods with claims). Exactly
    one NodeClaim is made, of that type; its node's slice comes, the six claims are
    allocated on it by the engine and the pods bound there."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    pool = f"dra-{namespace}"
    labels = {env.TEST_LABEL: namespace, dra.NODE_PATH_LABEL: dra.PATH_DRA}
    cp.create(
        karpenter.NODE_POOLS,
        karpenter.node_pool(pool, ["gpu-8xh100", "gpu-4xl40s"], labels=labels),
    )
    names = [f"c{i}" for i in range(6)]
    for name in names:
        _claim_pod(cp, namespace, name, scheduler, 40960)
    with OperatorThread(_operator_options(harness, scheduler)) as running:
        bound = [env.wait_bound(cp, namespace, n, timeout_s=180) for n in names]
        nodes = {p["spec"]["nodeName"] for p in bound}
        assert len(nodes) == 1
        claims = _pool_claims(cp, pool)
        assert len(claims) == 1, [c["metadata"]["name"] for c in claims]
        assert claims[0]["metadata"]["labels"][karpenter.INSTANCE_TYPE_LABEL] == "gpu-8xh100"
        assert autoscale_claims.OWNED_LABEL in claims[0]["metadata"]["labels"]
        for name in names:
            assert _allocated_on(cp, namespace, name) == nodes
        # The autoscaler's metrics: one claim made, a search timed, none on its way now.
        get = running.app.metrics.registry.get_sample_value
        prefix = "vgpu_operator_autoscale"
        assert get(f"{prefix}_claims_total", {"event": "created"}) == 1
        assert (get(f"{prefix}_search_cpu_seconds_count") or 0) >= 1
        env.wait_until(
            "no claim on its way",
            lambda: get(f"{prefix}_planned_nodes", {"instance_type": "gpu-8xh100"}) == 0,
            30,
        )


def test_pods_whose_claims_come_from_a_template_get_the_node_planned(
    harness: Harness,  # noqa: F811
) -> None:
    """Three pods whose 40 GB claims the claim controller makes from a template: one
    4xL40S (the cheapest single node with a card for each) is asked for, the claims are
    allocated on its node and the pods bound."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    pool = f"tmpl-{namespace}"
    labels = {env.TEST_LABEL: namespace, dra.NODE_PATH_LABEL: dra.PATH_DRA}
    cp.create(
        karpenter.NODE_POOLS,
        karpenter.node_pool(pool, ["gpu-8xh100", "gpu-4xl40s"], labels=labels),
    )
    exactly = {
        "deviceClassName": dra.SHARED_CLASS,
        "capacity": {"requests": {"memory": "40960Mi"}},
    }
    create_claim_template(cp, namespace, "share", exactly)
    names = [f"t{i}" for i in range(3)]
    for name in names:
        pod = claim_pod(name, template="share", scheduler=scheduler)
        pod["metadata"]["namespace"] = namespace
        pod["spec"]["nodeSelector"] = {env.TEST_LABEL: namespace}
        env.create_pod(cp, pod)
    with OperatorThread(_operator_options(harness, scheduler)):
        bound = [env.wait_bound(cp, namespace, n, timeout_s=180) for n in names]
        nodes = {p["spec"]["nodeName"] for p in bound}
        assert len(nodes) == 1
        claims = _pool_claims(cp, pool)
        assert len(claims) == 1, [c["metadata"]["name"] for c in claims]
        assert claims[0]["metadata"]["labels"][karpenter.INSTANCE_TYPE_LABEL] == "gpu-4xl40s"
        for pod in bound:
            (status,) = pod["status"]["resourceClaimStatuses"]
            assert _allocated_on(cp, namespace, status["resourceClaimName"]) == nodes


def test_a_gang_with_claims_is_held_whole_on_the_nodes_planned_for_it(
    harness: Harness,  # noqa: F811
) -> None:
    """A PodGroup of six members each with a 40 GB claim, gang minCount 6, on a NodePool
    of 4xL40S DRA nodes (one such claim a card): the engine asks for two nodes at once and
    all six are bound on them, none before both nodes are there."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    pool = f"dgang-{namespace}"
    labels = {env.TEST_LABEL: namespace, dra.NODE_PATH_LABEL: dra.PATH_DRA}
    cp.create(karpenter.NODE_POOLS, karpenter.node_pool(pool, ["gpu-4xl40s"], labels=labels))
    cp.create(
        f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups",
        {
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "train"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 6}}},
        },
    )
    names = [f"w{i}" for i in range(6)]
    for name in names:
        _claim_pod(cp, namespace, name, scheduler, 40960, group="train")
    with OperatorThread(_operator_options(harness, scheduler)):
        bound = [env.wait_bound(cp, namespace, n, timeout_s=180) for n in names]
        nodes = {p["spec"]["nodeName"] for p in bound}
        assert len(nodes) == 2
        assert len(_pool_claims(cp, pool)) == 2


def test_a_restarted_operator_adopts_the_claims_it_asked_for(
    harness: Harness,  # noqa: F811
) -> None:
    """Nodes of this NodeClass take 25 s to register. The operator asks for one node and is
    stopped while its NodeClaim is on its way; the next operator adopts that claim (its pod
    is nominated to it) instead of asking again: one NodeClaim only, and the pod is bound
    on its node when it comes."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    slow = f"later-{namespace}"
    cp.create(
        karpenter.NODE_CLASSES,
        {**karpenter.node_class(slow), "spec": {"nodeRegistrationDelay": "25s"}},
    )
    pool = f"adopt-{namespace}"
    _pool(cp, pool, ["gpu-4xl40s"], namespace, node_class_name=slow)
    pod = env.gpu_pod(namespace, "p", scheduler=scheduler, group=namespace, gpumem=20000)
    env.create_pod(cp, pod)
    with OperatorThread(_operator_options(harness, scheduler)):
        claim = env.wait_until("a claim", lambda: _pool_claims(cp, pool) or None, 60)[0]
    name = claim["metadata"]["name"]
    assert not (claim.get("status") or {}).get("nodeName")
    seen: set[str] = set()

    def bound() -> dict[str, Any] | None:
        # Every claim seen meanwhile: a second one would be withdrawn once the pod binds.
        seen.update(c["metadata"]["name"] for c in _pool_claims(cp, pool))
        found = env.get_pod(cp, namespace, "p")
        return found if found["spec"].get("nodeName") else None

    with OperatorThread(_operator_options(harness, scheduler)):
        placed = env.wait_until("the pod bound", bound, 120)
        assert seen == {name}
        claims = _pool_claims(cp, pool)
        assert [c["metadata"]["name"] for c in claims] == [name]
        assert claims[0]["status"]["nodeName"] == placed["spec"]["nodeName"]


def _claims_queue(harness: Harness, *, engine: bool) -> dict[str, float]:  # noqa: F811
    """Six pods with 40 GB claims on a NodePool of DRA nodes (8xH100, 4xL40S): with the
    engine asking, or Karpenter alone (the operator only decides and binds). NodeClaims
    made, pods bound within the window, and seconds from the operator's start to the last
    bound (the window when not all are)."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    pool = f"{'engine' if engine else 'alone'}-dra-{namespace}"
    labels = {env.TEST_LABEL: namespace, dra.NODE_PATH_LABEL: dra.PATH_DRA}
    cp.create(
        karpenter.NODE_POOLS,
        karpenter.node_pool(pool, ["gpu-8xh100", "gpu-4xl40s"], labels=labels),
    )
    names = [f"c{i}" for i in range(6)]
    for name in names:
        _claim_pod(cp, namespace, name, scheduler, 40960)
    options = _operator_options(harness, scheduler)
    if not engine:
        options = dataclasses.replace(options, autoscale=None)
    window_s = 30.0
    started = time.monotonic()

    def all_bound() -> bool:
        pods = [env.get_pod(cp, namespace, n) for n in names]
        return all(p["spec"].get("nodeName") for p in pods)

    with OperatorThread(options):
        with contextlib.suppress(AssertionError, TimeoutError):
            env.wait_until("every pod bound", all_bound, window_s)
        took = time.monotonic() - started
        bound = [n for n in names if env.get_pod(cp, namespace, n)["spec"].get("nodeName")]
        made = len(_pool_claims(cp, pool))
    return {
        "nodes": float(made),
        "pods_bound": float(len(bound)),
        "first_pending_to_last_bound_s": round(min(took, window_s), 1),
    }


def test_side_by_side_for_pods_with_claims(harness: Harness) -> None:  # noqa: F811
    """The same queue of pods with claims, Karpenter alone and with the engine."""
    alone = _claims_queue(harness, engine=False)
    with_engine = _claims_queue(harness, engine=True)
    print("side-by-side claims:", json.dumps({"alone": alone, "with_engine": with_engine}))
    assert with_engine["nodes"] == 1
    assert with_engine["pods_bound"] == 6
    # Karpenter v1.13.0's own simulation makes no node for pods with claims.
    assert alone["nodes"] == 0
    assert alone["pods_bound"] == 0


def _claims_replica_set(namespace: str, name: str, scheduler: str, replicas: int) -> dict[str, Any]:
    """A ReplicaSet of pods each using a claim made from the template ``share``."""
    template = claim_pod(name, template="share", scheduler=scheduler)
    template["spec"]["nodeSelector"] = {env.TEST_LABEL: namespace}
    return replica_set_of(namespace, name, template, replicas)


def _claims_made(cp: Any, namespace: str, app: str) -> bool:
    """Whether the ReplicaSet's four pods are there, each with its claim made."""
    listed = cp.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector=app%3D{app}")
    pods = listed.get("items") or ()
    return len(pods) == 4 and all(
        (p.get("status") or {}).get("resourceClaimStatuses") for p in pods
    )


def test_a_node_whose_claims_fit_elsewhere_is_given_back(harness: Harness) -> None:  # noqa: F811
    """Two 4xL40S DRA nodes, each filled by a ReplicaSet of four pods whose 40 GB claims
    come from a template; both scaled down to one pod. Below the administrator's threshold
    nothing moves; at 0, one NodeClaim is deleted, Karpenter drains and removes its node,
    and the ReplicaSet's new pod, with a claim made again from the template, is allocated
    and bound on the node kept."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    pool = f"shrink-dra-{namespace}"
    labels = {env.TEST_LABEL: namespace, dra.NODE_PATH_LABEL: dra.PATH_DRA}
    cp.create(karpenter.NODE_POOLS, karpenter.node_pool(pool, ["gpu-4xl40s"], labels=labels))
    exactly = {"deviceClassName": dra.SHARED_CLASS, "capacity": {"requests": {"memory": "40960Mi"}}}
    create_claim_template(cp, namespace, "share", exactly)
    rs_path = f"/apis/apps/v1/namespaces/{namespace}/replicasets"
    keep = _operator_options(
        harness, scheduler, scale_down_after_s=0.0, scale_down_min_savings=100.0
    )
    for app in ("a", "b"):
        # Each ReplicaSet's pods all there with their claims made before an operator looks:
        # one batch, one node (the controllers create them over a second or more).
        cp.create(rs_path, _claims_replica_set(namespace, app, scheduler, 4))
        env.wait_until(f"{app}'s claims made", lambda a=app: _claims_made(cp, namespace, a), 60)
        with OperatorThread(keep):
            env.wait_until(
                f"{app}'s pods bound", lambda a=app: len(_running(cp, namespace, a)) == 4, 180
            )
    assert len(_pool_claims(cp, pool)) == 2
    with OperatorThread(keep):
        for app in ("a", "b"):
            cp.patch(f"{rs_path}/{app}", {"spec": {"replicas": 1}})
            env.wait_until(
                f"{app} down to one", lambda a=app: len(_running(cp, namespace, a)) == 1, 60
            )
        time.sleep(5)  # rounds every half second: none gives a node back for its price
        assert len(_pool_claims(cp, pool)) == 2
    with OperatorThread(_operator_options(harness, scheduler, scale_down_after_s=0.0)):
        env.wait_until("one node given back", lambda: len(_pool_claims(cp, pool)) == 1, 120)

        def together() -> bool:
            pods = _running(cp, namespace, "a") + _running(cp, namespace, "b")
            return len(pods) == 2 and len({p["spec"]["nodeName"] for p in pods}) == 1

        env.wait_until("both pods on the node kept", together, 120)
        pods = _running(cp, namespace, "a") + _running(cp, namespace, "b")
        node = pods[0]["spec"]["nodeName"]
        assert _pool_claims(cp, pool)[0]["status"]["nodeName"] == node
        for pod in pods:
            (status,) = pod["status"]["resourceClaimStatuses"]
            assert _allocated_on(cp, namespace, status["resourceClaimName"]) == {node}
    for app in ("a", "b"):
        cp.delete(f"{rs_path}/{app}")


def test_a_late_pod_is_planned_onto_the_node_on_its_way(harness: Harness) -> None:  # noqa: F811
    """Nodes of this NodeClass take 25 s to register. Three pods whose 40 GB claims come
    from a template get one 4xL40S asked for; while that NodeClaim is on its way a fourth
    pod of the same shape arrives: it is planned onto the node's spare card, not given a
    NodeClaim of its own. Every NodeClaim seen until all four are bound is recorded (a
    second one would be withdrawn once the pods bind): exactly one, all four on its node."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    slow = f"late-{namespace}"
    cp.create(
        karpenter.NODE_CLASSES,
        {**karpenter.node_class(slow), "spec": {"nodeRegistrationDelay": "25s"}},
    )
    pool = f"late-{namespace}"
    labels = {env.TEST_LABEL: namespace, dra.NODE_PATH_LABEL: dra.PATH_DRA}
    cp.create(
        karpenter.NODE_POOLS,
        karpenter.node_pool(pool, ["gpu-4xl40s"], labels=labels, node_class_name=slow),
    )
    exactly = {"deviceClassName": dra.SHARED_CLASS, "capacity": {"requests": {"memory": "40960Mi"}}}
    create_claim_template(cp, namespace, "share", exactly)

    def make(name: str) -> None:
        pod = claim_pod(name, template="share", scheduler=scheduler)
        pod["metadata"]["namespace"] = namespace
        pod["spec"]["nodeSelector"] = {env.TEST_LABEL: namespace}
        env.create_pod(cp, pod)

    names = [f"t{i}" for i in range(4)]
    for name in names[:3]:
        make(name)
    seen: set[str] = set()

    def claims() -> list[dict[str, Any]]:
        found = _pool_claims(cp, pool)
        seen.update(c["metadata"]["name"] for c in found)
        return found

    with OperatorThread(_operator_options(harness, scheduler)):
        first = env.wait_until("a claim", lambda: claims() or None, 60)[0]
        assert not (first.get("status") or {}).get("nodeName")  # still on its way
        make(names[3])

        def all_bound() -> list[dict[str, Any]] | None:
            claims()
            pods = [env.get_pod(cp, namespace, n) for n in names]
            return pods if all(p["spec"].get("nodeName") for p in pods) else None

        bound = env.wait_until("the four pods bound", all_bound, 150)
        assert seen == {first["metadata"]["name"]}
        nodes = {p["spec"]["nodeName"] for p in bound}
        assert len(nodes) == 1
        (claim,) = claims()
        assert claim["status"]["nodeName"] in nodes
        for pod in bound:
            (status,) = pod["status"]["resourceClaimStatuses"]
            assert _allocated_on(cp, namespace, status["resourceClaimName"]) == nodes


def _shares_replica_set(namespace: str, name: str, scheduler: str, replicas: int) -> dict[str, Any]:
    """A ReplicaSet of annotation pods of one 40 GB share each (the device-plugin path)."""
    template = env.gpu_pod(namespace, name, scheduler=scheduler, group=namespace, gpumem=40960)
    return replica_set_of(namespace, name, template, replicas)


@pytest.mark.parametrize("dialect", ["claims", "annotation"])
def test_replica_sets_one_after_another_get_one_node_each(
    harness: Harness,  # noqa: F811
    dialect: str,
) -> None:
    """Two ReplicaSets of four 40 GB pods (claims from a template, or shares), the second
    created once the first is bound, while the operator runs: the controllers bring each
    set's pods in over a second or more, so a pod may come after its siblings' NodeClaim
    was asked for, while that node is on its way (not yet registered by Karpenter): it is
    planned onto the node's spare card. Every NodeClaim seen is recorded (a duplicate
    might be withdrawn later): exactly one per ReplicaSet."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    pool = f"sets-{namespace}"
    labels = {env.TEST_LABEL: namespace}
    if dialect == "claims":
        labels[dra.NODE_PATH_LABEL] = dra.PATH_DRA
    cp.create(karpenter.NODE_POOLS, karpenter.node_pool(pool, ["gpu-4xl40s"], labels=labels))
    exactly = {"deviceClassName": dra.SHARED_CLASS, "capacity": {"requests": {"memory": "40960Mi"}}}
    create_claim_template(cp, namespace, "share", exactly)
    make = _claims_replica_set if dialect == "claims" else _shares_replica_set
    rs_path = f"/apis/apps/v1/namespaces/{namespace}/replicasets"
    seen: set[str] = set()
    with OperatorThread(_operator_options(harness, scheduler, scale_down_min_savings=None)):
        for app in ("a", "b"):
            cp.create(rs_path, make(namespace, app, scheduler, 4))

            def bound(app: str = app) -> bool:
                seen.update(c["metadata"]["name"] for c in _pool_claims(cp, pool))
                return len(_running(cp, namespace, app)) == 4

            env.wait_until(f"{app}'s pods bound", bound, 150)
            assert len({p["spec"]["nodeName"] for p in _running(cp, namespace, app)}) == 1
    assert len(seen) == 2, sorted(seen)
    for app in ("a", "b"):
        cp.delete(f"{rs_path}/{app}")
