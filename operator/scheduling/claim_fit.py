"""Fit a pod's claims on one DRA node: the annotation path's Fit, on the devices each
request may use.

Each request of each claim to allocate is treated as the annotation path treats one
container: the devices its selectors, taints and request policies allow (``claims.
eligible``), sorted by the node's GPU policy (binpack, spread, topology-aware, NUMA:
``policies.card_sort_key``), chosen by ``fit.fit_container`` (type and node-layer
restrictions, NUMA binding, topology for several cards, the namespace quota), and booked
on the node's cards before the next request looks, so that requests of one pod add up on
a card as app containers do. A claim with ``matchAttribute`` constraints is tried once per
value of the attribute (``claims.attribute_groups``), the first that fits wins.

The result names, per claim, the devices and the exact capacity each consumes, which
``claim_wire`` turns into ``status.allocation``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vgpu_operator.devices import dra, model, vendor
from vgpu_operator.scheduling import (
    claim_best_fit,
    claim_cel,
    claims,
    dra_pool,
    fit,
    fragmentation,
    node_layer,
    placement,
)
from vgpu_operator.scheduling import policies as pol
from vgpu_operator.scheduling.status import Reason


@dataclass(frozen=True, slots=True)
class Pick:
    request: str
    device: dra_pool.PoolDevice
    consumption: claims.Consumption


@dataclass(slots=True)
class ClaimsOutcome:
    ok: bool
    #: claim key -> the devices chosen for it, in request order.
    picks: dict[str, list[Pick]] = field(default_factory=dict)
    reasons: Counter[Reason] = field(default_factory=Counter)
    refused_by: dict[Reason, set[str]] = field(default_factory=dict)
    #: A selector that failed at run time (kube-scheduler refuses the pod then too), or
    #: whose verdicts are being computed off the loop (the pod waits for them).
    error: str | None = None
    #: Per chosen device, its score as the request's card order saw it.
    card_scores: tuple[float, ...] = ()

    def as_placement(self) -> placement.Outcome:
        """The outcome in the annotation path's terms (for the diagnosis)."""
        return placement.Outcome(self.ok, {}, Counter(self.reasons), self.refused_by)


def fit_claims(
    job: placement.Job,
    pending: Sequence[claims.Claim],
    pool: dra_pool.Pool,
    cards: Sequence[model.DeviceUsage],
    pair_scores: model.PairScores,
    cordoned: frozenset[str],
    layer: node_layer.NodeLayer,
    cache: claim_cel.SelectorCache,
) -> ClaimsOutcome:
    """Choose devices for every claim in ``pending`` on this node; ``cards`` (the node's
    cards with what they hold now) are not changed."""
    work = [c.copy() for c in cards]
    devices = [pool.devices[c.id] for c in work if c.id in pool.devices]
    outcome = ClaimsOutcome(True)
    held: list[tuple[int, int]] = []  # (MiB, cores) this pod takes so far, for the quota
    scores: list[float] = []
    for claim in pending:
        failure = ClaimsOutcome(False)
        for restrict in claims.attribute_groups(claim, devices):
            trial = [c.copy() for c in work]
            result = _fit_claim(job, claim, restrict, pool, trial, pair_scores, cordoned, layer,
                                cache, held)  # fmt: skip
            if result.error is not None:
                return result
            if result.ok:
                work = trial
                outcome.picks[claim.key] = result.picks[claim.key]
                held.extend((p.consumption.memory_mib, p.consumption.cores)
                            for p in result.picks[claim.key])  # fmt: skip
                scores.extend(result.card_scores)
                break
            failure.reasons.update(result.reasons)
            for reason, keys in result.refused_by.items():
                failure.refused_by.setdefault(reason, set()).update(keys)
        else:
            if not failure.reasons:
                failure.reasons[Reason.NODE_INSUFFICIENT_DEVICE] = 1
            return failure
    outcome.card_scores = tuple(scores)
    return outcome


Options = dict[tuple[int, int, int], list[tuple[model.DeviceUsage, claims.Consumption]]]
Chosen = list[tuple[fit.Pick, claims.Consumption, float]]


def _fit_claim(
    job: placement.Job,
    claim: claims.Claim,
    restrict: Mapping[str, frozenset[str]],
    pool: dra_pool.Pool,
    cards: list[model.DeviceUsage],
    pair_scores: model.PairScores,
    cordoned: frozenset[str],
    layer: node_layer.NodeLayer,
    cache: claim_cel.SelectorCache,
    held: list[tuple[int, int]],
) -> ClaimsOutcome:
    picks: list[Pick] = []
    scores: list[float] = []
    taken = list(held)  # this pod's earlier requests, and this claim's as they are chosen
    for request in claim.requests:
        options = _options(claim, request, restrict.get(request.name), pool, cards, cache)
        if isinstance(options, ClaimsOutcome):
            return options
        chosen = _fit_request(job, claim, request, options, pair_scores, cordoned, layer, taken)
        if isinstance(chosen, ClaimsOutcome):
            return chosen
        for pick, consumption, score in chosen:
            pick.card.used += consumption.slots
            pick.card.used_memory_mib += consumption.memory_mib
            pick.card.used_cores += consumption.cores
            picks.append(Pick(request.name, pool.devices[pick.card.id], consumption))
            taken.append((consumption.memory_mib, consumption.cores))
            scores.append(score)
    return ClaimsOutcome(True, picks={claim.key: picks}, card_scores=tuple(scores))


def _options(
    claim: claims.Claim,
    request: claims.Request,
    allowed: frozenset[str] | None,
    pool: dra_pool.Pool,
    cards: list[model.DeviceUsage],
    cache: claim_cel.SelectorCache,
) -> Options | ClaimsOutcome:
    """The node's cards the request may take, grouped by what it would consume of each;
    or the outcome when none may (why), or when a selector cannot be judged yet."""
    options: Options = {}
    reasons: Counter[Reason] = Counter()
    pending: claim_cel.CelPending | None = None
    where = f"ResourceClaim {claim.key}, request {request.name!r}"
    for card in cards:
        device = pool.devices.get(card.id)
        if device is None:
            continue
        if allowed is not None and card.id not in allowed:
            reasons[Reason.DEVICE_NOT_SELECTED] += 1
            continue
        try:
            consumption = claims.eligible(
                request,
                device,
                cache,
                card.total_memory_mib,
                card.total_cores,
                card.count,
                whole=claim.whole_devices,
            )
        except claim_cel.CelRuntimeError as exc:
            return ClaimsOutcome(False, error=f"{where}: CEL runtime error: {exc}")
        except claim_cel.CelPending as exc:
            # Go on through the cards: their missing verdicts are queued together.
            pending = exc
            continue
        if consumption is None:
            reasons[Reason.DEVICE_NOT_SELECTED] += 1
            continue
        shape = (consumption.memory_mib, consumption.cores, consumption.slots)
        options.setdefault(shape, []).append((card, consumption))
    if pending is not None:
        return ClaimsOutcome(False, error=f"{where}: selector evaluation pending: {pending}")
    if not options:
        if not reasons:
            reasons[Reason.NODE_INSUFFICIENT_DEVICE] = 1
        return ClaimsOutcome(False, reasons=reasons)
    return options


def _fit_request(
    job: placement.Job,
    claim: claims.Claim,
    request: claims.Request,
    options: Options,
    pair_scores: model.PairScores,
    cordoned: frozenset[str],
    layer: node_layer.NodeLayer,
    taken: list[tuple[int, int]],
) -> Chosen | ClaimsOutcome:
    """The cards for one request, by the annotation path's Fit on each group of cards it
    consumes alike; or why none fits (devices the request's selectors rule out are named
    only when no device is left: otherwise why the eligible ones do not fit is the news)."""
    policy = job.policy_on(layer)
    spec = job.vendors.spec(dra.VENDOR)
    failed: Counter[Reason] = Counter()
    refused: dict[Reason, set[str]] = {}
    # Devices a request consumes alike are fitted together (one shape on a node of one
    # card model and request policy: the usual case).
    for (memory, cores, _slots), group in sorted(options.items(), key=lambda kv: -len(kv[1])):
        by_card = {card.id: consumption for card, consumption in group}
        ask = model.ContainerRequest(
            request.count, dra.VENDOR, memory, model.MEMORY_PERCENT_UNSET, cores
        )
        candidates = [card for card, _ in group]
        if policy == pol.FRAGMENTATION:
            classes = job.mix.classes if job.mix is not None else fragmentation.PRIOR
            need = ("", request.count, memory, -1, cores)
            card_scores = fragmentation.card_order_key(candidates, need, classes)
        else:
            card_scores = {c.id: pol.card_score(c, [ask], job.weights) for c in candidates}
        numa_bind = _numa_bind(job, spec)
        candidates.sort(key=pol.card_sort_key(policy, numa_bind, card_scores))
        if policy == pol.BINPACK and not numa_bind:
            # Binpack on claims: the card the request fills most tightly first (the node
            # was chosen by that measure too: ``claim_best_fit``).
            candidates = claim_best_fit.card_order(candidates, memory, cores)
        options_ = fit.FitOptions(
            spec=spec,
            annotations={},
            policy=policy,
            numa_bind=numa_bind,
            # Several cards of one request: the best-linked set, whatever the GPU policy
            # (a multi-card claim on unlinked cards is rarely what was meant).
            topology_aware=pol.policy_has(policy, pol.TOPOLOGY)
            or (request.count > 1 and bool(pair_scores)),
            mutex=pol.policy_has(policy, pol.MUTEX),
            cordoned=cordoned,
            pair_scores=pair_scores,
            quota_ok=_quota(job, claim.namespace, taken),
            node_restrictions=layer.restrictions,
        )
        result = fit.fit_container(candidates, ask, options_)
        if result.ok:
            return [(p, by_card[p.card.id], card_scores[p.card.id]) for p in result.picks]
        failed.update(result.reasons)
        for reason, keys in result.refused_by.items():
            refused.setdefault(reason, set()).update(keys)
    return ClaimsOutcome(False, reasons=failed, refused_by=refused)


def _numa_bind(job: placement.Job, spec: vendor.VendorSpec) -> bool:
    """The pod's ``numa-bind`` annotation (all of one request's cards on one NUMA node)."""
    card_filter = job.card_filters.get(dra.VENDOR)
    if card_filter is not None:
        return card_filter.numa_bind
    return vendor.numa_bind(spec, job.annotations)


def _quota(job: placement.Job, namespace: str, held: Sequence[tuple[int, int]]) -> fit.QuotaCheck:
    """The namespace quota, counting what the pod's earlier requests take."""
    if not job.quota.has_limits(namespace):
        return lambda _candidates: True
    factor = job.memory_factors.get(dra.VENDOR, 1)
    earlier_memory = sum(m for m, _ in held)
    earlier_cores = sum(c for _, c in held)

    def quota_ok(candidates: Sequence[tuple[str, int, int]]) -> bool:
        memory = earlier_memory + sum(m for _, m, _ in candidates)
        cores = earlier_cores + sum(c for _, _, c in candidates)
        return job.quota.fits(namespace, dra.VENDOR, memory, cores, factor)

    return quota_ok
