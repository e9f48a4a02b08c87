"""The verdict on a shape of pod that fits nowhere: per node, why, kept current.

A pod that fits no node gets a diagnosis: each node's reason counts (``status``). The
pods of one shape (``shapes``) get the same one, so it is made once per shape and kept
in a ``Verdict`` while any pod of that shape waits. When the cluster changes, only the
nodes changed since (``changes.ChangeLog``) are judged again, and a node is judged by
classes of identical cards (``card_classes``) where the pod's reasons cannot depend on
card order, by the full Fit elsewhere. A verdict whose inputs did not change costs
nothing to reuse: the search need not visit any node (every node was ruled out and none
changed), and the diagnosis, its message included, is the same object.

What else a verdict depends on, and how it notices:
- the config and the quota limits (the books' epoch): judged again from scratch;
- the pod's namespace's quota usage, when a quota limits it (Fit's quota check reads it):
  from scratch when it moved;
- the clock, through node heartbeats (a node whose heartbeat is older than the inventory
  timeout offers no devices): each node's freshness deadline is kept in a heap, and a
  node past it, or one ruled out as stale whose heartbeat moved, is judged again.

The queue keeps each waiting pod's verdict as its hint: an event wakes the pod only if
its verdict says the event could let it fit (``fits_now``).
"""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol

from vgpu_operator.scheduling.dialects.annotation import card_classes, card_groups, placement
from vgpu_operator.scheduling.policies import node_layer
from vgpu_operator.scheduling.status import Diagnosis, NodeFailure, Reason, nodes_message

if TYPE_CHECKING:
    from vgpu_operator.scheduling.cycle.plugin import Fit


class JudgedBooks(Protocol):
    """What judging reads of the books (``judged.JudgedView`` provides it)."""

    @property
    def epoch(self) -> int: ...
    def change_seq(self) -> int: ...
    def changed_since(self, seq: int) -> set[str] | None: ...
    def judged_nodes(self) -> Iterable[str]: ...
    def has_node(self, name: str) -> bool: ...
    def node_count(self) -> int: ...
    def node_gate(
        self, name: str, job: placement.Job, now: float, key: object = None
    ) -> Reason | None: ...
    def judge_by_classes(
        self, name: str, job: placement.Job, now: float, key: object, groups: card_groups.GroupJudge
    ) -> card_classes.Judgement: ...
    def node_profile(self, name: str, with_ids: bool) -> card_classes.NodeProfile | None: ...
    def node_layer(self, name: str) -> node_layer.NodeLayer: ...
    def node_fit(self, name: str, job: placement.Job, now: float) -> placement.Outcome: ...
    def heartbeat(self, name: str) -> float | None: ...
    def fresh_until(self, name: str) -> float | None: ...
    def namespace_quota(self, namespace: str) -> object: ...


class NodeJudge(Protocol):
    """How a dialect other than the annotation path's judges one node for a shape (the
    claims dialect's, ``decision._Judge`` over ``claims_plugin``); its gate is part of it."""

    def judge(self, name: str, job: placement.Job, now: float) -> NodeFailure | None: ...


#: The gate keys in use (``Verdict.gate_key``).
_GATE_KEYS: dict[tuple[object, ...], tuple[object, ...]] = {}


def failure_of(outcome: Fit) -> NodeFailure:
    """The diagnosis entry of a Fit that failed."""
    refused_by = {r: frozenset(keys) for r, keys in outcome.refused_by.items()}
    return NodeFailure(dict(outcome.reasons), refused_by, dict(outcome.allowed_reasons))


#: Not judged in this attempt (``Verdict._judge_all``).
_UNKNOWN: Final = NodeFailure({})


def _only_stale(failure: NodeFailure | None) -> bool:
    if failure is None:
        return False
    reasons = failure.reasons
    return len(reasons) == 1 and Reason.INVENTORY_STALE in reasons


@dataclass(eq=False)
class Verdict:
    """Why pods of one shape fit no node, as of change ``seq`` of the books.

    ``failures`` holds every node ruled out, ``fitting`` the nodes it fitted (only a
    pod that admission refuses is judged where it may fit). Compared by identity: the
    queue groups waiting pods by their verdict.
    """

    shape: str
    job: placement.Job
    #: The books' epoch the job was parsed in (its vendors and quota ledger).
    job_epoch: int
    #: Judges nodes by card classes; None where card order may matter (full Fits).
    simple: card_classes.Simple | None
    epoch: int = -1
    quota_usage: object = None
    seq: int = -1
    failures: dict[str, NodeFailure] = field(default_factory=dict)
    fitting: set[str] = field(default_factory=set)
    nodes_total: int = 0
    #: Nodes ruled out as stale, with the heartbeat they had then.
    stale: dict[str, float | None] = field(default_factory=dict)
    #: (deadline, node): when each node judged fresh goes stale unless its heartbeat moves.
    _deadlines: list[tuple[float, str]] = field(default_factory=list)
    _diagnosis: Diagnosis | None = None
    _quota_bound: bool | None = None
    #: Kept as ``failures`` changes, so that a diagnosis renders without walking every
    #: node: nodes per main reason (as the message names it, and as a code), devices
    #: per reason.
    _by_text: dict[str, int] = field(default_factory=dict)
    _by_code: dict[str, int] = field(default_factory=dict)
    _devices: dict[str, int] = field(default_factory=dict)
    #: The dialect's judge of a node (None: the annotation path's gate and Fit).
    dialect: NodeJudge | None = None
    _gate_key: tuple[object, ...] | None = None
    #: ``simple``'s judgements per group of alike nodes (``card_groups``).
    _groups: card_groups.GroupJudge | None = None

    @classmethod
    def new(
        cls, shape: str, job: placement.Job, epoch: int, dialect: NodeJudge | None = None
    ) -> Verdict:
        if dialect is not None:
            return cls(shape, job, epoch, None, dialect=dialect)
        return cls(shape, job, epoch, card_classes.Simple.of(job))

    @property
    def namespace(self) -> str:
        return self.job.namespace

    def gate_key(self) -> tuple[object, ...]:
        """What the annotation path's node gate reads of the job (``node_gate.check``:
        CPU and memory, the node terms, whether it wants devices), made once."""
        if self._gate_key is None:
            job, terms = self.job, self.job.node_terms
            node_terms = json.dumps(
                [terms.tolerations, terms.selector, terms.affinity_terms],
                sort_keys=True,
                default=str,
            )
            key = (job.resources, node_terms, job.wants_devices)
            # One object per distinct key, so that a node's kept gate (``JudgedView``)
            # is matched by identity, not by comparing its Fractions.
            if len(_GATE_KEYS) >= 4096:
                _GATE_KEYS.clear()
            self._gate_key = _GATE_KEYS.setdefault(key, key)
        return self._gate_key

    def kin_key(self) -> tuple[object, ...] | None:
        """What judging a node reads of the job: the node gate's part (namespace,
        CPU and memory, node terms) and the card classes' (``Simple.key``). Verdicts
        with equal keys (pods of shapes that differ only in what no judgement reads,
        such as an annotation the engine ignores) rule every node out alike. None for
        a verdict judged otherwise (full Fits, the DRA path's judge)."""
        if self.simple is None or self.dialect is not None:
            return None
        return (self.job.namespace, self.gate_key(), self.simple.key)

    def take_judgements(self, kin: Verdict) -> None:
        """Start from the judgements of ``kin``, a verdict of the same ``kin_key`` made
        in the same epoch: each node's failure as of ``kin.seq`` is this shape's too, so
        the next refresh judges only the nodes changed since (``changed``), as kin's own
        would, instead of every node."""
        self.simple, self._groups = kin.simple, kin._groups
        self.epoch, self.quota_usage, self.seq = kin.epoch, kin.quota_usage, kin.seq
        self.failures = dict(kin.failures)
        self.fitting = set(kin.fitting)
        self.nodes_total = kin.nodes_total
        self.stale = dict(kin.stale)
        self._deadlines = list(kin._deadlines)
        self._diagnosis, self._quota_bound = kin._diagnosis, kin._quota_bound
        self._by_text, self._by_code = dict(kin._by_text), dict(kin._by_code)
        self._devices = dict(kin._devices)

    @property
    def quota_bound(self) -> bool:
        """Whether a quota ruled cards out (its namespace's usage falling may help);
        worked out once per refresh that changed something."""
        if self._quota_bound is None:
            self._quota_bound = any(
                Reason.RESOURCE_QUOTA_NOT_FIT in f.reasons for f in self.failures.values()
            )
        return self._quota_bound

    def diagnosis(self) -> Diagnosis:
        """The diagnosis as of the last refresh (the same object until it changes),
        rendered from the tallies kept as failures changed."""
        if self._diagnosis is None:
            failed, total = len(self.failures), self.nodes_total
            self._diagnosis = Diagnosis.rendered(
                dict(self.failures),
                total,
                message=nodes_message(self._by_text, failed, total),
                device_counts={r: n for r, n in self._devices.items() if n},
                main_reasons=tuple(sorted(c for c, n in self._by_code.items() if n)),
            )
        return self._diagnosis

    def _count(self, failure: NodeFailure, sign: int) -> None:
        if not failure.reasons:
            return
        text = failure.main_reason_text()
        code = failure.main_reason().value if failure.refused_by else text
        self._by_text[text] = self._by_text.get(text, 0) + sign
        self._by_code[code] = self._by_code.get(code, 0) + sign
        for reason, n in failure.reasons.items():
            self._devices[reason.value] = self._devices.get(reason.value, 0) + sign * n

    def _set(self, name: str, failure: NodeFailure | None) -> bool:
        """Record the node's failure (None: it fits); whether anything changed."""
        old = self.failures.get(name)
        if old == failure:
            return False
        if old is not None:
            self._count(old, -1)
        if failure is None:
            del self.failures[name]
        else:
            self.failures[name] = failure
            self._count(failure, 1)
        return True

    # --- keeping it current -----------------------------------------------------------
    def changed(self, books: JudgedBooks, now: float) -> set[str] | None:
        """The nodes that may fit now: those whose judgement may differ from the
        verdict's, and those it fitted; None when every node must be judged again (never
        made, config, quota limits or usage moved, or the change log no longer reaches
        back)."""
        if self.epoch != books.epoch or self.quota_usage != books.namespace_quota(self.namespace):
            return None
        since = books.changed_since(self.seq)
        if since is None:
            return None
        since |= self.fitting
        for name, beat in self.stale.items():
            if books.heartbeat(name) != beat:
                since.add(name)
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] < now:
            _, name = heapq.heappop(deadlines)
            until = books.fresh_until(name) if books.has_node(name) else None
            if until is not None and until >= now:
                heapq.heappush(deadlines, (until, name))  # its heartbeat moved on
            elif until is not None:
                since.add(name)
        return since

    def refresh(
        self,
        books: JudgedBooks,
        now: float,
        tried: Mapping[str, Fit],
        changed: set[str] | None,
        judged: Mapping[str, NodeFailure] | None = None,
    ) -> None:
        """Judge again the ``changed`` nodes (every node when None), taking the Fits in
        ``tried`` and the failures in ``judged`` (made at this moment of the books) as
        they are."""
        judged = judged or {}
        if changed is None:
            self._judge_all(books, now, tried, judged)
            updated = True
        else:
            updated = False
            for name in changed:
                updated |= self._judge_again(books, name, now, tried, judged)
        total = books.node_count()
        if len(self._deadlines) > 2 * total + 16:
            self._deadlines = _current_deadlines(books, {n for _, n in self._deadlines})
        if updated or total != self.nodes_total or self._diagnosis is None:
            self.nodes_total = total
            self._diagnosis = None
            self._quota_bound = None
        self.epoch = books.epoch
        self.quota_usage = books.namespace_quota(self.namespace)
        self.seq = books.change_seq()

    def _failure_now(
        self,
        books: JudgedBooks,
        name: str,
        now: float,
        tried: Mapping[str, Fit],
        judged: Mapping[str, NodeFailure],
    ) -> NodeFailure | None:
        outcome = tried.get(name)
        if outcome is not None:
            return None if outcome.ok else failure_of(outcome)
        if name in judged:
            return judged[name]
        return self.judge(books, name, now)

    def _judge_again(
        self,
        books: JudgedBooks,
        name: str,
        now: float,
        tried: Mapping[str, Fit],
        judged: Mapping[str, NodeFailure],
    ) -> bool:
        """One changed node judged again; whether its judgement changed."""
        if not books.has_node(name):
            self.stale.pop(name, None)
            self.fitting.discard(name)
            return self._set(name, None)
        failure = self._failure_now(books, name, now, tried, judged)
        updated = self._set(name, failure)
        if failure is None:
            self.fitting.add(name)
        else:
            self.fitting.discard(name)
        if _only_stale(failure):
            self.stale[name] = books.heartbeat(name)
        else:
            self.stale.pop(name, None)
            until = books.fresh_until(name) if self.job.wants_devices else None
            if until is not None:
                heapq.heappush(self._deadlines, (until, name))
        return updated

    def _judge_all(
        self,
        books: JudgedBooks,
        now: float,
        tried: Mapping[str, Fit],
        judged: Mapping[str, NodeFailure],
    ) -> None:
        """Every node judged afresh (as ``_judge_again`` does one), the tallies counted
        once at the end: nodes judged alike share one failure (``card_groups``), which
        is read once for all of them."""
        failures: dict[str, NodeFailure] = {}
        fitting: set[str] = set()
        stale: dict[str, float | None] = {}
        deadlines: list[tuple[float, str]] = []
        wants_devices = self.job.wants_devices
        for name in books.judged_nodes():
            failure: NodeFailure | None = judged.get(name, _UNKNOWN)
            if failure is _UNKNOWN:
                failure = self._failure_now(books, name, now, tried, judged)
            if failure is None:
                fitting.add(name)
            else:
                failures[name] = failure
                reasons = failure.reasons
                if len(reasons) == 1 and Reason.INVENTORY_STALE in reasons:
                    stale[name] = books.heartbeat(name)
                    continue
            until = books.fresh_until(name) if wants_devices else None
            if until is not None:
                deadlines.append((until, name))
        heapq.heapify(deadlines)
        self.failures, self.fitting, self.stale, self._deadlines = (
            failures,
            fitting,
            stale,
            deadlines,
        )
        self._by_text, self._by_code, self._devices = {}, {}, {}
        values = list(failures.values())
        distinct = dict(zip(map(id, values), values, strict=True))
        for number, nodes in Counter(map(id, values)).items():
            self._count(distinct[number], nodes)

    # --- judging one node ---------------------------------------------------------------
    def judge(self, books: JudgedBooks, name: str, now: float) -> NodeFailure | None:
        """Why the shape does not fit node ``name`` now (None: it fits)."""
        job = self.job
        if self.dialect is not None:
            return self.dialect.judge(name, job, now)
        simple = self.simple
        if simple is not None:
            groups = self._groups
            if groups is None or groups.simple is not simple:
                groups = self._groups = card_groups.GroupJudge(simple)
            judged = books.judge_by_classes(name, job, now, self.gate_key(), groups)
            if judged is not card_classes.UNJUDGED:
                return judged  # type: ignore[return-value]
        else:
            gate = books.node_gate(name, job, now, self.gate_key())
            if gate is not None:
                return NodeFailure({gate: 1})
        outcome = books.node_fit(name, job, now)
        return None if outcome.ok else failure_of(outcome)

    def fits_now(self, books: JudgedBooks, name: str, now: float) -> bool:
        """Whether the shape fits node ``name`` as the books are now (a queueing hint:
        an event on that node wakes the shape's pods only then). A node whose cards
        could not take the request even idle is ruled out without judging it."""
        if not books.has_node(name):
            return False
        simple = self.simple
        if simple is not None:
            profile = books.node_profile(name, simple.wants_ids(books.node_layer(name)))
            if profile is not None and not simple.could_ever(profile):
                return False
        failure = self.judge(books, name, now)
        if failure is not None and Reason.RESOURCE_QUOTA_NOT_FIT in failure.reasons:
            # A node judged here only (one that appeared, or changed, since the last
            # refresh) may be ruled out by the quota alone: the namespace's usage falling
            # must then wake the shape, though no refreshed failure says so yet.
            self._quota_bound = True
        return failure is None


def _current_deadlines(books: JudgedBooks, names: Iterable[str]) -> list[tuple[float, str]]:
    """The deadline heap again, one entry per node, from the nodes' heartbeats now."""
    deadlines = [
        (until, name)
        for name in names
        if books.has_node(name) and (until := books.fresh_until(name)) is not None
    ]
    heapq.heapify(deadlines)
    return deadlines
