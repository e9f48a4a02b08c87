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
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vgpu_operator import names
from vgpu_operator.devices import model, vendor
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling import (
    claim_best_fit,
    claim_fit,
    claim_wire,
    claims,
    node_basics,
    placement,
    policies,
)
from vgpu_operator.scheduling.books import ClusterBooks, NodeEntry, PodEntry, is_dra_node
from vgpu_operator.scheduling.pod_key import PodKey
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

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


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


class ClaimScheduling(ClusterBooks):
    """The DRA path of ``ClusterState.schedule``."""

    def _place_claims(
        self, key: PodKey, pod: Mapping[str, Any], now: float, explain: bool = False
    ) -> ClaimPlacement:
        total = len(self._nodes)
        try:
            job = placement.Job.from_pod(pod, self._config, self._vendors, self._quota)
            wanted = claims.read_pod_claims(pod, self._claim_objects, self._classes, self._cel)
        except claims.Waiting as exc:
            diagnosis = Diagnosis({}, total, error=str(exc))
            return ClaimPlacement(None, diagnosis=diagnosis, waits_for_claims=True)
        except (claims.Refusal, CodecError) as exc:
            return ClaimPlacement(None, diagnosis=Diagnosis({}, total, error=str(exc)))
        consumer = claim_wire.consumer(pod)
        failures: dict[str, NodeFailure] = {}
        found: tuple[NodeEntry, claim_fit.ClaimsOutcome] | None = None
        scores: dict[str, float] = {}
        # A request for several cards looks on, past the first node that fits, for one
        # where they are linked (the first such node wins; else the first that fits).
        wants_links = any(r.count > 1 for c in wanted.pending for r in c.requests)
        linked = False
        for node in self._claim_order(job, wanted):
            outcome = self._fit_claims_on(node, job, wanted, now)
            if outcome.error is not None:
                return ClaimPlacement(None, diagnosis=Diagnosis({}, total, error=outcome.error))
            if not outcome.ok:
                failures[node.name] = NodeFailure(
                    dict(outcome.reasons), {r: frozenset(k) for r, k in outcome.refused_by.items()}
                )
                continue
            scores[node.name] = node.score
            on_links = wants_links and _linked(outcome, node.pair_scores)
            if found is None or (on_links and not linked):
                found, linked = (node, outcome), on_links
            if not explain and (not wants_links or linked):
                break
        if found is None:
            for name in self._nodes:
                failures.setdefault(name, NodeFailure({Reason.NODE_NOT_CLAIMS_NODE: 1}))
            return ClaimPlacement(None, diagnosis=Diagnosis(failures, total))
        node, outcome = found
        writes: list[ClaimWrite] = []
        decided: dict[str, tuple[str, list[claim_fit.Pick]]] = {}
        for claim in wanted.claims:
            reserved = any(r.get("uid") == consumer["uid"] for r in claim.reserved_for)
            allocation = None
            if claim.allocated_node is None:
                picks = outcome.picks[claim.key]
                allocation = claim_wire.allocation(claim, node.name, picks, self._classes)
                decided[claim.key] = (claim.namespace, picks)
            elif reserved:
                continue
            writes.append(
                ClaimWrite(
                    claim.namespace,
                    claim.name,
                    claim.uid,
                    claim.resource_version,
                    allocation,
                    consumer,
                )
            )
        self._hold_decided(key, node.name, decided)
        self._add_pod(
            PodEntry(
                key=key,
                namespace=job.namespace,
                node=node.name,
                requests=job.resources,
                devices={},
                bookings={},
                reserved=True,
                labels=dict((pod.get("metadata") or {}).get("labels") or {}),
                uid=consumer["uid"],
            )
        )
        return ClaimPlacement(node.name, tuple(writes), None, outcome.card_scores, scores)

    def _claim_order(self, job: placement.Job, wanted: claims.PodClaims) -> list[NodeEntry]:
        """The candidates; under binpack, where the claims fit most tightly first
        (``claim_best_fit``)."""
        ranked = self._claim_candidates(job, wanted.node)
        if wanted.node is not None or not wanted.pending or not self._binpacking(job, ranked):
            return ranked
        for node in ranked:
            self._refresh(node)
        requests = [r for c in wanted.pending for r in c.requests]
        return claim_best_fit.tightest_first(ranked, lambda n: n.cards, requests)

    def _binpacking(self, job: placement.Job, nodes: list[NodeEntry]) -> bool:
        """Whether binpack ranks these nodes: the pod's node policy, else each node's own."""
        if job.pod_node_policy is not None:
            return job.pod_node_policy == policies.BINPACK
        default = self._config.scheduler.node_scheduler_policy
        return all((n.layer.node_policy or default) == policies.BINPACK for n in nodes)

    def _claim_candidates(self, job: placement.Job, pinned: str | None) -> list[NodeEntry]:
        """Nodes in the order the annotation path would try them (best-ranked first),
        every node once; only ``pinned`` when allocated claims fix the node."""
        if pinned is not None:
            node = self._nodes.get(pinned)
            return [] if node is None else [node]
        self._rerank_dirty()
        if job.pod_node_policy is None:
            ranking = self._layered_rank
        elif job.pod_node_policy == policies.SPREAD:
            ranking = self._spread_rank
        else:
            ranking = self._binpack_rank
        ranked = [self._nodes[name] for _score, _order, name in ranking]
        seen = {n.name for n in ranked}
        rest = [n for n in self._nodes.values() if n.name not in seen]
        rest.sort(key=lambda n: n.order)
        return [*ranked, *rest]

    def _fit_claims_on(
        self, node: NodeEntry, job: placement.Job, wanted: claims.PodClaims, now: float
    ) -> claim_fit.ClaimsOutcome:
        self._refresh(node)
        refused = self._claim_node_gate(node, job, now)
        if refused is not None:
            return claim_fit.ClaimsOutcome(False, reasons=_one(refused))
        pool = self.pool_of(node.name)
        if pool is None:
            return claim_fit.ClaimsOutcome(False, reasons=_one(Reason.NODE_NOT_ON_DRA_PATH))
        if not wanted.pending:
            return claim_fit.ClaimsOutcome(True)
        # A DRA card is named by its device name, the UUID lower-cased: cordons and the
        # node layer's UUID restrictions name UUIDs.
        cordon_note = node.facts.annotations.get(names.NODE_DEVICE_CORDON)
        cordoned = frozenset(
            c.lower() for c in (*node.inventory_cordoned, *vendor.split_list(cordon_note))
        )
        spec = self._vendors.spec("NVIDIA")
        uuid_keys = (spec.use_uuid_annotation, spec.nouse_uuid_annotation)
        layer = dataclasses.replace(
            node.layer,
            restrictions={
                k: v.lower() if k in uuid_keys else v for k, v in node.layer.restrictions.items()
            },
        )
        return claim_fit.fit_claims(
            job, wanted.pending, pool, node.cards, node.pair_scores, cordoned, layer, self._cel
        )

    def _claim_node_gate(self, node: NodeEntry, job: placement.Job, now: float) -> Reason | None:
        reason = node_basics.check_node(
            job.pod, job.resources, node.facts, node.used, len(node.pods), job.node_terms
        )
        if reason is not None:
            return reason
        if not is_dra_node(node):
            return Reason.NODE_NOT_ON_DRA_PATH
        if (
            self._inventory_timeout_s is not None
            and node.inventory is not None
            and (node.heartbeat is None or now - node.heartbeat > self._inventory_timeout_s)
        ):
            return Reason.INVENTORY_STALE
        return None


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
