"""The cluster state does not depend on the order in which the cluster is observed.

At start-up (and after a watch reconnects) nodes, DeviceInventories, pods and quotas
arrive in any order. Whatever the order, the same running pods must book the same
devices and the same quota.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from builders import Json, bound
from hypothesis import given
from hypothesis import strategies as st
from strategies import ClusterSpec, Replay, Scenario, scenarios

from vgpu_operator.scheduling.cycle.cluster import ClusterState


@dataclass(frozen=True)
class Event:
    """One object observed: a Node, a node's inventory, a ResourceQuota or a Pod."""

    kind: str
    name: str
    payload: Any

    def apply(self, state: ClusterState) -> None:
        if self.kind == "node":
            state.set_node(self.payload)
        elif self.kind == "inventory":
            state.set_inventory(self.name, self.payload, {}, heartbeat=0.0)
        elif self.kind == "quota":
            state.set_quota(self.payload)
        else:
            state.set_pod(self.payload)


def _events(spec: ClusterSpec, pods: list[Json]) -> list[Event]:
    events: list[Event] = []
    for node in spec.nodes:
        events.append(Event("node", node.name, node.node()))
        events.append(Event("inventory", node.name, node.cards))
    events.extend(Event("quota", q["metadata"]["namespace"], q) for q in spec.quotas)
    events.extend(Event("pod", p["metadata"]["name"], p) for p in pods)
    return events


def observed(state: ClusterState) -> Any:
    usage = {row.uuid: row for row in state.device_usage()}
    return usage, state.quota_usage(), state.holding_pods()


@given(scenarios(), st.randoms(use_true_random=False))
def test_state_independent_of_event_order(scenario: Scenario, rng: Any) -> None:
    replay = Replay(scenario.cluster.build())
    for step in scenario.steps:
        replay.apply(step)
    running = [bound(pod, decision) for pod, decision in replay.live.values()]
    events = _events(scenario.cluster, running)
    canonical = ClusterState(scenario.cluster.config)
    for event in events:
        event.apply(canonical)
    shuffled = list(events)
    rng.shuffle(shuffled)
    state = ClusterState(scenario.cluster.config)
    for event in shuffled:
        event.apply(state)
    assert observed(state) == observed(canonical)
    assert observed(canonical)[0] == {row.uuid: row for row in replay.state.device_usage()}
