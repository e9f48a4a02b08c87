"""Defragmentation's vocabulary and what it reads of a cluster (``defrag``): plans,
moves and their options, which pods may move (``Candidates``, ``mover_of``), a pod's
replacement as its controller creates it again, and how much room each node holds for
a waiting pod pooled over its cards (``fragmentation``)."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from vgpu_operator import names
from vgpu_operator.devices import model
from vgpu_operator.scheduling.books import allocation_trust
from vgpu_operator.scheduling.books.entries import PodEntry
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.defrag.defrag_books import DefragBooks
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.wire import Pod

#: Appended to a moved pod's name for its replacement in a what-if (a character no real
#: pod name may hold, so it can never meet a real pod in the books).
REPLACEMENT_SUFFIX: Final = "~replacement"


class Replacement(enum.StrEnum):
    """When the moved pod's replacement is created, so when it must fit."""

    #: At the eviction, while the evicted pod terminates and still holds its shares
    #: (ReplicaSet, ReplicationController, Job with its default replacement policy).
    WHILE_TERMINATING = "while-terminating"
    #: Once the evicted pod is gone (StatefulSet: the replacement keeps its name; a bare
    #: pod, where allowed, is gone for good unless someone creates it again).
    AFTER_GONE = "after-gone"


#: Controller kinds (API group, kind) whose pods are recreated elsewhere after an eviction.
#: DaemonSet pods are not (they belong to their node), nor static pods (owned by a Node).
RECREATING_OWNERS: Final[Mapping[tuple[str, str], Replacement]] = {
    ("apps", "ReplicaSet"): Replacement.WHILE_TERMINATING,
    ("", "ReplicationController"): Replacement.WHILE_TERMINATING,
    ("batch", "Job"): Replacement.WHILE_TERMINATING,
    ("apps", "StatefulSet"): Replacement.AFTER_GONE,
}


@dataclass(frozen=True, slots=True)
class PlanOptions:
    max_evictions: int = 3
    #: Move pods no controller recreates (their owner must create them again).
    allow_bare_pods: bool = False
    #: More controller kinds, by ``kind`` or ``group/kind``, whose pods may move (their
    #: replacement is taken to be created at the eviction).
    owner_kinds: frozenset[str] = frozenset()
    #: Up to this many nodes the search is exact; beyond, the heuristic.
    exact_node_limit: int = 8
    #: The heuristic stops after this many target nodes with a plan of the same size...
    heuristic_plans: int = 8
    #: ...or after trying this many target nodes (where some set of pods frees enough)...
    heuristic_nodes: int = 64
    #: ...or after looking at this many, tried or not (at 1,000 nodes, a size of plan that
    #: exists nowhere would otherwise read every node's pods).
    heuristic_looks: int = 256


@dataclass(frozen=True, slots=True)
class Owner:
    kind: str
    name: str
    uid: str
    api_version: str = ""


@dataclass(frozen=True, slots=True)
class Mover:
    """A running pod that a plan may move."""

    key: PodKey
    uid: str
    node: str
    priority: int
    labels: Mapping[str, str]
    memory_mib: int
    cards: tuple[str, ...]
    owner: Owner | None
    replacement: Replacement
    pod: Pod = field(repr=False, compare=False)
    #: A PodGroup member's topology domain (node label, value): its replacement must land
    #: on a node of the same value, or the plan is not made (``stays_in_domain``).
    domain: tuple[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Move:
    """Evict ``pod`` from ``from_cards`` of ``from_node``; its replacement fits at
    ``to_node`` (``to_cards``) as the engine decides it."""

    pod: PodKey
    uid: str
    owner: Owner | None
    from_node: str
    from_cards: tuple[str, ...]
    to_node: str
    to_cards: tuple[str, ...]
    memory_mib: int
    replacement: Replacement

    def to_json(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "owner": None if self.owner is None else f"{self.owner.kind}/{self.owner.name}",
            "from": {"node": self.from_node, "cards": list(self.from_cards)},
            "to": {"node": self.to_node, "cards": list(self.to_cards)},
            "memoryMiB": self.memory_mib,
            "replacement": self.replacement.value,
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """The moves, in order, after which ``pod`` fits on ``node`` (on ``cards``, one tuple
    per container)."""

    pod: PodKey
    priority: int
    node: str
    cards: tuple[tuple[str, ...], ...]
    moves: tuple[Move, ...]
    method: str  # "exact" or "heuristic"

    @property
    def evictions(self) -> int:
        return len(self.moves)

    @property
    def memory_mib(self) -> int:
        return sum(m.memory_mib for m in self.moves)

    @property
    def moved(self) -> frozenset[PodKey]:
        return frozenset(m.pod for m in self.moves)

    def to_json(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "node": self.node,
            "cards": [list(c) for c in self.cards],
            "evictions": self.evictions,
            "memoryMovedMiB": self.memory_mib,
            "method": self.method,
            "moves": [m.to_json() for m in self.moves],
        }


@dataclass(frozen=True, slots=True)
class FragmentationVerdict:
    """Nodes that admit the pod and hold room enough for it, pooled over the cards it may
    use; the smallest shortfall on its best cards first."""

    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Report:
    """Plans for the pods blocked by fragmentation (each planned with the earlier plans
    carried out), and why the others have none."""

    plans: tuple[Plan, ...]
    fragmented: tuple[PodKey, ...]
    unplanned: Mapping[PodKey, str]
    #: PodGroups whose members on the nodes looked at were left alone, and why.
    groups_left: Mapping[str, str] = field(default_factory=dict)


# --- who may move -------------------------------------------------------------------------


def controller_of(pod: Pod) -> Owner | None:
    """The pod's controlling owner reference, if it has one."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return Owner(
                str(ref.get("kind") or ""),
                str(ref.get("name") or ""),
                str(ref.get("uid") or ""),
                str(ref.get("apiVersion") or ""),
            )
    return None


def replacement_rule(pod: Pod, options: PlanOptions) -> Replacement | None:
    """How the pod comes back after an eviction, or None when it may not move."""
    return rule_for(controller_of(pod), options)


def rule_for(owner: Owner | None, options: PlanOptions) -> Replacement | None:
    if owner is None:
        return Replacement.AFTER_GONE if options.allow_bare_pods else None
    group = owner.api_version.rpartition("/")[0] if "/" in owner.api_version else ""
    known = RECREATING_OWNERS.get((group, owner.kind))
    if known is not None:
        return known
    if owner.kind in options.owner_kinds or f"{group}/{owner.kind}" in options.owner_kinds:
        return Replacement.WHILE_TERMINATING
    return None


def mover_of(
    books: DefragBooks,
    key: PodKey,
    pod: Pod,
    options: PlanOptions,
    left: dict[str, str] | None = None,
    *,
    through_claims: Sequence[placement.Booking] | None = None,
) -> Mover | None:
    """The pod (``key`` is its ``pod_key``) as a plan may move it, or None (a pod object
    whose uid differs from the books' is not trusted to describe it). The books' entry is
    read first: it rules out most pods before their object is. ``left``: where a PodGroup
    member may not move alone, its group and why (``group_hold``) are noted there.
    ``through_claims``: what a pod of the claims dialect holds through its claims (it
    books nothing itself; the caller has judged its claims: ``autoscale.shrink_claims``)."""
    entry = books.entry(key)
    if entry is None or entry.node is None or entry.reserved or entry.deleting:
        return None
    domain: tuple[str, str] | None = None
    if entry.in_group:
        held = group_hold(books, entry)
        if not isinstance(held, tuple):
            if held and left is not None and entry.group is not None:
                left[entry.group] = held
            return None
        domain = held or None
    if books.is_claimed(key):
        return None  # already leaving for a preemption or another plan
    meta = pod.get("metadata") or {}
    holding = (
        [b for bs in entry.bookings.values() for b in bs]
        if through_claims is None
        else list(through_claims)
    )
    if not holding or meta.get("deletionTimestamp"):
        return None
    if entry.uid and str(meta.get("uid") or "") != entry.uid:
        return None
    if allocation_trust.scheduler_of(pod) != books.own_scheduler():
        # Only pods this operator placed: its replacement comes back to this scheduler,
        # so the engine's "fits again at Q" is a promise it can keep. A pod of a scheduler
        # opted in with ``trustedSchedulerNames`` holds its shares in the books, but
        # another scheduler places its replacement (and an untrusted one holds nothing).
        return None
    owner = controller_of(pod)
    rule = rule_for(owner, options)
    if rule is None:
        return None
    bookings = holding
    return Mover(
        key=key,
        uid=entry.uid,
        node=entry.node,
        priority=entry.priority,
        labels=dict(entry.labels),
        memory_mib=sum(b.memory_mib for b in bookings),
        cards=tuple(b.uuid for b in bookings),
        owner=owner,
        replacement=rule,
        pod=pod,
        domain=domain,
    )


def group_hold(books: DefragBooks, entry: PodEntry) -> str | tuple[str, str] | tuple[()]:
    """Whether a PodGroup's member may move alone: a sentence saying why not (its group
    is moved whole or not at all: ``disruptionMode: all``, or a PodGroup not read; or a
    topology domain the member's node is not in), else its domain (node label, value) that
    its replacement must stay in, or ``()`` for none. A ``single`` group's member may move
    as any pod: its group stays whole (its replacement comes back as a member) and in its
    domain. Defragmentation does not move a whole group (``docs/gangs.md``)."""
    group = entry.group
    rule = None if group is None else books.group_rule(group)
    if group is None or rule is None:
        return f"pod group {group}: its PodGroup is not read; moved whole or not at all"
    if not rule.one_by_one:
        return (
            f"pod group {group}: disruptionMode all, moved whole or not at all "
            "(defragmentation does not move a whole group)"
        )
    if rule.domain_key is None:
        return ()
    value = books.node_label(entry.node or "", rule.domain_key) if rule.domain_key else None
    if value is None:
        return f"pod group {group}: its topology domain cannot be read on node {entry.node}"
    return (rule.domain_key, value)


def left_alone(groups_left: Mapping[str, str]) -> str:
    """The PodGroups left alone, for a pod's "no plan" sentence (three named at most)."""
    named = sorted(groups_left.values())
    more = f"; and {len(named) - 3} more pod groups" if len(named) > 3 else ""
    return "".join(f"; left alone: {why}" for why in named[:3]) + more


def stays_in_domain(books: DefragBooks, mover: Mover, node: str) -> bool:
    """Whether a replacement on ``node`` keeps the mover's PodGroup in its domain."""
    return mover.domain is None or books.node_label(node, mover.domain[0]) == mover.domain[1]


#: The running pods' objects: a list, or a mapping by ``pod_key`` (which spares the planner
#: reading every pod's key, for a caller that keeps them so).
Running = Mapping[PodKey, Pod] | Iterable[Pod]


def by_key(running: Running) -> Mapping[PodKey, Pod]:
    if isinstance(running, Mapping):
        return running
    return {pod_key(pod): pod for pod in running}


class Candidates:
    """The running pods a plan may move, read from their objects node by node (the books
    say which pods a node holds), when a search first looks at the node (a search at
    1,000 nodes looks at a few hundred at most: ``PlanOptions.heuristic_looks``)."""

    def __init__(self, books: DefragBooks, running: Running, options: PlanOptions) -> None:
        self._books = books
        self._options = options
        self._running = by_key(running)
        self._on: dict[str, list[Mover]] = {}
        self._by_key: dict[PodKey, Mover] = {}
        #: Moved by an earlier plan of the same call: no longer there to move.
        self.spent: list[Mover] = []
        self._spent_keys: set[PodKey] = set()
        #: Each mover's replacement, one object per call (the engine parses it once).
        self.twins: dict[PodKey, Pod] = {}
        #: Each mover's shape (``pod_shape``), read once per call.
        self.shapes: dict[PodKey, str] = {}
        #: PodGroups whose members met were left alone, and why (``group_hold``).
        self.groups_left: dict[str, str] = {}

    def on(self, node: str) -> list[Mover]:
        made = self._on.get(node)
        if made is None:
            books, options, running = self._books, self._options, self._running
            pods = ((k, running.get(k)) for k in books.keys_on(node))
            left = self.groups_left
            found = (mover_of(books, k, p, options, left) for k, p in pods if p is not None)
            made = self._on[node] = [m for m in found if m is not None]
            self._by_key.update((m.key, m) for m in made)
        return [m for m in made if m.key not in self._spent_keys]

    def everywhere(self) -> list[Mover]:
        return [m for node in sorted(self._books.node_names()) for m in self.on(node)]

    def get(self, key: PodKey) -> Mover | None:
        return self._by_key.get(key)

    def spend(self, keys: Iterable[PodKey]) -> None:
        for key in keys:
            mover = self._by_key.get(key)
            if mover is not None and key not in self._spent_keys:
                self._spent_keys.add(key)
                self.spent.append(mover)


def movers(books: DefragBooks, running: Running, options: PlanOptions) -> dict[PodKey, Mover]:
    """The running pods a plan may move."""
    return {m.key: m for m in Candidates(books, running, options).everywhere()}


def pod_shape(pod: Pod, written: frozenset[str]) -> str:
    """What decides where a pod may go, as one text: pods of one Deployment share it, and
    whether one fits somewhere is asked once for all of them."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in written}
    return json.dumps(
        [
            meta.get("namespace"),
            annotations,
            [c.get("resources") for c in spec.get("initContainers") or ()],
            [c.get("resources") for c in spec.get("containers") or ()],
            {k: spec.get(k) for k in ("nodeSelector", "affinity", "tolerations", "priority")},
        ],
        sort_keys=True,
        default=str,
    )


def scheduler_written(state: ClusterState) -> frozenset[str]:
    keys = {
        names.ASSIGNED_NODE,
        names.ASSIGNED_TIME,
        names.BIND_PHASE,
        names.BIND_TIME,
        names.MIG_ALLOCATIONS,
    }
    for spec in state.vendors.specs():
        keys.add(spec.to_allocate_annotation)
        keys.add(spec.allocated_annotation)
    return frozenset(keys)


def replacement_pod(pod: Pod, written: frozenset[str]) -> Pod:
    """The pod as its controller creates it again: unbound, without what the scheduler
    wrote on it, under a name no real pod has."""
    meta = pod.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in written}
    spec = (pod.get("spec") or {}).copy()
    spec.pop("nodeName", None)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": meta.get("namespace") or "default",
            "name": f"{meta.get('name', '')}{REPLACEMENT_SUFFIX}",
            "labels": dict(meta.get("labels") or {}),
            "annotations": annotations,
            "ownerReferences": list(meta.get("ownerReferences") or ()),
        },
        "spec": spec,
    }


# --- the verdict --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Headroom:
    """What a node's usable cards offer a pod: the memory its best cards lack (a lower
    bound on what a plan must move off the node), and whether its free shares, pooled,
    would hold the pod."""

    shortfall_mib: int
    pooled: bool


def room_of(
    job: placement.Job, cards: Sequence[model.DeviceUsage], cordoned: frozenset[str]
) -> Headroom | None:
    """None when the node's usable cards could not hold the pod even empty."""
    shortfall = 0
    pooled = True
    for vendor_word in sorted({v for r in (*job.init_requests, *job.app_requests) for v in r}):
        card_filter = job.card_filters.get(vendor_word)
        usable = [
            c
            for c in cards
            if c.vendor == vendor_word
            and c.health
            and c.id not in cordoned
            and (
                card_filter is None
                or (
                    card_filter.type_allowed(c.type)
                    and card_filter.uuid_allowed(c.id)
                    and card_filter.mode_allowed(c.mode)
                )
            )
        ]
        if not usable:
            return None
        smallest = min(c.total_memory_mib for c in usable)
        largest = max(c.total_memory_mib for c in usable)
        free = sorted(
            (max(0, c.total_memory_mib - c.used_memory_mib) for c in usable), reverse=True
        )
        memory = cores = slots = widest = 0
        for requests in (*job.init_requests, *job.app_requests):
            request = requests.get(vendor_word)
            if request is None:
                continue
            each = (
                smallest * request.memory_percent // 100
                if request.uses_percentage
                else request.memory_mib
            )
            if each > largest:
                return None
            memory += each * request.count
            cores += min(request.cores, 100) * request.count
            slots += request.count
            widest = max(widest, request.count)
            shortfall += sum(max(0, each - f) for f in free[: request.count])
        if len(usable) < widest:
            return None
        pooled = (
            pooled
            and sum(free) >= memory
            and sum(max(0, c.total_cores - c.used_cores) for c in usable) >= cores
            and sum(max(0, c.count - c.used) for c in usable) >= slots
        )
    return Headroom(shortfall, pooled)


def rooms(books: DefragBooks, job: placement.Job, now: float) -> list[tuple[Headroom, int, str]]:
    """Every node that admits the pod and whose usable cards could hold it, with its
    room and its order."""
    found: list[tuple[Headroom, int, str]] = []
    for order, name in enumerate(books.node_names()):
        if not books.node_admits(name, job, now):
            continue
        room = room_of(job, books.cards(name), books.cordoned(name))
        if room is not None:
            found.append((room, order, name))
    return found


def fragmentation(
    books: DefragBooks, job: placement.Job, now: float
) -> FragmentationVerdict | None:
    """Whether a pod that fits nowhere is blocked by fragmentation: the nodes that admit
    it and whose free shares, pooled over its usable cards, would hold it."""
    if not job.wants_devices:
        return None
    pooled = sorted((r.shortfall_mib, o, n) for r, o, n in rooms(books, job, now) if r.pooled)
    return FragmentationVerdict(tuple(name for *_, name in pooled)) if pooled else None


# --- the search ---------------------------------------------------------------------------
