"""One decision, top to bottom: ``Cycle.schedule`` (``cluster.ClusterState`` is its face).

For one pending pod, whichever its dialect (``plugin``: HAMi's annotations, DRA claims):
the pod read once (admission's defaults and refusals included), the nomination check,
the dialect's request, one walk over the ranked nodes with the dialect's fit
(``walk``), a reservation in the books so the next decision cannot take the same shares
and what its Binding carries; or, when no node fits, the per-node diagnosis (kept per
shape of pod in a verdict) and, where allowed, preemption (``preempting``:
kube-scheduler's DefaultPreemption with the dialect's fit as the filter). The books it
reads and writes are ``books``.

Two node orders decide, and must decide the same (the tests compare them): the indexed
one (best-ranked first with O(1) rule-outs, ``Settings.use_index``) and the reference
one (every node in key order: HAMi's best score).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vgpu_operator.devices import model
from vgpu_operator.scheduling.books.books import DEFAULT_NOMINATION_TIMEOUT_S, Books
from vgpu_operator.scheduling.books.entries import Nomination, PodEntry
from vgpu_operator.scheduling.books.view import BooksView, BooksWriter
from vgpu_operator.scheduling.cycle import either_plugin, preempting, verdict_kin, verdicts, walk
from vgpu_operator.scheduling.cycle.annotation_plugin import AnnotationPlugin
from vgpu_operator.scheduling.cycle.claims_plugin import ClaimsPlugin
from vgpu_operator.scheduling.cycle.either_plugin import EitherPlugin, EitherRequest
from vgpu_operator.scheduling.cycle.fragmentation_order import Placer
from vgpu_operator.scheduling.cycle.judged import JudgedView
from vgpu_operator.scheduling.cycle.plugin import Fit, Plugin, Unread
from vgpu_operator.scheduling.cycle.pod_read import PodRead, read_pod
from vgpu_operator.scheduling.dialects.annotation import admission, placement
from vgpu_operator.scheduling.dialects.claims.claim_wire import ClaimWrite
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.scheduling.preemption import preemption
from vgpu_operator.scheduling.status import Diagnosis, NodeFailure
from vgpu_operator.wire import Pod

R = TypeVar("R")
F = TypeVar("F", bound=Fit)


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
    #: and reservations, ``claims_plugin``).
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
        #: The dialects: which one decides a pod is what its read says (``uses_claims``).
        self.annotations = AnnotationPlugin(books, settings, self.placer)
        self.claims = ClaimsPlugin(books, self.placer)
        #: A mapped extended resource: the claims dialect on DRA nodes, the annotation
        #: dialect on device-plugin nodes, chosen per node in the one walk.
        self.either = EitherPlugin(self.annotations, self.claims)
        #: One verdict per shape of pod that fits nowhere, alive while a pod holds it.
        self._verdicts: weakref.WeakValueDictionary[str, verdicts.Verdict] = (
            weakref.WeakValueDictionary()
        )
        #: New shapes' verdicts start from the judgements of kin shapes (``verdict_kin``).
        self._kin = verdict_kin.Kin()
        #: What verdicts read of the books: the view, with the annotation dialect's node
        #: gate and fit (a claims verdict judges with its own, ``_Judge``).
        self.judged = JudgedView(self.view, self.annotations.gate, self.annotations.fit)

    def admit(self, pod: Pod) -> admission.AdmissionResult:
        return admission.admit(pod, self.view.config, self.view.vendors, self.view.quota)

    def parse(self, key: PodKey, pod: Pod) -> PodRead:
        """The pod read once (``pod_read``): a waiting pod retried with the same object
        (the runtime keeps it until the pod changes) and the same config and quota limits
        reuses the last read instead of replaying admission on a copy."""
        cached, view = self.books.pod_read(key), self.view
        extended = self.claims.extended_resources()  # our classes' extended resources
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
        change starts a new one). ``judge``: how the dialect judges a node (the claims
        dialect's; None: the annotation dialect's, by card classes)."""
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

    def schedule(self, pod: Pod, now: float, explain: bool = False) -> Decision:
        """Decide one pod. ``explain`` also fits it on every other node, to report each
        candidate node's score (``Decision.node_scores``; ``simulate`` asks for it)."""
        key = pod_key(pod)
        self.books.expire_nominations(now)
        read = self.parse(key, pod)
        # A pod decided before gives up what its last decision held (a preemptor's hold
        # is put back below if it still waits for its victims).
        held = _Held(self.view.pods.get(key), self.books.pop_nomination(key))
        if read.uses_claims:
            held.claims = self.books.take_decided(key)
        self.books.drop_pod(key)
        if read.refused:
            return self._refused(read, now)
        if read.either:
            return self._decide(self.either, read, held, now, explain)
        if read.uses_claims:
            return self._decide(self.claims, read, held, now, explain)
        return self._decide(self.annotations, read, held, now, explain)

    def _refused(self, read: PodRead, now: float) -> Decision:
        """A pod admission refuses waits for its own change, judged as refused."""
        assert read.admitted is not None
        verdict = self._verdict_of(read) if self._keeps_verdicts() else None
        if verdict is not None:
            verdict.refresh(self.judged, now, {}, verdict.changed(self.judged, now))
            diagnosis = verdict.diagnosis()
        elif read.judged is None:
            diagnosis = Diagnosis({}, len(self.view.nodes), error=read.error)
        else:
            diagnosis = walk.diagnose(self.view, self.annotations, read.judged, now, {})
        message = read.admitted.message
        return Decision(read.key, False, diagnosis=diagnosis, rejected=message, verdict=verdict)

    def _decide(
        self, plugin: Plugin[R, F], read: PodRead, held: _Held, now: float, explain: bool
    ) -> Decision:
        """The pod's decision through its dialect (see the module docstring)."""
        key = read.key
        request = plugin.request(read)
        if isinstance(request, Unread):
            failure = Diagnosis({}, len(self.view.nodes), error=request.error)
            return Decision(
                key, False, diagnosis=failure, waits_for_claims=request.waits_for_claims
            )
        verdict = None
        if self._keeps_verdicts():
            judge = _Judge(plugin, request) if read.uses_claims else None
            verdict = self._verdict_of(read, read.shape + plugin.shape(request), judge)
        # What the walk learns of each node it fits is kept for the diagnosis, which then
        # judges only the nodes it did not fit. With a verdict on the pod's shape, only the
        # nodes changed since it was made can fit (the others were all ruled out), so the
        # walk visits those only; where the verdict judges by card classes, it judges a
        # node first and fits it in full only where the classes say it fits.
        tried: dict[str, F] = {}
        judged: dict[str, NodeFailure] = {}
        changed = verdict.changed(self.judged, now) if verdict is not None else None
        judge_node = self._by_classes(read, verdict, now)
        scores: dict[str, float] | None = {} if explain else None
        try:
            found = walk.find(plugin, request, now, tried, changed, judge_node, judged, scores)
        except walk.Unfit as exc:
            return Decision(key, False, diagnosis=Diagnosis({}, len(self.view.nodes), str(exc)))
        if found is not None:
            node, fit = found
            reserved = plugin.reserve(key, request, node, fit, now, nominated=False)
            return Decision(
                key,
                True,
                node.name,
                reserved.devices,
                reserved.annotations,
                warnings=read.admitted.warnings if read.admitted is not None else (),
                card_scores=reserved.card_scores,
                node_scores=walk.in_node_order(self.view, scores) if scores else {},
                claim_writes=reserved.claim_writes,
            )
        if verdict is None:
            diagnosis = walk.diagnose(self.view, plugin, request, now, tried, judged)
        else:
            verdict.refresh(self.judged, now, tried, changed, judged)
            diagnosis = verdict.diagnosis()
        if isinstance(request, EitherRequest):
            diagnosis = diagnosis.noted(either_plugin.notes(request))
        return self._unplaced(plugin, read, request, held, diagnosis, verdict, now)

    def _by_classes(
        self, read: PodRead, verdict: verdicts.Verdict | None, now: float
    ) -> walk.Judge | None:
        """A verdict that judges by card classes (the annotation dialect's, on the indexed
        walk) rules nodes out before the walk fits them."""
        if verdict is None or verdict.simple is None:
            return None
        if read.job is None or not self.annotations.indexed(read.job):
            return None
        judged = self.judged
        return lambda name: verdict.judge(judged, name, now)

    def _unplaced(
        self,
        plugin: Plugin[R, F],
        read: PodRead,
        request: R,
        held: _Held,
        diagnosis: Diagnosis,
        verdict: verdicts.Verdict | None,
        now: float,
    ) -> Decision:
        """A pod that fits nowhere: it waits for the victims of its nomination (the one
        nomination check), or preempts, or waits."""
        key, pod = read.key, read.subject
        nomination = held.nomination
        if (
            nomination is not None
            and held.entry is not None
            and preempting.waits_for_victims(self.view, nomination)
        ):
            # kube-scheduler's rule: a nominated pod whose victims are still terminating
            # waits for them rather than preempting again; it keeps what it held.
            self.books.nominate(key, nomination)
            self.books.add_pod(held.entry)
            self.books.restore_decided(key, held.claims)
            node = nomination.node
            return Decision(key, False, diagnosis=diagnosis, nominated_node=node, verdict=verdict)
        unplaced = Decision(key, False, diagnosis=diagnosis, verdict=verdict)
        if not self.settings.preemption_enabled or diagnosis.error or not preemption.eligible(pod):
            return unplaced
        chosen = preempting.choose(self.view, plugin, request, pod, diagnosis, now)
        if chosen is None:
            return unplaced
        if isinstance(chosen, str):
            return Decision(
                key, False, diagnosis=diagnosis, verdict=verdict, preemption_blocked=chosen
            )
        return self.nominate(plugin, key, request, chosen, diagnosis, now, verdict)

    def nominate(
        self,
        plugin: Plugin[R, F],
        key: PodKey,
        request: R,
        chosen: preempting.Chosen[F],
        diagnosis: Diagnosis,
        now: float,
        verdict: verdicts.Verdict | None = None,
    ) -> Decision:
        """Mark the victims and hold the shares they free for the preemptor, so that no
        other pod takes them while the victims terminate (nor, on the DRA path, while the
        claims they alone held are released)."""
        victims = chosen.candidate.victims
        node = self.view.nodes[chosen.candidate.node]
        until = now + self.settings.nomination_timeout_s
        awaited = victims.keys | chosen.spare  # the pods leaving anyway too
        self.books.nominate(key, Nomination(node.name, awaited, until, chosen.claims))
        reserved = plugin.reserve(key, request, node, chosen.fit, now, nominated=True)
        ordered = preempting.eviction_order(victims, self.view.budgets())
        pods = self.view.pods
        return Decision(
            key,
            False,
            devices=reserved.devices,
            annotations=reserved.annotations,
            diagnosis=diagnosis,
            nominated_node=node.name,
            victims=tuple(p.key for p in ordered),
            victim_uids={p.key: pods[p.key].uid for p in ordered if p.key in pods},
            card_scores=reserved.card_scores,
            verdict=verdict,
        )

    def find(
        self, job: placement.Job, now: float, tried: dict[str, placement.Outcome]
    ) -> tuple[Any, placement.Outcome] | None:
        """Where an annotation pod goes as the books stand (the defragmentation planner's
        question), by the one walk."""
        return walk.find(self.annotations, job, now, tried)

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


@dataclass(slots=True)
class _Held:
    """What a pod's last decision held: its entry and nomination, and (claims) its
    claims' holds; put back when it still waits for the victims of that nomination."""

    entry: PodEntry | None
    nomination: Nomination | None
    claims: tuple[object, ...] = ()


class _Judge:
    """A claims verdict's judge of one node (``verdicts.NodeJudge``): the dialect's, for
    the pod's claims as read at its last attempt, so that an event wakes the pod only
    where its claims may fit now."""

    def __init__(self, plugin: Plugin[Any, Any], request: object) -> None:
        self._plugin = plugin
        self._request = request

    def judge(self, name: str, job: placement.Job, now: float) -> NodeFailure | None:
        return self._plugin.judge(name, self._request, now)
