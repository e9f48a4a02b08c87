"""The dialects as plugins of the decision cycle: the points where the cycle calls one.

A dialect is how a pod asks for shares: HAMi's annotations (``annotation_plugin``), DRA
claims (``claims_plugin``), and whatever comes next. The cycle owns everything else,
written once (``decision``, ``walk``, ``preempting``): reading the pod once, the walk over
the ranked nodes, the diagnosis and verdicts, the nomination check, preemption's
candidate loop, trials and nominations, and the ``PodEntry`` (``pod_entries``). It calls
the dialect at fixed points, as kube-scheduler's framework calls its plugins at their
extension points:

- ``request`` (PreFilter): the pod's request, read once per attempt;
- ``order`` and ``fit`` (Filter): the nodes in the order the walk visits them (those an
  O(1) rule-out excludes left out), and the fit on one node (its gate and its cards), as
  the node stands or as if some of its pods had left (``Room``). It is *the* fit: the
  walk, the diagnosis, verdicts, preemption's and defragmentation's trials all call it;
- ``settles`` (Score): whether the walk may stop at a node that fits;
- ``freeing``: what the removal of some of a node's pods frees there (``Freeing``);
- ``reserve`` (Reserve): what a decision holds for the pod on the node it chose, and
  what its Binding carries (``Reserved``).

Adding a dialect is a module with one class of these methods and a line in
``decision.Cycle`` saying which reads it takes (docs/architecture.md, "How to add a
dialect").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from vgpu_operator.devices import model
from vgpu_operator.scheduling.books.entries import NodeEntry, PodEntry
from vgpu_operator.scheduling.cycle.pod_read import PodRead
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import claim_wire
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.status import NodeFailure, Reason


class Fit(Protocol):
    """One node's fit as the cycle reads it (``placement.Outcome``, ``ClaimsOutcome``):
    whether it fits, and if not, why (the diagnosis's entry for the node)."""

    @property
    def ok(self) -> bool: ...
    @property
    def reasons(self) -> Mapping[Reason, int]: ...
    @property
    def refused_by(self) -> Mapping[Reason, set[str]]: ...
    @property
    def allowed_reasons(self) -> Mapping[Reason, int]: ...
    @property
    def error(self) -> str | None: ...


R = TypeVar("R")  # a dialect's request
F = TypeVar("F", bound=Fit)  # a dialect's fit


@dataclass(frozen=True, slots=True)
class Holding:
    """Something one card holds that the removal of pods releases: the shares of one pod
    (annotations) or of one claim (claims), released only when every one of ``holders``
    has left (a claim shared by several pods). Empty ``holders``: no removal releases it."""

    holders: frozenset[PodKey]
    memory_mib: int
    cores: int
    slots: int


@dataclass(slots=True)
class Room:
    """A node as a trial sees it: as if ``leaving`` had left it."""

    #: The pods taken off (their CPU, memory and count leave the node gate).
    leaving: Sequence[PodEntry]
    #: The node's cards without what the leaving pods held (new objects).
    cards: list[model.DeviceUsage]
    #: Per namespace, the memory and cores their going releases from its quota.
    quota_freed: Sequence[tuple[str, Mapping[str, tuple[int, int]]]] = ()
    #: Claims: the MIG instances released (a device name per released result).
    instances: Sequence[str] = ()


def holders_by_card(units: Mapping[str, Sequence[Holding]]) -> dict[str, frozenset[PodKey]]:
    """Per card, the holders of its units."""
    out: dict[str, set[PodKey]] = {}
    for card, on_card in units.items():
        for unit in on_card:
            out.setdefault(card, set()).update(unit.holders)
    return {card: frozenset(keys) for card, keys in out.items()}


def job_in_room(job: placement.Job, room: Room | None) -> placement.Job:
    """The job with its namespace's quota as the room leaves it: what the leaving pods of
    that namespace held released, on a copy of the ledger (the books' is never written)."""
    if room is None:
        return job
    freed = [sums for namespace, sums in room.quota_freed if namespace == job.namespace]
    if not freed or not job.quota.has_limits(job.namespace):
        return job
    ledger = job.quota.copy()
    for sums in freed:
        ledger.remove_sums(job.namespace, dict(sums))
    return dataclasses.replace(job, quota=ledger)


class Freeing(Protocol):
    """What the removal of pods frees on one node, for one trial (a dialect's answer)."""

    def room(self, removed: frozenset[PodKey], only: str | None = None) -> Room | None:
        """The node as if ``removed`` had left (``only``: that card alone); None when what
        they free cannot be read off the cards (no trial then)."""
        ...

    def fitted(self, removed: frozenset[PodKey], room: Room) -> None:
        """The pod fitted in ``room``: a later room with fewer pods removed may start
        from it."""
        ...

    def units(self) -> Mapping[str, Sequence[Holding]]:
        """Per card, what each removal may release there (and who keeps it)."""
        ...

    def holders_by_card(self) -> Mapping[str, frozenset[PodKey]]:
        """Per card, the pods whose shares (or claims) are on it."""
        ...

    def freed_claims(self, removed: frozenset[PodKey]) -> frozenset[str]:
        """The claims (holds) the removal releases: a preemptor waits for them to go."""
        ...


@dataclass(frozen=True, slots=True)
class Unread:
    """A request that cannot be read now: why (the diagnosis's error), and whether it
    waits for a claim to arrive rather than for the pod's own change."""

    error: str
    waits_for_claims: bool = False


@dataclass(frozen=True, slots=True)
class Reserved:
    """What a decision carries for the node chosen: the devices and annotations of its
    Binding (annotations), or the writes on its claims (claims)."""

    devices: Mapping[str, model.PodSingleDevice] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    card_scores: Mapping[str, tuple[tuple[float, ...], ...]] = field(default_factory=dict)
    claim_writes: tuple[claim_wire.ClaimWrite, ...] = ()


class Plugin(Protocol[R, F]):
    """A dialect as the cycle calls it (see the module docstring). ``R``: what it reads of
    a pod (its request), ``F``: its fit on one node."""

    #: The dialect's name (logs, docs).
    name: str
    #: Whether preemption also walks each card's holders alone (``preempting``): for a
    #: dialect whose shares several pods may keep together (a shared claim).
    per_card_victims: bool

    def request(self, read: PodRead) -> R | Unread:
        """The pod's request (PreFilter), read once per attempt from the pod read once."""
        ...

    def shape(self, request: R) -> str:
        """What of the request, beyond the pod's shape, decides where it fits (its
        verdict is kept per both)."""
        ...

    def order(
        self, request: R, only: set[str] | None, rule_out: bool = True
    ) -> Iterable[NodeEntry]:
        """The nodes in the order the walk visits them, without those known in O(1) not
        to fit (the diagnosis judges them); ``only``: those that may fit (a verdict's
        changed nodes), in the same order. ``rule_out`` False: the walk judges the nodes
        it visits by classes (exact), and a node the O(1) rule-out left out is judged
        again by the verdict's refresh: leave out fewer, or none."""
        ...

    def fit(self, node: NodeEntry, request: R, now: float, room: Room | None = None) -> F:
        """The fit on one node: its gate and its cards (``room``: as a trial sees them)."""
        ...

    def settles(self, node: NodeEntry, request: R, fit: F) -> bool:
        """Whether the walk takes this fitting node without looking on."""
        ...

    def judge(self, name: str, request: R, now: float) -> NodeFailure | None:
        """Why the request does not fit node ``name`` now (None: it fits, or cannot be
        judged yet); the diagnosis of the nodes the walk did not fit."""
        ...

    def freeing(self, node: NodeEntry, request: R, now: float) -> Freeing:
        """What removals free on ``node`` (one trial's)."""
        ...

    def one_card(self, request: R) -> tuple[int, int] | None:
        """(MiB, cores) when the request asks one card of one device request and no quota
        limits it: preemption then judges each card by arithmetic first."""
        ...

    def taken_on_card(self, fit: F) -> tuple[int, int, int]:
        """What a fit of a one-card request (``one_card``) takes of its card: MiB, cores,
        slots."""
        ...

    def reserve(
        self, key: PodKey, request: R, node: NodeEntry, fit: F, now: float, nominated: bool
    ) -> Reserved:
        """Hold what the pod gets on ``node`` (its ``PodEntry`` and the dialect's holds),
        until its Binding, or (``nominated``) until its victims are gone."""
        ...
