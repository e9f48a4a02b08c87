"""Karpenter on the live harness, and the engine's autoscaling with it (``make karpenter``;
docs/autoscaling.md).

Karpenter's controller with its KWOK provider runs against the test API server with three
GPU instance types (``karpenter_env.GPU_TYPES``: 8x H100, 4x L40S, one A100 in MIG mode),
each described by the cards the agent reports on the matching simulated machine. Every node
Karpenter makes gets its agent (``karpenter_env.NodeAgents``), so its DeviceInventory and
Lease appear as on a real node. Karpenter acts on every unschedulable pod of the cluster,
so this module runs its own control plane.

The operator runs on its ServiceAccount's token under the manifests' roles
(``manifests/rbac.yaml`` and the opt-in ``manifests/karpenter-autoscaling.yaml``, applied
with kubectl): the whole flow needs nothing more, and what it may not do is refused.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from integration import karpenter_env
from integration import operator_env as env
from integration.test_install import service_account_token, token_kubeconfig

from vgpu_operator import node_leases
from vgpu_operator.control.options import AutoscaleOptions
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing import karpenter
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import ControlPlane

pytestmark = pytest.mark.integration

INVENTORIES = env.INVENTORIES


OPERATOR_NAMESPACE = "vgpu-operator"
ROLES = ("namespace.yaml", "rbac.yaml", "karpenter-autoscaling.yaml")


class Harness:
    def __init__(
        self, cp: ControlPlane, agents: karpenter_env.NodeAgents, work: Path, kubeconfig: Path
    ) -> None:
        self.cp = cp
        self.agents = agents
        self.work = work
        #: The operator's ServiceAccount token, under the manifests' roles.
        self.operator_kubeconfig = kubeconfig


def _install_roles(cp: ControlPlane, kubectl: Path, work: Path) -> Path:
    for name in ROLES:
        done = subprocess.run(
            [str(kubectl), f"--kubeconfig={cp.kubeconfig_path}", "apply", "-f",
             str(env.REPO / "manifests" / name)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    token = service_account_token(cp, "vgpu-operator")
    return token_kubeconfig(cp, token, work / "operator.kubeconfig")


@pytest.fixture(scope="module")
def harness(
    control_plane_binaries: Binaries,
    karpenter_binary: Path,
    kubectl: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Harness]:
    work = tmp_path_factory.mktemp("karpenter")
    types_file, machines = karpenter_env.write_instance_types(work)
    with ControlPlane(kwok=True, binaries=control_plane_binaries) as plane:
        plane.ensure_namespace(node_leases.NAMESPACE)
        env.install_crd(plane)
        plane.start_karpenter(types_file, karpenter_binary)
        kubeconfig = _install_roles(plane, kubectl, work)
        with karpenter_env.NodeAgents(plane, machines, plane.kubeconfig_path) as agents:
            yield Harness(plane, agents, work, kubeconfig)


@pytest.fixture(autouse=True)
def _clean(harness: Harness) -> Iterator[None]:
    """Each test's pods, NodePools and NodeClaims go with it: Karpenter provisions for any
    pod left waiting, in any NodePool that allows it, and one operator owns every claim
    labelled as its own, so the next test's would adopt them."""
    yield
    cp = harness.cp
    for pod in cp.get("/api/v1/pods").get("items") or ():
        meta = pod["metadata"]
        cp.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
    for kind in (karpenter.NODE_POOLS, karpenter.NODE_CLAIMS):
        for obj in cp.get(kind).get("items") or ():
            cp.delete(f"{kind}/{obj['metadata']['name']}")
    env.wait_until("the NodeClaims to be gone", lambda: not _claims(cp), 120)


def _mark_unschedulable(cp: ControlPlane, namespace: str, name: str) -> None:
    """What kube-scheduler writes on a pod no node holds (Karpenter acts on it)."""
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/0 nodes are available",
        "lastTransitionTime": env.rfc3339(),
    }
    cp.request(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}/status",
        {"status": {"conditions": [condition]}},
        content_type="application/strategic-merge-patch+json",
    )


def _inventory_of(cp: ControlPlane, node: str) -> dict[str, Any] | None:
    try:
        obj = cp.get(f"{INVENTORIES}/{node}")
    except Exception:
        return None
    return obj if (obj.get("status") or {}).get("devices") else None


def test_karpenter_makes_a_node_whose_agent_reports_the_instance_types_cards(
    harness: Harness,
) -> None:
    cp = harness.cp
    cp.create(karpenter.NODE_POOLS, karpenter.node_pool("whole-gpus", ["gpu-4xl40s", "gpu-8xh100"]))
    namespace = env.unique("kp")
    cp.ensure_namespace(namespace)
    pod = env.plain_pod(namespace, "four-cards", {"nvidia.com/gpu": "4"})
    env.create_pod(cp, pod)
    _mark_unschedulable(cp, namespace, "four-cards")

    def made() -> dict[str, Any] | None:
        nodes = list(karpenter_env.nodes_of_pools(cp))
        return nodes[0] if nodes else None

    node = env.wait_until("Karpenter's node", made, 120)
    labels = node["metadata"]["labels"]
    # The cheapest type with four cards.
    assert labels[karpenter.INSTANCE_TYPE_LABEL] == "gpu-4xl40s"
    assert labels[karpenter.NODE_POOL_LABEL] == "whole-gpus"
    name = node["metadata"]["name"]
    inventory = env.wait_until("the node's inventory", lambda: _inventory_of(cp, name), 60)
    devices = inventory["status"]["devices"]
    assert [d["model"] for d in devices] == ["NVIDIA L40S"] * 4
    claims = cp.get(karpenter.NODE_CLAIMS)["items"]
    assert len(claims) == 1

    def initialized() -> bool:
        claim = cp.get(karpenter.NODE_CLAIMS)["items"][0]
        conditions = (claim.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Initialized" and c["status"] == "True" for c in conditions)

    env.wait_until("the NodeClaim to be initialized", initialized, 60)


def _operator_options(harness: Harness, scheduler: str, **autoscale: Any) -> Any:
    """The operator of one test, on its ServiceAccount's token, deciding the pods that name
    ``scheduler`` (its device config in the operator's namespace, as installed)."""
    # A batching window of 2 s: pods created one by one on this loaded machine come in
    # over a second or more.
    settings = {
        "interval_s": 0.5,
        "node_timeout_s": 120.0,
        "cool_off_s": 120.0,
        "batch_idle_s": 2.0,
        **autoscale,
    }
    env.put_config_map(harness.cp, OPERATOR_NAMESPACE, env.config_text(scheduler))
    return env.options(
        harness.cp,
        OPERATOR_NAMESPACE,
        kubeconfig=harness.operator_kubeconfig,
        autoscale=AutoscaleOptions(instance_types=harness.work / "instance-types.json", **settings),
    )


def _scheduler(cp: ControlPlane) -> tuple[str, str]:
    """A fresh namespace and scheduler name for one test."""
    namespace = env.unique("as")
    cp.ensure_namespace(namespace)
    return namespace, env.unique("sched")


def _claims(cp: ControlPlane) -> list[dict[str, Any]]:
    return list(cp.get(karpenter.NODE_CLAIMS).get("items") or ())


def _pool_claims(cp: ControlPlane, pool: str) -> list[dict[str, Any]]:
    return [
        c for c in _claims(cp) if c["metadata"]["labels"].get(karpenter.NODE_POOL_LABEL) == pool
    ]


def _messages(cp: ControlPlane, namespace: str, name: str) -> list[str]:
    return [str(e.get("message") or "") for e in env.events_for(cp, namespace, name)]


def test_the_engine_asks_for_the_fewest_nodes_and_the_pods_bind_there(harness: Harness) -> None:
    """Six pods of 40 GB each: no node holds them; one 8xH100 holds all six (two 4xL40S
    would be cheaper but two nodes). Exactly one NodeClaim is made, of that type, and all
    six pods are bound on its node; each was told what it waited for."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    pool = f"shares-{namespace}"
    cp.create(
        karpenter.NODE_POOLS,
        karpenter.node_pool(pool, ["gpu-8xh100", "gpu-4xl40s"], labels={env.TEST_LABEL: namespace}),
    )
    # Created before the operator starts: its first listing finds all six waiting (pods
    # created one by one on this loaded machine may come in slower than the batching
    # window, and would then be planned in two batches).
    for i in range(6):
        pod = env.gpu_pod(namespace, f"p{i}", scheduler=scheduler, group=namespace, gpumem=40960)
        env.create_pod(cp, pod)
    with OperatorThread(_operator_options(harness, scheduler)):
        bound = [env.wait_bound(cp, namespace, f"p{i}", timeout_s=120) for i in range(6)]
        nodes = {p["spec"]["nodeName"] for p in bound}
        assert len(nodes) == 1
        claims = _pool_claims(cp, pool)
        assert len(claims) == 1, claims
        claim = claims[0]
        assert claim["metadata"]["labels"][karpenter.INSTANCE_TYPE_LABEL] == "gpu-8xh100"
        # Karpenter writes the claim's node a moment after the node registers, and the
        # pods may be bound there first.
        node_of = env.wait_until(
            "the claim's node written",
            lambda: (_pool_claims(cp, pool)[0].get("status") or {}).get("nodeName") or None,
            30,
        )
        assert node_of in nodes
        told = _messages(cp, namespace, "p0")
        assert any("waits for a new node: 1 x gpu-8xh100 requested" in m for m in told), told


def _pool(cp: ControlPlane, name: str, types: list[str], group: str, **kwargs: Any) -> None:
    cp.create(
        karpenter.NODE_POOLS,
        karpenter.node_pool(name, types, labels={env.TEST_LABEL: group}, **kwargs),
    )


def _condition_message(cp: ControlPlane, namespace: str, name: str) -> str:
    return str((env.condition(env.get_pod(cp, namespace, name)) or {}).get("message") or "")


def _told(cp: ControlPlane, namespace: str, name: str, text: str, timeout_s: float = 60) -> str:
    def check() -> str | None:
        message = _condition_message(cp, namespace, name)
        return message if text in message else None

    return env.wait_until(f"{name} to be told {text!r}", check, timeout_s)


def test_an_instance_type_without_card_facts_is_left_out_and_the_pod_told(
    harness: Harness,
) -> None:
    """The operator's catalogue lists gpu-8xh100 without cards: it is never asked for; a pod
    only an H100 would hold waits, told why, and no NodeClaim is made."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    pool = f"h100-{namespace}"
    _pool(cp, pool, ["gpu-8xh100"], namespace)
    no_cards = harness.work / f"no-cards-{namespace}"
    no_cards.mkdir()
    types_file, _ = karpenter_env.write_instance_types(no_cards, without_cards=["gpu-8xh100"])
    options = _operator_options(harness, scheduler)
    options = dataclasses.replace(
        options, autoscale=dataclasses.replace(options.autoscale, instance_types=types_file)
    )
    with OperatorThread(options):
        pod = env.gpu_pod(namespace, "big", scheduler=scheduler, group=namespace, gpumem=70000)
        env.create_pod(cp, pod)
        message = _told(cp, namespace, "big", "no new node would hold it")
        assert "'gpu-8xh100' is left out: no card facts" in message, message
        assert _pool_claims(cp, pool) == []


def test_a_node_pool_at_its_limit_gets_no_claim_and_the_pod_is_told(harness: Harness) -> None:
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    pool = f"capped-{namespace}"
    _pool(cp, pool, ["gpu-4xl40s"], namespace, limits={"nvidia.com/gpu": "4"})
    with OperatorThread(_operator_options(harness, scheduler)):
        pods = [
            env.gpu_pod(namespace, f"w{i}", scheduler=scheduler, group=namespace, gpumem=40000)
            for i in range(5)
        ]
        for pod in pods:
            env.create_pod(cp, pod)
        # One node of four cards is within the limit: four pods bind there; the fifth
        # would need a second node, past the limit.
        bound = [env.wait_bound(cp, namespace, f"w{i}", timeout_s=120) for i in range(4)]
        assert len({p["spec"]["nodeName"] for p in bound}) == 1
        message = _told(cp, namespace, "w4", "limit on nvidia.com/gpu (4) would be passed")
        assert f"NodePool {pool}" in message
        assert len(_pool_claims(cp, pool)) == 1


def test_a_claim_that_never_becomes_a_node_is_withdrawn_and_its_pods_told(
    harness: Harness,
) -> None:
    """A NodeClass whose nodes take an hour to register: the claim is launched but never
    becomes a node; after the operator's timeout it is deleted, the instance type cools
    off, and the pod is told why."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    slow = f"slow-{namespace}"
    cp.create(
        karpenter.NODE_CLASSES,
        {**karpenter.node_class(slow), "spec": {"nodeRegistrationDelay": "1h"}},
    )
    pool = f"slow-{namespace}"
    _pool(cp, pool, ["gpu-4xl40s"], namespace, node_class_name=slow)
    options = _operator_options(harness, scheduler, node_timeout_s=6.0, cool_off_s=600.0)
    with OperatorThread(options):
        env.create_pod(
            cp, env.gpu_pod(namespace, "late", scheduler=scheduler, group=namespace, gpumem=20000)
        )
        claim = env.wait_until("a claim", lambda: _pool_claims(cp, pool) or None, 60)[0][
            "metadata"
        ]["name"]
        message = _told(cp, namespace, "late", "did not become a node within 6 s", 90)
        assert f"NodeClaim {claim}" in message, message
        assert "withdrawn" in message
        env.wait_until("the claim to be gone", lambda: not _pool_claims(cp, pool), 60)
        assert "gpu-4xl40s is not asked for again" in message


def test_a_claim_no_pod_needs_any_more_is_withdrawn(harness: Harness) -> None:
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    slow = f"slower-{namespace}"
    cp.create(
        karpenter.NODE_CLASSES,
        {**karpenter.node_class(slow), "spec": {"nodeRegistrationDelay": "1h"}},
    )
    pool = f"gone-{namespace}"
    _pool(cp, pool, ["gpu-4xl40s"], namespace, node_class_name=slow)
    with OperatorThread(_operator_options(harness, scheduler)):
        env.create_pod(
            cp, env.gpu_pod(namespace, "left", scheduler=scheduler, group=namespace, gpumem=20000)
        )
        claim = env.wait_until("a claim", lambda: _pool_claims(cp, pool) or None, 60)[0][
            "metadata"
        ]["name"]
        # The pod is nominated right after its claim is made (the claim comes first).
        env.wait_until(
            "the pod nominated to its claim",
            lambda: env.get_pod(cp, namespace, "left")["status"].get("nominatedNodeName") == claim,
            30,
        )
        cp.delete(f"/api/v1/namespaces/{namespace}/pods/left")
        env.wait_until("the claim to be withdrawn", lambda: not _pool_claims(cp, pool), 60)


def test_pods_karpenter_serves_are_left_to_it(harness: Harness) -> None:
    """A pod asking for four whole cards (nvidia.com/gpu only, no HAMi annotation): Karpenter's
    own simulation provisions for it; the operator asks for nothing, and binds the pod on
    Karpenter's node once its inventory is read."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    pool = f"whole-{namespace}"
    _pool(cp, pool, ["gpu-4xl40s", "gpu-8xh100"], namespace)
    with OperatorThread(_operator_options(harness, scheduler)):
        env.create_pod(
            cp, env.gpu_pod(namespace, "four", scheduler=scheduler, group=namespace, gpus=4)
        )
        bound = env.wait_bound(cp, namespace, "four", timeout_s=120)
        claims = _pool_claims(cp, pool)
        assert len(claims) == 1, [(c["metadata"]["name"], c["metadata"]["labels"]) for c in claims]
        assert "vgpu-operator.io/autoscaled" not in claims[0]["metadata"]["labels"]
        name = claims[0]["metadata"]["name"]

        def launched_on() -> str | None:
            claim = cp.get(f"{karpenter.NODE_CLAIMS}/{name}")
            return (claim.get("status") or {}).get("nodeName")

        assert env.wait_until("the claim's node", launched_on, 30) == bound["spec"]["nodeName"]


# --- side by side: Karpenter alone, and Karpenter with the engine --------------------------

#: The queue: twelve 10 GB shares, two pods of two cards at 20 GB each, and one whole card.
SIDE_BY_SIDE = (
    *[{"gpus": 1, "gpumem": 10240} for _ in range(12)],
    {"gpus": 2, "gpumem": 20480},
    {"gpus": 2, "gpumem": 20480},
    {"gpus": 1, "gpumem": 46068, "gpucores": 100},
)


def _run_queue(harness: Harness, *, engine: bool) -> dict[str, float]:
    """The queue on a NodePool of 4xL40S and 8xH100 nodes: with the engine (the shares as
    written, the operator asking for nodes), or Karpenter alone (each pod asks for its cards
    as whole nvidia.com/gpu, which is all Karpenter's simulation knows; the operator only
    binds). Nodes made, cards on them that hold no pod once the queue is placed, and the
    time from the operator's start (the queue pending) to the last pod bound (wall clock,
    this loaded machine, the operator's start-up included)."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    pool = f"{'engine' if engine else 'alone'}-{namespace}"
    _pool(cp, pool, ["gpu-4xl40s", "gpu-8xh100"], namespace)
    options = _operator_options(harness, scheduler)
    if not engine:
        options = dataclasses.replace(options, autoscale=None)
    names = [f"q{i}" for i in range(len(SIDE_BY_SIDE))]
    # The queue is created before the operator starts, so that both see it whole (pods
    # created one by one on this loaded machine may come slower than either's batching
    # window); it is pending from the operator's start.
    for name, ask in zip(names, SIDE_BY_SIDE, strict=True):
        shares = ask if engine else {"gpus": ask["gpus"]}
        env.create_pod(
            cp, env.gpu_pod(namespace, name, scheduler=scheduler, group=namespace, **shares)
        )
    started = time.monotonic()
    with OperatorThread(options):
        bound = [env.wait_bound(cp, namespace, n, timeout_s=240) for n in names]
        took = time.monotonic() - started
    nodes = {p["spec"]["nodeName"] for p in bound}
    cards = {
        d["uuid"]
        for n in nodes
        for d in (cp.get(f"{INVENTORIES}/{n}").get("status") or {}).get("devices") or ()
    }
    used = set(env.usage_by_card(env.list_pods(cp, namespace)))
    return {
        "nodes": float(len(_pool_claims(cp, pool))),
        "price_per_hour": sum(
            next(t.price for t in karpenter_env.GPU_TYPES if t.name == _type_of(cp, n))
            for n in nodes
        ),
        "idle_gpus": float(len(cards - used)),
        "first_pending_to_last_bound_s": round(took, 1),
    }


def _type_of(cp: ControlPlane, node: str) -> str:
    return str(cp.get(f"/api/v1/nodes/{node}")["metadata"]["labels"][karpenter.INSTANCE_TYPE_LABEL])


def test_side_by_side_karpenter_alone_and_with_the_engine(
    harness: Harness, request: pytest.FixtureRequest
) -> None:
    alone = _run_queue(harness, engine=False)
    for kind in (karpenter.NODE_POOLS, karpenter.NODE_CLAIMS):
        for obj in harness.cp.get(kind).get("items") or ():
            harness.cp.delete(f"{kind}/{obj['metadata']['name']}")
    with_engine = _run_queue(harness, engine=True)
    figures = {"karpenter_alone": alone, "karpenter_with_engine": with_engine}
    print("side-by-side:", json.dumps(figures))
    out = request.config.getoption("--basetemp", None)
    if out:
        Path(out, "autoscaling-side-by-side.json").write_text(json.dumps(figures))
    assert with_engine["nodes"] < alone["nodes"]
    assert with_engine["idle_gpus"] <= alone["idle_gpus"]


# --- scale-down that understands shares ---------------------------------------------------


def _replica_set(namespace: str, name: str, scheduler: str, replicas: int) -> dict[str, Any]:
    template = env.gpu_pod(namespace, name, scheduler=scheduler, group=namespace, gpumem=40000)
    return replica_set_of(namespace, name, template, replicas)


def replica_set_of(
    namespace: str, name: str, template: dict[str, Any], replicas: int
) -> dict[str, Any]:
    """A ReplicaSet of ``replicas`` pods like ``template``, labelled ``app: name``."""
    template["metadata"] = {"labels": {"app": name}}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": template,
        },
    }


def _running(cp: ControlPlane, namespace: str, app: str) -> list[dict[str, Any]]:
    listed = cp.get(f"/api/v1/namespaces/{namespace}/pods?labelSelector=app%3D{app}")
    return [
        p
        for p in listed.get("items") or ()
        if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
    ]


def test_a_node_whose_shares_fit_elsewhere_is_given_back(harness: Harness) -> None:
    """Two 4xL40S nodes, each filled by a ReplicaSet of four 40 GB pods; both scaled down
    to one pod: one node's pod fits on the other. Below the administrator's threshold
    (100 $/h for a 12 $/h node) nothing moves; at 0, one NodeClaim is deleted, Karpenter
    drains and removes its node, and the ReplicaSet's new pod is bound on the other."""
    cp = harness.cp
    cp.start_controller_manager(["replicaset-controller"])
    namespace, scheduler = _scheduler(cp)
    pool = f"shrink-{namespace}"
    _pool(cp, pool, ["gpu-4xl40s"], namespace)
    rs_path = f"/apis/apps/v1/namespaces/{namespace}/replicasets"
    keep = {"scale_down_after_s": 0.0, "scale_down_min_savings": 100.0}
    with OperatorThread(_operator_options(harness, scheduler, **keep)):
        for app in ("a", "b"):
            cp.create(rs_path, _replica_set(namespace, app, scheduler, 4))
            env.wait_until(
                f"{app}'s pods bound", lambda a=app: len(_running(cp, namespace, a)) == 4, 120
            )
        assert len(_pool_claims(cp, pool)) == 2
        for app in ("a", "b"):
            cp.patch(f"{rs_path}/{app}", {"spec": {"replicas": 1}})
            env.wait_until(
                f"{app} down to one", lambda a=app: len(_running(cp, namespace, a)) == 1, 60
            )
        time.sleep(5)  # rounds every half second: none gives a node back for 12 $/h
        assert len(_pool_claims(cp, pool)) == 2
    with OperatorThread(_operator_options(harness, scheduler, scale_down_after_s=0.0)):
        env.wait_until("one node given back", lambda: len(_pool_claims(cp, pool)) == 1, 120)

        def together() -> bool:
            pods = _running(cp, namespace, "a") + _running(cp, namespace, "b")
            return len(pods) == 2 and len({p["spec"]["nodeName"] for p in pods}) == 1

        env.wait_until("both pods on the node kept", together, 120)
        node = _running(cp, namespace, "a")[0]["spec"]["nodeName"]
        assert _pool_claims(cp, pool)[0]["status"]["nodeName"] == node
    for app in ("a", "b"):
        cp.delete(f"{rs_path}/{app}")


@pytest.mark.parametrize(
    ("verb", "resource", "allowed"),
    [
        ("list", "nodepools.karpenter.sh", "yes"),
        ("create", "nodeclaims.karpenter.sh", "yes"),
        ("delete", "nodeclaims.karpenter.sh", "yes"),
        ("patch", "nodepools.karpenter.sh", "no"),
        ("delete", "nodepools.karpenter.sh", "no"),
        ("patch", "nodeclaims.karpenter.sh", "no"),
        ("update", "nodeclaims.karpenter.sh/status", "no"),
        ("create", "kwoknodeclasses.karpenter.kwok.sh", "no"),
        ("delete", "nodes", "no"),
        ("patch", "nodes", "no"),
    ],
)
def test_the_operators_token_may_do_what_autoscaling_needs_and_no_more(
    harness: Harness, kubectl: Path, verb: str, resource: str, allowed: str
) -> None:
    kubeconfig = f"--kubeconfig={harness.operator_kubeconfig}"
    done = subprocess.run(
        [str(kubectl), kubeconfig, "auth", "can-i", verb, resource],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.stdout.strip() == allowed, (verb, resource, done.stdout, done.stderr)


def test_a_gang_gets_the_nodes_it_needs_whole(harness: Harness) -> None:
    """A PodGroup of six 40 GB members, gang minCount 6, on a NodePool of 4xL40S: no node
    holds one member, no single node all six; the engine asks for two nodes at once and
    all six are bound on them, together."""
    cp = harness.cp
    namespace, scheduler = _scheduler(cp)
    pool = f"gang-{namespace}"
    _pool(cp, pool, ["gpu-4xl40s"], namespace)
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
        pod = env.gpu_pod(namespace, name, scheduler=scheduler, group=namespace, gpumem=40000)
        pod["spec"]["schedulingGroup"] = {"podGroupName": "train"}
        env.create_pod(cp, pod)
    with OperatorThread(_operator_options(harness, scheduler)):
        bound = [env.wait_bound(cp, namespace, n, timeout_s=120) for n in names]
        assert len({p["spec"]["nodeName"] for p in bound}) == 2
        claims = _pool_claims(cp, pool)
        assert len(claims) == 2, [c["metadata"]["name"] for c in claims]
        assert all("vgpu-operator.io/autoscaled" in c["metadata"]["labels"] for c in claims)
