"""Fit a pod's claims on one DRA node: the annotation path's Fit, on the devices each
request may use.

Each request of each claim to allocate is treated as the annotation path treats one
container: the devices its selectors, taints and request policies allow (``claims.
eligible``), sorted by the node's GPU policy (binpack, spread, topology-aware, NUMA:
``policies.card_sort_key``), chosen by ``fit.fit_container`` (type and node-layer
restrictions, NUMA binding, topology for several cards, the namespace quota), and booked
on the node's cards before the next request looks, so that requests of one pod add up on
a card as app containers do. A claim with ``matchAttribute`` constraints is tried once per
value of the attribute (``claims.attribute_groups``), the first that fits wins; one with
``firstAvailable`` requests once per combination of alternatives, in upstream's order
(``claim_variants``). A ``distinctAttribute`` constraint keeps, for each device chosen,
its value of the attribute from every other device of the requests it covers.

The result names, per claim, the devices and the exact capacity each consumes, which
``claim_wire`` turns into ``status.allocation``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpu_operator.devices import dra, model, vendor
from vgpu_operator.scheduling.cel import claim_cel
from vgpu_operator.scheduling.dialects.annotation import fit, placement
from vgpu_operator.scheduling.dialects.claims import (
    claim_best_fit,
    claim_taints,
    claim_variants,
    claims,
    dra_pool,
)
from vgpu_operator.scheduling.policies import fragmentation, node_layer
from vgpu_operator.scheduling.policies import policies as pol
from vgpu_operator.scheduling.status import Reason


@dataclass(frozen=True, slots=True)
class DevicePick:
    request: str
    device: dra_pool.PoolDevice
    consumption: claims.Consumption
    #: An adminAccess request's device: shared with whoever holds it, consuming nothing.
    admin: bool = False


#: What an adminAccess request consumes of its device (nothing; upstream's rule).
NOTHING: claims.Consumption = claims.Consumption({}, 0, 0, 0)


@dataclass(slots=True)
class ClaimsOutcome:
    ok: bool
    #: claim key -> the devices chosen for it, in request order.
    picks: dict[str, list[DevicePick]] = field(default_factory=dict)
    reasons: Counter[Reason] = field(default_factory=Counter)
    refused_by: dict[Reason, set[str]] = field(default_factory=dict)
    #: A selector that failed at run time (kube-scheduler refuses the pod then too), or
    #: whose verdicts are being computed off the loop (the pod waits for them).
    error: str | None = None
    #: Per chosen device, its score as the request's card order saw it.
    card_scores: tuple[float, ...] = ()

    @property
    def allowed_reasons(self) -> dict[Reason, int]:
        """The claims' fit keeps no reasons of cards the UUID restrictions allow."""
        return {}

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
    earlier: Sequence[tuple[int, int]] = (),
) -> ClaimsOutcome:
    """Choose devices for every claim in ``pending`` on this node; ``cards`` (the node's
    cards with what they hold now) are not changed. ``earlier``: (MiB, cores) the pod
    takes already elsewhere (its MIG instances), for the quota."""
    work = [c.copy() for c in cards]
    devices = [pool.devices[c.id] for c in work if c.id in pool.devices]
    outcome = ClaimsOutcome(True)
    held = list(earlier)  # (MiB, cores) this pod takes so far, for the quota
    scores: list[float] = []
    for claim in pending:
        failure = ClaimsOutcome(False)
        budget = _Budget(MAX_FITS_PER_CLAIM)
        tries = ((v, r) for v in claim_variants.variants(claim)
                 for r in claims.attribute_groups(v, devices))  # fmt: skip
        for variant, restrict in tries:
            search = _Search(job, variant, restrict, pool, pair_scores, cordoned, layer, cache,
                             budget)  # fmt: skip
            result, booked = search.run(work, held)
            if result.error is not None:
                return result
            if result.ok:
                work = booked
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
Chosen = list[tuple[fit.CardPick, claims.Consumption, float]]


#: How many request fits one claim may take on one node, over all its combinations,
#: while it goes back over earlier requests' choices. Upstream's allocator backtracks
#: without a count (within its own time limit); past this bound the first choices stand
#: and a claim that needs another does not fit the node.
MAX_FITS_PER_CLAIM = 256

Found = tuple[list[DevicePick], list[float], list[model.DeviceUsage]]


@dataclass(slots=True)
class _Budget:
    left: int


@dataclass(slots=True)
class _Search:
    """One claim (one combination of its alternatives, one value per ``matchAttribute``)
    on one node: its requests in order, each by the annotation path's Fit, booked before
    the next looks. Where a later request then finds no device, the search goes back, as
    upstream's allocator does: the earlier request is fitted again without one of the
    cards it took (``banned``), and the later ones after it, while the claim's budget of
    fits lasts. It goes back only where the earlier choice can matter: when the later
    requests fit without it. A claim of one request never goes back."""

    job: placement.Job
    claim: claims.Claim
    restrict: Mapping[str, frozenset[str]]
    pool: dra_pool.Pool
    pair_scores: model.PairScores
    cordoned: frozenset[str]
    layer: node_layer.NodeLayer
    cache: claim_cel.SelectorCache
    budget: _Budget

    def run(
        self, cards: list[model.DeviceUsage], held: list[tuple[int, int]]
    ) -> tuple[ClaimsOutcome, list[model.DeviceUsage]]:
        """The outcome, and the node's cards with the claim booked (``cards`` unchanged)."""
        seen = tuple(frozenset[Any]() for _ in self.claim.distinct_attributes)
        found = self._from(0, cards, seen, held, frozenset())
        if isinstance(found, ClaimsOutcome):
            return found, cards
        picks, scores, booked = found
        return ClaimsOutcome(True, picks={self.claim.key: picks}, card_scores=tuple(scores)), booked

    def _from(
        self,
        position: int,
        cards: list[model.DeviceUsage],
        seen: tuple[frozenset[Any], ...],
        taken: list[tuple[int, int]],
        banned: frozenset[str],
    ) -> Found | ClaimsOutcome:
        """The requests from ``position`` on (``taken``: the pod's earlier requests and
        this claim's, for the quota; ``seen``: the values each distinctAttribute
        constraint has had so far)."""
        if position == len(self.claim.requests):
            return [], [], cards
        request = self.claim.requests[position]
        level = [c.copy() for c in cards]
        distinct = Distinct(
            tuple(
                (i, attribute)
                for i, (covered, attribute) in enumerate(self.claim.distinct_attributes)
                if not covered or request.name in covered
            ),
            [set(values) for values in seen],
        )
        allowed = self.restrict.get(request.name)
        options = _options(self.claim, request, allowed, self.pool, level, self.cache, distinct,
                           banned)  # fmt: skip
        if isinstance(options, ClaimsOutcome):
            return options
        if request.admin_access:
            return self._admin(position, request, options, cards, distinct, taken)
        self.budget.left -= 1
        chosen = _fit_request(self.job, self.claim, request, options, self.pair_scores,
                              self.cordoned, self.layer, taken, self.pool, distinct)  # fmt: skip
        if isinstance(chosen, ClaimsOutcome):
            return chosen
        picks: list[DevicePick] = []
        scores: list[float] = []
        now_taken = list(taken)
        for pick, consumption, score in chosen:
            distinct.note(self.pool.devices[pick.card.id])
            pick.card.used += consumption.slots
            pick.card.used_memory_mib += consumption.memory_mib
            pick.card.used_cores += consumption.cores
            picks.append(DevicePick(request.name, self.pool.devices[pick.card.id], consumption))
            now_taken.append((consumption.memory_mib, consumption.cores))
            scores.append(score)
        now_seen = tuple(frozenset(values) for values in distinct.seen)
        rest = self._from(position + 1, level, now_seen, now_taken, frozenset())
        if not isinstance(rest, ClaimsOutcome):
            return [*picks, *rest[0]], [*scores, *rest[1]], rest[2]
        if rest.error is not None or self.budget.left <= 0:
            return rest
        # Would the later requests fit had this one taken nothing? If not, no other
        # choice of it helps.
        alone = self._from(position + 1, cards, seen, taken, frozenset())
        if isinstance(alone, ClaimsOutcome):
            return rest if alone.error is None else alone
        for pick, _consumption, _score in chosen:
            if self.budget.left <= 0:
                break
            again = self._from(position, cards, seen, taken, banned | {pick.card.id})
            if not isinstance(again, ClaimsOutcome) or again.error is not None:
                return again
        return rest

    def _admin(
        self,
        position: int,
        request: claims.Request,
        options: Options,
        cards: list[model.DeviceUsage],
        distinct: Distinct,
        taken: list[tuple[int, int]],
    ) -> Found | ClaimsOutcome:
        """An ``adminAccess`` request (upstream's semantics): the first ``count`` devices
        its selectors, taints and constraints allow, in the node's card order, whatever
        others hold of them; it consumes nothing and counts in no quota."""
        eligible = {card.id for group in options.values() for card, _ in group}
        picks: list[DevicePick] = []
        for card in cards:
            device = self.pool.devices.get(card.id)
            if device is None or card.id not in eligible or not distinct.allows(device):
                continue
            distinct.note(device)
            picks.append(DevicePick(request.name, device, NOTHING, admin=True))
            if len(picks) == request.count:
                break
        if len(picks) < request.count:
            return ClaimsOutcome(False, reasons=Counter({Reason.NODE_INSUFFICIENT_DEVICE: 1}))
        now_seen = tuple(frozenset(values) for values in distinct.seen)
        rest = self._from(position + 1, cards, now_seen, taken, frozenset())
        if isinstance(rest, ClaimsOutcome):
            return rest
        return [*picks, *rest[0]], [0.0] * len(picks) + rest[1], rest[2]


@dataclass(frozen=True, slots=True)
class Distinct:
    """The ``distinctAttribute`` constraints that cover one request (their positions and
    attributes) and the values the claim's devices chosen so far hold for each."""

    constraints: tuple[tuple[int, str], ...]
    seen: list[set[Any]]

    def allows(self, device: dra_pool.PoolDevice) -> bool:
        """A device without the attribute, or with a value taken already, may not serve
        (upstream's rule: the attribute must be there, and differ)."""
        for position, attribute in self.constraints:
            value = device.attribute(attribute)
            if value is None or value in self.seen[position]:
                return False
        return True

    def note(self, device: dra_pool.PoolDevice) -> None:
        for position, attribute in self.constraints:
            self.seen[position].add(device.attribute(attribute))

    def clashes(self, chosen: Sequence[dra_pool.PoolDevice]) -> set[str]:
        """The devices among ``chosen`` (in their order of preference) whose value an
        earlier one of them holds already: those to leave out of the next try."""
        out: set[str] = set()
        for _position, attribute in self.constraints:
            values: set[Any] = set()
            for device in chosen:
                value = device.attribute(attribute)
                if value in values:
                    out.add(device.name)
                values.add(value)
        return out


def _options(
    claim: claims.Claim,
    request: claims.Request,
    allowed: frozenset[str] | None,
    pool: dra_pool.Pool,
    cards: list[model.DeviceUsage],
    cache: claim_cel.SelectorCache,
    distinct: Distinct,
    banned: frozenset[str] = frozenset(),
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
        if (
            (allowed is not None and card.id not in allowed)
            or card.id in banned
            or not distinct.allows(device)
        ):
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
            return ClaimsOutcome(False, error=claim_cel.refusal(where, exc))
        except claim_cel.CelPending as exc:
            # Go on through the cards: their missing verdicts are queued together.
            pending = exc
            continue
        if consumption is None:
            reasons[claim_taints.refusal(request, device, cache)] += 1
            continue
        shape = (consumption.memory_mib, consumption.cores, consumption.slots)
        options.setdefault(shape, []).append((card, consumption))
    if pending is not None:
        return ClaimsOutcome(False, error=f"{where}: selector evaluation pending: {pending}")
    if not options:
        if not reasons:
            reasons[Reason.NODE_INSUFFICIENT_DEVICE] = 1
        claim_taints.only_the_news(reasons)
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
    pool: dra_pool.Pool,
    distinct: Distinct,
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
            classes = job.mix.weighted if job.mix is not None else fragmentation.PRIOR
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
        while result.ok and distinct.constraints:
            # Several cards of one request with one value: leave out all but the best of
            # them and fit again (each try has fewer candidates, so this ends).
            # ``fit_container`` scans from the end: the last candidate is the best.
            rank = {c.id: -n for n, c in enumerate(candidates)}
            picked = sorted((p.card.id for p in result.picks), key=rank.__getitem__)
            clash = distinct.clashes([pool.devices[i] for i in picked])
            if not clash:
                break
            candidates = [c for c in candidates if c.id not in clash]
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
