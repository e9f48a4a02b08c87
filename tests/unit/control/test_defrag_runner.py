"""Carrying out a defragmentation plan against a simulated cluster: the runner's writes
(hold, nominatedNodeName, Evictions, Events, metrics) and its stops on a refusal or a
surprise.

The world around the runner is the real engine and feed, with the controllers, the
kubelet and the scheduling worker played between two polls: an evicted pod's controller
creates its replacement at once, the engine places pending pods, evicted pods are gone
one step later.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import itertools
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from builders import make_node
from defrag_cases import running_pod, two_half_full_cards

from vgpu_operator.control import defrag, feed, queue
from vgpu_operator.control.options import DefragOptions
from vgpu_operator.kube.eviction import EvictOutcome
from vgpu_operator.metrics import DefragMetrics, OperatorMetrics
from vgpu_operator.scheduling.cycle.cluster import ClusterState, pod_key
from vgpu_operator.scheduling.defrag.defrag_books import DefragBooks

GIB = 1024
Json = dict[str, Any]


def pending(name: str, memory_mib: int) -> Json:
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory_mib}
    return {
        "metadata": {"namespace": "default", "name": name, "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "containers": [{"name": "c", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Pending"},
    }


@dataclass
class World:
    state: ClusterState
    feed: feed.StateFeed
    pods: dict[str, Json]
    now: float = 1000.0
    refuse: set[str] = field(default_factory=set)
    #: After an eviction: a pod that takes the room a replacement was planned for.
    intruder: Json | None = None
    evicted: list[str] = field(default_factory=list)
    nominated: list[tuple[str, str | None]] = field(default_factory=list)
    events: list[tuple[str, str, bool]] = field(default_factory=list)
    terminating: list[str] = field(default_factory=list)
    serial: int = 0

    # --- the API, as the runner sees it ---------------------------------------------------
    async def list_pods(self, namespace: str | None = None) -> list[Json]:
        return [
            copy.deepcopy(p)
            for p in self.pods.values()
            if namespace is None or p["metadata"]["namespace"] == namespace
        ]

    async def evict(self, key: str, uid: str) -> EvictOutcome:
        pod = self.pods.get(key)
        if pod is None or pod["metadata"].get("uid") != uid:
            return EvictOutcome.GONE
        if key in self.refuse:
            return EvictOutcome.REFUSED
        self.evicted.append(key)
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        self.feed.pod_event("MODIFIED", copy.deepcopy(pod))
        self.terminating.append(key)
        if self.intruder is not None:
            self._create(self.intruder)
            self.intruder = None
        if pod["metadata"].get("ownerReferences"):
            # The controller creates the replacement at once (a ReplicaSet does).
            self.serial += 1
            twin = copy.deepcopy(pod)
            meta = twin["metadata"]
            meta["name"] = f"{meta['name']}-r{self.serial}"
            meta["uid"] = f"{meta['uid']}-r{self.serial}"
            meta.pop("deletionTimestamp")
            meta["annotations"] = {}
            twin["spec"].pop("nodeName")
            twin["spec"]["schedulerName"] = "vgpu-scheduler"
            twin["status"] = {"phase": "Pending"}
            self._create(twin)
        return EvictOutcome.EVICTED

    async def nominate(self, pod: Mapping[str, Any], node: str | None) -> None:
        self.nominated.append((pod_key(pod), node))

    async def event(
        self, pod: Mapping[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        self.events.append((pod_key(pod), reason, warning))

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.step()

    # --- what happens between two polls ----------------------------------------------------
    def _create(self, pod: Json) -> None:
        self.pods[pod_key(pod)] = pod
        self.feed.pod_event("ADDED", copy.deepcopy(pod))

    def step(self) -> None:
        """The scheduling worker decides every waiting pod (the engine's own decision),
        then the terminating pods are gone."""
        self.decide()
        for key in self.terminating:
            self.feed.pod_event("DELETED", self.pods.pop(key))
        self.terminating.clear()
        self.decide()

    def decide(self) -> None:
        for pod in self.feed.waiting_for("vgpu-scheduler"):
            decision = self.state.schedule(pod, self.now)
            if not decision.scheduled:
                continue
            self.state.confirm(decision.pod)
            bound = copy.deepcopy(pod)
            bound["metadata"]["annotations"] = {
                **(bound["metadata"].get("annotations") or {}),
                **decision.annotations,
            }
            bound["spec"]["nodeName"] = decision.node
            bound["status"] = {"phase": "Running"}
            self.pods[decision.pod] = bound
            self.feed.binding_succeeded(decision.pod)
            self.feed.pod_event("MODIFIED", copy.deepcopy(bound))


def world(extra_node: bool = False) -> World:
    """Node a: 6 and 8 GiB free on two cards; node b (and c): 10 GiB free beside a pod
    that stays; a 12 GiB pod waits."""
    state = ClusterState(feed.device_config.DeviceConfig())
    nodes, pods = two_half_full_cards(keeper="keeper")
    if extra_node:
        nodes.append(make_node("c").gpu("GPU-c0", memory_mib=16 * GIB))
    for node, name in zip(nodes, "abc", strict=False):
        node.label("kubernetes.io/hostname", name)
        pods.append(running_pod("keeper-c", "c", "GPU-c0", 6 * GIB, priority=100))
    for node in nodes:
        node.install(state)
    state_feed = feed.StateFeed(state, queue.SchedulingQueue())
    w = World(state, state_feed, {})
    for pod in [*pods, pending("w", 12 * GIB)]:
        w._create(pod)
    return w


def runner(w: World, metrics: DefragMetrics, **settings: Any) -> defrag.DefragRunner:
    return defrag.DefragRunner(
        w.state,
        w.feed,
        w,
        metrics,
        DefragOptions(**settings),
        decides=lambda: True,
        wall_clock=lambda: w.now,
        clock=lambda: w.now,
        sleep=w.sleep,
    )


def sample(metrics: OperatorMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(f"vgpu_operator_defrag_{name}_total", labels)
    return value or 0.0


def test_a_plan_moves_the_pod_and_the_waiting_pod_binds_where_room_was_made() -> None:
    w = world()
    metrics = OperatorMetrics()
    outcome = asyncio.run(runner(w, DefragMetrics(metrics)).round())
    assert outcome is defrag.PlanOutcome.DONE
    assert w.evicted == ["default/p8"]
    (replacement,) = [p for k, p in w.pods.items() if k.startswith("default/p8-r")]
    assert replacement["spec"]["nodeName"] == "b"
    assert w.pods["default/w"]["spec"]["nodeName"] == "a"
    assert w.nominated == [("default/w", "a")]
    assert [(k, r) for k, r, _warning in w.events] == [
        ("default/w", defrag.DEFRAGMENTING),
        ("default/p8", defrag.MOVE),
        ("default/w", defrag.DONE),
    ]
    assert sample(metrics, "plans", result="succeeded") == 1
    assert sample(metrics, "moves", result="evicted") == 1
    assert not DefragBooks(w.state).is_claimed("default/p10")


@pytest.fixture(autouse=True)
def _unfrozen_after() -> Generator[None, None, None]:
    yield
    gc.unfreeze()  # a planning round freezes the heap (``heap.refreeze``)


class _Survivor:
    """Stands for an object made since the last freeze (a new pod's entry)."""


def test_a_planning_round_first_freezes_what_survived_out_of_the_full_passes() -> None:
    w = world()
    survivor = _Survivor()
    assert any(obj is survivor for obj in gc.get_objects())
    asyncio.run(runner(w, DefragMetrics(OperatorMetrics())).round())
    assert not any(obj is survivor for obj in gc.get_objects())


def test_the_freed_card_is_held_while_the_moved_pod_terminates() -> None:
    w = world()
    w.intruder = pending("intruder", 12 * GIB)
    asyncio.run(runner(w, DefragMetrics(OperatorMetrics())).round())
    # The intruder, created right after the eviction, finds the freed card held.
    assert w.pods["default/w"]["spec"]["nodeName"] == "a"
    assert "nodeName" not in w.pods["default/intruder"]["spec"]


def test_a_refused_eviction_stops_the_plan_and_gives_the_hold_back() -> None:
    w = world()
    w.refuse.add("default/p8")
    metrics = OperatorMetrics()
    outcome = asyncio.run(runner(w, DefragMetrics(metrics)).round())
    assert outcome is defrag.PlanOutcome.STOPPED
    assert w.evicted == []
    assert w.nominated == [("default/w", "a"), ("default/w", None)]
    assert (("default/w", defrag.STOPPED, True)) in w.events
    books = DefragBooks(w.state)
    assert not books.is_nominated("default/w")
    assert not books.is_claimed("default/p8")
    assert sample(metrics, "failures", reason="refused") == 1
    assert sample(metrics, "moves", result="refused") == 1
    assert sample(metrics, "plans", result="stopped") == 1


def test_a_replacement_bound_elsewhere_than_planned_stops_the_plan() -> None:
    w = world(extra_node=True)
    metrics = OperatorMetrics()
    run = runner(w, DefragMetrics(metrics))
    # Someone takes the room planned for p8's replacement right after the eviction.
    report_target = {"b": "c", "c": "b"}
    planned = asyncio.run(_planned_target(w))
    w.intruder = pending("intruder", 10 * GIB)
    w.intruder["spec"]["nodeSelector"] = {"kubernetes.io/hostname": planned}
    outcome = asyncio.run(run.round())
    assert outcome is defrag.PlanOutcome.STOPPED
    replacement = next(p for k, p in w.pods.items() if k.startswith("default/p8-r"))
    assert replacement["spec"]["nodeName"] == report_target[planned]
    assert sample(metrics, "failures", reason="misplaced") == 1
    assert w.nominated[-1] == ("default/w", None)


async def _planned_target(w: World) -> str:
    from vgpu_operator.scheduling.defrag import defrag as planner

    report = planner.plan(w.state, w.feed.waiting_for("vgpu-scheduler"), await w.list_pods(), w.now)
    return report.plans[0].moves[0].to_node


def test_a_move_that_takes_too_long_stops_the_plan() -> None:
    w = world()

    async def never(seconds: float) -> None:
        w.now += seconds  # time passes; nothing else happens

    metrics = OperatorMetrics()
    run = runner(w, DefragMetrics(metrics), step_timeout_s=30.0)
    run._sleep = never
    outcome = asyncio.run(run.round())
    assert outcome is defrag.PlanOutcome.STOPPED
    assert sample(metrics, "failures", reason="timeout") == 1
    assert not DefragBooks(w.state).is_nominated("default/w")


def test_nothing_is_listed_or_moved_while_no_pod_is_blocked_by_fragmentation() -> None:
    w = world()
    w.feed.pod_event("DELETED", w.pods.pop("default/w"))
    listed: list[str | None] = []

    async def list_pods(namespace: str | None = None) -> list[Json]:
        listed.append(namespace)
        return []

    w.list_pods = list_pods  # type: ignore[method-assign]
    assert asyncio.run(runner(w, DefragMetrics(OperatorMetrics())).round()) is None
    assert listed == []
    assert w.evicted == []


def test_a_replica_that_no_longer_decides_stops_after_the_move_under_way() -> None:
    w = world()
    metrics = OperatorMetrics()
    run = runner(w, DefragMetrics(metrics))
    run._decides = lambda: not w.evicted  # leadership moves right after the eviction
    outcome = asyncio.run(run.round())
    assert outcome is defrag.PlanOutcome.STOPPED
    assert sample(metrics, "failures", reason="hold_lost") == 1


def test_decisions_run_while_the_plan_is_made() -> None:
    """The runner lets the loop run between two steps of planning (here every step: each
    look at the clock is a second later); a plan that other work left intact is then
    checked again and carried out."""
    w = world()
    metrics = OperatorMetrics()
    run = runner(w, DefragMetrics(metrics))
    seconds = itertools.count()
    run._clock = lambda: float(next(seconds))
    listed: list[str | None] = []
    seen: list[tuple[list[str], list[tuple[str, str | None]]]] = []
    list_pods = w.list_pods

    async def listing(namespace: str | None = None) -> list[Json]:
        listed.append(namespace)
        return await list_pods(namespace)

    w.list_pods = listing  # type: ignore[method-assign]

    async def meanwhile() -> None:
        while not listed:
            await asyncio.sleep(0)
        seen.append((list(w.evicted), list(w.nominated)))  # the round is planning

    async def both() -> list[Any]:
        return list(await asyncio.gather(run.round(), meanwhile()))

    outcome, _ = asyncio.run(both())
    assert seen == [([], [])]
    assert outcome is defrag.PlanOutcome.DONE
    assert w.evicted == ["default/p8"]


def test_a_plan_that_other_work_made_out_of_date_is_not_carried_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The room planned for p8's replacement is taken while the loop runs after the
    search: the check before the hold refuses the plan; nothing is held or evicted."""
    from vgpu_operator.scheduling.defrag import defrag as planner

    w = world()
    waiting = w.feed.waiting_for("vgpu-scheduler")
    made = planner.plan(w.state, waiting, list(w.pods.values()), w.now, limit=1)
    assert [m.to_node for m in made.plans[0].moves] == ["b"]

    def out_of_date(*args: Any, **kwargs: Any) -> Generator[None, None, planner.Report]:
        yield  # the loop runs: a pod takes b0's room
        return made

    async def intruder() -> None:
        await asyncio.sleep(0)
        pod = pending("intruder", 10 * GIB)
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "b"}
        w._create(pod)
        w.decide()

    monkeypatch.setattr(planner, "plan_steps", out_of_date)
    run = runner(w, DefragMetrics(OperatorMetrics()))
    run._clock = itertools.count().__next__  # type: ignore[assignment]

    async def both() -> list[Any]:
        return list(await asyncio.gather(run.round(), intruder()))

    outcome, _ = asyncio.run(both())
    assert w.pods["default/intruder"]["spec"]["nodeName"] == "b"
    assert outcome is None
    assert (w.evicted, w.nominated) == ([], [])
    assert not DefragBooks(w.state).is_nominated("default/w")
