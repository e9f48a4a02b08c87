"""HAMi's annotation dialect as a plugin of the decision cycle (``plugin.Plugin``).

The request is the pod's ``placement.Job`` (read once, ``pod_read``); the node order is
the ranking by node policy (the books' index: only nodes with a free card, best first),
or the ``fragmentation`` placer's, or for a pod that wants no device (which the index does
not rank) and for the reference path (``Settings.use_index`` off, the tests' oracle)
every node in the ranking's key order; on the ranking, a node whose free-capacity summary
rules the pod out is left out in O(1); the fit is the node gate (``node_gate``) and
``placement.fit_pod`` on the node's cards with its configuration layer (GPU policy, card
restrictions). A reservation books the pod's devices and says what its Binding carries
(``binding``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from vgpu_operator.scheduling.books import pod_entries
from vgpu_operator.scheduling.books.entries import NodeEntry, PodEntry
from vgpu_operator.scheduling.books.view import BooksView, BooksWriter
from vgpu_operator.scheduling.cycle import binding, node_gate, reference_walk
from vgpu_operator.scheduling.cycle.annotation_freeing import AnnotationFreeing
from vgpu_operator.scheduling.cycle.fragmentation_order import Placer
from vgpu_operator.scheduling.cycle.plugin import Reserved, Room, Unread, job_in_room
from vgpu_operator.scheduling.cycle.pod_read import PodRead
from vgpu_operator.scheduling.cycle.verdicts import failure_of
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.status import NodeFailure, Reason

if TYPE_CHECKING:
    from vgpu_operator.scheduling.cycle.decision import Settings


class AnnotationPlugin:
    """The annotation dialect (see the module docstring)."""

    name = "annotations"
    #: kube-scheduler's victim walk alone: a pod's shares are its own, so putting the most
    #: important pods back first finds what it finds (the preempt-* scenarios pin it).
    per_card_victims = False

    def __init__(self, books: BooksWriter, settings: Settings, placer: Placer) -> None:
        self.books = books
        #: Typed as the read view: every read goes through it.
        self.view: BooksView = books
        self.settings = settings
        self.placer = placer

    # --- the request ----------------------------------------------------------------------
    def request(self, read: PodRead) -> placement.Job | Unread:
        """The pod's Job, with the mix of requests the ``fragmentation`` policy weighs:
        every pod's request counts in it (kept in the read: set once)."""
        if read.job is None:
            return Unread(read.error)
        self.placer.observe(read.key, read.job)
        read.job = self.placer.with_mix(read.job)
        return read.job

    def shape(self, request: placement.Job) -> str:
        return ""

    # --- the walk -------------------------------------------------------------------------
    def indexed(self, job: placement.Job) -> bool:
        """Whether the walk follows the books' index (else every node in key order)."""
        return self.settings.use_index and job.wants_devices

    def order(
        self, request: placement.Job, only: set[str] | None, rule_out: bool = True
    ) -> Iterable[NodeEntry]:
        """The ranking, best first (``only``: those nodes, in the ranking's order), less
        the nodes whose summary rules the pod out (``rule_out`` False: only the first
        ``JUDGE_AFTER`` of them); where the index does not rank (see the module
        docstring), every node in its key order, where the first that fits is the one the
        reference path's full walk takes."""
        job, view = request, self.view
        if not self.indexed(job):
            return reference_walk.in_key_order(view, self.placer, job)
        view.rerank()
        walk: Iterable[tuple[float, int, str]] = view.ranking(job.pod_node_policy)
        if only is not None:
            walk = sorted(
                entry
                for name in only
                if (entry := view.rank_entry(name, job.pod_node_policy)) is not None
            )
        if self.placer.walks_nodes(job, view.config.scheduler.node_scheduler_policy):
            log = view.change_log if only is None else None
            walk = self.placer.order(job, walk, view.nodes, log)
        return _may_fit(view, walk, job, None if rule_out else JUDGE_AFTER)

    def gate(
        self, node: NodeEntry, job: placement.Job, now: float, leaving: Sequence[PodEntry] = ()
    ) -> Reason | None:
        """The node gate (``node_gate``) of the annotation dialect."""
        return node_gate.check(node, job, now, self.view.inventory_timeout_s, leaving=leaving)

    def fit(
        self, node: NodeEntry, request: placement.Job, now: float, room: Room | None = None
    ) -> placement.Outcome:
        job = request
        if room is None:
            self.view.refresh(node)
            gate = self.gate(node, job, now)
            cards = node.cards
        else:
            gate = self.gate(node, job, now, room.leaving)
            job = job_in_room(job, room)
            cards = room.cards
        if gate is not None:
            return placement.Outcome.rejected({gate: 1})
        return placement.fit_pod(
            job, cards, node.facts, node.pair_scores, node.inventory_cordoned, node.layer
        )

    def settles(self, node: NodeEntry, request: placement.Job, fit: placement.Outcome) -> bool:
        return True

    def judge(self, name: str, request: placement.Job, now: float) -> NodeFailure | None:
        outcome = self.fit(self.view.nodes[name], request, now)
        return None if outcome.ok else failure_of(outcome)

    # --- preemption -----------------------------------------------------------------------
    def freeing(self, node: NodeEntry, request: placement.Job, now: float) -> AnnotationFreeing:
        return AnnotationFreeing(self.view, node)

    def one_card(self, request: placement.Job) -> tuple[int, int] | None:
        return None  # kube-scheduler's walk alone (``per_card_victims``)

    def taken_on_card(self, fit: placement.Outcome) -> tuple[int, int, int]:
        """What a fit of one card takes of it (MiB, cores, slots)."""
        device = next(d for single in fit.devices.values() for c in single for d in c)
        return device.memory_mib, device.cores, 1

    # --- reserve --------------------------------------------------------------------------
    def reserve(
        self,
        key: PodKey,
        request: placement.Job,
        node: NodeEntry,
        fit: placement.Outcome,
        now: float,
        nominated: bool,
    ) -> Reserved:
        """Book the pod's devices on ``node``: until its Binding, which says bind-phase
        allocating (its node's gate shuts once bound), or for a preemptor until its
        victims are gone."""
        job = request
        entry = pod_entries.reservation(
            key, job, job.pod, node.name, fit.devices, binding=not nominated
        )
        annotations = binding.hami_annotations(self.view, node.name, fit, now)
        self.books.add_pod(entry)
        devices = entry.devices
        return Reserved(
            devices=binding.wire_devices(self.view, node.name, devices),
            annotations=annotations,
            card_scores={v: fit.card_scores.get(v, ()) for v in devices},
        )


#: With a verdict judging the nodes the walk visits (``rule_out`` False), the summary's
#: rule-out stops after this many nodes: while a fit is near (a pod that fits passes a few
#: dozen to a few hundred nodes first) it is the cheaper look, but past it the pod likely
#: fits nowhere, and every node the summary leaves out is judged again by the verdict's
#: refresh, where the walk's judgement of it is read instead.
JUDGE_AFTER = 256


def _may_fit(
    view: BooksView,
    walk: Iterable[tuple[float, int, str]],
    job: placement.Job,
    limit: int | None = None,
) -> Iterator[NodeEntry]:
    """The ranked nodes whose free-capacity summary does not rule the pod out (O(1) each:
    a node's summary is kept with its cards); with ``limit``, every node after that many
    were ruled out."""
    nodes = view.nodes
    ranked = iter(walk)
    ruled_out = 0
    for _score, _order, name in ranked:
        node = nodes[name]
        if node.summary.may_fit(job):
            yield node
        else:
            ruled_out += 1
            if limit is not None and ruled_out >= limit:
                break
    for _score, _order, name in ranked:
        yield nodes[name]
