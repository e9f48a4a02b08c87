"""Preemption on the DRA path: kube-scheduler's DefaultPreemption at the level of
consumable capacity.

The rules are the annotation path's (``preemption``: priority, ``preemptionPolicy:
Never``, PodDisruptionBudgets, victims put back most important first, fewest and least
important victims, the node order), with the DRA Fit as the filter. What differs is
what a victim frees: a pod on a DRA node holds nothing itself, its claims do. So a trial
with some pods removed releases the holds of the claims whose every holder is among
them (``claim_books.ClaimBooks.holders_on``): a claim shared by several pods only when
all of them go, an exclusive or whole-card (``hamiCore: false``) claim like any other,
and never a claim reserved for nobody or one a decision is still writing (no eviction
frees those). The quota the released claims held in the preemptor's namespace is
released on a copy of the ledger.

The preemptor's claims are not allocated while the victims run: the decision nominates
the node and holds the shares the victims free for it (a decision's hold on its claims,
``claim_books.hold_decided``, with a reserved entry for the pod), so no other pod takes
them. It is decided again once the victims' pods are gone and their claims no longer
hold (the claim controller deallocates a claim whose ``reservedFor`` emptied); until
then it waits (``victims_remain``). Its claims are then allocated as any pod's, through
the ordinary decision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpu_operator.devices import dra
from vgpu_operator.scheduling.books import claim_ledger, group_victims, pod_entries
from vgpu_operator.scheduling.books.entries import NodeEntry, Nomination
from vgpu_operator.scheduling.books.view import BooksView, BooksWriter
from vgpu_operator.scheduling.cycle import node_gate
from vgpu_operator.scheduling.cycle.claim_decision import ClaimDialect
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import claim_mig, claims
from vgpu_operator.scheduling.dialects.claims.claim_fit import ClaimsOutcome
from vgpu_operator.scheduling.dialects.claims.claim_wire import consumer
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.preemption import disruption, preemption
from vgpu_operator.scheduling.status import Code, Diagnosis


@dataclass(frozen=True, slots=True)
class HeldClaim:
    """A claim's hold on one node, as a trial releases it."""

    key: str
    namespace: str
    #: The uids of the pods that keep it (empty: no eviction releases it).
    holders: frozenset[str]
    bookings: tuple[placement.Booking, ...]
    #: The device of every result it holds: a MIG instance gives its counters back
    #: (``claim_mig.ledger``) when the hold is released.
    devices: tuple[str, ...] = ()

    def quota_sums(self) -> dict[str, tuple[int, int]]:
        memory = sum(b.memory_mib for b in self.bookings)
        return {dra.VENDOR: (memory, sum(b.cores for b in self.bookings))}


class ClaimRemovalTrial:
    """Fit a pod's claims on one node as if some of its pods had left, with the holds of
    the claims they alone kept released (on copies of the cards and the quota ledger)."""

    def __init__(
        self,
        view: BooksView,
        dialect: ClaimDialect,
        node: NodeEntry,
        job: placement.Job,
        wanted: claims.PodClaims,
        now: float,
    ) -> None:
        self._view = view
        self._dialect = dialect
        self._node = node
        self._job = job
        self._wanted = wanted
        self._now = now
        view.refresh(node)
        by_id = {card.id: card for card in node.cards}
        self.held = [
            HeldClaim(
                h.key,
                h.namespace,
                holders,
                tuple(claim_ledger.bookings(h, by_id)),
                tuple(s.device for s in h.shares),
            )
            for h, holders in view.claims.holders_on(node.name)
        ]
        self._wanted_cache: tuple[int, int] | None = None
        self._by_card: dict[str, list[tuple[HeldClaim, list[placement.Booking]]]] | None = None
        mig = view.claims.mig_of(node.name)
        #: Each MIG instance's card: its holders stand in the way on that card.
        self._mig_cards = {} if mig is None else {d.name: d.card for d in mig.pool.devices}

    @property
    def simple(self) -> bool:
        """Whether the pod asks one card (one claim to allocate, one request of count 1, no
        constraint) and no quota limits it: then each card is judged alone by arithmetic
        (``_card_walk``)."""
        pending = self._wanted.pending
        if len(pending) != 1 or pending[0].match_attributes or len(pending[0].requests) != 1:
            return False
        if claim_mig.is_mig(pending[0]):
            return False  # an instance is fitted by counters, not by a card's free room
        job = self._job
        return pending[0].requests[0].count == 1 and not job.quota.has_limits(job.namespace)

    def gate_open(self, removed: frozenset[PodKey]) -> bool:
        """Whether the node gate (CPU, memory, pod count...) lets the pod in once
        ``removed`` left."""
        pods = self._view.pods
        leaving = [pods[k] for k in sorted(removed) if k in pods]
        timeout = self._view.inventory_timeout_s
        return (
            node_gate.check(self._node, self._job, self._now, timeout, claims=True, leaving=leaving)
            is None
        )

    def card_free(self, card_id: str, removed: frozenset[PodKey]) -> tuple[int, int, int]:
        """What the card has free (MiB, cores, slots) once ``removed`` left."""
        card = next(c for c in self._node.cards if c.id == card_id)
        memory = card.total_memory_mib - card.used_memory_mib
        cores = card.total_cores - card.used_cores
        slots = card.count - card.used
        for held in self.freed(removed):
            for booking in held.bookings:
                if booking.uuid == card_id:
                    memory += booking.memory_mib
                    cores += booking.cores
                    slots += booking.slots
        return memory, cores, slots

    def least_top(self, card: str, freeable: Mapping[str, int]) -> int | None:
        """A lower bound of the most important victim's priority on ``card`` for a pod
        that asks one card, or None when no victims can make room there. ``freeable``:
        the uids (and priorities) of the pods that may be victims.

        What the request names (memory, cores, one slot) is at most what it consumes, so
        the claims released must free at least what the card lacks of it; releasing the
        claims whose most important holder is least important first, the priority at
        which enough is freed bounds every set of victims from below."""
        want_memory, want_cores = self._wanted_amounts()
        memory, cores, slots = self.card_free(card, frozenset())
        lacking = (want_memory - memory, want_cores - cores, 1 - slots)
        releasable: list[tuple[int, int, int, int]] = []
        for held, on_card in self._held_by_card().get(card, ()):
            if not held.holders or not held.holders <= freeable.keys():
                continue
            top = max(freeable[uid] for uid in held.holders)
            releasable.append(
                (
                    top,
                    sum(b.memory_mib for b in on_card),
                    sum(b.cores for b in on_card),
                    sum(b.slots for b in on_card),
                )
            )
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

    def _wanted_amounts(self) -> tuple[int, int]:
        """What the one request names of memory (MiB) and cores, read once per trial
        (``least_top`` asks it for every card of every candidate node)."""
        if self._wanted_cache is None:
            [request] = self._wanted.pending[0].requests
            memory = int(-(-request.capacity.get(dra.MEMORY, 0) // dra.MIB))
            self._wanted_cache = (memory, int(-(-request.capacity.get(dra.CORES, 0) // 1)))
        return self._wanted_cache

    def _held_by_card(self) -> dict[str, list[tuple[HeldClaim, list[placement.Booking]]]]:
        """Per card, the holds with bookings on it and those bookings (built once)."""
        if self._by_card is None:
            self._by_card = {}
            for held in self.held:
                on: dict[str, list[placement.Booking]] = {}
                for booking in held.bookings:
                    on.setdefault(booking.uuid, []).append(booking)
                for card, bookings in on.items():
                    self._by_card.setdefault(card, []).append((held, bookings))
        return self._by_card

    def uid_of(self, key: PodKey) -> str:
        entry = self._view.pods.get(key)
        return "" if entry is None else entry.uid

    def pods_by_uid(self) -> dict[str, PodKey]:
        """The node's pods by uid (a claim names its holders by uid)."""
        pods = self._view.pods
        return {pods[k].uid: k for k in self._node.pods if k in pods and pods[k].uid}

    def holders_by_card(self) -> dict[str, frozenset[str]]:
        """Per card, the uids of the pods whose claims hold shares of it."""
        cards: dict[str, set[str]] = {}
        for held in self.held:
            for booking in held.bookings:
                cards.setdefault(booking.uuid, set()).update(held.holders)
            for device in held.devices:
                card = self._mig_cards.get(device)
                if card is not None:  # a MIG instance's holders, by its card
                    cards.setdefault(card.lower(), set()).update(held.holders)
        return {card: frozenset(uids) for card, uids in cards.items()}

    def freed(self, removed: frozenset[PodKey]) -> list[HeldClaim]:
        """The holds released once ``removed`` have left: every holder among them."""
        pods = self._view.pods
        uids = {pods[k].uid for k in removed if k in pods and pods[k].uid}
        return [h for h in self.held if h.holders and h.holders <= uids]

    def fits(self, removed: frozenset[PodKey]) -> bool:
        return self.outcome(removed).ok

    def outcome(self, removed: frozenset[PodKey], only: str | None = None) -> ClaimsOutcome:
        """The claims' Fit once ``removed`` left (``only``: on that card alone)."""
        pods = self._view.pods
        leaving = [pods[k] for k in sorted(removed) if k in pods]
        freed = self.freed(removed)
        cards = [card.copy() for card in self._node.cards if only is None or card.id == only]
        for held in freed:
            if not placement.shift(cards, {"claims": held.bookings}, -1):
                return ClaimsOutcome(False)  # cards a release cannot be read off: no trial
        job = self._job
        released = [h for h in freed if h.namespace == job.namespace]
        if released and job.quota.has_limits(job.namespace):
            ledger = job.quota.copy()
            for held in released:
                ledger.remove_sums(held.namespace, held.quota_sums())
            job = dataclasses.replace(job, quota=ledger)
        instances = [d for held in freed for d in held.devices]
        return self._dialect.fit_on(
            self._node, job, self._wanted, self._now, cards, leaving, instances
        )


@dataclass(frozen=True, slots=True)
class Chosen:
    """The node and victims chosen, the preemptor's Fit once they are gone, and the
    holds their going releases."""

    candidate: preemption.Candidate
    outcome: ClaimsOutcome
    claims: frozenset[str]


def occupants(view: BooksView, node: NodeEntry) -> list[preemption.Occupant]:
    """The pods on the node preemption may weigh: bound, not terminating, not a
    reservation, not a victim of a preemption under way."""
    entries = (view.pods[k] for k in sorted(node.pods) if k in view.pods)
    return [
        preemption.Occupant(e.key, e.priority, e.started, e.labels)
        for e in entries
        if not e.deleting
        and not e.reserved
        and not view.is_preempted(e.key)
        and not group_victims.protected(e, view.single_groups)
    ]


def select_victims(
    trial: ClaimRemovalTrial,
    priority: int,
    weighed: Sequence[preemption.Occupant],
    budgets: Sequence[disruption.Budget],
    beaten: tuple[int, int] | None = None,
) -> tuple[preemption.Victims | None, bool]:
    """The victims on one node, and whether a card was left out as beaten:
    kube-scheduler's walk (``preemption.select_victims``) over every lower-priority pod,
    and the same walk over the holders of each card alone, the best of them by
    ``pick_node``'s order.

    Why each card too: the walk puts the most important pods back first wherever their
    shares are, so it may keep a pod whose card alone would have made room and evict
    several pods of another card instead (three victims where one does), or leave only
    choices a budget forbids where another card's holders were allowed. Restricted to
    one card's holders, the walk frees that card; it costs about one more Fit per pod.

    ``beaten``: the (violations, most important victim's priority) of the best choice on
    another node so far: for a pod that asks one card, a card whose victims could only be
    worse (``least_top``) is not walked, and none whose victims cannot make room."""
    simple = trial.simple
    best = None
    if not simple:
        best = _recounted(
            preemption.select_victims(priority, weighed, budgets, trial.fits), budgets
        )
    by_key = {o.key: o for o in weighed}
    pods = trial.pods_by_uid()
    freeable = {trial.uid_of(o.key): o.priority for o in weighed if o.priority < priority}
    walks: list[tuple[int, str, frozenset[str]]] = []
    skipped = False
    for card, holders in trial.holders_by_card().items():
        top = trial.least_top(card, freeable) if simple else 0
        if top is None:
            continue
        if beaten is not None and (0, top) > beaten:
            skipped = True
            continue
        walks.append((top, card, holders))
    for top, card, holders in sorted(walks):
        if best is not None and preemption.victims_key(best)[:2] < (0, top):
            continue  # this node's best so far is better than the card could give
        keys = {pods[uid] for uid in holders if uid in pods}
        alone = [by_key[k] for k in sorted(keys) if k in by_key]
        if not alone or (not simple and len(alone) == len(weighed)):
            continue
        if simple:
            found = _card_walk(trial, card, alone, priority, budgets)
        else:
            found = preemption.select_victims(priority, alone, budgets, trial.fits)
        found = _recounted(found, budgets)
        if found is not None and (
            best is None or preemption.victims_key(found) < preemption.victims_key(best)
        ):
            best = found
    if simple and best is None and not skipped:
        # No card alone makes room: what stands in the way may be the node's CPU or
        # memory, which pods holding no card free too.
        best = _recounted(
            preemption.select_victims(priority, weighed, budgets, trial.fits), budgets
        )
    return best, skipped


def _card_walk(
    trial: ClaimRemovalTrial,
    card: str,
    alone: Sequence[preemption.Occupant],
    priority: int,
    budgets: Sequence[disruption.Budget],
) -> preemption.Victims | None:
    """kube-scheduler's walk over one card's holders for a pod that asks one card: the
    claim's Fit on that card alone, with every lower-priority holder gone, says whether
    the card can take it at all and what it would consume there (which does not depend
    on what else the card holds); a further trial that leaves the card less free memory,
    cores or slots than that is refused by arithmetic, and only the others are fitted
    (on that card alone). The chosen victims are fitted again on the whole node before
    anyone is evicted (``choose``)."""
    lower = frozenset(o.key for o in alone if o.priority < priority)
    if not lower:
        return None
    outcome = trial.outcome(lower, only=card)
    if not outcome.ok:
        return None
    [picks] = outcome.picks.values()
    need = picks[0].consumption

    def fits(removed: frozenset[PodKey]) -> bool:
        memory, cores, slots = trial.card_free(card, removed)
        if memory < need.memory_mib or cores < need.cores or slots < need.slots:
            return False
        # Room enough: the card's Fit (HAMi's rules beyond room: a card whose cores are
        # all taken refuses even a request of none, a whole card wants no other share).
        return trial.outcome(removed, only=card).ok

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


def choose(
    view: BooksView,
    dialect: ClaimDialect,
    job: placement.Job,
    pod: Mapping[str, Any],
    wanted: claims.PodClaims,
    diagnosis: Diagnosis,
    now: float,
) -> Chosen | str | None:
    """The node and victims DefaultPreemption chooses for the pod's claims, or a sentence
    when every choice would evict a pod its budget protects (nothing is evicted), or None."""
    priority = preemption.priority_of(pod)
    budgets = view.budgets()
    limit = preemption.candidate_limit(len(view.nodes))
    candidates: list[preemption.Candidate] = []
    trials: dict[str, ClaimRemovalTrial] = {}
    without_violations = 0
    #: The best (violations, most important victim) so far: cards that cannot beat it
    #: are not walked (``select_victims``).
    beaten: tuple[int, int] | None = None
    outdone = 0
    for node in sorted(view.nodes.values(), key=lambda n: n.order):
        if wanted.node is not None and node.name != wanted.node:
            continue  # claims allocated already pin the pod to their node
        failure = diagnosis.node_failures.get(node.name)
        if failure is None or failure.code is not Code.UNSCHEDULABLE:
            continue  # no release can fix what rules this node out
        weighed = occupants(view, node)
        if not any(o.priority < priority for o in weighed):
            continue
        trial = ClaimRemovalTrial(view, dialect, node, job, wanted, now)
        victims, skipped = select_victims(trial, priority, weighed, budgets, beaten)
        if victims is None:
            # A node left out as beaten counts as a candidate (it would have been one,
            # no better than the best), so the search stops as kube-scheduler's does.
            outdone += skipped
            if without_violations and len(candidates) + outdone >= limit:
                break
            continue
        trials[node.name] = trial
        candidates.append(preemption.Candidate(node.name, victims))
        rank = preemption.victims_key(victims)[:2]
        beaten = rank if beaten is None else min(beaten, rank)
        without_violations += victims.budget_violations == 0
        if without_violations and len(candidates) + outdone >= limit:
            break
    chosen = preemption.pick_node(candidates)
    if chosen is None:
        return None
    if chosen.victims.budget_violations:
        return preemption.blocked_message(chosen, budgets)
    trial = trials[chosen.node]
    outcome = trial.outcome(chosen.victims.keys)
    # The search found that the claims fit once the victims leave; a fresh trial that
    # disagrees would be an engine bug, and must not evict anyone.
    if not outcome.ok:
        return None
    freed = frozenset(h.key for h in trial.freed(chosen.victims.keys))
    return Chosen(chosen, outcome, freed)


def hold(
    books: BooksWriter,
    key: PodKey,
    job: placement.Job,
    pod: Mapping[str, Any],
    wanted: claims.PodClaims,
    chosen: Chosen,
    until: float,
) -> None:
    """Nominate the node and hold the shares the victims free for the preemptor, so
    that no other pod takes them while the victims terminate and their claims are
    released. Given up by ``cancel_preemption``, the nomination's expiry, or the pod's
    next decision once the victims are gone."""
    node = chosen.candidate.node
    books.nominate(key, Nomination(node, chosen.candidate.victims.keys, until, chosen.claims))
    picks = chosen.outcome.picks
    books.hold_decided(
        key, node, {c.key: (c.namespace, picks[c.key]) for c in wanted.pending if c.key in picks}
    )
    books.add_pod(pod_entries.reservation(key, job, pod, node, {}, uid=consumer(pod)["uid"]))


def victims_remain(view: BooksView, nomination: Nomination) -> bool:
    """Whether a victim of the nomination still runs, or a claim its victims held still
    holds (not deallocated yet): the preemptor waits rather than preempting again."""
    if view.victims_remain(nomination):
        return True
    return any(view.claims.holds_claim(k) for k in nomination.claims)


def eviction_order(
    chosen: Chosen, budgets: Sequence[disruption.Budget]
) -> tuple[preemption.Occupant, ...]:
    """Victims a budget covers first: if the Eviction API refuses one (its budget
    changed since it was read), none of the others has been evicted yet."""
    return tuple(
        sorted(
            chosen.candidate.victims.pods,
            key=lambda p: not disruption.covered(preemption.identity(p), budgets),
        )
    )
