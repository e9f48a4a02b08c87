"""Hypothesis strategies: small clusters, GPU pods, and sequences of scheduling steps.

Domains are deliberately tiny (1-4 nodes, 1-6 cards, a handful of models and sizes) so
that full cards, filter collisions and quota limits come up in most examples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from builders import A100_40, H100, T4, Json, bound, make_node, make_pod, resource_quota
from hypothesis import strategies as st

from vgpu_operator import names
from vgpu_operator.config import DeviceConfig, load_config
from vgpu_operator.devices import model, nvidia
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision
from vgpu_operator.scheduling.status import Diagnosis

A10 = "NVIDIA A10"

#: Card models and their memory in MiB. "A10" is a substring of "A100" on purpose.
MODELS: tuple[tuple[str, int], ...] = ((A100_40, 40960), (H100, 81920), (T4, 15360), (A10, 24576))

NAMESPACES = ("team-a", "team-b")

#: Seed-form MIG geometries of the A100 40GB; every geometry fits the card's 40960 MiB
#: and 100 cores, so bookings of MIG instances never exceed what the card registers.
MIG_CONFIG: Json = {
    "nvidia": {
        "knownMigGeometries": [
            {
                "models": ["A100-SXM4-40GB"],
                "allowedGeometries": [
                    [{"name": "1g.5gb", "core": 14, "memory": 5120, "count": 7}],
                    [
                        {"name": "1g.5gb", "core": 14, "memory": 5120, "count": 1},
                        {"name": "2g.10gb", "core": 28, "memory": 10240, "count": 3},
                    ],
                    [{"name": "3g.20gb", "core": 42, "memory": 20480, "count": 2}],
                    [{"name": "7g.40gb", "core": 100, "memory": 40960, "count": 1}],
                ],
            }
        ]
    }
}
#: Instances of the largest MIG geometry: a MIG card registers this many slots.
MIG_SLOTS = 7


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cards: tuple[model.DeviceInfo, ...]
    unschedulable: bool = False
    #: The node configuration layer: policy and card-restriction annotations.
    annotations: tuple[tuple[str, str], ...] = ()

    def node(self) -> Json:
        """The Node object: a slot per card, 110 pods, the annotations."""
        builder = make_node(self.name).allocatable(gpus=str(len(self.cards)), pods="110")
        if self.unschedulable:
            builder.unschedulable()
        for key, value in self.annotations:
            builder.annotate(key, value)
        return builder.obj()[0]


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster to build, with the namespace quotas that apply."""

    nodes: tuple[NodeSpec, ...]
    quotas: tuple[Json, ...] = ()
    config: DeviceConfig = field(default_factory=lambda: load_config(MIG_CONFIG))

    def build(self, use_index: bool = True) -> ClusterState:
        state = ClusterState(self.config)
        state.use_index = use_index
        for spec in self.nodes:
            state.set_node(spec.node())
            state.set_inventory(spec.name, spec.cards, {}, heartbeat=0.0)
        for quota in self.quotas:
            state.set_quota(quota)
        return state

    def cards(self) -> dict[str, model.DeviceInfo]:
        return {c.id: c for n in self.nodes for c in n.cards}


@st.composite
def cards(draw: st.DrawFn, node: str, mig: bool | None = None) -> tuple[model.DeviceInfo, ...]:
    """1-6 cards of a few models; some unhealthy, on NUMA 0/1; some A100s in MIG mode."""
    out: list[model.DeviceInfo] = []
    for index in range(draw(st.integers(1, 6))):
        card_type, memory_mib = draw(st.sampled_from(MODELS))
        in_mig = card_type == A100_40 and (draw(st.integers(0, 4)) == 0 if mig is None else mig)
        out.append(
            model.DeviceInfo(
                id=f"GPU-{node}{index}",
                index=index,
                count=MIG_SLOTS if in_mig else draw(st.sampled_from((1, 2, 4, 10))),
                memory_mib=memory_mib,
                cores=100,
                type=card_type,
                numa=draw(st.integers(0, 1)),
                health=draw(st.integers(0, 7)) != 0,
                mode=model.MODE_MIG if in_mig else model.MODE_HAMI_CORE,
            )
        )
    return tuple(out)


@st.composite
def node_layers(draw: st.DrawFn) -> tuple[tuple[str, str], ...]:
    """Mostly none; else node/GPU policies (now and then unreadable) and type limits."""
    if draw(st.integers(0, 2)) == 0:
        return ()
    choices = (
        (names.NODE_SCHEDULER_POLICY, ("binpack", "spread", "packed")),
        (names.GPU_SCHEDULER_POLICY, ("binpack", "spread", "topology-aware", "fastest")),
        (nvidia.USE_TYPE_ANNOTATION, ("A100", "H100,T4")),
        (nvidia.NOUSE_TYPE_ANNOTATION, ("T4",)),
    )
    out = []
    for key, values in choices:
        value = draw(st.sampled_from((None, None, *values)))
        if value is not None:
            out.append((key, value))
    return tuple(out)


@st.composite
def clusters(draw: st.DrawFn, mig: bool | None = None) -> ClusterSpec:
    """1-4 nodes; now and then a cordoned node and namespace quotas."""
    nodes = tuple(
        NodeSpec(
            name,
            draw(cards(name, mig)),
            unschedulable=draw(st.integers(0, 9)) == 0,
            annotations=draw(node_layers()),
        )
        for name in ("a", "b", "c", "d")[: draw(st.integers(1, 4))]
    )
    quotas: list[Json] = []
    for namespace in NAMESPACES:
        gpumem = draw(st.sampled_from((None, None, 8192, 30000)))
        gpucores = draw(st.sampled_from((None, None, 100, 300)))
        if gpumem is not None or gpucores is not None:
            quotas.append(resource_quota(namespace, gpumem=gpumem, gpucores=gpucores))
    return ClusterSpec(nodes, tuple(quotas))


#: (gpu, gpumem, percentage, cores) of one container; None leaves the resource out.
_CONTAINER = st.tuples(
    st.sampled_from((None, 1, 1, 1, 2, 3)),
    st.sampled_from((None, None, 1024, 4096, 8192, 20000)),
    st.sampled_from((None, None, None, 25, 50, 100)),
    st.sampled_from((None, None, 0, 10, 30, 50, 100)),
)
_THEN: tuple[Literal["confirm", "rollback", "keep"], ...] = (
    "confirm",
    "confirm",
    "rollback",
    "keep",
)
_HOW: tuple[Literal["succeeded", "remove"], ...] = ("succeeded", "remove")

_TYPES = ("A100", "T4", "H100", "A10", "A100,T4")
_GPU_POLICIES = ("binpack", "spread", "mutex", "topology-aware", "numa", "binpack,numa")


@st.composite
def pods(draw: st.DrawFn, name: str, uuids: Sequence[str]) -> Json:
    """A GPU pod: 1-2 containers (count 1-3), sometimes an init container, filters, policies."""
    builder = make_pod(name, draw(st.sampled_from(NAMESPACES)))
    if draw(st.integers(0, 5)) == 0:
        gpu, gpumem, percentage, cores = draw(_CONTAINER)
        builder.init_container(gpu, gpumem, cores, percentage)
    for _ in range(draw(st.integers(1, 2))):
        gpu, gpumem, percentage, cores = draw(_CONTAINER)
        builder.container(gpu, gpumem, cores, percentage)
    optional: list[tuple[str, st.SearchStrategy[str]]] = [
        (nvidia.USE_TYPE_ANNOTATION, st.sampled_from(_TYPES)),
        (nvidia.NOUSE_TYPE_ANNOTATION, st.sampled_from(_TYPES)),
        (nvidia.USE_UUID_ANNOTATION, _uuid_list(uuids)),
        (nvidia.NOUSE_UUID_ANNOTATION, _uuid_list(uuids)),
        (names.GPU_SCHEDULER_POLICY, st.sampled_from(_GPU_POLICIES)),
        (names.NODE_SCHEDULER_POLICY, st.sampled_from(("binpack", "spread"))),
        (nvidia.NUMA_BIND_ANNOTATION, st.just("true")),
        (nvidia.MODE_ANNOTATION, st.sampled_from(("hami-core", "mig"))),
    ]
    for key, values in optional:
        if draw(st.integers(0, 6)) == 0:
            builder.annotate(key, draw(values))
    return builder.obj()


def _uuid_list(uuids: Sequence[str]) -> st.SearchStrategy[str]:
    choices = [*uuids, "GPU-none"]
    return st.lists(st.sampled_from(choices), min_size=1, max_size=2).map(",".join)


@dataclass(frozen=True)
class Schedule:
    """Schedule a pod, then confirm the binding, roll it back, or leave it reserved."""

    pod: Json
    then: Literal["confirm", "rollback", "keep"]


@dataclass(frozen=True)
class Release:
    """A placed pod goes away: its phase becomes Succeeded, or it is deleted."""

    pick: int
    how: Literal["succeeded", "remove"]


@dataclass(frozen=True)
class Observe:
    """A placed pod is seen bound (the informer's view replaces the reservation)."""

    pick: int


Step = Schedule | Release | Observe


@dataclass(frozen=True)
class Scenario:
    cluster: ClusterSpec
    steps: tuple[Step, ...]


@st.composite
def scenarios(draw: st.DrawFn, mig: bool | None = None, max_steps: int = 14) -> Scenario:
    """A cluster and a sequence of steps; at least half of the steps schedule a pod."""
    spec = draw(clusters(mig))
    uuids = sorted(spec.cards())
    steps: list[Step] = []
    for position in range(draw(st.integers(1, max_steps))):
        kind = draw(st.integers(0, 5))
        if kind <= 2 or not steps:
            then = draw(st.sampled_from(_THEN))
            steps.append(Schedule(draw(pods(f"p{position}", uuids)), then))
        elif kind <= 4:
            steps.append(Release(draw(st.integers(0, 20)), draw(st.sampled_from(_HOW))))
        else:
            steps.append(Observe(draw(st.integers(0, 20))))
    return Scenario(spec, tuple(steps))


def annotations_of(pod: Json) -> dict[str, Any]:
    return dict((pod.get("metadata") or {}).get("annotations") or {})


@dataclass
class Replay:
    """Applies steps to a ClusterState and remembers which pods hold devices.

    ``live`` holds the pods placed and not released (reserved or confirmed), with the
    pod as submitted and the decision that placed it, in placement order.
    """

    state: ClusterState
    live: dict[str, tuple[Json, Decision]] = field(default_factory=dict)

    def apply(self, step: Step, now: float = 0.0) -> Decision | None:
        """Run one step; returns the decision of a Schedule step, None otherwise."""
        if isinstance(step, Schedule):
            decision = self.state.schedule(step.pod, now)
            if decision.scheduled:
                self.live[decision.pod] = (step.pod, decision)
                if step.then == "confirm":
                    self.state.confirm(decision.pod)
                elif step.then == "rollback":
                    self.state.rollback(decision.pod)
                    del self.live[decision.pod]
            return decision
        if not self.live:
            return None
        key = list(self.live)[step.pick % len(self.live)]
        pod, decision = self.live[key]
        if isinstance(step, Observe):
            self.state.set_pod(bound(pod, decision))
        elif step.how == "succeeded":
            self.state.set_pod(bound(pod, decision, phase="Succeeded"))
            del self.live[key]
        else:
            self.state.remove_pod(key)
            del self.live[key]
        return None


# --- changes to a cluster, as the stateful property tests apply them ---------------------


#: What a ``NodeChange`` does to a node (``change_node``).
NODE_CHANGES: tuple[str, ...] = (
    "cordon",
    "uncordon",
    "taint",
    "untaint",
    "label",
    "unlabel",
    "restrict",
    "unrestrict",
)


@dataclass(frozen=True)
class NodeChange:
    node: int
    what: str  # one of NODE_CHANGES


def change_node(node: Json, what: str) -> None:
    """Apply one of ``NODE_CHANGES`` to a Node object, in place."""
    meta, spec = node["metadata"], node.setdefault("spec", {})
    labels = meta.setdefault("labels", {})
    annotations = meta.setdefault("annotations", {})
    if what in ("cordon", "uncordon"):
        spec["unschedulable"] = what == "cordon"
    elif what == "taint":
        spec["taints"] = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
    elif what == "untaint":
        spec["taints"] = []
    elif what == "label":
        labels["zone"] = "b"
    elif what == "unlabel":
        labels.pop("zone", None)
    elif what == "restrict":
        annotations[nvidia.USE_TYPE_ANNOTATION] = "H100"
    else:
        annotations.pop(nvidia.USE_TYPE_ANNOTATION, None)


@dataclass(frozen=True)
class CardChange:
    node: int
    card: int
    what: str  # fail, heal, cordon, uncordon


def change_card(cards: list[model.DeviceInfo], cordoned: set[str], index: int, what: str) -> None:
    """Apply a ``CardChange`` to a node's cards (health) or its cordoned set, in place."""
    at = index % len(cards)
    card = cards[at]
    if what in ("fail", "heal"):
        cards[at] = dataclasses.replace(card, health=what == "heal")
    elif what == "cordon":
        cordoned.add(card.id)
    else:
        cordoned.discard(card.id)


@dataclass(frozen=True)
class QuotaChange:
    namespace: str
    gpumem: int | None


@dataclass(frozen=True)
class Tick:
    seconds: float


#: A namespace no quota limits (the strategies' quotas are for team-a and team-b).
FREE_NAMESPACE = "team-free"

_SIMPLE_GPU_POLICIES = ("binpack", "spread", "mutex", "topology-aware", "binpack,mutex")


@st.composite
def simple_pods(draw: st.DrawFn, name: str, uuids: list[str]) -> dict[str, object]:
    """A pod judged by card classes (``card_classes.Simple``): one device request, no
    NUMA binding, in a namespace no quota limits."""
    builder = make_pod(name, FREE_NAMESPACE)
    gpu = draw(st.integers(1, 4))
    gpumem = draw(st.sampled_from((None, 1024, 4096, 8192, 20000, 1 << 20)))
    percentage = None if gpumem is not None else draw(st.sampled_from((None, 25, 50, 100)))
    cores = draw(st.sampled_from((None, 0, 10, 30, 50, 100, 100)))
    as_init = draw(st.integers(0, 4)) == 0
    if as_init:
        builder.init_container(gpu, gpumem, cores, percentage)
        builder.container(None, None, None, None)
    else:
        builder.container(gpu, gpumem, cores, percentage)
    choices = [
        (nvidia.USE_TYPE_ANNOTATION, st.sampled_from(("A100", "T4", "H100", "A10", "A100,T4"))),
        (nvidia.NOUSE_TYPE_ANNOTATION, st.sampled_from(("A100", "T4"))),
        (
            nvidia.USE_UUID_ANNOTATION,
            st.lists(st.sampled_from([*uuids, "GPU-none"]), min_size=1, max_size=3).map(",".join),
        ),
        (
            nvidia.NOUSE_UUID_ANNOTATION,
            st.lists(st.sampled_from([*uuids, "GPU-none"]), min_size=1, max_size=2).map(",".join),
        ),
        (names.GPU_SCHEDULER_POLICY, st.sampled_from(_SIMPLE_GPU_POLICIES)),
        (nvidia.MODE_ANNOTATION, st.sampled_from(("hami-core", "mig"))),
    ]
    for key, values in choices:
        # The GPU policy often: mutex and the exclusive-core check read what a card holds.
        if draw(st.integers(0, 1 if key == names.GPU_SCHEDULER_POLICY else 4)) == 0:
            builder.annotate(key, draw(values))
    return builder.obj()


def comparable(decision: Decision | None, diagnosis_parts: Callable[[Diagnosis], Any]) -> Any:
    """What two engines must agree on in a decision; of its diagnosis, ``diagnosis_parts``."""
    if decision is None:
        return None
    diagnosis = decision.diagnosis
    return (
        decision.pod,
        decision.scheduled,
        decision.node,
        dict(decision.devices),
        dict(decision.annotations),
        None if diagnosis is None else diagnosis_parts(diagnosis),
        decision.rejected,
    )
