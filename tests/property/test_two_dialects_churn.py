"""Annotation pods and DRA claims on one cluster, with churn (issue 34).

With ``nvidia.com/gpu`` mapped to the shared DeviceClass (issue 47 item 7), the
annotation pods are served on either path: on a device-plugin node with HAMi's annotations,
or on a DRA node through their special claim (``either_plugin``), and the books must equal
a recount all the same.

Pods of both dialects arrive (each DRA pod with its own claim), are decided and bound as
the runtime binds them (annotations on the pod; allocation and reservedFor on the
claim), and end or are deleted (a DRA pod's claim with it); what-ifs run in between: a
victim trial (preemption's ``Trial``) and a defragmentation what-if (``WhatIf``: pods out, a
replacement placed). After every step the books equal a recount, books built afresh from
the objects as the API server holds them, and every node's usage kept pod by pod equals
a rebuild; a what-if leaves the live books as they were.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from builders import (
    Json,
    books_from,
    books_readings,
    bound,
    claim_pod,
    dra_cards,
    dra_node,
    make_node,
    make_pod,
    resource_quota,
    shared_claim,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from vgpu_operator import simulation_dra
from vgpu_operator.devices import dra, model
from vgpu_operator.scheduling.cycle import preempting
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.defrag.defrag_books import DefragBooks, WhatIf
from vgpu_operator.scheduling.dialects.annotation import placement

ANNOTATION_NODES = ("gpu-a", "gpu-b")
DRA_NODES = ("dra-a", "dra-b")
NAMESPACES = ("ns1", "ns2")


@dataclass(frozen=True)
class Arrive:
    dra: bool
    memory_mib: int
    namespace: str


@dataclass(frozen=True)
class End:
    pick: int
    deleted: bool


@dataclass(frozen=True)
class Trial:
    pick: int


@dataclass(frozen=True)
class Replan:
    pick: int
    memory_mib: int


Step = Arrive | End | Trial | Replan

steps = st.lists(
    st.one_of(
        st.builds(
            Arrive, st.booleans(), st.sampled_from((1024, 3072, 6144)), st.sampled_from(NAMESPACES)
        ),
        st.builds(End, st.integers(0, 50), st.booleans()),
        st.builds(Trial, st.integers(0, 50)),
        st.builds(Replan, st.integers(0, 50), st.sampled_from((1024, 4096))),
    ),
    max_size=25,
)


@dataclass
class World:
    """The API server's objects, and the engine fed from them."""

    nodes: list[Json] = field(default_factory=list)
    inventories: dict[str, list[model.DeviceInfo]] = field(default_factory=dict)
    slices: list[Json] = field(default_factory=list)
    claims: dict[str, Json] = field(default_factory=dict)
    pods: dict[str, Json] = field(default_factory=dict)
    #: ns1's quota: trials there release quota (on a copy of the ledger).
    quota: Json = field(default_factory=lambda: resource_quota("ns1", gpumem=12288))
    serial: int = 0
    #: ``nvidia.com/gpu`` mapped to the shared class: GPU pods on either path.
    mapped: bool = False
    #: Per pod, the special claim it got (deleted with the pod, as its owner's).
    special: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ANNOTATION_NODES:
            node, cards = make_node(name).gpu(f"GPU-{name}-0").gpu(f"GPU-{name}-1").obj()
            self.nodes.append(node)
            self.inventories[name] = cards
        for name in DRA_NODES:
            self.nodes.append(dra_node(name))
            self.slices.append(dict(dra.slice_wire(name, dra_cards(name, 8192, 4), 1, None)))
        self.state = self.fresh()
        self.state.preemption_enabled = True

    def fresh(self) -> ClusterState:
        """Books built from the objects as they are now."""
        state = books_from(
            self.nodes,
            self.inventories,
            self.slices,
            list(self.claims.values()),
            list(self.pods.values()),
            [self.quota],
        )
        if self.mapped:
            mapped = copy.deepcopy(dict(dra.device_classes()[0]))
            mapped["spec"]["extendedResourceName"] = "nvidia.com/gpu"
            state.set_device_class(mapped)
        return state

    def bound_keys(self) -> list[str]:
        return sorted(k for k, p in self.pods.items() if p["spec"].get("nodeName"))

    # --- steps --------------------------------------------------------------------------
    def arrive(self, step: Arrive) -> None:
        self.serial += 1
        name = f"p{self.serial}"
        key = f"{step.namespace}/{name}"
        if step.dra:
            claim = shared_claim(f"c{self.serial}", step.namespace, step.memory_mib)
            self.claims[f"{step.namespace}/c{self.serial}"] = claim
            self.state.set_claim(claim)
            pod = claim_pod(name, step.namespace, f"c{self.serial}")
        else:
            builder = make_pod(name, step.namespace).container(gpu=1, gpumem=step.memory_mib)
            pod = builder.obj()
            pod["metadata"]["uid"] = f"uid-{name}"
        decision = self.state.schedule(pod, 0.0)
        if not decision.scheduled:
            self.state.remove_pod(key)  # it gives up (deleted while pending)
            return
        for write in decision.claim_writes:  # the runtime's claim writes, then the Binding
            simulation_dra.write_claims(decision, self.state)
            self.claims[write.key] = copy.deepcopy(dict(self.state.claim_object(write.key) or {}))
            if write.create is not None:
                self.special[key] = write.key
        self.state.confirm(key)
        self.pods[key] = bound(pod, decision)
        self.state.set_pod(self.pods[key])

    def end(self, step: End) -> None:
        keys = self.bound_keys()
        if not keys:
            return
        key = keys[step.pick % len(keys)]
        pod = self.pods.pop(key)
        if step.deleted:
            self.state.remove_pod(key)
        else:
            pod["status"] = {"phase": "Succeeded"}
            self.state.set_pod(pod)
        owned = [self.special.pop(key)] if key in self.special else []
        for entry in pod["spec"].get("resourceClaims") or ():
            owned.append(f"{key.split('/')[0]}/{entry['resourceClaimName']}")
        for claim in owned:
            self.claims.pop(claim, None)
            self.state.remove_claim(claim)

    def trial(self, step: Trial) -> None:
        """Preemption's victim trial: a pod of the first namespace fitted on a node as if
        its pods had left (their quota too)."""
        keys = [
            k for k in self.bound_keys() if self.pods[k]["spec"]["nodeName"] in ANNOTATION_NODES
        ]
        if not keys:
            return
        victim = keys[step.pick % len(keys)]
        node = self.state.books.nodes[self.pods[victim]["spec"]["nodeName"]]
        pod = make_pod("trial", victim.split("/")[0]).container(gpu=1, gpumem=8192).obj()
        job = placement.Job.from_pod(pod, self.state.config, self.state.vendors, self.state.quota)
        annotations = self.state.cycle.annotations
        trial = preempting.Trial(self.state.books, annotations, node, job, 0.0)
        trial.outcome(frozenset({victim}))

    def replan(self, step: Replan) -> None:
        """A defragmentation what-if: a pod taken out, a replacement placed, all undone."""
        keys = self.bound_keys()
        books = DefragBooks(self.state)
        replacement = make_pod("mover", "ns1").container(gpu=1, gpumem=step.memory_mib).obj()
        with WhatIf(books) as what_if:
            if keys:
                what_if.take_out(keys[step.pick % len(keys)])
            what_if.place(replacement, 0.0)
            # The overlay's nodes, kept pod by pod, equal a rebuild from its pods.
            for node in books.view.nodes.values():
                books.view.refresh(node)
                assert node.cards == books.view.fresh_cards(node, frozenset())


@settings(max_examples=60, deadline=None)
@given(steps, st.booleans())
def test_books_equal_a_recount_and_what_ifs_leave_them_equal(
    plan: list[Step], mapped: bool
) -> None:
    world = World(mapped=mapped)
    for step in plan:
        before = books_readings(world.state)
        if isinstance(step, Arrive):
            world.arrive(step)
        elif isinstance(step, End):
            world.end(step)
        elif isinstance(step, Trial):
            world.trial(step)
            assert books_readings(world.state) == before, "a victim trial changed the books"
        else:
            world.replan(step)
            assert books_readings(world.state) == before, "a what-if changed the books"
        assert world.state.drifted_nodes() == []
        assert books_readings(world.state) == books_readings(world.fresh()), f"after {step}"
