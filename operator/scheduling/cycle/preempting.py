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
  chosen victims before anyone is evicted.
- ``waits_for_victims``: the one nomination check (a preemptor waits while a victim of its
  nomination runs or a claim they held still holds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from vgpu_operator.scheduling.books import group_victims
from vgpu_operator.scheduling.books.entries import NodeEntry, Nomination
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.cycle.plugin import Fit, Plugin, Unit
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.preemption import disruption, preemption
from vgpu_operator.scheduling.status import Code, Diagnosis

R = TypeVar("R")
F = TypeVar("F", bound=Fit)


class Trial(Generic[R, F]):
    """The pod's fit on ``node`` as if some of its pods had left (see the module
    docstring); the books are read only."""

    def __init__(
        self, view: BooksView, plugin: Plugin[R, F], node: NodeEntry, request: R, now: float
    ) -> None:
        self.view = view
        self.plugin = plugin
        self.node = node
        self.request = request
        self.now = now
        self.freeing = plugin.freeing(node, request, now)

    def outcome(self, removed: frozenset[PodKey], only: str | None = None) -> F | None:
        """The fit once ``removed`` left (``only``: on that card alone); None when what
        they free cannot be read off the cards."""
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

    def units(self) -> Mapping[str, Sequence[Unit]]:
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


def occupants(view: BooksView, node: NodeEntry) -> list[preemption.Occupant]:
    """The pods on the node preemption may weigh: bound, not terminating, not a
    reservation, not a victim of a preemption under way, not a member of a PodGroup that
    may be disrupted only whole (``group_victims``)."""
    entries = (view.pods[k] for k in sorted(node.pods) if k in view.pods)
    return [
        preemption.Occupant(e.key, e.priority, e.started, e.labels)
        for e in entries
        if not e.deleting
        and not e.reserved
        and not view.is_preempted(e.key)
        and not group_victims.protected(e, view.single_groups)
    ]


def awaits_earlier_victims(view: BooksView, pod: Mapping[str, Any], priority: int) -> bool:
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


def choose(
    view: BooksView,
    plugin: Plugin[R, F],
    request: R,
    pod: Mapping[str, Any],
    diagnosis: Diagnosis,
    now: float,
) -> Chosen[F] | str | None:
    """The node and victims DefaultPreemption chooses, or a sentence when every choice
    would evict a pod its budget protects (nothing is evicted), or None.

    Unlike kube-scheduler, which deletes its victims, ours leave through the Eviction API,
    which refuses an eviction a PodDisruptionBudget does not allow: a choice that violates
    a budget (the best there is) would evict the other victims for nothing. It is not made;
    the returned sentence says which budget stops it."""
    priority = preemption.priority_of(pod)
    if awaits_earlier_victims(view, pod, priority):
        return None
    if not any(e.priority < priority for e in view.pods.values()):
        return None  # nobody to evict: spare a removal trial on every node (a replay)
    budgets = view.budgets()
    search = _Search(view, plugin, request, priority, budgets, now)
    for node in sorted(view.nodes.values(), key=lambda n: n.order):
        failure = diagnosis.node_failures.get(node.name)
        if failure is None or failure.code is not Code.UNSCHEDULABLE:
            continue  # no release can fix what rules this node out
        if search.visit(node):
            break
    chosen = preemption.pick_node(search.candidates)
    if chosen is None:
        return None
    if chosen.victims.budget_violations:
        return preemption.blocked_message(chosen, budgets)
    trial = search.trials[chosen.node]
    fit = trial.outcome(chosen.victims.keys)
    # The search found that the pod fits once the victims leave; a fresh trial that
    # disagrees would be an engine bug, and must not evict anyone.
    if fit is None or not fit.ok:
        return None
    return Chosen(chosen, fit, trial.freeing.freed_claims(chosen.victims.keys))


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

    def visit(self, node: NodeEntry) -> bool:
        """Weigh one node; whether the search has enough candidates to stop."""
        weighed = occupants(self.view, node)
        if not any(o.priority < self.priority for o in weighed):
            return False
        trial = Trial(self.view, self.plugin, node, self.request, self.now)
        victims, skipped = select_victims(trial, self.priority, weighed, self.budgets, self.beaten)
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
    beaten: tuple[int, int] | None = None,
) -> tuple[preemption.Victims | None, bool]:
    """The victims on one node, and whether a card was left out as beaten.

    kube-scheduler's walk (``preemption.select_victims``) over every lower-priority pod;
    where the dialect's shares are kept together by several pods
    (``Plugin.per_card_victims``), also the same walk over the holders of each card alone,
    the best of them by ``pick_node``'s order, with the budget violations their own
    eviction makes (``_recounted``). Why each card too: the walk puts the most important
    pods back first wherever their shares are, so it may keep a pod whose card alone would
    have made room and evict several pods of another card instead, or leave only choices a
    budget forbids where another card's holders were allowed. Restricted to one card's
    holders, the walk frees that card; it costs about one more fit per pod.

    ``beaten``: the (violations, most important victim's priority) of the best choice on
    another node so far: for a pod that asks one card, a card whose victims could only be
    worse (``Trial.least_top``) is not walked, and none whose victims cannot make room."""
    if not trial.plugin.per_card_victims:
        return preemption.select_victims(priority, weighed, budgets, trial.fits), False
    want = trial.plugin.one_card(trial.request)
    best = None
    if want is None:
        best = _recounted(
            preemption.select_victims(priority, weighed, budgets, trial.fits), budgets
        )
    by_key = {o.key: o for o in weighed}
    freeable = {o.key: o.priority for o in weighed if o.priority < priority}
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
            found = _card_walk(trial, card, alone, priority, budgets)
        else:
            found = preemption.select_victims(priority, alone, budgets, trial.fits)
        found = _recounted(found, budgets)
        if found is not None and (
            best is None or preemption.victims_key(found) < preemption.victims_key(best)
        ):
            best = found
    if want is not None and best is None and not skipped:
        # No card alone makes room: what stands in the way may be the node's CPU or
        # memory, which pods holding no card free too.
        best = _recounted(
            preemption.select_victims(priority, weighed, budgets, trial.fits), budgets
        )
    return best, skipped


def _card_walk(
    trial: Trial[R, F],
    card: str,
    alone: Sequence[preemption.Occupant],
    priority: int,
    budgets: Sequence[disruption.Budget],
) -> preemption.Victims | None:
    """kube-scheduler's walk over one card's holders for a pod that asks one card: the
    fit on that card alone, with every lower-priority holder gone, says whether the card
    can take it at all and what it would take there (which does not depend on what else
    the card holds); a further trial that leaves the card less free memory, cores or
    slots than that is refused by arithmetic, and only the others are fitted (on that
    card alone). The chosen victims are fitted again on the whole node before anyone is
    evicted (``choose``)."""
    lower = frozenset(o.key for o in alone if o.priority < priority)
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

    return preemption.select_victims(priority, alone, budgets, fits)


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
