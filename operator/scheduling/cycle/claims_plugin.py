"""DRA's claims dialect as a plugin of the decision cycle (``plugin.Plugin``): a pod whose
claims use this driver's DeviceClasses.

The request is the pod's claims, read at each attempt (they change on their own:
``claims.read_pod_claims``, with the special claim of a pod that asks an extended resource
one of our classes serves, ``extended_claims``) and its Job (CPU, memory, node terms). The
node order is the annotation dialect's ranking (each node's policy from its annotation or
the ConfigMap, or the pod's own, best first), then the nodes it does not rank, every node
once; under binpack the nodes where the claims fit most tightly first (``claim_best_fit``),
under ``fragmentation`` the placer's; only their node when claims allocated already pin
the pod. The fit is the one node gate (claims=True) and ``claim_fit`` on the node's cards
(the node layer's restrictions, cordons, taints, quota). A request for several cards
looks on, past the first node that fits, for one where they are linked. A reservation
holds what the fit chose in the books until the claims come back allocated; claims
already allocated (by anyone, or shared with other pods) are respected and only reserved
for the pod.

The reservation (``Reserved.claim_writes``) carries what the runtime writes before the
Binding: per claim, its ``status.allocation`` (None for a claim allocated already) and the
pod's ``reservedFor`` entry.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence

from vgpu_operator.devices import dra, model
from vgpu_operator.scheduling import node_annotations
from vgpu_operator.scheduling.books import pod_entries
from vgpu_operator.scheduling.books.books import Books
from vgpu_operator.scheduling.books.entries import NodeEntry, PodEntry
from vgpu_operator.scheduling.books.view import BooksView, BooksWriter
from vgpu_operator.scheduling.cycle import claims_request, node_gate
from vgpu_operator.scheduling.cycle.claims_freeing import ClaimsFreeing
from vgpu_operator.scheduling.cycle.claims_request import ClaimsRequest, Classed
from vgpu_operator.scheduling.cycle.fragmentation_order import Placer
from vgpu_operator.scheduling.cycle.plugin import Reserved, Room, Unread, job_in_room
from vgpu_operator.scheduling.cycle.pod_read import PodRead
from vgpu_operator.scheduling.cycle.verdicts import failure_of
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import (
    claim_best_fit,
    claim_classes,
    claim_fit,
    claim_mig,
    claim_routing,
    claim_wire,
    claims,
    dra_pool,
    extended_claims,
)
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.scheduling.policies import node_layer, policies
from vgpu_operator.scheduling.status import NodeFailure, Reason
from vgpu_operator.wire import Pod, PodExtendedResourceClaimStatus, ResourceClaim


class ClaimsPlugin:
    """The claims dialect (see the module docstring)."""

    name = "claims"
    #: A claim shared by several pods is released only when all of them go: preemption
    #: walks each card's holders alone too (``preempting.select_victims``).
    per_card_victims = True

    def __init__(
        self, books: BooksWriter, placer: Placer | None = None, classes: bool = True
    ) -> None:
        self.books = books
        #: The ``fragmentation`` node policy's walk (None: the policy orders as binpack).
        self.placer = placer
        #: Typed as the read view: every read goes through it.
        self.view: BooksView = books
        #: Simple claims judged by node classes (``claim_classes``), on the live books
        #: only (an overlay's changes are not numbered by its change log); None: every
        #: node fitted in full (the tests compare).
        self._classes = claim_classes.Classes() if classes and isinstance(books, Books) else None
        #: Per node: its change, and what removals free there (``freeing``).
        self._freeings: dict[str, tuple[object, ClaimsFreeing]] = {}
        #: Per node: its change, its cordoned cards and layer as the claims' fit reads them.
        self._node_inputs: dict[
            str, tuple[object, tuple[frozenset[str], node_layer.NodeLayer, bool]]
        ] = {}

    # --- the request ----------------------------------------------------------------------
    def request(self, read: PodRead) -> ClaimsRequest | Unread:
        """The pod's claims as the books hold them now, or why they cannot be read (a
        claim not made yet is a wait for it): ``claims_request``."""
        resources = self.extended_resources()
        return claims_request.read_request(self.view, read, resources, self._classed)

    def shape(self, request: ClaimsRequest) -> str:
        return request.shape

    def _classed(self, wanted: claims.PodClaims, job: placement.Job) -> Classed | None:
        """A simple claim's request and its key (``claim_classes``), or None."""
        if self._classes is None:
            return None
        request = claim_classes.simple_request(wanted.pending, job)
        if request is None:
            return None
        key = claim_classes.request_key(request, wanted.pending[0].whole_devices, job)
        return request, self._classes.number(key)

    def extended_resources(self) -> dict[str, str]:
        """Extended resource -> our DeviceClass serving it (``extended_claims``)."""
        return extended_claims.mapping(
            (c.name, c.extended_resource_name)
            for c in self.view.claims.classes.values()
            if c.name in claim_routing.OUR_CLASSES and c.name != dra.MIG_CLASS
        )

    # --- the walk -------------------------------------------------------------------------
    def order(
        self, request: ClaimsRequest, only: set[str] | None, rule_out: bool = True
    ) -> list[NodeEntry]:
        """The candidates (``only``: those of them); under binpack, where the claims fit
        most tightly first (``claim_best_fit``); under ``fragmentation``, the placer's.
        (No O(1) rule-out: ``rule_out`` changes nothing.)"""
        job, wanted = request.job, request.wanted
        ranked = self._claim_candidates(job, wanted.node)
        if only is not None:
            ranked = [n for n in ranked if n.name in only]
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

    def fit(
        self, node: NodeEntry, request: ClaimsRequest, now: float, room: Room | None = None
    ) -> claim_fit.ClaimsOutcome:
        if room is None:
            return self._fit_claims_on(
                node, request.job, request.wanted, now, classed=request.classed
            )
        job = job_in_room(request.job, room)
        return self._fit_claims_on(
            node,
            job,
            request.wanted,
            now,
            room.cards,
            room.leaving,
            room.instances,
            request.classed,
        )

    def settles(
        self, node: NodeEntry, request: ClaimsRequest, fit: claim_fit.ClaimsOutcome
    ) -> bool:
        """A request for several cards looks on, past the first node that fits, for one
        where they are linked (the first such node wins; else the first that fits)."""
        wanted = request.wanted
        wants_links = any(r.count > 1 for c in wanted.pending for r in c.requests)
        return not wants_links or _linked(fit, node.pair_scores)

    def judge(self, name: str, request: ClaimsRequest, now: float) -> NodeFailure | None:
        """Why the claims do not fit node ``name`` now (None: they may; also when they
        cannot be judged without a CEL verdict still being computed)."""
        node = self.view.nodes.get(name)
        wanted = request.wanted
        if node is None or (wanted.node is not None and name != wanted.node):
            return NodeFailure({Reason.NODE_NOT_CLAIMS_NODE: 1})
        outcome = self._fit_claims_on(node, request.job, wanted, now, classed=request.classed)
        if outcome.ok or outcome.error is not None:
            return None
        return failure_of(outcome)

    # --- preemption -----------------------------------------------------------------------
    def freeing(self, node: NodeEntry, request: ClaimsRequest, now: float) -> ClaimsFreeing:
        """What removals free on ``node``: its holds read once per change of the node
        (a victim search reads them on each of up to 100 candidate nodes)."""
        if self._classes is None:
            return ClaimsFreeing(self.view, node)
        stamp = (self.view.epoch, self.view.change_log.last(node.name))
        kept = self._freeings.get(node.name)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        made = ClaimsFreeing(self.view, node)
        if len(self._freeings) > 4 * len(self.view.nodes) + 64:
            self._freeings.clear()
        self._freeings[node.name] = (stamp, made)
        return made

    def one_card(self, request: ClaimsRequest) -> tuple[int, int] | None:
        """The request's memory (MiB) and cores when the pod asks one card (one claim to
        allocate, one request of count 1, no constraint, no MIG instance) and no quota
        limits it: then each card is judged alone by arithmetic first."""
        pending = request.wanted.pending
        if len(pending) != 1 or pending[0].match_attributes or len(pending[0].requests) != 1:
            return None
        if claim_mig.is_mig(pending[0]):
            return None  # an instance is fitted by counters, not by a card's free room
        job = request.job
        [wanted] = pending[0].requests
        if wanted.count != 1 or job.quota.has_limits(job.namespace):
            return None
        memory = int(-(-wanted.capacity.get(dra.MEMORY, 0) // dra.MIB))
        return memory, int(-(-wanted.capacity.get(dra.CORES, 0) // 1))

    def taken_on_card(self, fit: claim_fit.ClaimsOutcome) -> tuple[int, int, int]:
        [picks] = fit.picks.values()
        need = picks[0].consumption
        return need.memory_mib, need.cores, need.slots

    # --- reserve --------------------------------------------------------------------------
    def reserve(
        self,
        key: PodKey,
        request: ClaimsRequest,
        node: NodeEntry,
        fit: claim_fit.ClaimsOutcome,
        now: float,
        nominated: bool,
    ) -> Reserved:
        """Hold what the pod gets on ``node`` until its claims come back allocated (or, for
        a preemptor, until its victims and their claims are gone) and, when placed, say
        what to write on its claims."""
        pod, wanted = request.pod, request.wanted
        own = claim_wire.consumer(pod)
        decided = {
            c.key: (c.namespace, fit.picks[c.key]) for c in wanted.pending if c.key in fit.picks
        }
        self.books.hold_decided(key, node.name, decided)
        # Read by preemption once bound, before the bound copy comes back.
        entry = pod_entries.reservation(key, request.job, pod, node.name, {}, uid=own["uid"])
        self.books.add_pod(entry)
        if nominated:
            return Reserved()
        writes = self._writes(request, node, fit, own)
        scores = {dra.VENDOR: (fit.card_scores,)} if fit.card_scores else {}
        return Reserved(card_scores=scores, claim_writes=writes)

    def _writes(
        self,
        request: ClaimsRequest,
        node: NodeEntry,
        fit: claim_fit.ClaimsOutcome,
        own: Mapping[str, str],
    ) -> tuple[claim_wire.ClaimWrite, ...]:
        """What to write on the pod's claims before its Binding (a group claim is reserved
        for the PodGroup, not the pod: ``group_claims``)."""
        writes: list[claim_wire.ClaimWrite] = []
        special, sharing = request.special, request.sharing
        for claim in request.wanted.claims:
            consumer = sharing.consumer_of(claim.key, own)
            reserved = any(r.get("uid") == consumer["uid"] for r in claim.reserved_for)
            if claim.key in sharing.pinned:
                writes.append(_awaiting(claim, consumer))
                continue
            allocation = None
            if claim.allocated_node is None:
                picks = fit.picks[claim.key]
                allocation = claim_wire.allocation(
                    claim, node.name, picks, self.view.claims.classes
                )
            elif reserved and not _status_missing(request.pod, claim.name, special):
                continue
            create: ResourceClaim | None = None
            pod_status: PodExtendedResourceClaimStatus | None = None
            if special is not None and claim.name == special.name:
                create = special.claim if special.new else None
                pod_status = special.status
            writes.append(
                claim_wire.ClaimWrite(
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
        return tuple(writes)

    def _fit_claims_on(
        self,
        node: NodeEntry,
        job: placement.Job,
        wanted: claims.PodClaims,
        now: float,
        cards: list[model.DeviceUsage] | None = None,
        leaving: Sequence[PodEntry] = (),
        released: Sequence[str] = (),
        classed: Classed | None = None,
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
        return self._fit_cards(node, job, wanted.pending, pool, cards, classed=classed)

    def _fit_cards(
        self,
        node: NodeEntry,
        job: placement.Job,
        pending: Sequence[claims.Claim],
        pool: dra_pool.Pool,
        cards: list[model.DeviceUsage] | None,
        earlier: Sequence[tuple[int, int]] = (),
        classed: Classed | None = None,
    ) -> claim_fit.ClaimsOutcome:
        """The claims of shared and exclusive classes on the node's cards (``earlier``:
        what the pod's MIG instances take, for the quota). A simple claim (``classed``) is
        judged by its class (``claim_classes``) where a node of the same profile failed it
        already, on the node's own cards, and on a trial's one card where one of the same
        profile failed or took it."""
        cordoned, layer, with_ids = self._inputs(node)
        cache = self.view.claims.selector_cache
        classes = self._classes if classed is not None and not earlier else None
        found = None
        if classes is not None and classed is not None and (cards is None or len(cards) == 1):
            request, key = classed
            if cards is None:

                def make() -> claim_classes.Profile | None:
                    return claim_classes.profile(
                        pool, node.cards, cordoned, layer, request, cache, with_ids
                    )

                stamp = (self.view.epoch, self.view.change_log.last(node.name))
                found = classes.profile_of(node.name, stamp, request, make)
            else:  # a trial's one card: its profile afresh (what the removal freed)
                made = claim_classes.profile(pool, cards, cordoned, layer, request, cache, with_ids)
                found = None if made is None else classes.number(made)
            if found is not None:
                hit = classes.failure(key, found)
                if hit is None and cards is not None and cards[0].id in pool.devices:
                    device = pool.devices[cards[0].id]
                    hit = classes.taken(key, found, pending[0].key, request.name, device)
                if hit is not None:
                    return hit
        outcome = claim_fit.fit_claims(
            job,
            pending,
            pool,
            node.cards if cards is None else cards,
            node.pair_scores,
            cordoned,
            layer,
            cache,
            earlier,
        )
        if classes is not None and classed is not None and found is not None:
            classes.learn(classed[1], found, outcome, one_card=cards is not None)
        return outcome

    def _inputs(self, node: NodeEntry) -> tuple[frozenset[str], node_layer.NodeLayer, bool]:
        """The node's cordoned cards and layer as the claims' fit reads them (a DRA card
        is named by its device name, the UUID lower-cased: cordons and the node layer's
        UUID restrictions name UUIDs), made once per change of the node; and whether the
        layer restricts cards by UUID."""
        stamp = (self.view.epoch, self.view.change_log.last(node.name))
        kept = self._node_inputs.get(node.name)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        marked = node_annotations.cordoned_cards(node.facts.annotations, node.inventory_cordoned)
        cordoned = frozenset(card.lower() for card in marked)
        spec = self.view.vendors.spec(dra.VENDOR)
        uuid_keys = (spec.use_uuid_annotation, spec.nouse_uuid_annotation)
        restrictions = node.layer.restrictions
        layer = dataclasses.replace(
            node.layer,
            restrictions={k: v.lower() if k in uuid_keys else v for k, v in restrictions.items()},
        )
        made = (cordoned, layer, any(k in restrictions for k in uuid_keys))
        if self._classes is not None:  # the books' change log numbers the node's changes
            if len(self._node_inputs) > 4 * len(self.view.nodes) + 64:
                self._node_inputs.clear()
            self._node_inputs[node.name] = (stamp, made)
        return made


def _awaiting(claim: claims.Claim, consumer: Mapping[str, str]) -> claim_wire.ClaimWrite:
    return claim_wire.ClaimWrite(
        claim.namespace,
        claim.name,
        claim.uid,
        claim.resource_version,
        None,
        consumer,
        awaits_allocation=True,
    )


def _status_missing(pod: Pod, claim: str, special: extended_claims.Special | None) -> bool:
    """Whether ``claim`` is the pod's special claim, reserved for it already (an attempt
    cut short before its Binding, e.g. by a restart) but not named in its status yet."""
    if special is None or claim != special.name:
        return False
    written = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    return bool(written.get("resourceClaimName") != claim)


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
