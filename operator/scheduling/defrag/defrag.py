"""Defragmentation: the fewest moves that free room for a pod waiting on scattered shares.

A pod is *blocked by fragmentation* when it fits on no node, yet some node that admits
it (taints, selector, CPU, heartbeat) holds enough free memory, cores and slots on cards
it may use, only spread over several cards (``fragmentation``). A *plan* for it is an
ordered list of moves, each "evict pod P from its cards; its replacement fits again at
Q", after which the waiting pod fits. A plan is read exactly as the operator carries it
out (``control/defrag.py``), and checked by replaying it through the engine itself:

1. the waiting pod holds the shares it gets on the target node once the plan's pods on
   that node have left (preemption's hold: nominated, the shares booked for it at once,
   so that no replacement can take them back);
2. for each move in order, the pod's replacement (the same pod, as its controller would
   create it again) is decided by the engine, without preemption, where it must fit:
   while the evicted pod still terminates and holds its shares (a ReplicaSet's or a
   Job's replacement is created at the eviction), or once it is gone (a StatefulSet's,
   which keeps its name). Its placement, type and UUID choices included, is the ``to``.

Only pods this operator placed (their ``schedulerName`` is its own, and the books believe
their allocation) and that something recreates may move (a controller owner: ReplicaSet,
StatefulSet, Job, ReplicationController, or kinds the options add; a bare pod only when
allowed), of
priority lower than or equal to the waiting pod's, never terminating, reserved (decided,
not bound yet) or already claimed by a preemption; the plan's evictions, counted
together, must leave every PodDisruptionBudget within its ``disruptionsAllowed``; and
there are at most ``max_evictions`` of them.

Cost: fewest evictions, then least memory moved (MiB booked by the moved pods), then the
node met first and the pods' names. On clusters of up to ``exact_node_limit`` nodes the
search is exact: every target node, every set of its pods that lets the waiting pod fit
there, with any other pods of the cluster added to make room for replacements (chains),
every order, by increasing number of evictions, pruned only by the bound of the best
memory found (the tests compare it with an exhaustive search of every set and order).
Beyond that a heuristic: target nodes by shortfall (the memory their best cards lack,
a lower bound on what must move off them), moves from the target node only (no chains)
of pods whose replacement fits somewhere already, sets of pods by increasing memory, a
bounded number of nodes (``heuristic_looks`` looked at, ``heuristic_nodes`` tried); its
distance from the exact answer is measured in ``tests/bench/bench_defrag.py``.

Pure: the planner reads the books and tries its plans only through ``defrag_books``, on
an overlay of the books that it drops before it returns (the live books are never
written). ``plan_steps`` is the planner in steps, pausing where its overlay holds no
change, for a caller that lets other work run meanwhile; such a caller checks the plan
again (``recheck``) before acting on it. Its vocabulary lives in ``defrag_parts``.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from itertools import combinations, permutations

from vgpu_operator.devices import codec
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.cycle.decision import Decision
from vgpu_operator.scheduling.defrag.defrag_books import DefragBooks, WhatIf
from vgpu_operator.scheduling.defrag.defrag_parts import (
    Candidates,
    FragmentationVerdict,
    Move,
    Mover,
    Plan,
    PlanOptions,
    Replacement,
    Report,
    Running,
    controller_of,
    fragmentation,
    left_alone,
    movers,
    pod_shape,
    replacement_pod,
    replacement_rule,
    rooms,
    scheduler_written,
    stays_in_domain,
)
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.scheduling.preemption import disruption, preemption
from vgpu_operator.wire import Pod

#: The planner, and its vocabulary (``defrag_parts``), as callers import them from here.
__all__ = [
    "FragmentationVerdict",
    "Move",
    "Mover",
    "Plan",
    "PlanOptions",
    "Replacement",
    "Report",
    "controller_of",
    "fragmentation",
    "movers",
    "plan",
    "plan_steps",
    "recheck",
    "replacement_rule",
    "replay",
]


def _cost(plan: Plan, order: Mapping[str, int]) -> tuple[int, int, int, tuple[str, ...]]:
    return (plan.evictions, plan.memory_mib, order[plan.node], tuple(m.pod for m in plan.moves))


class _Search:
    """Plans for one waiting pod over one what-if (see the module docstring)."""

    def __init__(
        self,
        whatif: WhatIf,
        pod: Pod,
        job: placement.Job,
        candidates: Candidates,
        budgets: Sequence[disruption.Budget],
        now: float,
    ) -> None:
        self.whatif = whatif
        self.books = whatif.books
        self.pod = pod
        self.key = pod_key(pod)
        self.priority = preemption.priority_of(pod)
        self.job = job
        self.now = now
        self.candidates = candidates
        # Which budgets cover each pod, read once (``Budget.covers``), and how many
        # disruptions each has left after the pods earlier plans moved.
        self.budgets = budgets
        self._covers: dict[PodKey, tuple[int, ...]] = {}
        self.left = [b.disruptions_allowed for b in budgets]
        for mover in candidates.spent:
            for index in self._covering(mover):
                self.left[index] -= 1
        #: Per pod shape (``pod_shape``): whether such a pod fits somewhere now.
        self.placeable: dict[str, bool] = {}
        self.written = scheduler_written(self.books.state)
        self._movers_on: dict[str, list[Mover]] = {}
        self._groups_on: dict[str, list[list[Mover]]] = {}
        self._eligible: list[Mover] | None = None
        self.order = {name: i for i, name in enumerate(self.books.node_names())}
        asked = [r for rs in (*job.init_requests, *job.app_requests) for r in rs.values()]
        self.cards_asked = sum(r.count for r in asked)
        self.one_card = len(asked) == 1 and asked[0].count == 1
        self._fits: dict[tuple[str, frozenset[PodKey]], bool] = {}

    def movers_on(self, node: str) -> list[Mover]:
        """The node's pods this pod may move, the lightest first."""
        known = self._movers_on.get(node)
        if known is None:
            known = self._movers_on[node] = sorted(
                (
                    m
                    for m in self.candidates.on(node)
                    if m.priority <= self.priority and m.key != self.key
                ),
                key=lambda m: (m.memory_mib, m.key),
            )
        return known

    @property
    def eligible(self) -> list[Mover]:
        """Every pod this pod may move, the lightest first (the exact search's chains)."""
        if self._eligible is None:
            self._eligible = sorted(
                (m for n in self.books.node_names() for m in self.movers_on(n)),
                key=lambda m: (m.memory_mib, m.key),
            )
        return self._eligible

    # --- checks -------------------------------------------------------------------------

    def violates_budget(self, moved: Sequence[Mover]) -> bool:
        """Whether evicting ``moved`` (after the pods earlier plans moved) takes a
        disruption budget below zero (each eviction spends one disruption of every
        budget covering the pod, as ``disruption.split_by_violation`` counts)."""
        spending: dict[int, int] = {}
        for mover in moved:
            for index in self._covering(mover):
                spending[index] = spending.get(index, 0) + 1
        return any(self.left[i] < n for i, n in spending.items())

    def _covering(self, mover: Mover) -> tuple[int, ...]:
        known = self._covers.get(mover.key)
        if known is None:
            namespace, _, name = mover.key.partition("/")
            known = self._covers[mover.key] = tuple(
                i for i, b in enumerate(self.budgets) if b.covers(namespace, name, mover.labels)
            )
        return known

    def twin(self, mover: Mover) -> Pod:
        """The mover's replacement, one object per search (the engine parses it once)."""
        twins = self.candidates.twins
        known = twins.get(mover.key)
        if known is None:
            known = twins[mover.key] = replacement_pod(mover.pod, self.written)
        return known

    def placeable_now(self, mover: Mover) -> bool:
        """Whether the mover's replacement fits somewhere as the books stand, before any
        move: the heuristic's quick test (a replacement created while its pod
        terminates fits no better once the plan's hold is booked, unless an earlier
        move of the same plan freed room for it, which the heuristic does not count on)."""
        shape = self.candidates.shapes.get(mover.key)
        if shape is None:
            shape = self.candidates.shapes[mover.key] = pod_shape(mover.pod, self.written)
        known = self.placeable.get(shape)
        if known is None:
            job = self.books.admitted_job(mover.pod)
            known = job is None or self.books.fits_somewhere(job, self.now)
            self.placeable[shape] = known
        return known

    def fits_after(self, node: str, leaving: Sequence[Mover]) -> bool:
        keys = frozenset(m.key for m in leaving)
        known = self._fits.get((node, keys))
        if known is None:
            known = self.books.fit_after_leaving(node, self.job, keys, self.now).ok
            self._fits[(node, keys)] = known
        return known

    def may_fit_after(self, node: str, leaving: Sequence[Mover]) -> bool:
        """The engine's own quick test (``placement.Summary``) on the node's cards with
        ``leaving`` gone: never False where the Fit would succeed."""
        cards = [c.copy() for c in self.books.cards(node)]
        for mover in leaving:
            entry = self.books.entry(mover.key)
            if entry is None or not placement.shift(cards, entry.bookings, -1):
                return True  # MIG cards: only the Fit can tell
        return placement.Summary.of(cards).may_fit(self.job)

    def replay(self, node: str, order: Sequence[Mover], method: str, keep: bool) -> Plan | None:
        """The plan as the operator would carry it out, through the engine; None where a
        step fails. ``keep``: leave it carried out in the what-if."""
        whatif, now = self.whatif, self.now
        mark = whatif.mark()
        held = whatif.hold(self.pod, node, frozenset(m.key for m in order), now)
        if held is None:
            return None
        moves: list[Move] = []
        for mover in order:
            twin = self.twin(mover)
            if mover.replacement is Replacement.WHILE_TERMINATING:
                decision = whatif.place(twin, now)
                whatif.take_out(mover.key)
            else:
                whatif.take_out(mover.key)
                decision = whatif.place(twin, now)
            to = decision.node if decision.scheduled else None
            if not (to and stays_in_domain(self.books, mover, to)):
                whatif.undo_to(mark)  # no room; or out of its PodGroup's topology domain
                return None
            moves.append(_move(mover, decision))
        if not keep:
            whatif.undo_to(mark)
        cards = tuple(tuple(d.uuid for d in c) for single in held.devices.values() for c in single)
        return Plan(self.key, self.priority, node, cards, tuple(moves), method)

    def first_order(self, node: str, moved: Sequence[Mover], method: str) -> Plan | None:
        """The plan for the first order (by name) in which every step succeeds."""
        for order in permutations(sorted(moved, key=lambda m: m.key)):
            plan = self.replay(node, order, method, keep=False)
            if plan is not None:
                return plan
        return None

    def targets(self) -> list[str]:
        return [
            n
            for n in self.books.node_names()
            if self.movers_on(n) and self.books.node_admits(n, self.job, self.now)
        ]

    # --- exact ----------------------------------------------------------------------------
    def pause(self) -> Iterator[None]:
        """A point where the caller may let other work change the books (``plan_steps``):
        only while this what-if holds no change (no earlier plan of the call kept). The
        search pauses before each target node and, in the heuristic, before each set of
        pods it tests."""
        if self.whatif.mark() == 0:
            yield

    def exact(self, size: int) -> Generator[None, None, Plan | None]:
        """The cheapest plan of exactly ``size`` evictions (module docstring)."""
        best: Plan | None = None
        for node in self.targets():
            yield from self.pause()
            if not self.books.has_node(node):
                continue  # gone while other work ran
            on = self.movers_on(node)
            others = [m for m in self.eligible if m.node != node]
            for direct in range(1, min(size, len(on)) + 1):
                for here in combinations(on, direct):
                    memory_here = sum(m.memory_mib for m in here)
                    if best is not None and memory_here > best.memory_mib:
                        continue
                    if not self.fits_after(node, here):
                        continue
                    for chain in combinations(others, size - direct):
                        moved = (*here, *chain)
                        memory = memory_here + sum(m.memory_mib for m in chain)
                        if best is not None and memory > best.memory_mib:
                            continue
                        if self.violates_budget(moved):
                            continue
                        plan = self.first_order(node, moved, "exact")
                        if plan is not None and (
                            best is None or _cost(plan, self.order) < _cost(best, self.order)
                        ):
                            best = plan
        return best

    # --- heuristic ------------------------------------------------------------------------
    def pools(self, node: str, size: int, shortfall: int) -> list[list[Mover]]:
        """Groups of the node's movable pods among which the heuristic looks for a
        plan's ``size`` evictions. A pod that asks for one card needs room on one card:
        each card's pods are a group (a pod on several cards is in each of their groups).
        Otherwise one group: the pods of the cards with the most free memory, one card
        more than the pod asks for, the smallest ``_POOL`` of them. Only pods whose
        replacement fits somewhere now (``placeable_now``) are in a group; a group whose
        ``size`` heaviest pods, placeable or not, free less than ``shortfall`` is left out
        before that costlier test."""
        limit = None if self.one_card else _POOL
        return [
            [m for m in group if self.placeable_now(m)][:limit]
            for group in self._groups(node)
            if sum(m.memory_mib for m in group[-size:]) >= shortfall
        ]

    def _groups(self, node: str) -> list[list[Mover]]:
        """``pools`` before the placeable test, the lightest pod first in each (read once
        per node and search: the heuristic walks the nodes once per number of evictions)."""
        known = self._groups_on.get(node)
        if known is None:
            known = self._groups_on[node] = self._group(node)
        return known

    def _group(self, node: str) -> list[list[Mover]]:
        on = self.movers_on(node)
        if self.one_card:
            by_card: dict[str, list[Mover]] = {}
            for mover in on:
                for card in dict.fromkeys(_base(c) for c in mover.cards):
                    by_card.setdefault(card, []).append(mover)
            return [by_card[c] for c in sorted(by_card)]
        cards = sorted(
            self.books.cards(node), key=lambda c: (c.used_memory_mib - c.total_memory_mib, c.id)
        )[: self.cards_asked + 1]
        wanted = {c.id for c in cards}
        return [[m for m in on if wanted & {_base(c) for c in m.cards}]]

    def heuristic(
        self, size: int, targets: Sequence[tuple[int, str]], options: PlanOptions
    ) -> Generator[None, None, Plan | None]:
        """The cheapest plan of ``size`` evictions, all from one node's group
        (``pools``), among the first target nodes by shortfall (a node whose shortfall
        exceeds the best plan's memory cannot beat it, so the walk stops there)."""
        best: Plan | None = None
        found = tried = looked = 0
        for shortfall, node in targets:
            if best is not None and shortfall > best.memory_mib:
                break
            if looked >= options.heuristic_looks:
                break
            looked += 1
            yield from self.pause()
            if not self.books.has_node(node):
                continue  # gone while other work ran
            sets: dict[tuple[PodKey, ...], tuple[Mover, ...]] = {}
            for pool in self.pools(node, size, shortfall):
                for moved in combinations(pool, size):
                    if sum(m.memory_mib for m in moved) >= shortfall:
                        sets[tuple(sorted(m.key for m in moved))] = moved
            if not sets:
                continue
            tried += 1
            ordered = sorted(
                sets.items(), key=lambda item: (sum(m.memory_mib for m in item[1]), item[0])
            )
            for _keys, moved in ordered:
                memory = sum(m.memory_mib for m in moved)
                if best is not None and memory > best.memory_mib:
                    break
                # A node may hold hundreds of sets, each maybe replayed: a pause per set.
                yield from self.pause()
                if not self.books.has_node(node):
                    break
                # The cheapest tests first: the budgets, the node's summary, its Fit.
                if self.violates_budget(moved) or not self.may_fit_after(node, moved):
                    continue
                if not self.fits_after(node, moved):
                    continue
                # The biggest pods first: they are the hardest to place while room lasts.
                plan = self.replay(
                    node, sorted(moved, key=lambda m: (-m.memory_mib, m.key)), "heuristic", False
                ) or self.first_order(node, moved, "heuristic")
                if plan is not None:
                    found += 1
                    if best is None or _cost(plan, self.order) < _cost(best, self.order):
                        best = plan
                    break
            if found >= options.heuristic_plans or tried >= options.heuristic_nodes:
                break
        return best


#: The most pods of one group the heuristic combines (pods asking several cards).
_POOL = 12


def _base(uuid: str) -> str:
    """A card's id without a MIG instance's suffix."""
    return codec.split_mig_uuid(uuid)[0]


def _move(mover: Mover, decision: Decision) -> Move:
    to_cards = tuple(
        device.uuid
        for single in decision.devices.values()
        for container in single
        for device in container
    )
    return Move(
        pod=mover.key,
        uid=mover.uid,
        owner=mover.owner,
        from_node=mover.node,
        from_cards=mover.cards,
        to_node=str(decision.node),
        to_cards=tuple(dict.fromkeys(to_cards)),
        memory_mib=mover.memory_mib,
        replacement=mover.replacement,
    )


def _plan_one(
    search: _Search, options: PlanOptions, exact: bool, targets: Sequence[tuple[int, str]]
) -> Generator[None, None, Plan | None]:
    for size in range(1, options.max_evictions + 1):
        if exact:
            plan = yield from search.exact(size)
        else:
            plan = yield from search.heuristic(size, targets, options)
        if plan is not None:
            order = [search.candidates.get(m.pod) for m in plan.moves]
            # Carried out in the what-if, so that the next waiting pod sees it done.
            return search.replay(plan.node, [m for m in order if m], plan.method, keep=True)
    return None


def plan(
    state: ClusterState,
    waiting: Iterable[Pod],
    running: Running,
    now: float,
    options: PlanOptions | None = None,
    *,
    exact: bool | None = None,
    limit: int | None = None,
) -> Report:
    """Plans for the ``waiting`` pods blocked by fragmentation, the most important first,
    each planned as if the earlier plans had been carried out; ``running`` are the pod
    objects of the pods holding shares (their owners and specs; the books say where they
    are). ``exact`` forces the method (default: by ``options.exact_node_limit``);
    ``limit`` stops after that many plans (the pods after them are not looked at). The
    books are left as they were."""
    steps = plan_steps(state, waiting, running, now, options, exact=exact, limit=limit)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            report: Report = done.value
            return report


def plan_steps(
    state: ClusterState,
    waiting: Iterable[Pod],
    running: Running,
    now: float,
    options: PlanOptions | None = None,
    *,
    exact: bool | None = None,
    limit: int | None = None,
) -> Generator[None, None, Report]:
    """``plan`` in steps: it stops before each target node it looks at, at a point where
    the books hold none of its what-if changes, so that the caller may let other work run
    (and change the books) before it goes on; its report is the generator's value. Other
    work may have made a plan out of date by the time it is returned (the planner reads
    the books as they are at each step): ``recheck`` it on the books before acting."""
    options = options or PlanOptions()
    books = DefragBooks(state)
    use_exact = books.node_count() <= options.exact_node_limit if exact is None else exact
    candidates = Candidates(books, running, options)
    budgets = books.budgets()
    ordered = sorted(waiting, key=lambda p: -preemption.priority_of(p))
    plans: list[Plan] = []
    fragmented: list[PodKey] = []
    unplanned: dict[PodKey, str] = {}
    with WhatIf(books) as whatif:
        for pod in ordered:
            key = pod_key(pod)
            if books.entry(key) is not None or books.is_nominated(key):
                continue  # being bound, or waiting for a preemption's victims
            job = books.job(pod)
            if job is None or not job.wants_devices or books.fits_somewhere(job, now):
                continue
            node_rooms = rooms(books, job, now)
            if not any(room.pooled for room, _o, _n in node_rooms):
                continue  # not fragmentation: no node could hold it even pooled
            fragmented.append(key)
            search = _Search(whatif, pod, job, candidates, budgets, now)
            targets = sorted((room.shortfall_mib, name) for room, _o, name in node_rooms)
            found = yield from _plan_one(search, options, use_exact, targets)
            if found is None:
                unplanned[key] = (
                    f"no plan of at most {options.max_evictions} evictions of pods that "
                    "their controllers recreate, of lower or equal priority, within the "
                    "disruption budgets"
                ) + left_alone(candidates.groups_left)
                continue
            plans.append(found)
            candidates.spend(m.pod for m in found.moves)
            if limit is not None and len(plans) >= limit:
                break
    return Report(tuple(plans), tuple(fragmented), unplanned, dict(candidates.groups_left))


def replay(
    state: ClusterState,
    pod: Pod,
    node: str,
    order: Sequence[PodKey],
    running: Running,
    now: float,
    options: PlanOptions | None = None,
) -> Plan | None:
    """The plan "move ``order``, in that order, so that ``pod`` fits on ``node``" as the
    operator would carry it out, or None where a step fails (the hold, a replacement) or
    a pod may not move (owner, priority, state). Budgets and the eviction limit are not
    checked here. The books are left as they were."""
    options = options or PlanOptions()
    books = DefragBooks(state)
    candidates = Candidates(books, running, options)
    job = books.job(pod)
    if job is None or len(set(order)) < len(order):
        return None
    with WhatIf(books) as whatif:
        search = _Search(whatif, pod, job, candidates, [], now)
        allowed = {m.key: m for m in search.eligible}
        if any(k not in allowed for k in order):
            return None
        return search.replay(node, [allowed[k] for k in order], "replay", keep=False)


def recheck(
    state: ClusterState,
    made: Plan,
    pod: Pod,
    running: Running,
    now: float,
    options: PlanOptions | None = None,
) -> Plan | None:
    """``made`` checked again on the books as they are now, for a plan made in steps
    (``plan_steps``) while other work ran: the pod still waits (not decided, not
    nominated), every pod to move is still there (same uid) and may still move, the
    disruption budgets and the eviction limit allow the moves, and the plan replays
    through the engine (the hold, then each replacement). The plan replayed (its
    replacements where the engine now puts them), or None. The books are left as they
    were."""
    options = options or PlanOptions()
    books = DefragBooks(state)
    key = pod_key(pod)
    if key != made.pod or books.entry(key) is not None or books.is_nominated(key):
        return None
    if made.evictions > options.max_evictions or not books.has_node(made.node):
        return None
    job = books.job(pod)
    if job is None:
        return None
    candidates = Candidates(books, running, options)
    with WhatIf(books) as whatif:
        search = _Search(whatif, pod, job, candidates, books.budgets(), now)
        order: list[Mover] = []
        for move in made.moves:
            mover = next((m for m in search.movers_on(move.from_node) if m.key == move.pod), None)
            if mover is None or mover.uid != move.uid:
                return None
            order.append(mover)
        if search.violates_budget(order):
            return None
        return search.replay(made.node, order, made.method, keep=False)
