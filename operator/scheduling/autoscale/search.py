"""Which new nodes to ask for: the fewest, then the cheapest, on which the decision cycle
places every waiting pod; found in bounded time.

Every candidate set of new nodes is judged by a trial (``whatif``): the nodes already
requested and the candidate's added to an overlay of the books, then the waiting units
placed in one order (those nominated to a requested node first, held there; then the
largest first, gangs whole), each by the decision cycle. A set holds the queue when every
unit is placed. The search:

1. A trial with the requested nodes only: when it holds everything, nothing new is asked
   for (and a requested node no unit needs is withdrawn).
2. Each unit left alone on new nodes of each option (one node; a group up to one per
   member): a unit no option holds is left out, with the reason its last trial gave (a
   card type no instance type has, a NodePool limit...).
3. A greedy set per option (the option preferred, each unit that does not fit given a new
   node of it, or of the cheapest option that holds it): the best of these, by count then
   price, is the incumbent.
4. Exhaustive, smallest count first: every multiset of options of each count from a lower
   bound (memory and cores wanted against the most one node offers) up to the incumbent's,
   cheapest first, each within the NodePools' limits and with room enough, is tried; the
   first that holds the queue is the answer, fewest then cheapest. A budget of trials (and
   of seconds, where a clock is given) bounds it; spent, the incumbent is the answer
   (``ScalePlan.optimal`` False).

A trial places the units in their order by the walk; for a small queue that does not all
fit so, it also tries every assignment of the pods to the nodes (``assign``), so that
there the set found is the fewest on which any placement by the engine's Fit holds the
queue, not only the walk's.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from vgpu_operator.devices import dra
from vgpu_operator.scheduling.autoscale import assign
from vgpu_operator.scheduling.autoscale.catalogue import NodeOption
from vgpu_operator.scheduling.autoscale.hypothetical import NEW_NODE_PREFIX, NodeFactory
from vgpu_operator.scheduling.autoscale.whatif import Slot, Unit, WhatIfEngine, pod_shape
from vgpu_operator.scheduling.books import Books
from vgpu_operator.scheduling.cycle import Decision
from vgpu_operator.scheduling.cycle.plugin import Unread
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.wire import Pod, ResourceClaim

#: Why a unit that fits no node alone is left out, when its trial gave no diagnosis.
_NO_OPTION = "no instance type a NodePool allows holds it"


@dataclass(frozen=True, slots=True)
class SearchBudget:
    """How much one search may do."""

    #: Trials (each places the whole queue) after the first per-option ones.
    max_trials: int = 200
    #: New nodes asked for at once, at most.
    max_new_nodes: int = 32
    #: Multisets of one count listed at most (beyond: that count is not searched).
    max_subsets: int = 20_000
    #: Seconds (of the clock given to ``plan``) the search may take.
    max_seconds: float = 2.0
    #: Pods held to a node by the assignment search (``assign``), all trials together.
    max_placements: int = 4_000


@dataclass(frozen=True, slots=True)
class ScalePlan:
    """The new nodes to ask for, where each pod would go, and what no node would hold."""

    new: tuple[Slot, ...] = ()
    #: Each pod placed: the node (new, requested before, or live for a group's member).
    where: Mapping[PodKey, str] = field(default_factory=dict)
    #: Units (by key) no new node would hold, and why.
    unplaceable: Mapping[str, str] = field(default_factory=dict)
    #: Nodes requested before that no pod needs now.
    unused: tuple[str, ...] = ()
    #: Whether the set is proven the fewest nodes, then the cheapest (budget not spent).
    optimal: bool = True
    trials: int = 0

    @property
    def price(self) -> float:
        return sum(s.option.price for s in self.new)

    def pods_on(self, node: str) -> tuple[PodKey, ...]:
        """The pods placed on ``node``, in the order the trial placed them (the order to
        hold their shares in)."""
        return tuple(k for k, n in self.where.items() if n == node)

    def summary(self) -> str:
        """``1 x gpu-8xh100, 2 x gpu-4xl40s``: the new nodes by instance type."""
        counts: dict[str, int] = {}
        for slot in self.new:
            name = slot.option.instance_type.name
            counts[name] = counts.get(name, 0) + 1
        return ", ".join(f"{n} x {name}" for name, n in sorted(counts.items()))


@dataclass(frozen=True, slots=True)
class _Tried:
    """A trial's outcome: where the placed pods went, and the units that did not fit."""

    where: dict[PodKey, str]
    failed: list[tuple[Unit, Decision | None]]


class _Search:
    def __init__(
        self,
        live: Books,
        options: Sequence[NodeOption],
        requested: Sequence[Slot],
        now: float,
        budget: SearchBudget,
        clock: Callable[[], float] | None,
    ) -> None:
        self.live = live
        self.options = list(options)
        self.requested = list(requested)
        self.now = now
        self.budget = budget
        self.factory = NodeFactory(live, now)
        self.trials = 0
        self.placements = 0
        self._clock = clock
        self._started = clock() if clock is not None else 0.0
        self._extra: dict[str, Fraction] = {}
        #: The units' claims not made yet (every trial's overlay holds them).
        self.claims: list[ResourceClaim] = []

    def spent(self) -> bool:
        if self.trials >= self.budget.max_trials:
            return True
        if self._clock is None:
            return False
        return self._clock() - self._started >= self.budget.max_seconds

    def engine(self, new: Sequence[NodeOption]) -> WhatIfEngine:
        engine = WhatIfEngine(self.live, self.factory)
        engine.add_claims(self.claims)
        for slot in self.requested:
            engine.add(slot)
        for slot in self._slots(new):
            engine.add(slot)
        return engine

    def trial(self, new: Sequence[NodeOption], units: Sequence[Unit]) -> _Tried:
        """The units placed in their order by the walk; for a small queue that does not
        all fit so, every assignment of its pods to the nodes (``assign``)."""
        self.trials += 1
        engine = self.engine(new)
        where: dict[PodKey, str] = {}
        failed: list[tuple[Unit, Decision | None]] = []
        for unit in units:
            placed, why = engine.place(unit, self.now)
            if placed:
                where.update(placed)
            else:
                failed.append((unit, why))
        if failed and new and assign.eligible(units) and self._placements_left() > 0:
            assigned = self._assign(new, units)
            if assigned is not None:
                return _Tried(assigned, [])
        return _Tried(where, failed)

    def _placements_left(self) -> int:
        return self.budget.max_placements - self.placements

    def _assign(self, new: Sequence[NodeOption], units: Sequence[Unit]) -> dict[PodKey, str] | None:
        engine = self.engine(new)
        slots = [*self.requested, *self._slots(new)]
        options = {s.name: s.option.key for s in self._slots(new)}
        assigner = assign.Assigner(engine, slots, options, self.now, self._placements_left())
        found = assigner.run(units)
        self.placements += assigner.placements
        return found

    @staticmethod
    def _slots(new: Sequence[NodeOption]) -> list[Slot]:
        return [Slot(f"{NEW_NODE_PREFIX}{i}", o) for i, o in enumerate(new)]

    def limit_problem(self, new: Sequence[NodeOption]) -> str | None:
        """Why ``new`` would pass a NodePool's limit (None: within every limit)."""
        by_pool: dict[str, tuple[Any, dict[str, Fraction]]] = {}
        for option in new:
            pool, extra = by_pool.setdefault(option.pool.name, (option.pool, {}))
            for resource, amount in option.usage().items():
                extra[resource] = extra.get(resource, Fraction(0)) + amount
        for pool, extra in by_pool.values():
            problem: str | None = pool.room(extra)
            if problem is not None:
                return problem
        return None


def plan(
    live: Books,
    units: Sequence[Unit],
    options: Sequence[NodeOption],
    requested: Sequence[Slot] = (),
    *,
    now: float,
    budget: SearchBudget = SearchBudget(),
    clock: Callable[[], float] | None = None,
) -> ScalePlan:
    """The new nodes (of ``options``) on which, with the nodes ``requested`` before, the
    decision cycle places every unit of ``units`` that some node would hold; see the
    module docstring. ``clock`` bounds the search in seconds too (None: trials only)."""
    search = _Search(live, options, requested, now, budget, clock)
    search.claims = [claim for unit in units for claim in unit.claims]
    units = _ordered(search, units)
    first = search.trial((), units)
    if not first.failed:
        return _plan(search, (), first.where, {}, True)
    # A pin to a requested node that no longer holds the unit is dropped.
    units = [_unpinned(u) if any(u is f for f, _ in first.failed) else u for u in units]
    unplaceable, alone = _alone(search, [u for u, _ in first.failed])
    units = [u for u in units if u.key not in unplaceable]
    greedy = _greedy(search, units, alone)
    unplaceable.update(greedy.left)
    units = [u for u in units if u.key not in greedy.left]
    chosen, where, optimal = _exhaustive(search, units, (greedy.nodes, greedy.where))
    return _plan(search, chosen, where, unplaceable, optimal)


def _plan(
    search: _Search,
    chosen: Sequence[NodeOption],
    where: Mapping[PodKey, str],
    unplaceable: Mapping[str, str],
    optimal: bool,
) -> ScalePlan:
    new = tuple(Slot(f"{NEW_NODE_PREFIX}{i}", o) for i, o in enumerate(chosen))
    used = set(where.values())
    unused = tuple(s.name for s in search.requested if s.name not in used)
    return ScalePlan(new, dict(where), dict(unplaceable), unused, optimal, search.trials)


def _unpinned(unit: Unit) -> Unit:
    if unit.pinned is None:
        return unit
    return dataclasses.replace(unit, pinned=None)


def _ordered(search: _Search, units: Sequence[Unit]) -> list[Unit]:
    """Units nominated to a requested node first, then the others; each part the most
    demanding first: a whole card's cores, then the most memory one card must give, then
    the memory and cards wanted in all (then by key). The pinned ones so replay the order
    the plan that pinned them placed them in."""
    engine = search.engine(())
    sizes = {u.key: _demand(engine, u) for u in units}

    def demand(unit: Unit) -> tuple[tuple[int, ...], str]:
        return tuple(-v for v in sizes[unit.key]), unit.key

    pinned = sorted((u for u in units if u.pinned is not None), key=demand)
    rest = sorted((u for u in units if u.pinned is None), key=demand)
    return [*pinned, *rest]


def _needs(engine: WhatIfEngine, pod: Pod) -> list[tuple[int, int, int]]:
    """Per request of the pod: cards, and memory (MiB) and cores each card must give. A
    percentage of a card's memory, or an amount a claim does not name, counts as none
    (a lower bound). A pod with claims: its claims' requests (``claims_plugin``)."""
    read = engine.cycle.parse(pod_key(pod), pod)
    if read.job is None:
        return []
    if not read.uses_claims:
        return [
            (count, mib if percent < 0 else 0, cores)
            for _vendor, count, mib, percent, cores in read.job.needs
        ]
    request = engine.cycle.claims.request(read)
    if isinstance(request, Unread):
        return []
    return [
        (
            r.count,
            int(r.capacity.get(dra.MEMORY, 0) // dra.MIB),
            int(r.capacity.get(dra.CORES, 0)),
        )
        for claim in request.wanted.pending
        for r in claim.requests
    ]


def _demand(engine: WhatIfEngine, unit: Unit) -> tuple[int, int, int, int]:
    """Cores and memory (MiB) the most demanding card of the unit must give, then the
    memory and cards it wants in all."""
    card_cores = card_memory = 0
    for pod in unit.pods:
        for _count, mib, cores in _needs(engine, pod):
            card_cores = max(card_cores, cores)
            card_memory = max(card_memory, mib)
    memory, cards, _ = _size(engine, unit)
    return card_cores, card_memory, memory, cards


def _size(engine: WhatIfEngine, unit: Unit) -> tuple[int, int, int]:
    """Memory (MiB), cards and cores the unit's pods ask for (``_needs``: a lower bound)."""
    memory = cards = cores = 0
    for pod in unit.pods:
        for count, mib, card_cores in _needs(engine, pod):
            cards += count
            memory += count * mib
            cores += count * card_cores
    return memory, cards, cores


def _alone(
    search: _Search, failed: Sequence[Unit]
) -> tuple[dict[str, str], dict[str, dict[tuple[str, str, str, str], int]]]:
    """Per unit that did not fit the requested nodes: how many new nodes of each option
    hold it alone (one for a pod, up to one per member for a group), or why none does.
    Units of one shape are tried once."""
    unplaceable: dict[str, str] = {}
    alone: dict[str, dict[tuple[str, str, str, str], int]] = {}
    seen: dict[str, tuple[str | None, dict[tuple[str, str, str, str], int]]] = {}
    for unit in failed:
        shape = _shape(unit)
        if shape not in seen:
            seen[shape] = _alone_one(search, unit)
        why, counts = seen[shape]
        if counts:
            alone[unit.key] = counts
        else:
            unplaceable[unit.key] = why or _NO_OPTION
    return unplaceable, alone


def _alone_one(
    search: _Search, unit: Unit
) -> tuple[str | None, dict[tuple[str, str, str, str], int]]:
    counts: dict[tuple[str, str, str, str], int] = {}
    why: str | None = None
    most = 1 if unit.group is None else min(len(unit.pods), search.budget.max_new_nodes)
    for option in search.options:
        for count in range(1, most + 1):
            new = [option] * count
            limit = search.limit_problem(new)
            if limit is not None:
                why = why or limit
                break
            tried = search.trial(new, [_unpinned(unit)])
            if not tried.failed:
                counts[option.key] = count
                break
            decision = tried.failed[0][1]
            why = _reason(decision) or why
    if not search.options:
        why = "no NodePool allows an instance type whose cards are known"
    return why, counts


def _reason(decision: Decision | None) -> str | None:
    if decision is None:
        return None
    if decision.rejected:
        return decision.rejected
    if decision.diagnosis is not None:
        return f"{_NO_OPTION}: {decision.diagnosis.message()}"
    return None


def _shape(unit: Unit) -> str:
    """What makes two units alike for the what-if: everything but their names."""
    if unit.group is not None:
        return f"group:{unit.key}"
    return pod_shape(unit.pods[0])


@dataclass(frozen=True, slots=True)
class _Greedy:
    """A greedy run: the new nodes, where the pods went, the units no new node was left
    for (a NodePool's limit, the search's bound on nodes) and why."""

    nodes: list[NodeOption]
    where: dict[PodKey, str]
    left: dict[str, str]

    def rank(self) -> tuple[int, int, float]:
        return len(self.left), len(self.nodes), _price(self.nodes)


def _greedy(
    search: _Search,
    units: Sequence[Unit],
    alone: Mapping[str, Mapping[tuple[str, str, str, str], int]],
) -> _Greedy:
    """The best greedy run over the preferred options (one run per instance type and
    pool, cheapest first): fewest units left out, then fewest nodes, then cheapest."""
    best: _Greedy | None = None
    tried: set[tuple[str, str]] = set()
    for prefer in search.options:
        kind = (prefer.pool.name, prefer.instance_type.name)
        if kind in tried:
            continue
        tried.add(kind)
        found = _greedy_one(search, units, alone, prefer)
        if best is None or found.rank() < best.rank():
            best = found
    return best or _Greedy([], {}, {})


def _price(nodes: Iterable[NodeOption]) -> float:
    return sum(o.price for o in nodes)


def _greedy_one(
    search: _Search,
    units: Sequence[Unit],
    alone: Mapping[str, Mapping[tuple[str, str, str, str], int]],
    prefer: NodeOption,
) -> _Greedy:
    """Each unit placed in turn; one that does not fit gets new nodes (as many as held it
    alone) of ``prefer`` if they hold it, else of the cheapest option that does."""
    search.trials += 1
    engine = search.engine(())
    run = _Greedy([], {}, {})
    order = [prefer, *(o for o in search.options if o is not prefer)]
    for unit in units:
        placed, _ = engine.place(unit, search.now)
        if not placed:
            placed, why = _open(search, engine, unit, alone.get(unit.key, {}), order, run.nodes)
            if not placed:
                run.left[unit.key] = why
                continue
        run.where.update(placed)
    return run


def _open(
    search: _Search,
    engine: WhatIfEngine,
    unit: Unit,
    counts: Mapping[tuple[str, str, str, str], int],
    order: Sequence[NodeOption],
    chosen: list[NodeOption],
) -> tuple[dict[PodKey, str], str]:
    """New nodes for ``unit`` in a greedy run (added to ``chosen``), or nothing and why."""
    why = _NO_OPTION
    for option in order:
        most = counts.get(option.key)
        if most is None:
            continue
        for count in range(1, most + 1):
            new = [option] * count
            if len(chosen) + count > search.budget.max_new_nodes:
                why = f"more than {search.budget.max_new_nodes} new nodes would be needed"
                break
            limit = search.limit_problem([*chosen, *new])
            if limit is not None:
                why = limit
                break
            names = [f"{NEW_NODE_PREFIX}{len(chosen) + i}" for i in range(count)]
            for name in names:
                engine.add(Slot(name, option))
            placed, _ = engine.place(unit, search.now)
            if placed:
                chosen.extend(new)
                return placed, ""
            for name in reversed(names):
                engine.remove(name)
    return {}, why


def _wanted(search: _Search, units: Sequence[Unit]) -> tuple[int, int]:
    """Memory (MiB) and cores the units want beyond what the requested nodes offer."""
    engine = search.engine(())
    memory = cores = 0
    for unit in units:
        m, _, c = _size(engine, unit)
        memory, cores = memory + m, cores + c
    for slot in search.requested:
        memory -= _memory(slot.option)
        cores -= _cores(slot.option)
    return max(0, memory), max(0, cores)


def _lower_bound(search: _Search, wanted: tuple[int, int]) -> int:
    """New nodes any set needs at least: what is wanted against the most one node offers."""
    most_memory = max((_memory(o) for o in search.options), default=0)
    most_cores = max((_cores(o) for o in search.options), default=0)
    bound = 1
    if most_memory > 0:
        bound = max(bound, math.ceil(wanted[0] / most_memory))
    if most_cores > 0:
        bound = max(bound, math.ceil(wanted[1] / most_cores))
    return bound


def _memory(option: NodeOption) -> int:
    return sum(d.memory_mib for d in option.instance_type.devices)


def _cores(option: NodeOption) -> int:
    return sum(d.cores for d in option.instance_type.devices)


def _exhaustive(
    search: _Search,
    units: Sequence[Unit],
    incumbent: tuple[list[NodeOption], dict[PodKey, str]],
) -> tuple[list[NodeOption], dict[PodKey, str], bool]:
    """Every multiset of options, fewest nodes first, cheapest first, up to the
    incumbent's: the first that holds the queue (see the module docstring)."""
    best_nodes, best_where = incumbent
    count = len(best_nodes)
    best_price = _price(best_nodes)
    n = len(search.options)
    memory, cores = _wanted(search, units)
    for size in range(_lower_bound(search, (memory, cores)), count + 1):
        if math.comb(n + size - 1, size) > search.budget.max_subsets:
            return best_nodes, best_where, False
        sets = sorted(
            itertools.combinations_with_replacement(range(n), size),
            key=lambda s: (sum(search.options[i].price for i in s), s),
        )
        for indices in sets:
            new = [search.options[i] for i in indices]
            if size == count and _price(new) >= best_price - 1e-9:
                break  # the incumbent is the cheapest of its count from here on
            if sum(map(_memory, new)) < memory or sum(map(_cores, new)) < cores:
                continue  # not room enough, whatever the placement
            if search.limit_problem(new) is not None:
                continue
            if search.spent():
                return best_nodes, best_where, False
            tried = search.trial(new, units)
            if not tried.failed:
                return new, tried.where, True
    return best_nodes, best_where, True
