"""Gangs on both dialects with churn and member failures (issue 36).

Random gangs (2-16 members, fractional and whole-GPU, annotation pods and DRA claims, some
held to one island) arrive and compete for a small cluster; a member's Binding may fail
(its reservation released, the group retried with the bound members counted), bound
members fail and come back pending (placed one by one), whole gangs end, and every waiting
gang is retried. After every step:

- no gang is left partly bound by a decision: a gang with no member bound goes to none or
  to at least ``minCount`` bound;
- no waiting gang holds a reservation, so none blocks another: a gang that waits also
  waits on books recounted from the API objects alone (no reservation anywhere), i.e. it
  does not fit alone in what is free;
- the books equal a recount from the objects, and every node's usage equals a rebuild.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
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
    shared_claim,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vgpu_operator import simulation_dra
from vgpu_operator.devices import dra, model
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision
from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.scheduling.gangs.gangs import GroupSpec

ISLAND = "vgpu.io/island"
ANNOTATION_NODES = (("gpu-a", "x"), ("gpu-b", "x"), ("gpu-c", "y"), ("gpu-d", "y"))
DRA_NODES = (("dra-a", "x"), ("dra-b", "y"))
NAMESPACE = "ml"
#: Whole-GPU members ask for a card's memory and cores; the others share.
SHAPES = ((2048, 20), (4096, 30), (8192, 50), (16384, 100))

GANGS_TRIED = {"count": 0}


@dataclass(frozen=True)
class Arrive:
    size: int
    min_count: int
    shape: int
    dra: bool
    topology: bool
    fail_binding: int  # the member whose first Binding fails (>= size: none)


@dataclass(frozen=True)
class MemberFails:
    pick: int


@dataclass(frozen=True)
class End:
    pick: int


@dataclass(frozen=True)
class Retry:
    pass


Step = Arrive | MemberFails | End | Retry


@st.composite
def arrivals(draw: st.DrawFn) -> Arrive:
    size = draw(st.integers(2, 16))
    return Arrive(
        size,
        draw(st.integers(1, size)),
        draw(st.integers(0, len(SHAPES) - 1)),
        draw(st.booleans()),
        draw(st.booleans()),
        draw(st.integers(0, 2 * size)),
    )


steps = st.lists(
    st.one_of(
        arrivals(),
        arrivals(),
        st.builds(MemberFails, st.integers(0, 200)),
        st.builds(End, st.integers(0, 50)),
        st.just(Retry()),
    ),
    min_size=8,
    max_size=20,
)


@dataclass
class Gang:
    spec: GroupSpec
    pods: dict[str, Json]  # every member, pending or bound
    fail_binding: str | None = None


@dataclass
class World:
    """The API server's objects, and the engine fed from them."""

    nodes: list[Json] = field(default_factory=list)
    inventories: dict[str, list[model.DeviceInfo]] = field(default_factory=dict)
    slices: list[Json] = field(default_factory=list)
    claims: dict[str, Json] = field(default_factory=dict)
    gangs: dict[str, Gang] = field(default_factory=dict)
    serial: int = 0

    def __post_init__(self) -> None:
        for name, island in ANNOTATION_NODES:
            builder = make_node(name).label(ISLAND, island)
            for i in range(2):
                builder.gpu(f"GPU-{name}-{i}", memory_mib=16384)
            node, cards = builder.obj()
            self.nodes.append(node)
            self.inventories[name] = cards
        for name, island in DRA_NODES:
            self.nodes.append(dra_node(name, {ISLAND: island}))
            self.slices.append(dict(dra.slice_wire(name, dra_cards(name, 16384, 8), 1, None)))
        self.state = self.fresh()

    def fresh(self) -> ClusterState:
        """Books built from the objects as they are now (no reservation in them)."""
        pods = [pod for gang in self.gangs.values() for pod in gang.pods.values()]
        return books_from(
            self.nodes, self.inventories, self.slices, list(self.claims.values()), pods
        )

    # --- the objects ---------------------------------------------------------------------
    def member(self, group: str, step: Arrive) -> Json:
        self.serial += 1
        name = f"p{self.serial}"
        memory, cores = SHAPES[step.shape]
        if step.dra:
            claim_name = f"c{self.serial}"
            claim = shared_claim(claim_name, NAMESPACE, memory, uid=f"uid-c-{name}")
            self.claims[f"{NAMESPACE}/{claim_name}"] = claim
            self.state.set_claim(claim)
            pod = claim_pod(name, NAMESPACE, claim_name)
        else:
            pod = make_pod(name, NAMESPACE).container(gpu=1, gpumem=memory, cores=cores).obj()
            pod["metadata"]["uid"] = f"uid-{name}"
        pod["spec"]["schedulingGroup"] = {"podGroupName": group}
        return pod

    def pending(self, gang: Gang) -> list[Json]:
        return [p for p in gang.pods.values() if not p["spec"].get("nodeName")]

    def bound_nodes(self, gang: Gang) -> dict[str, str]:
        return {
            f"{NAMESPACE}/{k}": p["spec"]["nodeName"]
            for k, p in gang.pods.items()
            if p["spec"].get("nodeName")
        }

    # --- the runtime's part ----------------------------------------------------------------
    def decide(self, name: str) -> None:
        """One attempt at the gang, its Bindings written; a failed one released and the
        group retried at once (the room is still free)."""
        gang = self.gangs[name]
        before = len(self.bound_nodes(gang))
        for _ in range(3):
            pending = self.pending(gang)
            if not pending:
                break
            out = gangs.decide_group(
                self.state, gang.spec, gang.spec.key, pending, self.bound_nodes(gang), 0.0
            )
            failed = [d for d in out.placed if self.bind(gang, d) is False]
            if failed:
                gangs.release(self.state, [d.pod for d in failed])
                continue
            break
        after = len(self.bound_nodes(gang))
        if before == 0 and gang.spec.gang:
            assert after == 0 or after >= gang.spec.min_count, f"{name}: {after} bound"

    def bind(self, gang: Gang, decision: Decision) -> bool:
        name = decision.pod.split("/", 1)[1]
        if gang.fail_binding == name:
            gang.fail_binding = None
            return False
        pod = gang.pods[name]
        if decision.claim_writes:
            simulation_dra.write_claims(decision, self.state)
            for write in decision.claim_writes:
                claim = self.state.claim_object(write.key)
                self.claims[write.key] = copy.deepcopy(dict(claim or {}))
        self.state.confirm(decision.pod)
        gang.pods[name] = bound(pod, decision)
        self.state.set_pod(gang.pods[name])
        return True

    def remove(self, gang: Gang, name: str) -> None:
        pod = gang.pods.pop(name)
        self.state.remove_pod(f"{NAMESPACE}/{name}")
        for entry in pod["spec"].get("resourceClaims") or ():
            claim = f"{NAMESPACE}/{entry['resourceClaimName']}"
            self.claims.pop(claim, None)
            self.state.remove_claim(claim)

    # --- steps ----------------------------------------------------------------------------
    def arrive(self, step: Arrive) -> None:
        GANGS_TRIED["count"] += 1
        group = f"g{self.serial}"
        spec = GroupSpec(
            f"{NAMESPACE}/{group}", True, step.min_count, ISLAND if step.topology else None
        )
        members = [self.member(group, step) for _ in range(step.size)]
        gang = Gang(spec, {p["metadata"]["name"]: p for p in members})
        if step.fail_binding < step.size:
            gang.fail_binding = members[step.fail_binding]["metadata"]["name"]
        self.gangs[group] = gang
        self.decide(group)

    def member_fails(self, step: MemberFails) -> None:
        """A bound member ends; its controller makes it again, pending."""
        bound_members = [(g, n) for g, gang in self.gangs.items() for n in self.bound_nodes(gang)]
        if not bound_members:
            return
        group, key = bound_members[step.pick % len(bound_members)]
        gang = self.gangs[group]
        name = key.split("/", 1)[1]
        shape = _shape_of(gang.pods[name])
        self.remove(gang, name)
        again = self.member(group, shape)
        gang.pods[again["metadata"]["name"]] = again

    def end(self, step: End) -> None:
        if not self.gangs:
            return
        group = sorted(self.gangs)[step.pick % len(self.gangs)]
        gang = self.gangs.pop(group)
        for name in list(gang.pods):
            self.remove(gang, name)
        self.gangs.pop(group, None)

    def retry(self) -> None:
        for group in sorted(self.gangs):
            self.decide(group)

    # --- checks ---------------------------------------------------------------------------
    def check(self, step: Step) -> None:
        assert self.state.drifted_nodes() == []
        assert books_readings(self.state) == books_readings(self.fresh()), f"after {step}"
        holding = set(self.state.holding_pods()) | set(self.state.claim_holds().values())
        for group, gang in self.gangs.items():
            waiting = {f"{NAMESPACE}/{p['metadata']['name']}" for p in self.pending(gang)}
            assert not waiting & holding, f"waiting gang {group} holds a reservation"


def _shape_of(pod: Json) -> Arrive:
    """An Arrive that makes a member of the same shape (its dialect and request)."""
    if pod["spec"].get("resourceClaims"):
        return Arrive(1, 1, 0, True, False, 1)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    memory = int(limits["nvidia.com/gpumem"])
    return Arrive(1, 1, [m for m, _ in SHAPES].index(memory), False, False, 1)


@pytest.fixture(scope="module", autouse=True)
def _enough_gangs() -> Iterator[None]:
    """The issue asks for at least 1,000 random gangs; count those the examples made."""
    GANGS_TRIED["count"] = 0
    yield
    assert GANGS_TRIED["count"] >= 1000, GANGS_TRIED


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(steps)
def test_gangs_all_or_nothing_with_churn(plan: list[Step]) -> None:
    world = World()
    for step in plan:
        if isinstance(step, Arrive):
            world.arrive(step)
        elif isinstance(step, MemberFails):
            world.member_fails(step)
        elif isinstance(step, End):
            world.end(step)
        else:
            world.retry()
        world.check(step)
    # No deadlock: every gang still waiting does not fit alone in the room left free,
    # books recounted from the objects (no reservation anywhere) agree.
    for group in sorted(world.gangs):
        gang = world.gangs[group]
        pending = world.pending(gang)
        if not pending:
            continue
        fresh = world.fresh()
        alone = gangs.decide_group(
            fresh, gang.spec, gang.spec.key, pending, world.bound_nodes(gang), 0.0
        )
        live = gangs.decide_group(
            world.state, gang.spec, gang.spec.key, pending, world.bound_nodes(gang), 0.0
        )
        assert bool(alone.placed) == bool(live.placed), group
        gangs.release(world.state, [d.pod for d in live.placed])
