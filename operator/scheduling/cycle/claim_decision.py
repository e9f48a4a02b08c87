"""One decision on the DRA path: a pod whose claims use this driver's DeviceClasses.

The engine picks the node as for the annotation path (the same ranking: each node's
policy from its annotation or the ConfigMap, or the pod's own, best first; the same
node checks: taints, selectors, affinity, CPU and memory, a stale agent), then the cards
on it with ``claim_fit``, and holds what it chose in the books until the claims come back
allocated. Claims already allocated (by anyone, or shared with other pods) are respected:
they pin the pod to their node and are only reserved for it.

The outcome (``ClaimPlacement``) carries what the runtime writes before the Binding: per
claim, its ``status.allocation`` (None for a claim allocated already) and the pod's
``reservedFor`` entry.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpu_operator import names
from vgpu_operator.devices import dra, model, vendor
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.books import group_claims
from vgpu_operator.scheduling.books.entries import NodeEntry, PodEntry
from vgpu_operator.scheduling.books.view import BooksView, BooksWriter
from vgpu_operator.scheduling.cycle import node_gate
from vgpu_operator.scheduling.cycle.fragmentation_order import Placer
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import (
    claim_best_fit,
    claim_fit,
    claim_mig,
    claim_routing,
    claim_wire,
    claims,
    dra_pool,
    extended_claims,
)
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.scheduling.policies import policies
from vgpu_operator.scheduling.preemption import preemption
from vgpu_operator.scheduling.status import Diagnosis, NodeFailure, Reason


@dataclass(frozen=True, slots=True)
class ClaimWrite:
    """What to write on one claim before the pod's Binding."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    #: ``status.allocation`` to write; None when the claim is allocated already.
    allocation: Mapping[str, Any] | None
    consumer: Mapping[str, str]
    #: The claim to create first: the pod's special claim (``extended_claims``).
    create: Mapping[str, Any] | None = None
    #: ``status.extendedResourceClaimStatus`` to write on the pod once the claim is.
    pod_status: Mapping[str, Any] | None = None
    #: A group claim another member's decision is allocating: nothing to write, the
    #: Binding waits until that allocation is (``group_claims``).
    awaits_allocation: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Sharing:
    """The pod's group claims (``group_claims``): its PodGroup, the claims that are the
    group's, and those another member's decision is allocating."""

    group: group_claims.GroupClaims | None = None
    keys: frozenset[str] = frozenset()
    pinned: frozenset[str] = frozenset()

    def consumer_of(self, key: str, own: Mapping[str, str]) -> Mapping[str, str]:
        """Who the claim ``key`` is reserved for: the group for a group claim."""
        return self.group.consumer() if self.group is not None and key in self.keys else own


def _awaiting(claim: claims.Claim, consumer: Mapping[str, str]) -> ClaimWrite:
    return ClaimWrite(
        claim.namespace,
        claim.name,
        claim.uid,
        claim.resource_version,
        None,
        consumer,
        awaits_allocation=True,
    )


@dataclass(frozen=True, slots=True)
class ClaimPlacement:
    node: str | None
    writes: tuple[ClaimWrite, ...] = ()
    diagnosis: Diagnosis | None = None
    card_scores: tuple[float, ...] = ()
    #: Per candidate node, its score before the pod (only when asked to explain).
    node_scores: Mapping[str, float] = field(default_factory=dict)
    #: A claim the pod names is not in the books yet: its arrival, not the pod's own
    #: change, lets the pod be placed.
    waits_for_claims: bool = False
    #: When no node fits: how to judge a node for the pod's claims as read (its verdict's).
    judge: ClaimJudge | None = None
    #: When no node fits: the pod's claims as read (what preemption fits).
    wanted: claims.PodClaims | None = None


#: Given the claims' shape (``ClaimJudge.shape``): node -> its failure as the pod's
#: verdict holds it, for the nodes unchanged since (None: no such verdict).
KnownFailures = Callable[[str], Mapping[str, NodeFailure] | None]


class ClaimDialect:
    """The DRA dialect of the decision cycle: the node walk and gate are the cycle's
    (the ranking, ``node_gate``), the cards come from claims (``claim_fit``)."""

    def __init__(self, books: BooksWriter, placer: Placer | None = None) -> None:
        self.books = books
        #: The ``fragmentation`` node policy's walk (None: the policy orders as binpack).
        self.placer = placer
        #: Typed as the read view: every read goes through it.
        self.view: BooksView = books

    def place(
        self,
        key: PodKey,
        pod: Mapping[str, Any],
        job: placement.Job,
        now: float,
        explain: bool = False,
        known: KnownFailures | None = None,
    ) -> ClaimPlacement:
        """The node and cards for the pod's claims (``job``: the pod as read once), held
        in the books until the claims come back allocated. ``known``: given the claims'
        shape, the nodes whose failure the pod's verdict still holds (not fitted again)."""
        total = len(self.view.nodes)
        objects = self.view.claims.objects
        special: extended_claims.Special | None = None
        resources = self.extended_resources()
        if extended_claims.asks(pod, resources):
            try:
                special = extended_claims.special(pod, resources, objects, self.view.vendors)
            except extended_claims.Refusal as exc:
                return ClaimPlacement(None, diagnosis=Diagnosis({}, total, error=str(exc)))
            pod, objects = extended_claims.with_special(pod, objects, special)
        try:
            wanted = claims.read_pod_claims(
                pod,
                objects,
                self.view.claims.classes,
                self.view.claims.selector_cache,
            )
            group = group_claims.of_pod(pod, self.view.group_claims)
            shared = frozenset() if group is None else group_claims.claim_keys(pod, group[1])
            wanted, pinned = group_claims.pin_to_decided(wanted, shared, key, self.view.claims)
        except claims.Waiting as exc:
            diagnosis = Diagnosis({}, total, error=str(exc))
            return ClaimPlacement(None, diagnosis=diagnosis, waits_for_claims=True)
        except (claims.Refusal, CodecError) as exc:
            return ClaimPlacement(None, diagnosis=Diagnosis({}, total, error=str(exc)))
        refused = _admin_access_refusal(wanted.pending, self.view.claims.admin_namespaces)
        if refused is not None:
            return ClaimPlacement(None, diagnosis=Diagnosis({}, total, error=refused))
        failures: dict[str, NodeFailure] = {}
        # Nodes unchanged since the verdict on this shape ruled them out stay ruled out
        # for the same reasons: only the others are fitted (as on the annotation path).
        skip = known(ClaimJudge(self, wanted).shape) if known is not None else None
        found: tuple[NodeEntry, claim_fit.ClaimsOutcome] | None = None
        scores: dict[str, float] = {}
        # A request for several cards looks on, past the first node that fits, for one
        # where they are linked (the first such node wins; else the first that fits).
        wants_links = any(r.count > 1 for c in wanted.pending for r in c.requests)
        linked = False
        if skip:
            nodes = self.view.nodes
            failures.update((n, f) for n, f in skip.items() if n in nodes)
        for node in self._claim_order(job, wanted, skip or {}):
            outcome = self._fit_claims_on(node, job, wanted, now)
            if outcome.error is not None:
                return ClaimPlacement(None, diagnosis=Diagnosis({}, total, error=outcome.error))
            if not outcome.ok:
                failures[node.name] = _failure(outcome)
                continue
            scores[node.name] = node.score
            on_links = wants_links and _linked(outcome, node.pair_scores)
            if found is None or (on_links and not linked):
                found, linked = (node, outcome), on_links
            if not explain and (not wants_links or linked):
                break
        if found is None:
            for name in self.view.nodes:
                failures.setdefault(name, NodeFailure({Reason.NODE_NOT_CLAIMS_NODE: 1}))
            judge = ClaimJudge(self, wanted)
            diagnosis = Diagnosis(failures, total)
            return ClaimPlacement(None, diagnosis=diagnosis, judge=judge, wanted=wanted)
        sharing = Sharing(None if group is None else group[0], shared, pinned)
        return self._book(key, pod, job, wanted, found, scores, special, sharing)

    def extended_resources(self) -> dict[str, str]:
        """Extended resource -> our DeviceClass serving it (``extended_claims``)."""
        return extended_claims.mapping(
            (c.name, c.extended_resource_name)
            for c in self.view.claims.classes.values()
            if c.name in claim_routing.OUR_CLASSES and c.name != dra.MIG_CLASS
        )

    def _book(
        self,
        key: PodKey,
        pod: Mapping[str, Any],
        job: placement.Job,
        wanted: claims.PodClaims,
        found: tuple[NodeEntry, claim_fit.ClaimsOutcome],
        scores: dict[str, float],
        special: extended_claims.Special | None = None,
        sharing: Sharing | None = None,
    ) -> ClaimPlacement:
        """Hold what the pod gets on the node found, and say what to write on its claims
        (a group claim is reserved for the PodGroup, not the pod: ``group_claims``)."""
        own = claim_wire.consumer(pod)
        sharing = sharing or Sharing()
        node, outcome = found
        writes: list[ClaimWrite] = []
        decided: dict[str, tuple[str, list[claim_fit.Pick]]] = {}
        for claim in wanted.claims:
            consumer = sharing.consumer_of(claim.key, own)
            reserved = any(r.get("uid") == consumer["uid"] for r in claim.reserved_for)
            if claim.key in sharing.pinned:
                writes.append(_awaiting(claim, consumer))
                continue
            allocation = None
            if claim.allocated_node is None:
                picks = outcome.picks[claim.key]
                allocation = claim_wire.allocation(
                    claim, node.name, picks, self.view.claims.classes
                )
                decided[claim.key] = (claim.namespace, picks)
            elif reserved and not _status_missing(pod, claim.name, special):
                continue
            create: Mapping[str, Any] | None = None
            pod_status: Mapping[str, Any] | None = None
            if special is not None and claim.name == special.name:
                create = special.claim if special.new else None
                pod_status = special.status
            writes.append(
                ClaimWrite(
                    claim.namespace,
                    claim.name,
                    claim.uid,
                    claim.resource_version,
                    allocation,
                    consumer,
                    create=create,
                    pod_status=pod_status,
                )
            )
        self.books.hold_decided(key, node.name, decided)
        self.books.add_pod(
            PodEntry(
                key=key,
                namespace=job.namespace,
                node=node.name,
                requests=job.resources,
                devices={},
                bookings={},
                reserved=True,
                # Read by preemption once bound, before the bound copy comes back.
                priority=preemption.priority_of(pod),
                labels=dict((pod.get("metadata") or {}).get("labels") or {}),
                uid=own["uid"],
            )
        )
        return ClaimPlacement(node.name, tuple(writes), None, outcome.card_scores, scores)

    def judge(
        self, name: str, job: placement.Job, wanted: claims.PodClaims, now: float
    ) -> NodeFailure | None:
        """Why the claims do not fit node ``name`` now (None: they may; also when they
        cannot be judged without a CEL verdict still being computed)."""
        node = self.view.nodes.get(name)
        if node is None:
            return NodeFailure({Reason.NODE_NOT_CLAIMS_NODE: 1})
        if wanted.node is not None and name != wanted.node:
            return NodeFailure({Reason.NODE_NOT_CLAIMS_NODE: 1})
        outcome = self._fit_claims_on(node, job, wanted, now)
        if outcome.ok or outcome.error is not None:
            return None
        return _failure(outcome)

    def _claim_order(
        self, job: placement.Job, wanted: claims.PodClaims, skip: Mapping[str, NodeFailure]
    ) -> list[NodeEntry]:
        """The candidates but those in ``skip``; under binpack, where the claims fit most
        tightly first (``claim_best_fit``)."""
        ranked = [n for n in self._claim_candidates(job, wanted.node) if n.name not in skip]
        if wanted.node is not None or not wanted.pending:
            return ranked
        default = self.view.config.scheduler.node_scheduler_policy
        if self.placer is not None and self.placer.walks_nodes(job, default):
            for node in ranked:
                self.view.refresh(node)
            requests = [r for c in wanted.pending for r in c.requests]
            return self.placer.order_claims(pod_key(job.pod), job, ranked, requests)
        if not self._binpacking(job, ranked):
            return ranked
        for node in ranked:
            self.view.refresh(node)
        # MIG instances are placed by counters (``claim_mig``): no card measure.
        requests = [r for c in wanted.pending if not claim_mig.is_mig(c) for r in c.requests]
        if not requests:
            return ranked
        return claim_best_fit.tightest_first(ranked, lambda n: n.cards, requests)

    def _binpacking(self, job: placement.Job, nodes: list[NodeEntry]) -> bool:
        """Whether binpack ranks these nodes: the pod's node policy, else each node's own."""
        if job.pod_node_policy is not None:
            return job.pod_node_policy == policies.BINPACK
        default = self.view.config.scheduler.node_scheduler_policy
        return all((n.layer.node_policy or default) == policies.BINPACK for n in nodes)

    def _claim_candidates(self, job: placement.Job, pinned: str | None) -> list[NodeEntry]:
        """Nodes in the order the annotation path would try them (best-ranked first),
        every node once; only ``pinned`` when allocated claims fix the node."""
        if pinned is not None:
            node = self.view.nodes.get(pinned)
            return [] if node is None else [node]
        self.view.rerank()
        ranking = self.view.ranking(job.pod_node_policy)
        ranked = [self.view.nodes[name] for _score, _order, name in ranking]
        seen = {n.name for n in ranked}
        rest = [n for n in self.view.nodes.values() if n.name not in seen]
        rest.sort(key=lambda n: n.order)
        return [*ranked, *rest]

    def fit_on(
        self,
        node: NodeEntry,
        job: placement.Job,
        wanted: claims.PodClaims,
        now: float,
        cards: list[model.DeviceUsage],
        leaving: Sequence[PodEntry],
        released: Sequence[str] = (),
    ) -> claim_fit.ClaimsOutcome:
        """The claims' Fit on ``cards`` (the node's, as if some holds were released) with
        ``leaving`` gone from the node and the MIG instances ``released`` (a device name
        per released result) given back: preemption's trials (``claim_preemption``)."""
        return self._fit_claims_on(node, job, wanted, now, cards, leaving, released)

    def _fit_claims_on(
        self,
        node: NodeEntry,
        job: placement.Job,
        wanted: claims.PodClaims,
        now: float,
        cards: list[model.DeviceUsage] | None = None,
        leaving: Sequence[PodEntry] = (),
        released: Sequence[str] = (),
    ) -> claim_fit.ClaimsOutcome:
        self.view.refresh(node)
        timeout = self.view.inventory_timeout_s
        refused = node_gate.check(node, job, now, timeout, claims=True, leaving=leaving)
        if refused is not None:
            return claim_fit.ClaimsOutcome(False, reasons=_one(refused))
        pool = self.view.claims.pool_of(node.name)
        if pool is None and self.view.claims.mig_of(node.name) is None:
            return claim_fit.ClaimsOutcome(False, reasons=_one(Reason.NODE_NOT_ON_DRA_PATH))
        if not wanted.pending:
            return claim_fit.ClaimsOutcome(True)
        mig = [c for c in wanted.pending if claim_mig.is_mig(c)]
        if mig:
            # MIG claims take instances by counters (``claim_mig``), the rest cards.
            placed = claim_mig.fit_mig_claims(
                job,
                mig,
                self.view.claims.mig_of(node.name),
                _less(self.view.claims.held_devices(node.name), released),
                self.view.claims.selector_cache,
            )
            rest = [c for c in wanted.pending if not claim_mig.is_mig(c)]
            if not placed.ok or not rest:
                return placed
            if pool is None:
                return claim_fit.ClaimsOutcome(False, reasons=_one(Reason.NODE_NOT_ON_DRA_PATH))
            instances = [(p.consumption.memory_mib, 0) for ps in placed.picks.values() for p in ps]
            others = self._fit_cards(node, job, rest, pool, cards, instances)
            others.picks.update(placed.picks)
            return others
        if pool is None:
            return claim_fit.ClaimsOutcome(False, reasons=_one(Reason.NODE_NOT_ON_DRA_PATH))
        return self._fit_cards(node, job, wanted.pending, pool, cards)

    def _fit_cards(
        self,
        node: NodeEntry,
        job: placement.Job,
        pending: Sequence[claims.Claim],
        pool: dra_pool.Pool,
        cards: list[model.DeviceUsage] | None,
        earlier: Sequence[tuple[int, int]] = (),
    ) -> claim_fit.ClaimsOutcome:
        """The claims of shared and exclusive classes on the node's cards (``earlier``:
        what the pod's MIG instances take, for the quota)."""
        # A DRA card is named by its device name, the UUID lower-cased: cordons and the
        # node layer's UUID restrictions name UUIDs.
        cordon_note = node.facts.annotations.get(names.NODE_DEVICE_CORDON)
        cordoned = frozenset(
            c.lower() for c in (*node.inventory_cordoned, *vendor.split_list(cordon_note))
        )
        spec = self.view.vendors.spec(dra.VENDOR)
        uuid_keys = (spec.use_uuid_annotation, spec.nouse_uuid_annotation)
        layer = dataclasses.replace(
            node.layer,
            restrictions={
                k: v.lower() if k in uuid_keys else v for k, v in node.layer.restrictions.items()
            },
        )
        return claim_fit.fit_claims(
            job,
            pending,
            pool,
            node.cards if cards is None else cards,
            node.pair_scores,
            cordoned,
            layer,
            self.view.claims.selector_cache,
            earlier,
        )


class ClaimJudge:
    """Judges one node for a pod's claims as read at its last attempt: the verdict of a
    pod on the DRA path judges nodes with it (``verdicts.NodeJudge``), so that an event
    wakes the pod only where its claims may fit now."""

    def __init__(self, dialect: ClaimDialect, wanted: claims.PodClaims) -> None:
        self._dialect = dialect
        self._wanted = wanted

    @property
    def shape(self) -> str:
        """What of the claims decides where they fit (their requests, and for claims
        allocated already their node): added to the pod's shape (``shapes``)."""
        read = [
            (
                c.requests,
                c.match_attributes,
                c.config,
                c.whole_devices,
                c.allocated_node,
                c.choices,
                c.distinct_attributes,
            )
            for c in self._wanted.claims
        ]
        return "+claims:" + hashlib.blake2b(repr(read).encode(), digest_size=16).hexdigest()

    def judge(self, name: str, job: placement.Job, now: float) -> NodeFailure | None:
        return self._dialect.judge(name, job, self._wanted, now)


def _status_missing(
    pod: Mapping[str, Any], claim: str, special: extended_claims.Special | None
) -> bool:
    """Whether ``claim`` is the pod's special claim, reserved for it already (an attempt
    cut short before its Binding, e.g. by a restart) but not named in its status yet."""
    if special is None or claim != special.name:
        return False
    written = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    return bool(written.get("resourceClaimName") != claim)


def _failure(outcome: claim_fit.ClaimsOutcome) -> NodeFailure:
    return NodeFailure(
        dict(outcome.reasons), {r: frozenset(k) for r, k in outcome.refused_by.items()}
    )


def _linked(outcome: claim_fit.ClaimsOutcome, pair_scores: model.PairScores) -> bool:
    """Whether every request's cards are linked to each other (a positive pair score)."""
    for picks in outcome.picks.values():
        by_request: dict[str, list[str]] = {}
        for pick in picks:
            by_request.setdefault(pick.request, []).append(pick.device.name)
        for cards in by_request.values():
            for i, card in enumerate(cards):
                for other in cards[i + 1 :]:
                    score = max(
                        (pair_scores.get(card) or {}).get(other, 0),
                        (pair_scores.get(other) or {}).get(card, 0),
                    )
                    if score <= 0:
                        return False
    return True


def _one(reason: Reason) -> Counter[Reason]:
    return Counter({reason: 1})


def _less(held: Sequence[str], released: Sequence[str]) -> list[str]:
    """``held`` with one occurrence of each of ``released`` taken out (a device held by
    two claims still holds when only one of them is released)."""
    if not released:
        return list(held)
    left = Counter(released)
    out = []
    for name in held:
        if left[name] > 0:
            left[name] -= 1
        else:
            out.append(name)
    return out


def _admin_access_refusal(pending: Sequence[claims.Claim], allowed: frozenset[str]) -> str | None:
    """Why a claim's adminAccess request is not allocated: upstream allows adminAccess
    only in namespaces an administrator labelled for it (the API server refuses such a
    claim elsewhere when it is made; one made before the label went is refused here)."""
    for claim in pending:
        requests = [r for choice in claim.choices for r in choice] or list(claim.requests)
        admin = [r.name for r in requests if r.admin_access]
        if not admin:
            continue
        if claim_mig.is_mig(claim):
            return (
                f"ResourceClaim {claim.key}, request {admin[0]!r} asks adminAccess, which this "
                f"scheduler does not honour for DeviceClass {dra.MIG_CLASS}; remove it"
            )
        if claim.namespace not in allowed:
            return (
                f"ResourceClaim {claim.key}, request {admin[0]!r} asks adminAccess, which is "
                f"allowed only in namespaces an administrator labelled "
                f"{names.ADMIN_ACCESS_LABEL}=true, and namespace {claim.namespace} is not: "
                "remove adminAccess, or ask an administrator for the label"
            )
    return None
