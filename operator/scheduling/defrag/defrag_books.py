"""The books as defragmentation reads and changes them, and a what-if on an overlay.

The planner (``defrag``) reads each node's cards and pods, the disruption budgets, a pod
admitted and parsed into a Job, a Fit "as if these pods had left" (preemption's ``Trial``,
through the annotation dialect's one fit), and
tries plans: pods taken out, their replacements placed by the decision cycle, a hold on
the shares a waiting pod gets (preemption's nomination). All through the books' view
(``view.BooksView``) and the cycle's public members.

``WhatIf`` runs those changes on an overlay of the books (``overlay.Overlay``) and drops
it on exit: the live books, their quota, nominations, change log and the queue's hints
are never written, so a plan cannot leave anything behind, and the planner may pause
for other work (``defrag.plan_steps``) whenever its overlay holds no change. Outside a
what-if, ``hold`` and ``release`` are the runtime's: they write the live books.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TypeVar

from vgpu_operator.devices import model
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling import node_annotations
from vgpu_operator.scheduling.books.entries import NodeEntry, PodEntry
from vgpu_operator.scheduling.books.group_victims import GroupRule
from vgpu_operator.scheduling.books.overlay import Overlay
from vgpu_operator.scheduling.books.view import BooksView, BooksWriter
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.cycle.decision import Cycle, Decision, Settings
from vgpu_operator.scheduling.cycle.plugin import Fit, Plugin, Unread
from vgpu_operator.scheduling.cycle.pod_read import PodRead
from vgpu_operator.scheduling.cycle.preempting import Chosen, Trial
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.scheduling.preemption import disruption, preemption
from vgpu_operator.scheduling.status import Diagnosis
from vgpu_operator.wire import Pod, ResourceClaim

R = TypeVar("R")
F = TypeVar("F", bound=Fit)


class DefragBooks:
    """Read access to the books for the planner, and the hold the runtime makes.

    Outside a what-if it reads and writes the live books (the runtime's hold); inside one
    (``WhatIf``) every read and write goes to the what-if's overlay (``overlay``), with a
    decision cycle of its own on it."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._live = state.books
        #: Every read goes through the books' view: the live books', or the overlay's.
        self.view: BooksView = state.books
        self._writer: BooksWriter = state.books
        self.cycle: Cycle = state.cycle
        self._overlay: Overlay | None = None

    def begin(self) -> Overlay:
        """Start a what-if: reads and writes go to a new overlay until ``end``."""
        overlay = Overlay(self._live)
        self._overlay = overlay
        self.view = self._writer = overlay
        self.cycle = Cycle(overlay, Settings(preemption_enabled=False, verdicts=False))
        return overlay

    def end(self) -> None:
        """End the what-if: its overlay is dropped, the live books are as they were."""
        self._overlay = None
        self.view = self._writer = self._live
        self.cycle = self.state.cycle

    # --- reads --------------------------------------------------------------------------
    def node_names(self) -> list[str]:
        """Every node, in the order the books met them (the engine's tie-break order)."""
        return self.state.node_names()

    def has_node(self, node: str) -> bool:
        return node in self.view.nodes

    def node_count(self) -> int:
        return len(self.view.nodes)

    def entry(self, key: PodKey) -> PodEntry | None:
        return self.view.pods.get(key)

    def entries_on(self, node: str) -> list[PodEntry]:
        entry = self.view.nodes.get(node)
        if entry is None:
            return []
        pods = self.view.pods
        return [pods[k] for k in sorted(entry.pods) if k in pods]

    def keys_on(self, node: str) -> list[PodKey]:
        """The keys of the pods the node holds, sorted."""
        entry = self.view.nodes.get(node)
        return [] if entry is None else sorted(entry.pods)

    def cards(self, node: str) -> Sequence[model.DeviceUsage]:
        """The node's cards as booked now (the books' own objects: read, never change)."""
        entry = self.view.nodes.get(node)
        if entry is None:
            return ()
        self.view.refresh(entry)
        return entry.cards

    def cordoned(self, node: str) -> frozenset[str]:
        """Cards no pod may take: the inventory's cordons and ``hami.io/device-cordon``."""
        entry = self.view.nodes.get(node)
        if entry is None:
            return frozenset()
        return node_annotations.cordoned_cards(entry.facts.annotations, entry.inventory_cordoned)

    def node_label(self, node: str, key: str) -> str | None:
        """The node's label ``key`` (a PodGroup's topology domain), None if it has none."""
        entry = self.view.nodes.get(node)
        return None if entry is None else entry.facts.labels.get(key)

    def group_rule(self, group: str) -> GroupRule | None:
        """The PodGroup as the books read it (``group_victims``), None when not read."""
        return self.view.groups.rule(group)

    def own_scheduler(self) -> str:
        """The name this operator schedules under (``scheduler.schedulerName``)."""
        return self.state.config.scheduler.scheduler_name

    def budgets(self) -> list[disruption.Budget]:
        return self.view.budgets()

    def is_claimed(self, key: PodKey) -> bool:
        """Whether the pod is a victim of a preemption or plan already under way."""
        return self.view.is_preempted(key)

    def is_nominated(self, key: PodKey) -> bool:
        return self.view.nominated_node(key) is not None

    def job(self, pod: Pod) -> placement.Job | None:
        """The pod as admission mutates it, parsed; None when admission refuses it or its
        annotations cannot be read (nothing to plan for)."""
        attempt = self.cycle.parse(pod_key(pod), pod)
        if attempt.refused:
            return None
        return attempt.job

    def admitted_job(self, pod: Pod) -> placement.Job | None:
        """A pod already admitted (a running pod's spec), parsed without admission's
        copy, and without being remembered; None when it cannot be read."""
        view = self.view
        try:
            return placement.Job.from_pod(pod, view.config, view.vendors, view.quota)
        except CodecError:
            return None

    def node_admits(self, node: str, job: placement.Job, now: float) -> bool:
        """Whether the node's own checks (taints, selector, CPU, heartbeat...) let the pod
        in, whatever its cards hold."""
        entry = self.view.nodes.get(node)
        return entry is not None and self.cycle.annotations.gate(entry, job, now) is None

    def fits_somewhere(self, job: placement.Job, now: float) -> bool:
        """Whether the pod fits on some node as the books stand (no plan is needed)."""
        return self.cycle.find(job, now, {}) is not None

    def fit_after_leaving(
        self, node: str, job: placement.Job, leaving: frozenset[PodKey], now: float
    ) -> placement.Outcome:
        """The pod's Fit on ``node`` as if ``leaving`` (pods of that node) had left."""
        entry = self.view.nodes[node]
        outcome = Trial(self.view, self.cycle.annotations, entry, job, now).outcome(leaving)
        return outcome if outcome is not None else placement.Outcome(False)

    # --- changes --------------------------------------------------------------------------
    def take_out(self, key: PodKey) -> PodEntry | None:
        """Remove a pod's entry (and its bookings); ``put_back`` restores it as it was."""
        entry = self.view.pods.get(key)
        if entry is not None:
            self._writer.drop_pod(key)
        return entry

    def put_back(self, entry: PodEntry) -> None:
        self._writer.add_pod(entry)

    def place(self, pod: Pod, now: float) -> Decision:
        """The engine's decision for a pod, without preemption (a replacement must fit as
        the cluster stands); a placement is booked as a reservation. A pod that fits
        nowhere is not diagnosed (the decision has no reasons): a plan only needs to
        know, and a diagnosis fits every node."""
        key = pod_key(pod)
        attempt = self.cycle.parse(key, pod)
        if attempt.refused or attempt.job is None:
            return Decision(key, False)
        # The quick test is the annotation dialect's walk; a pod with claims (scale-down's
        # replacements: ``autoscale.shrink_claims``) goes to the claims dialect's at once.
        if not attempt.uses_claims and self.cycle.find(attempt.job, now, {}) is None:
            return Decision(key, False)
        if self._overlay is None:
            raise RuntimeError("a replacement is placed only within a what-if")
        return self.cycle.schedule(pod, now)

    def add_claim(self, obj: ResourceClaim) -> None:
        """A claim that does not exist yet joins the what-if (a replacement's template
        claim, as the claim controller would make it)."""
        if self._overlay is None:
            raise RuntimeError("a claim is made up only within a what-if")
        self._overlay.add_claim(obj)

    def unplace(self, key: PodKey) -> None:
        """Undo ``place``: the pod's reservation is dropped, with what its claims'
        decision held (its parse is kept, for the next what-if of the same pod)."""
        if self._overlay is not None:
            self._overlay.release_decided(key)
        self._writer.drop_pod(key)

    def forget(self, key: PodKey) -> None:
        """Drop all the books know of a pod that never was (a what-if's replacement)."""
        if self._overlay is not None:
            self._overlay.forget(key)

    def hold(self, pod: Pod, node: str, leaving: frozenset[PodKey], now: float) -> Decision | None:
        """Hold for ``pod`` the shares it gets on ``node`` once ``leaving`` are gone, as a
        preemption holds what its victims free: the pod is nominated to the node, waits
        for every pod of ``leaving`` (on any node) to go, and they are marked so that no
        preemption picks them meanwhile. None when it does not fit there even then. Either
        dialect: a pod with claims is held by the claims dialect (its claims' devices
        held as a decision's until the worker decides it)."""
        key = pod_key(pod)
        target = self.view.nodes.get(node)
        attempt = self.cycle.parse(key, pod)
        if target is None or attempt.job is None or key in self.view.pods:
            return None
        if attempt.refused:
            return None
        if attempt.uses_claims:
            return self._hold_by(self.cycle.claims, attempt, target, leaving, now)
        return self._hold_by(self.cycle.annotations, attempt, target, leaving, now)

    def _hold_by(
        self,
        plugin: Plugin[R, F],
        attempt: PodRead,
        target: NodeEntry,
        leaving: frozenset[PodKey],
        now: float,
    ) -> Decision | None:
        """``hold`` through the pod's dialect: its request, the one trial, the nomination."""
        request = plugin.request(attempt)
        if isinstance(request, Unread):
            return None
        node, pods = target.name, self.view.pods
        on_node = frozenset(k for k in leaving if k in pods and pods[k].node == node)
        trial = Trial(self.view, plugin, target, request, now)
        outcome = trial.outcome(on_node)
        if outcome is None or not outcome.ok:
            return None
        entries = sorted(
            (pods[k] for k in leaving if k in pods),
            key=lambda e: (-e.priority, e.started or 0.0, e.key),
        )
        victims = preemption.Victims(
            tuple(preemption.Occupant(e.key, e.priority, e.started, e.labels) for e in entries),
            0,
        )
        claims = trial.freeing.freed_claims(on_node)
        chosen = Chosen(preemption.Candidate(node, victims), outcome, claims)
        diagnosis = Diagnosis({}, len(self.view.nodes))
        return self.cycle.nominate(plugin, attempt.key, request, chosen, diagnosis, now)

    def release(self, key: PodKey, victims: frozenset[PodKey]) -> None:
        """Give up a hold: the shares go back, and the pods it waited for that are still
        there may be chosen again (also when the pod bound early and the books dropped
        its nomination already)."""
        if self._overlay is not None:
            self._overlay.cancel_preemption(key)
            self._overlay.unmark_preempted(victims)
        else:
            self.state.cancel_preemption(key)
            self._live.unmark_preempted(victims)


class WhatIf:
    """Changes on an overlay of the books (``overlay``), all undone on exit (or back to a
    ``mark``); the live books are never written."""

    def __init__(self, books: DefragBooks) -> None:
        self.books = books
        self._undo: list[Callable[[], None]] = []
        self._placed: set[PodKey] = set()

    def __enter__(self) -> WhatIf:
        self.books.begin()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.undo_to(0)
        for key in self._placed:
            self.books.forget(key)
        self.books.end()

    def mark(self) -> int:
        return len(self._undo)

    def undo_to(self, mark: int) -> None:
        while len(self._undo) > mark:
            self._undo.pop()()

    def take_out(self, key: PodKey) -> None:
        entry = self.books.take_out(key)
        if entry is not None:
            self._undo.append(lambda: self.books.put_back(entry))

    def place(self, pod: Pod, now: float) -> Decision:
        key = pod_key(pod)
        self._placed.add(key)
        self._undo.append(lambda: self.books.unplace(key))
        return self.books.place(pod, now)

    def hold(self, pod: Pod, node: str, leaving: frozenset[PodKey], now: float) -> Decision | None:
        decision = self.books.hold(pod, node, leaving, now)
        if decision is not None:
            key = decision.pod
            self._undo.append(lambda: self.books.release(key, leaving))
        return decision
