"""Defragmentation against a real API server: a ReplicaSet's pod is evicted through the
Eviction API, its replacement is placed where the plan said, the waiting pod binds on the
card that was freed, and a PodDisruptionBudget with no disruption left keeps its pod
where it is. ``vgpu-operator defrag plan`` reads the same cluster with a read-only
identity (manifests/defrag-plan-reader.yaml) and is refused any write.

No kube-controller-manager runs here: a small stand-in plays the ReplicaSet controller
(it keeps each ReplicaSet's count of live pods, creating one from the template when an
eviction leaves one missing, as the real controller does for pods being deleted), and
budgets get the status the disruption controller would write. KWOK's pod-delete stage
removes evicted pods as a kubelet would.

The cluster of both tests: node a has two 16000 MiB cards, a0 holding a 10000 MiB pod of
ReplicaSet ``web`` and a1 an 8000 MiB pod of ReplicaSet ``db``; node b one card with a
6000 MiB pod pinned to it (10000 free). A 12000 MiB pod waits: node a has 14000 MiB
free, but on two cards.
"""

from __future__ import annotations

import copy
import json
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from integration import operator_env as env
from integration.test_install import token_kubeconfig

from vgpu_operator.cli import main
from vgpu_operator.control.options import DefragOptions
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane

Json = dict[str, Any]
USE_UUID = "nvidia.com/use-gpuuuid"
READER = env.REPO / "manifests" / "defrag-plan-reader.yaml"


class ReplicaSetStandIn:
    """The ReplicaSet controller, as far as these tests need it: every 0.2 s, each
    ReplicaSet gets pods from its template until it has ``replicas`` live ones (pods
    being deleted do not count)."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self._cp = cp
        self._namespace = namespace
        self._sets: list[Json] = []
        self._serial = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        # One reconciliation at a time (the thread's and a test's own).
        self._reconciling = threading.Lock()
        self._thread = threading.Thread(target=self._main, name="replicaset", daemon=True)

    def __enter__(self) -> ReplicaSetStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def create(self, name: str, template: Json) -> Json:
        labels = dict(template["metadata"]["labels"])
        replica_set = self._cp.create(
            f"/apis/apps/v1/namespaces/{self._namespace}/replicasets",
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {"name": name, "namespace": self._namespace},
                "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template},
            },
        )
        with self._lock:
            self._sets.append(replica_set)
        self.reconcile()
        return replica_set

    def pods_of(self, name: str) -> list[Json]:
        return [
            p
            for p in env.list_pods(self._cp, self._namespace)
            if any(r.get("name") == name for r in p["metadata"].get("ownerReferences") or ())
        ]

    def live_pod_of(self, name: str) -> Json:
        """The one live pod of a ReplicaSet (its replacement, after an eviction)."""

        def one() -> Json | None:
            live = [p for p in self.pods_of(name) if not p["metadata"].get("deletionTimestamp")]
            return live[0] if len(live) == 1 else None

        return env.wait_until(f"one live pod of {name}", one, 30)

    def reconcile(self) -> None:
        with self._reconciling:
            self._reconcile()

    def _reconcile(self) -> None:
        with self._lock:
            sets = list(self._sets)
        pods = env.list_pods(self._cp, self._namespace)
        for replica_set in sets:
            uid = replica_set["metadata"]["uid"]
            live = [
                p
                for p in pods
                if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or ())
                and not p["metadata"].get("deletionTimestamp")
            ]
            for _ in range(replica_set["spec"]["replicas"] - len(live)):
                self._serial += 1
                pod = copy.deepcopy(replica_set["spec"]["template"])
                pod["metadata"]["name"] = f"{replica_set['metadata']['name']}-{self._serial}"
                pod["metadata"]["namespace"] = self._namespace
                pod["metadata"]["ownerReferences"] = [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": replica_set["metadata"]["name"],
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ]
                env.create_pod(self._cp, {"apiVersion": "v1", "kind": "Pod", **pod})

    def _main(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.reconcile()
            except (AdminRequestError, OSError):
                continue  # the next round reads the cluster again


@dataclass
class Setup:
    cp: ControlPlane
    namespace: str
    scheduler: str
    replica_sets: ReplicaSetStandIn
    a: list[env.Card]
    b: list[env.Card]

    def node(self, suffix: str) -> str:
        return f"{self.namespace}-{suffix}"

    def pod(self, name: str, gpumem: int, *, card: str | None = None, **labels: str) -> Json:
        pod = env.gpu_pod(
            self.namespace,
            name,
            scheduler=self.scheduler,
            group=self.namespace,
            gpumem=gpumem,
            labels=labels or {"app": name},
        )
        if card is not None:
            pod["metadata"]["annotations"] = {USE_UUID: card}
        return pod

    def bound(self, name: str, gpumem: int, *, card: str) -> Json:
        env.create_pod(self.cp, self.pod(name, gpumem, card=card))
        return env.wait_bound(self.cp, self.namespace, name, 30)

    def replica_set(self, name: str, gpumem: int, group: str | None = None) -> Json:
        template = self.pod(name, gpumem)
        template["metadata"] = {"labels": {"app": name}}
        if group is not None:
            template["spec"]["schedulingGroup"] = {"podGroupName": group}
        self.replica_sets.create(name, template)
        pod = self.replica_sets.live_pod_of(name)
        return env.wait_bound(self.cp, self.namespace, pod["metadata"]["name"], 30)

    def delete(self, name: str) -> None:
        self.cp.delete(f"/api/v1/namespaces/{self.namespace}/pods/{name}")
        env.wait_until(f"{name} to be gone", lambda: not self.exists(name), 30)

    def exists(self, name: str) -> bool:
        try:
            env.get_pod(self.cp, self.namespace, name)
        except AdminRequestError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def budget(self, name: str, labels: dict[str, str], allowed: int) -> None:
        env.disruption_budget(self.cp, self.namespace, name, labels, allowed)

    def scatter(self, db_group: str | None = None) -> tuple[Json, Json]:
        """The cluster of the module docstring; returns web's pod and db's pod (a member
        of PodGroup ``db_group`` if named)."""
        a0, a1 = (c.uuid for c in self.a)
        (b0,) = (c.uuid for c in self.b)
        self.bound("keeper", 6000, card=b0)
        self.bound("fill-b", 10000, card=b0)  # b0 full while the ReplicaSets' pods land
        self.bound("fill-a1", 16000, card=a1)
        web = self.replica_set("web", 10000)  # a0: the only card with room
        self.delete("fill-a1")
        db = self.replica_set("db", 8000, db_group)  # a1: a0 has 6000 left
        self.delete("fill-b")
        assert env.allocation(web) == [(a0, 10000, 0)]
        assert env.allocation(db) == [(a1, 8000, 0)]
        return web, db


@pytest.fixture
def setup(control_plane: ControlPlane, namespace: str) -> Iterator[Setup]:
    scheduler = env.new_scheduler(control_plane, namespace)
    a = env.cards(f"{namespace}-a", 2, memory_mib=16000)
    b = env.cards(f"{namespace}-b", 1, memory_mib=16000)
    env.gpu_node(control_plane, f"{namespace}-a", a, group=namespace)
    env.gpu_node(control_plane, f"{namespace}-b", b, group=namespace)
    with ReplicaSetStandIn(control_plane, namespace) as replica_sets:
        yield Setup(control_plane, namespace, scheduler, replica_sets, a, b)
    env.cleanup_group(control_plane, namespace)


def _operator(setup: Setup, defrag: bool) -> OperatorThread:
    settings = DefragOptions(interval_s=1.0, poll_s=0.2, step_timeout_s=30.0)
    options = env.options(setup.cp, setup.namespace, defrag=settings if defrag else None)
    return OperatorThread(options)


def _event(s: Setup, name: str, reason: str) -> Json:
    def check() -> Json | None:
        found = [e for e in env.events_for(s.cp, s.namespace, name) if e["reason"] == reason]
        return found[0] if found else None

    return env.wait_until(f"a {reason} event for {name}", check, 60)


def _sample(operator: OperatorThread, name: str, **labels: str) -> float:
    registry = operator.app.metrics.registry
    return registry.get_sample_value(f"vgpu_operator_defrag_{name}_total", labels) or 0.0


@pytest.mark.parametrize("guarded", [False, True], ids=["lighter-pod-moves", "budget-holds"])
def test_a_replicaset_pod_moves_and_the_waiting_pod_takes_the_freed_card(
    setup: Setup, guarded: bool
) -> None:
    with _operator(setup, defrag=True) as operator:
        web, db = setup.scatter()
        if guarded:
            setup.budget("db", {"app": "db"}, allowed=0)
        # The lighter db pod moves; with its budget at 0, the web pod moves instead.
        moved, stays = (web, db) if guarded else (db, web)
        freed = env.allocation(moved)[0][0]
        env.create_pod(setup.cp, setup.pod("waiting", 12000))
        waiting = env.wait_bound(setup.cp, setup.namespace, "waiting", 90)
        assert env.allocation(waiting) == [(freed, 12000, 0)]
        assert not setup.exists(moved["metadata"]["name"])
        kept = env.get_pod(setup.cp, setup.namespace, stays["metadata"]["name"])
        assert kept["metadata"].get("deletionTimestamp") is None
        owner = moved["metadata"]["ownerReferences"][0]["name"]
        replacement = setup.replica_sets.live_pod_of(owner)
        replacement = env.wait_bound(setup.cp, setup.namespace, replacement["metadata"]["name"])
        assert replacement["spec"]["nodeName"] == setup.node("b")
        plan_event = _event(setup, "waiting", "Defragmenting")
        assert f"to make room on node {setup.node('a')}" in plan_event["message"]
        move_event = _event(setup, moved["metadata"]["name"], "DefragmentationMove")
        assert f"to make room for {setup.namespace}/waiting" in move_event["message"]
        assert f"fit again on node {setup.node('b')}" in move_event["message"]
        _event(setup, "waiting", "Defragmented")
        assert _sample(operator, "plans", result="succeeded") == 1
        assert _sample(operator, "moves", result="evicted") == 1
        assert _sample(operator, "moves", result="refused") == 0
        usage = env.usage_by_card(env.list_pods(setup.cp, setup.namespace))
        for card in (*setup.a, *setup.b):
            assert usage.get(card.uuid, (0, 0, 0))[1] <= card.memory_mib


def _reader_kubeconfig(setup: Setup, path: Path) -> Path:
    """A ServiceAccount bound to the roles of manifests/defrag-plan-reader.yaml (the
    device config's Role in this test's namespace, where its ConfigMap is), and a
    kubeconfig with its token."""
    cp, namespace = setup.cp, setup.namespace
    account = env.unique("reader")
    cp.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
    )
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    for document in yaml.safe_load_all(READER.read_text()):
        kind, meta = document["kind"], document["metadata"]
        name = f"{meta['name']}-{namespace}"
        if kind == "ClusterRole":
            base, binding, where = rbac, "ClusterRoleBinding", {}
        else:
            home = namespace if meta["namespace"] == "vgpu-operator" else meta["namespace"]
            base, binding, where = f"{rbac}/namespaces/{home}", "RoleBinding", {"namespace": home}
        plural = f"{kind.lower()}s"
        cp.create(f"{base}/{plural}", {**document, "metadata": {"name": name, **where}})
        cp.create(
            f"{base}/{binding.lower()}s",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": binding,
                "metadata": {"name": name, **where},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
                "subjects": [subject],
            },
        )
    answer = cp.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    kubeconfig: Path = token_kubeconfig(cp, str(answer["status"]["token"]), path)
    return kubeconfig


def test_defrag_plan_prints_the_plan_with_a_read_only_identity(
    setup: Setup, tmp_path: Path
) -> None:
    with _operator(setup, defrag=False):
        _web, db = setup.scatter()
        env.create_pod(setup.cp, setup.pod("waiting", 12000))
        _event(setup, "waiting", "FailedScheduling")
    kubeconfig = _reader_kubeconfig(setup, tmp_path / "reader.yaml")
    args = ["defrag", "plan", "--kubeconfig", str(kubeconfig), "--namespace", setup.namespace]
    result = CliRunner().invoke(main, [*args, "--config-map", env.CONFIG_MAP, "-o", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # the log of reading the cluster goes to stderr
    (plan,) = [p for p in report["plans"] if p["pod"] == f"{setup.namespace}/waiting"]
    db_key = f"{setup.namespace}/{db['metadata']['name']}"
    assert [(m["pod"], m["to"]["node"]) for m in plan["moves"]] == [(db_key, setup.node("b"))]
    assert plan["node"] == setup.node("a")
    table = CliRunner().invoke(main, [*args, "--config-map", env.CONFIG_MAP])
    assert table.exit_code == 0, table.output
    assert f"Plan 1: {setup.namespace}/waiting fits on {setup.node('a')}" in table.output
    # Nothing moved, and the identity may not move anything.
    assert setup.exists(db["metadata"]["name"])
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": db["metadata"]["name"], "namespace": setup.namespace},
    }
    path = f"/api/v1/namespaces/{setup.namespace}/pods/{db['metadata']['name']}/eviction"
    assert _status_as(setup.cp, token, "POST", path, eviction) == 403
    assert _status_as(setup.cp, token, "GET", f"/api/v1/namespaces/{setup.namespace}/pods") == 200


@pytest.mark.parametrize("mode", ["all", "single"])
def test_defrag_plan_moves_a_single_groups_member_and_leaves_an_all_group(
    setup: Setup, tmp_path: Path, mode: str
) -> None:
    """Issue 47 item 2 on the live server, with the read-only identity: db's pod (the
    cheapest move) is a member of PodGroup ``db``; ``single``, it moves; ``all``, the
    group is left alone (web's pod moves instead) and the report says so."""
    api = "/apis/scheduling.k8s.io/v1beta1"
    setup.cp.create(
        f"{api}/namespaces/{setup.namespace}/podgroups",
        {
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "db"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}, "disruptionMode": {mode: {}}},
        },
    )
    with _operator(setup, defrag=False):
        web, db = setup.scatter(db_group="db")
        env.create_pod(setup.cp, setup.pod("waiting", 12000))
        _event(setup, "waiting", "FailedScheduling")
    kubeconfig = _reader_kubeconfig(setup, tmp_path / "reader.yaml")
    args = ["defrag", "plan", "--kubeconfig", str(kubeconfig), "--namespace", setup.namespace]
    result = CliRunner().invoke(main, [*args, "--config-map", env.CONFIG_MAP, "-o", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (plan,) = [p for p in report["plans"] if p["pod"] == f"{setup.namespace}/waiting"]
    moved = db if mode == "single" else web
    key = f"{setup.namespace}/{moved['metadata']['name']}"
    assert [m["pod"] for m in plan["moves"]] == [key]
    left = report.get("groupsLeft", {})
    if mode == "all":
        assert "disruptionMode all, moved whole or not at all" in left[f"{setup.namespace}/db"]
    else:
        assert left == {}


def _status_as(cp: ControlPlane, token: str, method: str, path: str, body: Any = None) -> int:
    """The HTTP status of one request made with ``token``."""
    context = ssl.create_default_context(cafile=str(cp.ca_path))
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(cp.server + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
