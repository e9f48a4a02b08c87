"""Restart safety: the operator process is killed (SIGKILL) in the middle of a burst of
300 pods and started again; in the end no card holds more than it has, and every pod
left pending truly fits nowhere.

The operator runs as a real process (``vgpu-operator run`` through the click command),
so the kill is abrupt: Bindings in flight are lost or committed, never half-written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from integration import operator_env as env

from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.testing.controlplane import ControlPlane

NODES = 5
CARDS_PER_NODE = 8
CARD_MEMORY_MIB = 40000
SPLIT = 10
PODS = 300
KILL_AFTER_BOUND = 60


def _demand(i: int) -> dict[str, Any]:
    """A varied mix, about twice what fits: memory-, core- and share-limited pods."""
    gpus = 2 if i % 10 == 0 else 1
    gpumem = (3000, 6000, 10000, 16000)[i % 4]
    gpucores = 40 if i % 3 == 0 else None
    return {"gpus": gpus, "gpumem": gpumem, "gpucores": gpucores}


class OperatorProcess:
    def __init__(self, cp: ControlPlane, namespace: str, log_path: Path) -> None:
        self._argv = [
            sys.executable,
            "-c",
            "from vgpu_operator.operator_cli import run; run()",
            "--kubeconfig",
            str(cp.kubeconfig_path),
            "--namespace",
            namespace,
            "--config-map",
            env.CONFIG_MAP,
            "--standalone",
            "--allocation-gate=off",
            "--metrics-port",
            "-1",
            "--log-format",
            "json",
        ]
        self._env = {**cp.env(), "PYTHONSAFEPATH": "1"}
        self._log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self._log_path.open("ab")
        self.proc = subprocess.Popen(
            self._argv, env=self._env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def wait_active(self, timeout_s: float = 60.0) -> None:
        """Until the process logs that it decides (its startup resync is done)."""
        env.wait_until(
            "the operator to start deciding",
            lambda: b'"scheduling_active"' in self._log_path.read_bytes(),
            timeout_s,
        )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def group(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    env.install_crd(control_plane)
    yield namespace
    env.cleanup_group(control_plane, namespace)


def _bound(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if (p.get("spec") or {}).get("nodeName")]


def _settled(cp: ControlPlane, namespace: str, previous: list[int]) -> bool:
    """Every pod is bound or marked unschedulable, and nothing changed for a while."""
    pods = env.list_pods(cp, namespace)
    if len(pods) < PODS:
        return False
    waiting = [p for p in pods if not (p.get("spec") or {}).get("nodeName")]
    reported = all((env.condition(p) or {}).get("status") == "False" for p in waiting)
    previous.append(len(pods) - len(waiting))
    stable = len(previous) >= 15 and len(set(previous[-15:])) == 1
    return reported and stable


def test_kill_mid_burst_and_restart_never_overcommits(
    control_plane: ControlPlane, group: str, tmp_path: Path
) -> None:
    cp = control_plane
    scheduler = env.new_scheduler(cp, group)
    card_node: dict[str, str] = {}
    for n in range(NODES):
        name = f"{group}-r{n}"
        node_cards = env.cards(name, CARDS_PER_NODE, memory_mib=CARD_MEMORY_MIB, split_count=SPLIT)
        env.gpu_node(cp, name, node_cards, group=group)
        card_node.update({c.uuid: name for c in node_cards})

    operator = OperatorProcess(cp, group, tmp_path / "operator.log")
    operator.start()
    operator.wait_active()
    created: list[str] = []

    def burst() -> None:
        for i in range(PODS):
            pod = env.gpu_pod(group, f"p{i:03d}", scheduler=scheduler, group=group, **_demand(i))
            env.create_pod(cp, pod)
            created.append(pod["metadata"]["name"])

    creator = threading.Thread(target=burst)
    try:
        creator.start()
        env.wait_until(
            f"{KILL_AFTER_BOUND} pods to be bound",
            lambda: len(_bound(env.list_pods(cp, group))) >= KILL_AFTER_BOUND,
            120,
        )
        operator.kill()
        killed_at = len(_bound(env.list_pods(cp, group)))
        creator.join(120)
        assert len(created) == PODS
        assert killed_at < PODS, "the burst was over before the kill; nothing was tested"
        operator.start()
        history: list[int] = []
        env.wait_until("the operator to settle", lambda: _settled(cp, group, history), 240)
    finally:
        creator.join(120)
        operator.stop()

    pods = env.list_pods(cp, group)
    bound = _bound(pods)
    assert len(bound) > killed_at
    usage = env.usage_by_card(bound)
    for card, (shares, memory_mib, cores) in usage.items():
        assert shares <= SPLIT, f"{card}: {shares} pods"
        assert memory_mib <= CARD_MEMORY_MIB, f"{card}: {memory_mib} MiB"
        assert cores <= 100, f"{card}: {cores} cores"
    for pod in bound:
        node = pod["spec"]["nodeName"]
        assert pod["metadata"]["annotations"]["hami.io/vgpu-node"] == node
        assert {card_node[c] for c, _, _ in env.allocation(pod)} == {node}
    # Nothing is leaked: a pod still waiting would not fit on what is left.
    free = _free_cards(card_node, usage)
    for pod in pods:
        if pod in bound:
            continue
        demand = _demand(int(pod["metadata"]["name"][1:]))
        assert not _fits(demand, free), f"{pod['metadata']['name']} fits but waits"


def _free_cards(
    card_node: Mapping[str, str], usage: Mapping[str, tuple[int, int, int]]
) -> dict[str, list[tuple[int, int, int]]]:
    per_node: dict[str, list[tuple[int, int, int]]] = {}
    for card, node in card_node.items():
        shares, memory_mib, cores = usage.get(card, (0, 0, 0))
        per_node.setdefault(node, []).append(
            (SPLIT - shares, CARD_MEMORY_MIB - memory_mib, 100 - cores)
        )
    return per_node


def _fits(demand: Mapping[str, Any], free: Mapping[str, list[tuple[int, int, int]]]) -> bool:
    cores = demand["gpucores"] or 0
    for cards in free.values():
        usable = [c for c in cards if c[0] >= 1 and c[1] >= demand["gpumem"] and c[2] >= cores]
        if len(usable) >= demand["gpus"]:
            return True
    return False


def test_restarted_operator_rebuilds_usage_from_bound_pods(
    control_plane: ControlPlane, group: str, tmp_path: Path
) -> None:
    """A pod bound before the restart keeps its card: the new process does not reuse it."""
    cp = control_plane
    scheduler = env.new_scheduler(cp, group)
    name = f"{group}-one"
    env.gpu_node(cp, name, env.cards(name, 1, memory_mib=20000), group=group)
    first = OperatorProcess(cp, group, tmp_path / "first.log")
    first.start()
    try:
        env.create_pod(
            cp, env.gpu_pod(group, "holder", scheduler=scheduler, group=group, gpumem=15000)
        )
        env.wait_bound(cp, group, "holder")
    finally:
        first.kill()
    second = OperatorProcess(cp, group, tmp_path / "second.log")
    second.start()
    try:
        env.create_pod(
            cp, env.gpu_pod(group, "late", scheduler=scheduler, group=group, gpumem=15000)
        )
        env.wait_until(
            "the late pod to be reported unschedulable",
            lambda: (env.condition(env.get_pod(cp, group, "late")) or {}).get("status") == "False",
            60,
        )
        assert not env.get_pod(cp, group, "late")["spec"].get("nodeName")
    finally:
        second.stop()


# --- a gang cut in two by the kill (issue 47 item 5) ----------------------------------------

POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


def _stall(cp: ControlPlane, name: str, namespace: str, members: list[str]) -> None:
    """A policy that refuses the Bindings of ``members`` and every write of a PodGroup's
    status in ``namespace``: the operator binds the group's other members, its Bindings of
    these fail (and are retried), and its PodGroup never says the group was scheduled, as
    when the operator is killed between its first Bindings and the condition's write."""
    listed = ", ".join(f"'{m}'" for m in members)
    cp.create(
        POLICIES,
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods/binding"],
                        },
                        {
                            "apiGroups": ["scheduling.k8s.io"],
                            "apiVersions": ["*"],
                            "operations": ["UPDATE"],
                            "resources": ["podgroups/status"],
                        },
                    ]
                },
                "validations": [
                    {
                        "expression": f"object.metadata.namespace != '{namespace}' || "
                        f"(object.kind == 'Binding' && !(object.metadata.name in [{listed}]))",
                        "message": "stalled by the test",
                    }
                ],
            },
        },
    )
    cp.create(
        BINDINGS,
        {
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        },
    )


def _unstall(cp: ControlPlane, name: str) -> None:
    cp.delete(f"{BINDINGS}/{name}")
    cp.delete(f"{POLICIES}/{name}")


def _scheduled(cp: ControlPlane, namespace: str, name: str) -> str | None:
    group = cp.get(f"/apis/{gangs.API_VERSION}/namespaces/{namespace}/podgroups/{name}")
    for condition in (group.get("status") or {}).get("conditions") or []:
        if condition.get("type") == gangs.INITIALLY_SCHEDULED:
            return str(condition.get("status"))
    return None


def test_kill_with_part_of_a_gang_bound_and_the_restarted_operator_completes_it(
    control_plane: ControlPlane, group: str, tmp_path: Path
) -> None:
    """A gang of four (minCount 4) on four cards: two members are bound when the operator
    is killed, the other two and the PodGroup's condition not written. The restarted
    process has placed no member itself; the two bound ones count toward minCount as they
    did before (the API says they are bound, the books hold them), so the two pending ones
    complete the group. Before this was counted, the group waited for four pending
    members forever, two of them bound: a partly bound gang."""
    cp = control_plane
    scheduler = env.new_scheduler(cp, group)
    node = f"{group}-gang"
    cards = env.cards(node, 4, memory_mib=20000)
    env.gpu_node(cp, node, cards, group=group)
    cp.create(
        f"/apis/{gangs.API_VERSION}/namespaces/{group}/podgroups",
        {
            "apiVersion": gangs.API_VERSION,
            "kind": "PodGroup",
            "metadata": {"name": "g"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 4}}},
        },
    )
    stall = env.unique("stall")
    _stall(cp, stall, group, ["g-2", "g-3"])
    log_path = tmp_path / "first.log"
    first = OperatorProcess(cp, group, log_path)
    first.start()
    stalled = True
    try:
        first.wait_active()
        for i in range(4):
            pod = env.gpu_pod(group, f"g-{i}", scheduler=scheduler, group=group, gpumem=15000)
            pod["spec"]["schedulingGroup"] = {"podGroupName": "g"}
            env.create_pod(cp, pod)
        for name in ("g-0", "g-1"):
            env.wait_bound(cp, group, name, 60)
        env.wait_until(
            "a stalled member's Binding to fail",
            lambda: b'"bind_failed"' in log_path.read_bytes(),
            60,
        )
        first.kill()
        _unstall(cp, stall)
        stalled = False
        for name in ("g-2", "g-3"):
            assert not env.get_pod(cp, group, name)["spec"].get("nodeName")
        assert _scheduled(cp, group, "g") != "True"
        second = OperatorProcess(cp, group, tmp_path / "second.log")
        second.start()
        try:
            for name in ("g-2", "g-3"):
                env.wait_bound(cp, group, name, 60)
            env.wait_until(
                "the group's condition", lambda: _scheduled(cp, group, "g") == "True", 30
            )
        finally:
            second.stop()
    finally:
        first.kill()
        if stalled:
            _unstall(cp, stall)
    pods = [p for p in env.list_pods(cp, group) if p["metadata"]["name"].startswith("g-")]
    usage = env.usage_by_card(pods)
    assert sorted(usage) == sorted(c.uuid for c in cards)  # one member per card
    assert all(shares == 1 and memory == 15000 for shares, memory, _ in usage.values())
