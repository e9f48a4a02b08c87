"""One decision, top to bottom: ``Cycle.schedule`` (``cluster.ClusterState`` is its face).

For one pending pod: admission defaults (and refusals), one parsed job, the node walk
(indexed: best-ranked first with O(1) rule-outs; reference: every node, best score), the
Fit on the chosen node's cards, a reservation in the books so the next decision cannot
take the same shares, the annotations a Binding must carry; or, when no node fits, the
per-node diagnosis and, where allowed, preemption (kube-scheduler's DefaultPreemption
with the device Fit as the filter). The books it reads and writes are ``books``.

Two paths decide, and must decide the same (the tests compare them): the reference
path fits the pod on every node and takes the best node score, as HAMi does; the
indexed path visits nodes best-score first, skips nodes whose free-capacity summary
rules them out in O(1), and stops at the first node that fits.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpu_operator.devices import dra, model
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.books import allocation_gate, group_victims
from vgpu_operator.scheduling.books.books import DEFAULT_NOMINATION_TIMEOUT_S, Books
from vgpu_operator.scheduling.books.entries import NodeEntry, Nomination, PodEntry
from vgpu_operator.scheduling.books.view import BooksView, BooksWriter
from vgpu_operator.scheduling.cycle import (
    binding,
    claim_decision,
    claim_preemption,
    claim_verdicts,
    node_gate,
    reference_walk,
    verdict_kin,
    verdicts,
)
from vgpu_operator.scheduling.cycle.claim_decision import ClaimWrite
from vgpu_operator.scheduling.cycle.fragmentation_order import Placer
from vgpu_operator.scheduling.cycle.judged import JudgedView
from vgpu_operator.scheduling.cycle.pod_read import PodRead, read_pod
from vgpu_operator.scheduling.cycle.removal_trial import RemovalTrial
from vgpu_operator.scheduling.dialects.annotation import admission, placement
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.scheduling.preemption import disruption, preemption
from vgpu_operator.scheduling.status import Code, Diagnosis, NodeFailure, Reason


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of scheduling one pod.

    ``annotations`` are what the Binding must carry (``hami.io/vgpu-node``,
    ``hami.io/vgpu-time``, ``hami.io/vgpu-devices-to-allocate``, ``-allocated``,
    ``hami.io/bind-phase``...). ``rejected`` is set when admission would refuse the pod
    (e.g. over quota); ``diagnosis`` when no node fits. ``devices`` are named as the
    annotations name them (a MIG instance of a card that publishes its profiles by the
    card's plain UUID; its profile and placement are in ``hami.io/vgpu-mig-allocations``).

    A pod that fits nowhere but may preempt is not scheduled yet: ``nominated_node``
    names the node it will take once ``victims`` (to evict now) are gone, ``devices``
    are the shares held for it meanwhile. ``nominated_node`` without ``victims``: the
    pod still waits for the victims of an earlier decision to terminate.
    """

    pod: PodKey
    scheduled: bool
    node: str | None = None
    devices: Mapping[str, model.PodSingleDevice] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    diagnosis: Diagnosis | None = None
    rejected: str | None = None
    nominated_node: str | None = None
    victims: tuple[PodKey, ...] = ()
    #: The victims' uids as the books saw them (an Eviction's precondition).
    victim_uids: Mapping[PodKey, str] = field(default_factory=dict)
    #: What the engine adjusted in the request (cores above 100 booked as 100): the
    #: runtime tells the pod's owner in a Warning Event.
    warnings: tuple[str, ...] = ()
    #: Why the pod, which fits nowhere, does not preempt although victims exist: each
    #: choice would evict a pod its PodDisruptionBudget protects (nothing is evicted).
    preemption_blocked: str | None = None
    #: Per vendor and container, the score of each card in ``devices`` (HAMi's
    #: DeviceListsScore when the container's cards were sorted).
    card_scores: Mapping[str, tuple[tuple[float, ...], ...]] = field(default_factory=dict)
    #: Only when asked (``schedule(..., explain=True)``): every node the pod fits on, with
    #: its score before the pod (HAMi's NodeScore: usage of slots, cores and memory).
    node_scores: Mapping[str, float] = field(default_factory=dict)
    #: When no node fits: the verdict the diagnosis was read from, shared by every pod of
    #: the same shape and kept current (``verdicts``); the queue's hint for the pod.
    verdict: verdicts.Verdict | None = None
    #: The DRA path: what to write on the pod's claims before its Binding (allocations
    #: and reservations, ``claim_decision``).
    claim_writes: tuple[ClaimWrite, ...] = ()
    #: The DRA path: a claim the pod names is not in the books yet (the pod waits for
    #: it to arrive, not for its own change).
    waits_for_claims: bool = False


AdmissionResult = admission.AdmissionResult


@dataclass(slots=True)
class Settings:
    """How the cycle decides (the runtime and tests set them)."""

    #: Whether a pod that fits nowhere may preempt (the caller must then evict).
    preemption_enabled: bool = False
    #: Decide with the reference path only when False (tests compare the two).
    use_index: bool = True
    #: How long a preemptor's hold on the shares its victims free lasts without a bind.
    nomination_timeout_s: float = DEFAULT_NOMINATION_TIMEOUT_S
    #: Keep a verdict per shape of pod that fits nowhere (off on a what-if's overlay,
    #: whose changes the books' change log does not number).
    verdicts: bool = True


class Cycle:
    """The decision cycle over the books: reads them through the view, writes only
    reservations and nominations. ``cluster.ClusterState`` is its face."""

    def __init__(self, books: BooksWriter, settings: Settings) -> None:
        self.books = books
        #: Typed as the read view: every read goes through it.
        self.view: BooksView = books
        self.settings = settings
        #: The ``fragmentation`` policy's mix of requests seen and its node walk.
        self.placer = Placer(indexed=isinstance(books, Books))
        self._claims = claim_decision.ClaimDialect(books, self.placer)
        #: One verdict per shape of pod that fits nowhere, alive while a pod holds it.
        self._verdicts: weakref.WeakValueDictionary[str, verdicts.Verdict] = (
            weakref.WeakValueDictionary()
        )
        #: New shapes' verdicts start from the judgements of kin shapes (``verdict_kin``).
        self._kin = verdict_kin.Kin()
        #: What verdicts read of the books: the view, with this cycle's node gate and Fit.
        self.judged = JudgedView(self.view, self.node_gate_of, self._try_node)

    def admit(self, pod: Mapping[str, Any]) -> admission.AdmissionResult:
        return admission.admit(pod, self.view.config, self.view.vendors, self.view.quota)

    def parse(self, key: PodKey, pod: Mapping[str, Any]) -> PodRead:
        """The pod read once (``pod_read``): a waiting pod retried with the same object
        (the runtime keeps it until the pod changes) and the same config and quota limits
        reuses the last read instead of replaying admission on a copy."""
        cached, view = self.books.pod_read(key), self.view
        extended = self._claims.extended_resources()  # our classes' extended resources
        if isinstance(cached, PodRead) and cached.fresh(pod, view.epoch, extended):
            return cached
        read = read_pod(key, pod, view.epoch, self.admit, view, extended)
        self.books.keep_read(key, read)
        return read

    def _verdict_of(
        self, read: PodRead, shape: str = "", judge: verdicts.NodeJudge | None = None
    ) -> verdicts.Verdict | None:
        """The verdict of the pod's shape (``shape``, else the read's), shared with every
        pod of that shape (one made with this epoch's parse: a config or quota limit
        change starts a new one). ``judge``: how the dialect judges a node (the DRA
        path's; None: the annotation path's Fit)."""
        if read.judged is None:
            return None
        shape = shape or read.shape
        verdict = self._verdicts.get(shape)
        if verdict is None or verdict.job_epoch != self.view.epoch:
            verdict = self._kin.new(shape, read.judged, self.view.epoch, judge)
            self._verdicts[shape] = verdict
        elif judge is not None:
            verdict.dialect = judge  # the claims as read now
        read.verdict = verdict
        return verdict

    def _keeps_verdicts(self) -> bool:
        return self.settings.use_index and self.settings.verdicts

    def schedule(self, pod: Mapping[str, Any], now: float, explain: bool = False) -> Decision:
        """Decide one pod. ``explain`` also fits it on every other node, to report each
        candidate node's score (``Decision.node_scores``; ``simulate`` asks for it)."""
        key = pod_key(pod)
        self.books.expire_nominations(now)
        read = self.parse(key, pod)
        if read.uses_claims:
            return self._schedule_claims(read, now, explain)
        held = self.view.pods.get(key)
        nomination = self.books.pop_nomination(key)
        self.books.drop_pod(key)
        verdict = self._verdict_of(read) if self._keeps_verdicts() else None
        if read.admitted is not None and read.refused:
            if verdict is None:
                diagnosis = self._diagnose(read.admitted.pod, now)
            else:
                verdict.refresh(self.judged, now, {}, verdict.changed(self.judged, now))
                diagnosis = verdict.diagnosis()
            message = read.admitted.message
            return Decision(key, False, diagnosis=diagnosis, rejected=message, verdict=verdict)
        if read.job is None:
            failure = Diagnosis({}, len(self.view.nodes), error=read.error)
            return Decision(key, False, diagnosis=failure)
        # Every pod's request counts in the mix the ``fragmentation`` policy weighs, and
        # its Job carries the mix for Fit's card order (kept in the read: set once).
        self.placer.observe(key, read.job)
        job = read.job = self.placer.with_mix(read.job)
        # What the search learns of each node it fits is kept for the diagnosis, which
        # then judges only the nodes the search did not fit. With a verdict on the pod's
        # shape, only the nodes changed since it was made can fit (the others were all
        # ruled out), so the search visits those only.
        tried: dict[str, placement.Outcome] = {}
        judged: dict[str, NodeFailure] = {}
        changed = verdict.changed(self.judged, now) if verdict is not None else None
        found = self.find(job, now, tried, changed, verdict, judged)
        if found is not None:
            return self._reserve(read, job, found, tried, now, explain)
        if verdict is None:
            diagnosis = self._diagnose(read.subject, now, job, tried)
        else:
            verdict.refresh(self.judged, now, tried, changed, judged)
            diagnosis = verdict.diagnosis()
        if nomination is not None and held is not None and self.view.victims_remain(nomination):
            # kube-scheduler's rule: a nominated pod whose victims are still terminating
            # waits for them rather than preempting again.
            self.books.nominate(key, nomination)
            self.books.add_pod(held)
            node = nomination.node
            return Decision(key, False, diagnosis=diagnosis, nominated_node=node, verdict=verdict)
        preempting = self._preempt(job, read.subject, diagnosis, now)
        if preempting is None:
            return Decision(key, False, diagnosis=diagnosis, verdict=verdict)
        if isinstance(preempting, str):
            blocked = preempting
            return Decision(
                key, False, diagnosis=diagnosis, verdict=verdict, preemption_blocked=blocked
            )
        chosen, outcome = preempting
        return self.nominate(key, job, read.subject, chosen, outcome, diagnosis, now)

    def _reserve(
        self,
        read: PodRead,
        job: placement.Job,
        found: tuple[NodeEntry, placement.Outcome],
        tried: Mapping[str, placement.Outcome],
        now: float,
        explain: bool,
    ) -> Decision:
        """Book the pod's shares on the node found, until its Binding (``confirm``)."""
        node, outcome = found
        node_scores = self._candidate_scores(job, now, found, tried) if explain else {}
        annotations = binding.hami_annotations(self.view, node.name, outcome, now)
        devices = {v: pd for v, pd in outcome.devices.items() if any(pd)}
        entry = PodEntry(
            key=read.key,
            namespace=job.namespace,
            node=node.name,
            requests=job.resources,
            devices=devices,
            bookings=placement.collapse(devices, job.init_count),
            reserved=True,
            priority=read.priority,
            labels=dict((read.subject.get("metadata") or {}).get("labels") or {}),
            # Its Binding says bind-phase allocating: once bound, the node's gate is shut,
            # timed from the Binding's answer (``confirm``), not from this decision.
            allocating_since=allocation_gate.UNTIMED if any(devices.values()) else None,
        )
        self.books.add_pod(entry)
        return Decision(
            read.key,
            True,
            node.name,
            binding.wire_devices(self.view, node.name, devices),
            annotations,
            warnings=read.admitted.warnings if read.admitted is not None else (),
            card_scores={v: outcome.card_scores.get(v, ()) for v in devices},
            node_scores=node_scores,
        )

    def _schedule_claims(self, read: PodRead, now: float, explain: bool) -> Decision:
        """The DRA dialect (``claim_decision``) after the same read, node walk and node
        gate; a pod that fits nowhere gets a verdict judged by the dialect, and may preempt.
        A preemptor waits for its victims and their claims' release, the shares they free
        held for it meanwhile (``claim_preemption``)."""
        key = read.key
        nomination = self.books.pop_nomination(key)
        if nomination is not None and claim_preemption.victims_remain(self.view, nomination):
            self.books.nominate(key, nomination)
            return Decision(key, False, nominated_node=nomination.node)
        self.books.release_decided(key)
        self.books.drop_pod(key)
        if read.job is None:
            failure = Diagnosis({}, len(self.view.nodes), error=read.error)
            return Decision(key, False, diagnosis=failure)
        kept = claim_verdicts.KeptFailures(self._verdicts, read, self.judged, now)
        known = kept if self._keeps_verdicts() else None
        placed = self._claims.place(key, read.source, read.job, now, explain, known)
        if placed.node is None:
            verdict = None
            if placed.judge is not None and self._keeps_verdicts():
                shape = read.shape + placed.judge.shape
                verdict = self._verdict_of(read, shape, placed.judge)
                if verdict is not None and placed.diagnosis is not None:
                    failures = placed.diagnosis.node_failures
                    verdict.refresh(self.judged, now, {}, kept.changed_for(verdict), failures)
            decision = Decision(
                key,
                False,
                diagnosis=placed.diagnosis,
                waits_for_claims=placed.waits_for_claims,
                verdict=verdict,
            )
            return self._preempt_claims(read, read.job, placed, decision, now)
        return Decision(
            key,
            True,
            placed.node,
            node_scores=placed.node_scores,
            claim_writes=placed.writes,
            card_scores={dra.VENDOR: (placed.card_scores,)} if placed.card_scores else {},
        )

    def _preempt_claims(
        self,
        read: PodRead,
        job: placement.Job,
        placed: claim_decision.ClaimPlacement,
        decision: Decision,
        now: float,
    ) -> Decision:
        """DefaultPreemption for a pod whose claims fit nowhere (``claim_preemption``):
        the decision nominating a node with its victims, or ``decision`` unchanged."""
        pod = read.source
        if (
            not self.settings.preemption_enabled
            or placed.wanted is None
            or placed.diagnosis is None
            or not preemption.eligible(pod)
            or self._awaits_earlier_victims(pod, preemption.priority_of(pod))
        ):
            return decision
        chosen = claim_preemption.choose(
            self.view, self._claims, job, pod, placed.wanted, placed.diagnosis, now
        )
        if chosen is None:
            return decision
        if isinstance(chosen, str):
            return dataclasses.replace(decision, preemption_blocked=chosen)
        until = now + self.settings.nomination_timeout_s
        claim_preemption.hold(self.books, read.key, job, pod, placed.wanted, chosen, until)
        victims = claim_preemption.eviction_order(chosen, self.view.budgets())
        uids = {p.key: self.view.pods[p.key].uid for p in victims if p.key in self.view.pods}
        keys = tuple(p.key for p in victims)
        return dataclasses.replace(
            decision, nominated_node=chosen.candidate.node, victims=keys, victim_uids=uids
        )

    def _candidate_scores(
        self,
        job: placement.Job,
        now: float,
        found: tuple[NodeEntry, placement.Outcome],
        tried: Mapping[str, placement.Outcome],
    ) -> dict[str, float]:
        """Every node the pod fits on, in node order, with its score before the pod."""
        scores: dict[str, float] = {}
        for node in sorted(self.view.nodes.values(), key=lambda n: n.order):
            if node.name in tried:
                continue
            if node is not found[0] and not self._try_node(node, job, now).ok:
                continue
            self.view.refresh(node)
            scores[node.name] = node.score
        return scores

    def _preempt(
        self, job: placement.Job, pod: Mapping[str, Any], diagnosis: Diagnosis, now: float
    ) -> tuple[preemption.Candidate, placement.Outcome] | str | None:
        """The node and victims kube-scheduler's DefaultPreemption would choose, with
        our Fit deciding whether the pod fits once they are gone (module preemption).

        Unlike kube-scheduler, which deletes its victims, ours leave through the Eviction
        API, which refuses an eviction a PodDisruptionBudget does not allow: a choice
        that violates a budget (the best there is) would evict the other victims for
        nothing. It is not made; the returned sentence says which budget stops it."""
        if not self.settings.preemption_enabled or not preemption.eligible(pod) or diagnosis.error:
            return None
        priority = preemption.priority_of(pod)
        if self._awaits_earlier_victims(pod, priority):
            return None
        if not any(e.priority < priority for e in self.view.pods.values()):
            return None  # nobody to evict: spare a removal trial on every node (a replay)
        budgets = self.view.budgets()
        limit = preemption.candidate_limit(len(self.view.nodes))
        candidates: list[preemption.Candidate] = []
        without_violations = 0
        for node in sorted(self.view.nodes.values(), key=lambda n: n.order):
            failure = diagnosis.node_failures.get(node.name)
            if failure is None or failure.code is not Code.UNSCHEDULABLE:
                continue  # no release can fix what rules this node out
            occupants = [
                preemption.Occupant(e.key, e.priority, e.started, e.labels)
                for e in (self.view.pods[k] for k in sorted(node.pods) if k in self.view.pods)
                if not (e.deleting or e.reserved or self.view.is_preempted(e.key))
                and not group_victims.protected(e, self.view.single_groups)
            ]

            trial = RemovalTrial(self.books, node, job, now)
            victims = preemption.select_victims(priority, occupants, budgets, trial.fits)
            if victims is None:
                continue
            candidates.append(preemption.Candidate(node.name, victims))
            without_violations += victims.budget_violations == 0
            if without_violations and len(candidates) >= limit:
                break
        chosen = preemption.pick_node(candidates)
        if chosen is None:
            return None
        if chosen.victims.budget_violations:
            return preemption.blocked_message(chosen, budgets)
        outcome = RemovalTrial(self.books, self.view.nodes[chosen.node], job, now).outcome(
            chosen.victims.keys
        )
        # The search found that the pod fits once the victims leave; a fresh trial that
        # disagrees would be an engine bug, and must not evict anyone.
        return (chosen, outcome) if outcome.ok else None

    def nominate(
        self,
        key: PodKey,
        job: placement.Job,
        pod: Mapping[str, Any],
        chosen: preemption.Candidate,
        outcome: placement.Outcome,
        diagnosis: Diagnosis,
        now: float,
    ) -> Decision:
        """Mark the victims and hold the shares they free for the preemptor, so that no
        other pod takes them while the victims terminate."""
        victims = chosen.victims.keys
        self.books.nominate(
            key, Nomination(chosen.node, victims, now + self.settings.nomination_timeout_s)
        )
        devices = {v: pd for v, pd in outcome.devices.items() if any(pd)}
        entry = PodEntry(
            key=key,
            namespace=job.namespace,
            node=chosen.node,
            requests=job.resources,
            devices=devices,
            bookings=placement.collapse(devices, job.init_count),
            reserved=True,
            priority=preemption.priority_of(pod),
            labels=dict((pod.get("metadata") or {}).get("labels") or {}),
        )
        self.books.add_pod(entry)
        # Victims a budget covers first: if the Eviction API refuses one (its budget
        # changed since it was read), none of the others has been evicted yet.
        budgets = self.view.budgets()
        ordered = sorted(
            chosen.victims.pods,
            key=lambda p: not disruption.covered(preemption.identity(p), budgets),
        )
        return Decision(
            key,
            False,
            devices=binding.wire_devices(self.view, chosen.node, devices),
            annotations=binding.hami_annotations(self.view, chosen.node, outcome, now),
            diagnosis=diagnosis,
            nominated_node=chosen.node,
            victims=tuple(p.key for p in ordered),
            victim_uids={v: self.view.pods[v].uid for v in victims if v in self.view.pods},
            card_scores={v: outcome.card_scores.get(v, ()) for v in devices},
        )

    def _awaits_earlier_victims(self, pod: Mapping[str, Any], priority: int) -> bool:
        """kube-scheduler's ``PodEligibleToPreemptOthers``: a pod already nominated to a
        node where a lower-priority pod is terminating waits for it instead of preempting
        again (read from ``status.nominatedNodeName``, so it holds across restarts)."""
        nominated = (pod.get("status") or {}).get("nominatedNodeName")
        node = self.view.nodes.get(nominated) if isinstance(nominated, str) else None
        if node is None:
            return False
        entries = (self.view.pods.get(k) for k in node.pods)
        return any(e is not None and e.deleting and e.priority < priority for e in entries)

    def node_gate_of(
        self, node: NodeEntry, job: placement.Job, now: float, leaving: Sequence[PodEntry] = ()
    ) -> Reason | None:
        """The node gate (``node_gate``) of the annotation dialect."""
        return node_gate.check(node, job, now, self.view.inventory_timeout_s, leaving=leaving)

    def _try_node(self, node: NodeEntry, job: placement.Job, now: float) -> placement.Outcome:
        self.view.refresh(node)
        gate = self.node_gate_of(node, job, now)
        if gate is not None:
            return placement.Outcome.rejected({gate: 1})
        return placement.fit_pod(
            job, node.cards, node.facts, node.pair_scores, node.inventory_cordoned, node.layer
        )

    def find(
        self,
        job: placement.Job,
        now: float,
        tried: dict[str, placement.Outcome],
        only: set[str] | None = None,
        verdict: verdicts.Verdict | None = None,
        judged: dict[str, NodeFailure] | None = None,
    ) -> tuple[NodeEntry, placement.Outcome] | None:
        """The node the pod goes to, with its Fit; ``tried`` receives every node's Fit
        made on the way. ``only``: the nodes that may fit (every other node is known to
        rule the pod out); the first of them in the ranking's order is chosen, as the
        full walk would choose it. With the ``verdict`` of a pod whose reasons its card
        classes give, a node is judged by classes first (into ``judged``), and fitted in
        full only where the classes say it fits."""
        if not self.settings.use_index:
            return reference_walk.find(self.view, self.placer, self._try_node, job, now, tried)
        if not job.wants_devices:
            # The index ranks only nodes with a free card; a pod that wants no device
            # may go to a full one: nodes in the reference's order, up to the first fit.
            first_fit = reference_walk.find_in_key_order
            return first_fit(self.view, self.placer, self._try_node, job, now, tried)
        self.view.rerank()
        ranking = self.view.ranking(job.pod_node_policy)
        nodes = self.view.nodes
        walk: Iterable[tuple[float, int, str]] = ranking
        if only is not None:
            walk = sorted(
                entry
                for name in only
                if (entry := self.view.rank_entry(name, job.pod_node_policy)) is not None
            )
        if self.placer.walks_nodes(job, self.view.config.scheduler.node_scheduler_policy):
            log = self.view.change_log if only is None else None
            walk = self.placer.order(job, walk, nodes, log)
        by_classes = verdict is not None and verdict.simple is not None and judged is not None
        for _score, _order, name in walk:
            if by_classes:
                # Judged by its group or card classes (exact, and as cheap as the
                # summary's rule-out): a node it rules out needs no second look.
                assert verdict is not None
                assert judged is not None
                failure = verdict.judge(self.judged, name, now)
                if failure is not None:
                    judged[name] = failure
                    continue
                node = nodes[name]
            else:
                node = nodes[name]
                if not node.summary.may_fit(job):
                    continue
            outcome = self._try_node(node, job, now)
            if outcome.ok:
                return node, outcome
            tried[name] = outcome
        return None

    def _diagnose(
        self,
        pod: Mapping[str, Any],
        now: float,
        job: placement.Job | None = None,
        tried: Mapping[str, placement.Outcome] | None = None,
    ) -> Diagnosis:
        """Per node, why the pod does not fit; ``tried`` holds Fits the search already made
        in this attempt (the books have not changed since), which are not made again."""
        if job is None:
            try:
                job = placement.Job.from_pod(
                    pod, self.view.config, self.view.vendors, self.view.quota
                )
            except CodecError as exc:
                return Diagnosis({}, len(self.view.nodes), error=str(exc))
        failures: dict[str, NodeFailure] = {}
        known = tried or {}
        for node in self.view.nodes.values():
            outcome = known.get(node.name) or self._try_node(node, job, now)
            if not outcome.ok:
                refused_by = {r: frozenset(keys) for r, keys in outcome.refused_by.items()}
                failures[node.name] = NodeFailure(
                    dict(outcome.reasons), refused_by, dict(outcome.allowed_reasons)
                )
        return Diagnosis(failures, len(self.view.nodes))

    # --- queueing hints -------------------------------------------------------------------
    def fits_now(self, verdict: verdicts.Verdict, node: str, now: float) -> bool:
        """Whether pods of the verdict's shape fit ``node`` as the books are now: an
        event on that node (room freed, the node or its inventory changed) wakes them
        only then. A verdict from before a config change answers yes (its pods are all
        woken by that change anyway)."""
        if verdict.job_epoch != self.view.epoch:
            return True
        return verdict.fits_now(self.judged, node, now)

    def quota_may_help(self, verdict: verdicts.Verdict, namespace: str) -> bool:
        """Whether a quota change in ``namespace`` (usage falling, limits changing) may
        let the verdict's pods fit: theirs, where a quota ruled cards out for them."""
        if verdict.namespace != namespace:
            return False
        return verdict.quota_bound or verdict.job_epoch != self.view.epoch
