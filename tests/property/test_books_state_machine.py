"""The books under arbitrary interleavings, checked against a plain recount after every step.

A hypothesis state machine plays the API server: it holds the Nodes, the inventories and
the pods (pending, reserved by a decision, bound), and drives one ``ClusterState``
through inventory changes, scheduling with confirm or rollback, binds, deletions and
operator restarts (a fresh engine fed the server's objects). After every step the
engine's card usage must equal a recount made here from the pods alone, and no card may
hold more than its inventory says: nothing over-committed, nothing lost.
"""

from __future__ import annotations

import copy
from collections import defaultdict

from builders import Json, make_node, make_pod
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from vgpu_operator import names
from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import codec, model, nvidia
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision

NODES = ("n0", "n1", "n2")
CARD_MEMORY = 16000
ALLOCATED = {"NVIDIA": nvidia.ALLOCATED_ANNOTATION}


def _cards(node: str, healthy: frozenset[int]) -> list[model.DeviceInfo]:
    return [
        model.DeviceInfo(f"GPU-{node}-{i}", i, 4, CARD_MEMORY, 100, "NVIDIA A100", 0, i in healthy)
        for i in range(2)
    ]


Usage = dict[str, tuple[int, int, int]]  # card -> (slots, memory MiB, cores)


class BooksMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.config = DeviceConfig()
        self.state = ClusterState(self.config)
        self.nodes: dict[str, Json] = {}
        self.inventories: dict[str, list[model.DeviceInfo]] = {}
        self.bound: dict[str, Json] = {}  # key -> pod as the API server holds it
        self.reserved: dict[str, Decision] = {}  # decided, not yet bound or rolled back
        self.pending_pods: dict[str, Json] = {}  # the reserved pods as created
        self.serial = 0

    # --- the API server's objects -------------------------------------------------------
    @rule(node=st.sampled_from(NODES), healthy=st.frozensets(st.integers(0, 1)))
    def inventory_changes(self, node: str, healthy: frozenset[int]) -> None:
        if node not in self.nodes:
            self.nodes[node] = make_node(node).obj()[0]
            self.state.set_node(self.nodes[node])
        self.inventories[node] = _cards(node, healthy)
        self.state.set_inventory(node, self.inventories[node], {}, heartbeat=0.0)

    @rule(node=st.sampled_from(NODES))
    def inventory_goes(self, node: str) -> None:
        self.inventories.pop(node, None)
        self.state.remove_inventory(node)

    @rule(
        memory=st.sampled_from((1000, 6000, 12000)),
        cores=st.sampled_from((0, 30, 60, 100)),
        gpus=st.integers(1, 2),
    )
    def schedule(self, memory: int, cores: int, gpus: int) -> None:
        self.serial += 1
        pod = make_pod(f"p{self.serial}").container(gpus, memory, cores).obj()
        decision = self.state.schedule(pod, now=0.0)
        if decision.scheduled:
            self.reserved[decision.pod] = decision
            self.pending_pods[decision.pod] = pod

    @precondition(lambda self: bool(self.reserved))
    @rule(data=st.data(), bind=st.booleans())
    def settle(self, data: st.DataObject, bind: bool) -> None:
        key = data.draw(st.sampled_from(sorted(self.reserved)))
        decision = self.reserved.pop(key)
        pod = self.pending_pods.pop(key)
        if not bind:
            self.state.rollback(key)
            return
        self.state.confirm(key)
        bound = copy.deepcopy(pod)
        bound["metadata"]["annotations"] = {
            **bound["metadata"].get("annotations", {}),
            **decision.annotations,
        }
        bound["spec"]["nodeName"] = decision.node
        bound["spec"]["schedulerName"] = names.SCHEDULER_NAME  # the webhook's routing
        bound["status"] = {"phase": "Running"}
        self.bound[key] = bound
        self.state.set_pod(bound)

    @precondition(lambda self: bool(self.bound))
    @rule(data=st.data(), how=st.sampled_from(("deleted", "Succeeded", "Failed")))
    def pod_ends(self, data: st.DataObject, how: str) -> None:
        key = data.draw(st.sampled_from(sorted(self.bound)))
        pod = self.bound.pop(key)
        if how == "deleted":
            self.state.remove_pod(key)
        else:
            self.state.set_pod({**pod, "status": {"phase": how}})

    @rule()
    def operator_restarts(self) -> None:
        """A new engine learns everything from the server; reservations die with the old."""
        self.state = ClusterState(self.config)
        for node in self.nodes.values():
            self.state.set_node(node)
        for name, cards in self.inventories.items():
            self.state.set_inventory(name, cards, {}, heartbeat=0.0)
        for pod in self.bound.values():
            self.state.set_pod(pod)
        self.reserved.clear()
        self.pending_pods.clear()

    # --- the recount ---------------------------------------------------------------------
    def recount(self) -> Usage:
        """Per card, what the bound and reserved pods hold, from their allocations alone."""
        totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        allocations = [
            codec.decode_pod_devices(pod["metadata"]["annotations"], ALLOCATED)
            for pod in self.bound.values()
        ]
        allocations += [dict(decision.devices) for decision in self.reserved.values()]
        for devices in allocations:
            for container in devices.get("NVIDIA", ()):
                for device in container:
                    card = totals[device.uuid]
                    card[0] += 1
                    card[1] += device.memory_mib
                    card[2] += device.cores
        return {uuid: (s, m, c) for uuid, (s, m, c) in totals.items()}

    @invariant()
    def books_equal_the_recount_and_nothing_is_overcommitted(self) -> None:
        expected = self.recount()
        registered = {c.id: c for cards in self.inventories.values() for c in cards}
        seen: set[str] = set()
        for row in self.state.device_usage():
            seen.add(row.uuid)
            slots, memory, cores = expected.get(row.uuid, (0, 0, 0))
            assert (row.used_slots, row.used_memory_mib, row.used_cores) == (
                slots,
                memory,
                cores,
            ), f"{row.uuid}: books say {row}, recount says {(slots, memory, cores)}"
            card = registered[row.uuid]
            assert slots <= card.count, f"{row.uuid}: {slots} tasks on {card.count} slots"
            assert memory <= card.memory_mib, f"{row.uuid}: {memory} MiB of {card.memory_mib}"
            assert cores <= card.cores, f"{row.uuid}: {cores} cores of {card.cores}"
        # Every card a pod holds is on the books while its node reports it.
        assert {u for u in expected if u in registered} <= seen
        # What the books keep up to date pod by pod is what a rebuild would give.
        assert self.state.drifted_nodes() == []


TestBooks = BooksMachine.TestCase
TestBooks.settings = settings(stateful_step_count=30, deadline=None)
