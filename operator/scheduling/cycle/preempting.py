"""Preemption, written once for every dialect: kube-scheduler's DefaultPreemption with the
dialect's own fit as the filter.

The rules are ``preemption``'s (priority, ``preemptionPolicy: Never``, PodDisruptionBudgets,
victims put back most important first, ``pick_node``'s order, the candidate limit). Here
they run over the books through a dialect (``plugin.Plugin``):

- ``Trial``: the pod's fit on one node as if some of its pods had left. The room comes from
  the dialect (``Plugin.freeing``: what their going frees: a pod's shares, or the claims
  whose every holder leaves) and the fit is the dialect's ``fit``, the same the walk calls:
  node gate, GPU policy, card restrictions (the node layer's and the pod's), cordons,
  taints, topology and quota alike. (A trial once fitted the annotation pod without the
  node's layer, and nominated it for a card the node withholds.)
- ``select_victims``: kube-scheduler's walk on one node; for a dialect whose shares several
  pods keep together (``Plugin.per_card_victims``: a claim shared by pods frees only when
  all go), also the same walk over each card's holders alone, the best of them (see its
  docstring), with a card's victims bounded by arithmetic first for a request of one card.
- ``choose``: the candidate loop over the nodes, the choice, and the fresh trial of the
  chosen victims before anyone is evicted. Who may be a victim, and which pods go only
  together (a PodGroup evicted whole, its members on any node), is ``victim_sets``'s.
- ``waits_for_victims``: the one nomination check (a preemptor waits while a victim of its
  nomination runs or a claim they held still holds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from vgpu_operator.scheduling.books.entries import NodeEntry, Nomination
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.cycle.plugin import Fit, Holding, Plugin
from vgpu_operator.scheduling.cycle.victim_sets import Occupancy
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.preemption import disruption, preemption
from vgpu_operator.scheduling.status import Code, Diagnosis
from vgpu_operator.wire import Pod

R = TypeVar("R")
F = TypeVar("F", bound=Fit)


class Trial(Generic[R, F]):
    """The pod's fit on ``node`` as if some of its pods had left (see the module
    docstring); the books are read only."""

    def __init__(
        self,
        view: BooksView,
        plugin: Plugin[R, F],
        node: NodeEntry,
        request: R,
        now: float,
        spare: frozenset[PodKey] = frozenset(),
    ) -> None:
        self.view = view
        self.plugin = plugin
        self.node = node
        self.request = request
        self.now = now
        #: Pods of the node leaving anyway (``victim_sets.Occupancy.spare``): every trial
        #: counts them gone.
        self.spare = spare
        self.freeing = plugin.freeing(node, request, now)

    def outcome(self, removed: frozenset[PodKey], only: str | None = None) -> F | None:
        """The fit once ``removed`` left (``only``: on that card alone); None when what
        they free cannot be read off the cards. Pods of ``removed`` on other nodes (a
        whole group's members) free nothing here."""
        if not removed <= self.node.pods:
            removed = removed & frozenset(self.node.pods)
        removed |= self.spare
        room = self.freeing.room(removed, only)
        if room is None:
            return None
        fit = self.plugin.fit(self.node, self.request, self.now, room)
        if fit.ok and only is None:
            self.freeing.fitted(removed, room)
        return fit

    def fits(self, removed: frozenset[PodKey]) -> bool:
        fit = self.outcome(removed)
        return fit is not None and fit.ok

    def units(self) -> Mapping[str, Sequence[Holding]]:
        """Per card, what removals may release there."""
        return self.freeing.units()

    def card_free(self, card_id: str, removed: frozenset[PodKey]) -> tuple[int, int, int]:
        """What the card has free (MiB, cores, slots) once ``removed`` left."""
        card = next(c for c in self.node.cards if c.id == card_id)
        memory = card.total_memory_mib - card.used_memory_mib
        cores = card.total_cores - card.used_cores
        slots = card.count - card.used
        for unit in self.units().get(card_id, ()):
            if unit.holders and unit.holders <= removed:
                memory += unit.memory_mib
                cores += unit.cores
                slots += unit.slots
        return memory, cores, slots

    def least_top(
        self, card: str, freeable: Mapping[PodKey, int], want: tuple[int, int]
    ) -> int | None:
        """A lower bound of the most important victim's priority on ``card`` for a pod
        that asks one card (``want``: its MiB and cores), or None when no victims can make
        room there. ``freeable``: the pods that may be victims, with their priorities.

        What the request names is at most what it consumes, so what is released must
        free at least what the card lacks of it; releasing the units whose most important
        holder is least important first, the priority at which enough is freed bounds
        every set of victims from below."""
        memory, cores, slots = self.card_free(card, frozenset())
        lacking = (want[0] - memory, want[1] - cores, 1 - slots)
        releasable: list[tuple[int, int, int, int]] = []
        for unit in self.units().get(card, ()):
            if not unit.holders or not unit.holders <= freeable.keys():
                continue
            if not (unit.memory_mib or unit.cores or unit.slots):
                continue  # frees no room (a MIG instance's holders, by its card)
            top = max(freeable[k] for k in unit.holders)
            releasable.append((top, unit.memory_mib, unit.cores, unit.slots))
        if not releasable:
            return None
        releasable.sort()
        bound = releasable[0][0]  # at least one victim: the pod fits nowhere now
        for dimension, lack in enumerate(lacking, start=1):
            freed = 0
            for entry in releasable:
                if freed >= lack:
                    break
                freed += entry[dimension]
                bound = max(bound, entry[0])
            if freed < lack:
                return None
        return bound

    def holders_by_card(self) -> Mapping[str, frozenset[PodKey]]:
        """Per card, the pods whose shares (or claims) are on it."""
        return self.freeing.holders_by_card()


def awaits_earlier_victims(view: BooksView, pod: Pod, priority: int) -> bool:
    """kube-scheduler's ``PodEligibleToPreemptOthers``: a pod already nominated to a node
    where a lower-priority pod is terminating waits for it instead of preempting again
    (read from ``status.nominatedNodeName``, so it holds across restarts)."""
    nominated = (pod.get("status") or {}).get("nominatedNodeName")
    node = view.nodes.get(nominated) if isinstance(nominated, str) else None
    if node is None:
        return False
    entries = (view.pods.get(k) for k in node.pods)
    return any(e is not None and e.deleting and e.priority < priority for e in entries)


def waits_for_victims(view: BooksView, nomination: Nomination) -> bool:
    """The one nomination check: a victim of the nomination still runs, or a claim its
    victims held still holds (the claim controller has not released it yet)."""
    if view.victims_remain(nomination):
        return True
    return any(view.claims.holds_claim(k) for k in nomination.claims)


@dataclass(frozen=True, slots=True)
class Chosen(Generic[F]):
    """The node and victims chosen, the pod's fit once they are gone, and the claims
    their going releases (the preemptor waits for those too)."""

    candidate: preemption.Candidate
    fit: F
    claims: frozenset[str]
    #: Pods of the node leaving anyway that the preemptor counts on (it waits for them).
    spare: frozenset[PodKey] = frozenset()


def choose(
    view: BooksView,
    plugin: Plugin[R, F],
    request: R,
    pod: Pod,
    diagnosis: Diagnosis,
    now: float,
) -> Chosen[F] | str | None:
    """The node and victims DefaultPreemption chooses, or a sentence when every choice
    would evict a pod its budget protects, or only a whole group not of lower priority
    would make room (nothing is evicted), or None.

    Unlike kube-scheduler, which deletes its victims, ours leave through the Eviction API,
    which refuses an eviction a PodDisruptionBudget does not allow: a choice that violates
    a budget (the best there is) would evict the other victims for nothing. It is not made;
    the returned sentence says which budget stops it."""
    priority = preemption.priority_of(pod)
    if awaits_earlier_victims(view, pod, priority):
        return None
    groups = view.groups
    if not any(groups.priority(e) < priority for e in view.pods.values()):
        # Nobody to evict (nor a whole group to name: only one with a member of lower
        # priority is, ``victim_sets``): spare a removal trial on every node (a replay).
        return None
    budgets = _budgets_left(view)
    nodes = [
        node
        for node in sorted(view.nodes.values(), key=lambda n: n.order)
        if (failure := diagnosis.node_failures.get(node.name)) is not None
        and failure.code is Code.UNSCHEDULABLE  # else no release can fix what rules it out
    ]
    search = _Search(view, plugin, request, priority, budgets, now)
    for node in nodes:
        if search.visit(node):
            break
    chosen = preemption.pick_node(search.candidates)
    if chosen is None:
        return _shielded(search, nodes)
    if chosen.victims.budget_violations:
        # kube-scheduler's count spends a budget on the pods its walk put back too; the
        # Eviction API counts only the victims: a choice it lets through is made.
        recounted = _recounted(chosen.victims, budgets)
        if recounted is None or recounted.budget_violations:
            return preemption.blocked_message(chosen, budgets)
    trial = search.trials[chosen.node]
    fit = trial.outcome(chosen.victims.keys)
    # The search found that the pod fits once the victims leave; a fresh trial that
    # disagrees would be an engine bug, and must not evict anyone.
    if fit is None or not fit.ok:
        return None
    gone = chosen.victims.keys | trial.spare
    return Chosen(chosen, fit, trial.freeing.freed_claims(gone), trial.spare)


def _budgets_left(view: BooksView) -> list[disruption.Budget]:
    """The budgets less the victims of preemptions under way that they cover: those are
    counted once, across every preemptor (a gang's members, one after the other)."""
    budgets = view.budgets()
    if not budgets:
        return budgets
    leaving = [
        preemption.identity(preemption.Occupant(entry.key, 0, None, entry.labels))
        for entry in view.pods.values()
        if view.is_preempted(entry.key) and not entry.deleting
    ]
    return disruption.less_leaving(budgets, leaving) if leaving else budgets


def _shielded(search: _Search[R, F], nodes: Sequence[NodeEntry]) -> str | None:
    """No candidate: where a whole group not of lower priority than the preemptor stood
    in the way, whether evicting it would have made room (the sentence that says so), so
    that the preemptor does not wait silently behind it."""
    if not search.occupancy.shielded:
        return None
    lifted = _Search(
        search.view, search.plugin, search.request, search.priority, search.budgets, search.now
    )
    lifted.occupancy = Occupancy(search.view, search.priority, lift=True)
    where = search.occupancy.shielded_nodes
    for node in nodes:
        if node.name in where and lifted.visit(node):
            break
    chosen = preemption.pick_node(lifted.candidates)
    if chosen is None:
        return None
    return preemption.shielded_message(chosen, search.priority, lifted.occupancy.shielded)


class _Search(Generic[R, F]):
    """The candidate loop's state: the candidates so far, their trials, and the best
    (violations, most important victim) so far, which cards that cannot beat it are not
    walked for (``select_victims``)."""

    def __init__(
        self,
        view: BooksView,
        plugin: Plugin[R, F],
        request: R,
        priority: int,
        budgets: Sequence[disruption.Budget],
        now: float,
    ) -> None:
        self.view, self.plugin, self.request = view, plugin, request
        self.priority, self.budgets, self.now = priority, budgets, now
        self.limit = preemption.candidate_limit(len(view.nodes))
        self.candidates: list[preemption.Candidate] = []
        self.trials: dict[str, Trial[R, F]] = {}
        self.without_violations = 0
        self.beaten: tuple[int, int] | None = None
        #: Nodes left out as beaten: each counts as a candidate (it would have been one,
        #: no better than the best), so that the search stops as kube-scheduler's does.
        self.outdone = 0
        #: Who may be a victim, and the whole groups (``victim_sets``).
        self.occupancy = Occupancy(view, priority)

    def visit(self, node: NodeEntry) -> bool:
        """Weigh one node; whether the search has enough candidates to stop."""
        occupancy = self.occupancy
        weighed = occupancy.on(node)
        spare = occupancy.spare(node)
        lower = any(occupancy.unit_priority(o) < self.priority for o in weighed)
        if not lower and not spare:
            return False
        trial = Trial(self.view, self.plugin, node, self.request, self.now, spare)
        victims: preemption.Victims | None = None
        skipped = False
        if spare and trial.fits(frozenset()):
            victims = preemption.Victims((), 0)  # room enough once those leaving are gone
        elif lower:
            victims, skipped = select_victims(
                trial, self.priority, weighed, self.budgets, occupancy, self.beaten
            )
        if victims is None:
            self.outdone += skipped
        else:
            self.trials[node.name] = trial
            self.candidates.append(preemption.Candidate(node.name, victims))
            rank = preemption.victims_key(victims)[:2]
            self.beaten = rank if self.beaten is None else min(self.beaten, rank)
            self.without_violations += victims.budget_violations == 0
        enough = len(self.candidates) + self.outdone >= self.limit
        return bool(self.without_violations) and enough


def select_victims(
    trial: Trial[R, F],
    priority: int,
    weighed: Sequence[preemption.Occupant],
    budgets: Sequence[disruption.Budget],
    occupancy: Occupancy,
    beaten: tuple[int, int] | None = None,
) -> tuple[preemption.Victims | None, bool]:
    """The victims on one node, and whether a card was left out as beaten.

    kube-scheduler's walk (``preemption.select_victims``) over every lower-priority victim
    set (a pod, or a whole group: ``victim_sets``); where the dialect's shares are kept
    together by several pods (``Plugin.per_card_victims``), also the same walk over the
    holders of each card alone, the best of them by ``pick_node``'s order, with the budget
    violations their own eviction makes (``_recounted``). Why each card too: the walk puts
    the most important pods back first wherever their shares are, so it may keep a pod
    whose card alone would have made room and evict several pods of another card instead,
    or leave only choices a budget forbids where another card's holders were allowed.
    Restricted to one card's holders, the walk frees that card; it costs about one more
    fit per pod.

    ``beaten``: the (violations, most important victim's priority) of the best choice on
    another node so far: for a pod that asks one card, a card whose victims could only be
    worse (``Trial.least_top``) is not walked, and none whose victims cannot make room."""
    whole = occupancy.whole
    if not trial.plugin.per_card_victims:
        return preemption.select_victims(priority, weighed, budgets, trial.fits, whole), False
    want = trial.plugin.one_card(trial.request)
    best = None
    if want is None:
        best = _recounted(
            preemption.select_victims(priority, weighed, budgets, trial.fits, whole), budgets
        )
    by_key = {o.key: o for o in weighed}
    freeable = occupancy.freeable(weighed)
    walks: list[tuple[int, str, frozenset[PodKey]]] = []
    skipped = False
    for card, holders in trial.holders_by_card().items():
        top = trial.least_top(card, freeable, want) if want is not None else 0
        if top is None:
            continue
        if beaten is not None and (0, top) > beaten:
            skipped = True
            continue
        walks.append((top, card, holders))
    for top, card, holders in sorted(walks):
        if best is not None and preemption.victims_key(best)[:2] < (0, top):
            continue  # this node's best so far is better than the card could give
        alone = [by_key[k] for k in sorted(holders) if k in by_key]
        if not alone or (want is None and len(alone) == len(weighed)):
            continue
        if want is not None:
            found = _card_walk(trial, card, alone, priority, budgets, occupancy)
        else:
            found = preemption.select_victims(priority, alone, budgets, trial.fits, whole)
        found = _recounted(found, budgets)
        if found is not None and (
            best is None or preemption.victims_key(found) < preemption.victims_key(best)
        ):
            best = found
    if want is not None and best is None and not skipped:
        # No card alone makes room: what stands in the way may be the node's CPU or
        # memory, which pods holding no card free too.
        best = _recounted(
            preemption.select_victims(priority, weighed, budgets, trial.fits, whole), budgets
        )
    return best, skipped


def _card_walk(
    trial: Trial[R, F],
    card: str,
    alone: Sequence[preemption.Occupant],
    priority: int,
    budgets: Sequence[disruption.Budget],
    occupancy: Occupancy,
) -> preemption.Victims | None:
    """kube-scheduler's walk over one card's holders for a pod that asks one card: the
    fit on that card alone, with every lower-priority holder gone, says whether the card
    can take it at all and what it would take there (which does not depend on what else
    the card holds); a further trial that leaves the card less free memory, cores or
    slots than that is refused by arithmetic, and only the others are fitted (on that
    card alone). The chosen victims are fitted again on the whole node before anyone is
    evicted (``choose``)."""
    lower = occupancy.lower_sets(alone)
    if not lower:
        return None
    fit = trial.outcome(lower, only=card)
    if fit is None or not fit.ok:
        return None
    need = trial.plugin.taken_on_card(fit)

    def fits(removed: frozenset[PodKey]) -> bool:
        memory, cores, slots = trial.card_free(card, removed)
        if memory < need[0] or cores < need[1] or slots < need[2]:
            return False
        # Room enough: the card's fit (HAMi's rules beyond room: a card whose cores are
        # all taken refuses even a request of none, a whole card wants no other share).
        again = trial.outcome(removed, only=card)
        return again is not None and again.ok

    return preemption.select_victims(priority, alone, budgets, fits, occupancy.whole)


def _recounted(
    victims: preemption.Victims | None, budgets: Sequence[disruption.Budget]
) -> preemption.Victims | None:
    """The victims with the budget violations their own eviction makes. kube-scheduler
    counts a budget's allowance as spent by every lower-priority pod of the node in
    order of importance, also by pods the walk then puts back; the Eviction API counts
    only the pods evicted, and a choice it would let through must not be refused."""
    if victims is None:
        return None
    identities = [preemption.identity(p) for p in victims.pods]
    return preemption.Victims(victims.pods, len(disruption.blocking_budgets(identities, budgets)))


def eviction_order(
    victims: preemption.Victims, budgets: Sequence[disruption.Budget]
) -> tuple[preemption.Occupant, ...]:
    """Victims a budget covers first: if the Eviction API refuses one (its budget changed
    since it was read), none of the others has been evicted yet."""
    return tuple(
        sorted(victims.pods, key=lambda p: not disruption.covered(preemption.identity(p), budgets))
    )
