"""A verdict kept current decides exactly as a full search and diagnosis made afresh.

The indexed path keeps one verdict per shape of pod that fits nowhere and, on the next
attempt of any pod of that shape, visits only the nodes changed since and judges nodes
by classes of identical cards; the reference path fits every node every time. Both run
the same steps: pods scheduled, retried, copied under new names (the same shape) and
copied with one annotation set (a new shape, whose verdict may start from its kin's),
pods placed and released, nodes cordoned, tainted and relabelled, cards failing and
healing, quotas changing, time passing with node heartbeats going stale and renewed.
Every decision must be the same, diagnosis message included.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from builders import Json, bound, resource_quota
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import (
    NAMESPACES,
    NODE_CHANGES,
    CardChange,
    ClusterSpec,
    NodeChange,
    QuotaChange,
    Tick,
    change_card,
    change_node,
    clusters,
    comparable,
    pods,
)

from vgpu_operator import names
from vgpu_operator.devices import nvidia
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision

TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Schedule:
    pod: Json
    then: str  # confirm, rollback, keep


@dataclass(frozen=True)
class Retry:
    """An earlier pod that did not fit, decided again (the same object)."""

    pick: int


@dataclass(frozen=True)
class Twin:
    """A copy of an earlier pod under a new name: the same shape."""

    pick: int


@dataclass(frozen=True)
class Kin:
    """A copy of an earlier pod under a new name with one annotation set: a new shape.
    Its verdict starts from an older one's judgements when no judgement reads the
    annotation (``verdict_kin``), and must not where one does."""

    pick: int
    key: str
    value: str


#: Annotations a kin may differ in: one no judgement reads, and those Fit or the node
#: gate read (which must give a verdict of its own).
_KIN_ANNOTATIONS = (
    ("example.com/rollout", ("1", "2")),
    ("example.com/rollout", ("1", "2")),
    (nvidia.USE_TYPE_ANNOTATION, ("H100", "A100")),
    (nvidia.NOUSE_TYPE_ANNOTATION, ("H100", "A100")),
    (names.GPU_SCHEDULER_POLICY, ("binpack", "spread")),
    (names.NODE_SCHEDULER_POLICY, ("binpack", "spread")),
    (nvidia.MODE_ANNOTATION, ("hami-core", "mig")),
    (nvidia.NUMA_BIND_ANNOTATION, ("true",)),
)


@dataclass(frozen=True)
class Release:
    pick: int
    how: str  # succeeded, remove


@dataclass(frozen=True)
class Beat:
    node: int


Step = Schedule | Retry | Twin | Kin | Release | NodeChange | CardChange | QuotaChange | Tick | Beat


@st.composite
def steps(draw: st.DrawFn, spec: ClusterSpec) -> list[Step]:
    uuids = sorted(spec.cards())
    out: list[Step] = []
    for position in range(draw(st.integers(1, 18))):
        kind = draw(st.integers(0, 13))
        if kind <= 2 or not out:
            out.append(
                Schedule(
                    draw(pods(f"p{position}", uuids)),
                    draw(st.sampled_from(("confirm", "confirm", "rollback", "keep"))),
                )
            )
        elif kind <= 4:
            out.append(Retry(draw(st.integers(0, 20))))
        elif kind == 5:
            out.append(Twin(draw(st.integers(0, 20))))
        elif kind == 6:
            how = draw(st.sampled_from(("succeeded", "remove")))
            out.append(Release(draw(st.integers(0, 20)), how))
        elif kind == 7:
            out.append(NodeChange(draw(st.integers(0, 3)), draw(st.sampled_from(NODE_CHANGES))))
        elif kind == 8:
            out.append(
                CardChange(
                    draw(st.integers(0, 3)),
                    draw(st.integers(0, 5)),
                    draw(st.sampled_from(("fail", "heal", "cordon", "uncordon"))),
                )
            )
        elif kind == 9:
            out.append(
                QuotaChange(
                    draw(st.sampled_from(NAMESPACES)),
                    draw(st.sampled_from((None, 4096, 8192, 30000))),
                )
            )
        elif kind == 10:
            out.append(Tick(draw(st.sampled_from((10.0, 30.0, 61.0, 61.0)))))
        elif kind == 11:
            out.append(Beat(draw(st.integers(0, 3))))
        else:
            key, values = draw(st.sampled_from(_KIN_ANNOTATIONS))
            out.append(Kin(draw(st.integers(0, 20)), key, draw(st.sampled_from(values))))
    return out


@dataclass
class Driver:
    """Applies steps to one ClusterState, as the runtime would feed it."""

    spec: ClusterSpec
    state: ClusterState
    now: float = 0.0
    live: dict[str, tuple[Json, Decision]] = field(default_factory=dict)
    waiting: list[Json] = field(default_factory=list)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    cards: dict[str, list[Any]] = field(default_factory=dict)
    cordoned: dict[str, set[str]] = field(default_factory=dict)
    twins: int = 0

    @classmethod
    def build(cls, spec: ClusterSpec, use_index: bool) -> Driver:
        state = ClusterState(spec.config, inventory_timeout_s=TIMEOUT_S)
        state.use_index = use_index
        driver = cls(spec, state)
        for node in spec.nodes:
            driver.nodes[node.name] = node.node()
            driver.cards[node.name] = list(node.cards)
            driver.cordoned[node.name] = set()
            state.set_node(driver.nodes[node.name])
            state.set_inventory(node.name, node.cards, {}, heartbeat=0.0)
        for quota in spec.quotas:
            state.set_quota(quota)
        return driver

    def _node_name(self, index: int) -> str:
        return self.spec.nodes[index % len(self.spec.nodes)].name

    def _schedule(self, pod: Json, then: str) -> Decision:
        decision = self.state.schedule(pod, self.now)
        if decision.scheduled:
            self.live[decision.pod] = (pod, decision)
            if then == "confirm":
                self.state.confirm(decision.pod)
            elif then == "rollback":
                self.state.rollback(decision.pod)
                del self.live[decision.pod]
        else:
            self.waiting.append(pod)
        return decision

    def apply(self, step: Step) -> Decision | None:
        if isinstance(step, Schedule):
            return self._schedule(step.pod, step.then)
        if isinstance(step, Kin):
            if not self.waiting:
                return None
            self.twins += 1
            kin = copy.deepcopy(self.waiting[step.pick % len(self.waiting)])
            kin["metadata"]["name"] = f"{kin['metadata']['name']}-kin{self.twins}"
            kin["metadata"].setdefault("annotations", {})[step.key] = step.value
            return self._schedule(kin, "confirm")
        if isinstance(step, Retry | Twin):
            if not self.waiting:
                return None
            pod = self.waiting[step.pick % len(self.waiting)]
            if isinstance(step, Retry):
                self.waiting.remove(pod)
                return self._schedule(pod, "confirm")
            self.twins += 1
            twin = copy.deepcopy(pod)
            twin["metadata"]["name"] = f"{pod['metadata']['name']}-twin{self.twins}"
            return self._schedule(twin, "confirm")
        if isinstance(step, Release):
            if not self.live:
                return None
            key = list(self.live)[step.pick % len(self.live)]
            pod, decision = self.live.pop(key)
            if step.how == "succeeded":
                self.state.set_pod(bound(pod, decision, phase="Succeeded"))
            else:
                self.state.remove_pod(key)
            return None
        if isinstance(step, NodeChange):
            self._change_node(self._node_name(step.node), step.what)
        elif isinstance(step, CardChange):
            self._change_card(self._node_name(step.node), step.card, step.what)
        elif isinstance(step, QuotaChange):
            self.state.set_quota(resource_quota(step.namespace, gpumem=step.gpumem))
        elif isinstance(step, Tick):
            self.now += step.seconds
        elif isinstance(step, Beat):
            self.state.set_heartbeat(self._node_name(step.node), self.now)
        return None

    def _change_node(self, name: str, what: str) -> None:
        node = copy.deepcopy(self.nodes[name])
        change_node(node, what)
        self.nodes[name] = node
        self.state.set_node(node)

    def _change_card(self, name: str, index: int, what: str) -> None:
        cards = self.cards[name]
        change_card(cards, self.cordoned[name], index, what)
        heartbeat = self.state.cycle.judged.heartbeat(name)
        self.state.set_inventory(
            name, cards, {}, heartbeat=heartbeat, cordoned=sorted(self.cordoned[name])
        )


def _same_decision(decision: Decision | None) -> Any:
    return comparable(
        decision, lambda d: (d.to_json(), d.message(), d.device_counts(), d.main_reasons())
    )


@st.composite
def runs(draw: st.DrawFn) -> tuple[ClusterSpec, list[Step]]:
    spec = draw(clusters())
    return spec, draw(steps(spec))


@settings(max_examples=500, deadline=None)
@given(runs())
def test_verdicts_decide_as_a_fresh_search(run: tuple[ClusterSpec, list[Step]]) -> None:
    spec, plan = run
    indexed = Driver.build(spec, use_index=True)
    reference = Driver.build(spec, use_index=False)
    for position, step in enumerate(plan):
        fast = indexed.apply(step)
        slow = reference.apply(step)
        assert _same_decision(fast) == _same_decision(slow), f"step {position}: {step}"
        assert indexed.state.device_usage() == reference.state.device_usage()
