"""Preemption against a real API server: who is evicted, where the preemptor binds, and
that nothing is over-committed while victims terminate.

Priorities come from PriorityClasses (the API server's Priority admission plugin fills
``spec.priority``); victims leave through the Eviction API, and kwok's pod-delete stage
removes evicted pods as a kubelet would. A finalizer keeps a victim terminating for as
long as a test needs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from integration import operator_env as env

from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane

PRIORITY_CLASSES = "/apis/scheduling.k8s.io/v1/priorityclasses"
HOLD = "vgpu-test/hold"


@dataclass
class Setup:
    cp: ControlPlane
    namespace: str
    scheduler: str
    classes: dict[int, str]

    def create(
        self,
        name: str,
        priority: int,
        *,
        gpumem: int,
        labels: dict[str, str] | None = None,
        finalizer: bool = False,
    ) -> dict[str, Any]:
        pod = env.gpu_pod(
            self.namespace,
            name,
            scheduler=self.scheduler,
            group=self.namespace,
            gpumem=gpumem,
            labels=labels,
        )
        pod["spec"]["priorityClassName"] = self.classes[priority]
        if finalizer:
            pod["metadata"]["finalizers"] = [HOLD]
        return env.create_pod(self.cp, pod)

    def running(self, name: str, priority: int, **kwargs: Any) -> dict[str, Any]:
        self.create(name, priority, **kwargs)
        env.wait_bound(self.cp, self.namespace, name)

        def running() -> dict[str, Any] | None:
            pod = self.get(name)
            return pod if pod["status"].get("phase") == "Running" else None

        return env.wait_until(f"{name} to run", running)

    def get(self, name: str) -> dict[str, Any]:
        return env.get_pod(self.cp, self.namespace, name)

    def exists(self, name: str) -> bool:
        try:
            self.get(name)
        except AdminRequestError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def node(self, suffix: str) -> str:
        return f"{self.namespace}-{suffix}"

    def budget(self, name: str, labels: dict[str, str], allowed: int) -> None:
        env.disruption_budget(self.cp, self.namespace, name, labels, allowed)


@pytest.fixture
def setup(control_plane: ControlPlane, namespace: str) -> Iterator[Setup]:
    scheduler = env.new_scheduler(control_plane, namespace)
    classes = {}
    for value in (0, 10, 100, 1000):
        name = f"{namespace}-p{value}"
        control_plane.create(
            PRIORITY_CLASSES,
            {"apiVersion": "scheduling.k8s.io/v1", "metadata": {"name": name}, "value": value},
        )
        classes[value] = name
    s = Setup(control_plane, namespace, scheduler, classes)
    yield s
    for pod in env.list_pods(control_plane, namespace):
        if pod["metadata"].get("finalizers"):
            control_plane.patch(
                f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                {"metadata": {"finalizers": None}},
            )
    env.cleanup_group(control_plane, namespace)
    for name in classes.values():
        control_plane.delete(f"{PRIORITY_CLASSES}/{name}")


@pytest.fixture
def operator(setup: Setup) -> Iterator[OperatorThread]:
    with OperatorThread(env.options(setup.cp, setup.namespace)) as running:
        yield running


def _event(s: Setup, name: str, reason: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        found = [e for e in env.events_for(s.cp, s.namespace, name) if e["reason"] == reason]
        return found[0] if found else None

    return env.wait_until(f"a {reason} event for {name}", check, 30)


def _gone(s: Setup, name: str) -> None:
    env.wait_until(f"{name} to be gone", lambda: not s.exists(name), 30)


def test_fractional_pod_evicts_exactly_the_chosen_victim_and_binds_to_the_freed_card(
    setup: Setup, operator: OperatorThread
) -> None:
    cards = env.cards(setup.node("a"), 1, memory_mib=20000)
    env.gpu_node(setup.cp, setup.node("a"), cards, group=setup.namespace)
    setup.running("keep", 100, gpumem=8000)
    setup.running("evict", 10, gpumem=8000)
    # 4000 MiB are free; 10000 need one share to go: the less important one.
    setup.create("urgent", 1000, gpumem=10000)
    _gone(setup, "evict")
    urgent = env.wait_bound(setup.cp, setup.namespace, "urgent", 30)
    assert urgent["spec"]["nodeName"] == setup.node("a")
    assert env.allocation(urgent) == [(cards[0].uuid, 10000, 0)]
    assert setup.exists("keep")
    assert urgent["status"].get("nominatedNodeName") in (None, setup.node("a"))
    preempting = _event(setup, "urgent", "Preempting")
    assert preempting["message"] == f"Preempting 1 pod on node {setup.node('a')}"
    preempted = _event(setup, "evict", "Preempted")
    assert (
        preempted["message"] == f"Preempted by {setup.namespace}/urgent on node {setup.node('a')}"
    )
    usage = env.usage_by_card(env.list_pods(setup.cp, setup.namespace))
    assert usage[cards[0].uuid][1] == 18000


def test_pod_protected_by_a_budget_is_spared_when_another_choice_exists(
    setup: Setup, operator: OperatorThread
) -> None:
    for suffix in ("a", "b"):
        env.gpu_node(
            setup.cp,
            setup.node(suffix),
            env.cards(setup.node(suffix), 1, memory_mib=10000),
            group=setup.namespace,
        )
    setup.budget("db", {"app": "db"}, allowed=0)
    guarded = setup.running("guarded", 10, gpumem=9000, labels={"app": "db"})
    plain = setup.running("plain", 10, gpumem=9000, labels={"app": "web"})
    assert guarded["spec"]["nodeName"] != plain["spec"]["nodeName"]
    setup.create("urgent", 1000, gpumem=6000)
    _gone(setup, "plain")
    urgent = env.wait_bound(setup.cp, setup.namespace, "urgent", 30)
    assert urgent["spec"]["nodeName"] == plain["spec"]["nodeName"]
    assert setup.exists("guarded")


def test_a_budget_allowing_no_disruption_blocks_the_preemption_before_any_eviction(
    setup: Setup, operator: OperatorThread
) -> None:
    """The only victim is protected: the Eviction API would refuse it, so the operator
    does not try (nor nominate), and tells the preemptor why (issue 22)."""
    env.gpu_node(
        setup.cp,
        setup.node("a"),
        env.cards(setup.node("a"), 1, memory_mib=10000),
        group=setup.namespace,
    )
    setup.budget("db", {"app": "db"}, allowed=0)
    setup.running("guarded", 10, gpumem=9000, labels={"app": "db"})
    setup.create("urgent", 1000, gpumem=6000)
    event = _event(setup, "urgent", "PreemptionBlocked")
    assert event["type"] == "Warning"
    assert f"PodDisruptionBudget {setup.namespace}/db" in event["message"]
    condition = env.condition(setup.get("urgent")) or {}
    assert condition.get("reason") == "PreemptionBlocked"
    reasons = {e["reason"] for e in env.events_for(setup.cp, setup.namespace, "urgent")}
    assert "Preempting" not in reasons
    assert setup.get("urgent")["status"].get("nominatedNodeName") is None
    assert setup.exists("guarded")
    assert setup.get("guarded").get("metadata", {}).get("deletionTimestamp") is None
    assert not setup.get("urgent")["spec"].get("nodeName")


def test_no_over_commit_while_the_victim_terminates(setup: Setup, operator: OperatorThread) -> None:
    cards = env.cards(setup.node("a"), 1, memory_mib=10000)
    env.gpu_node(setup.cp, setup.node("a"), cards, group=setup.namespace)
    setup.running("victim", 10, gpumem=6000, finalizer=True)
    setup.create("urgent", 1000, gpumem=8000)
    env.wait_until(
        "the victim to be terminating",
        lambda: setup.get("victim")["metadata"].get("deletionTimestamp"),
        30,
    )
    # 4000 MiB are free on the card right now, but they are held for urgent: a lower
    # priority pod that would fit there must wait, and urgent must not start beside the
    # victim that still holds its share.
    setup.create("filler", 0, gpumem=3000)
    _event(setup, "filler", "FailedScheduling")
    assert not setup.get("filler")["spec"].get("nodeName")
    assert not setup.get("urgent")["spec"].get("nodeName")
    assert setup.get("urgent")["status"].get("nominatedNodeName") == setup.node("a")
    setup.cp.patch(
        f"/api/v1/namespaces/{setup.namespace}/pods/victim", {"metadata": {"finalizers": None}}
    )
    _gone(setup, "victim")
    urgent = env.wait_bound(setup.cp, setup.namespace, "urgent", 30)
    assert env.allocation(urgent) == [(cards[0].uuid, 8000, 0)]
    assert not setup.get("filler")["spec"].get("nodeName")
    usage = env.usage_by_card(env.list_pods(setup.cp, setup.namespace))
    assert usage[cards[0].uuid][1] <= 10000


def test_a_gang_preempts_when_the_whole_gang_then_fits(
    setup: Setup, operator: OperatorThread
) -> None:
    cards = env.cards(setup.node("a"), 2, memory_mib=20000)
    env.gpu_node(setup.cp, setup.node("a"), cards, group=setup.namespace)
    setup.running("batch-0", 10, gpumem=16000)
    setup.running("batch-1", 10, gpumem=16000)
    setup.cp.create(
        f"/apis/scheduling.k8s.io/v1beta1/namespaces/{setup.namespace}/podgroups",
        {
            "apiVersion": "scheduling.k8s.io/v1beta1",
            "kind": "PodGroup",
            "metadata": {"name": "train"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
        },
    )
    # Each member needs a card of its own: both batch pods go, then both members bind.
    for name in ("w0", "w1"):
        pod = env.gpu_pod(
            setup.namespace, name, scheduler=setup.scheduler, group=setup.namespace, gpumem=10000
        )
        pod["spec"]["priorityClassName"] = setup.classes[1000]
        pod["spec"]["schedulingGroup"] = {"podGroupName": "train"}
        env.create_pod(setup.cp, pod)
    _gone(setup, "batch-0")
    _gone(setup, "batch-1")
    for name in ("w0", "w1"):
        assert env.wait_bound(setup.cp, setup.namespace, name, 30)["spec"]["nodeName"]


def test_a_preemptor_is_told_what_it_waits_for_and_when_its_hold_times_out(
    setup: Setup, operator: OperatorThread
) -> None:
    """Issue 44: a preemptor waited without a word, and past its nomination's timeout its
    hold was dropped silently. Its condition and Events now say that it preempts, and,
    when its victim (kept by a finalizer) outlives the hold, that the hold timed out; its
    nominatedNodeName is cleared and it is decided again."""
    from vgpu_operator.control import reporting

    operator.app.running.state.nomination_timeout_s = 3.0  # set before the preemption
    cards = env.cards(setup.node("a"), 1, memory_mib=10000)
    env.gpu_node(setup.cp, setup.node("a"), cards, group=setup.namespace)
    setup.running("victim", 10, gpumem=6000, finalizer=True)
    setup.create("urgent", 1000, gpumem=8000)
    preempting = _event(setup, "urgent", reporting.REASON_PREEMPTING)
    assert preempting["message"] == f"Preempting 1 pod on node {setup.node('a')}"
    timed_out = _event(setup, "urgent", reporting.REASON_NOMINATION_TIMED_OUT)
    assert timed_out["type"] == "Warning"
    assert f"{setup.namespace}/victim" in timed_out["message"]
    assert "did not leave in time" in timed_out["message"]
    env.wait_until(
        "urgent's nomination to be cleared",
        lambda: setup.get("urgent")["status"].get("nominatedNodeName") is None,
        30,
    )
    assert not setup.get("urgent")["spec"].get("nodeName")
    assert setup.exists("victim")  # still terminating: nothing evicted again
