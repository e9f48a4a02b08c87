"""Claims of the MIG DeviceClass in the engine's decision cycle (pure).

A node's MIG cards are read with their counters (``mig_partitions.read_mig_pool``) and,
beside them, as the pool publishes each placement (``dra_pool.read_device``): its
attributes are what a request's CEL selectors look at. What the node's claims hold
already (any allocator's, and the engine's own decisions still being written: the
books' holds, by device name) is taken from the counters first, so two decisions never
get overlapping instances; a share device that consumes counters too (a card offered
both as shares and as MIG) takes its counters while it holds any share, so such a card
is never both at once.

Each request of a MIG claim gets ``count`` instances by the engine's MIG rules
(``mig_partitions.choose``: fewest cards broken, HAMi v2.10's profile and placement
order), among the devices its selectors allow and, when it names
``capacity.requests.memory``, that hold that much (the smallest such profile wins).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from vgpu_operator.devices import dra
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.cel import claim_cel
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import claim_fit, claims, dra_pool
from vgpu_operator.scheduling.mig import mig_partitions
from vgpu_operator.scheduling.status import Reason
from vgpu_operator.wire import ResourceSlice


@dataclass(slots=True)
class MigNode:
    """A node's MIG placements: with their counters, and as published."""

    pool: mig_partitions.MigPool
    devices: dict[str, dra_pool.PoolDevice] = field(default_factory=dict)


def read_mig_node(node: str, slices: Iterable[ResourceSlice]) -> MigNode | None:
    """The node's MIG placements, or None when it publishes none."""
    items = list(slices)
    pool = mig_partitions.read_mig_pool(node, items)
    if not pool.devices:
        return None
    wanted = pool.by_name
    found = MigNode(pool)
    for item in items:
        spec = item.get("spec") or {}
        meta = spec.get("pool") or {}
        if spec.get("driver") != dra.DRIVER or meta.get("name") != node:
            continue
        generation = int(meta.get("generation") or 0)
        for raw in spec.get("devices") or ():
            if not isinstance(raw, Mapping) or raw.get("name") not in wanted:
                continue
            try:
                device = dra_pool.read_device(raw, dra.DRIVER, node, generation)
            except CodecError as exc:
                pool.problems.append(f"{node}: {exc}")
                continue
            previous = found.devices.get(device.name)
            if previous is None or previous.generation < generation:
                found.devices[device.name] = device
    pool.devices = [d for d in pool.devices if d.name in found.devices]
    return found


def is_mig(claim: claims.Claim) -> bool:
    return any(r.device_class == dra.MIG_CLASS for r in claim.requests)


def ledger(node: MigNode, held: Iterable[str]) -> mig_partitions.CounterLedger:
    """The node's counters less what ``held`` (device names the node's claims hold,
    once per claim result) consumes. A MIG device held twice, or past its counters,
    takes every counter of its card (fail closed: nothing more is placed there)."""
    pool = node.pool
    counted = mig_partitions.CounterLedger(pool.counters)
    by_name = pool.by_name
    seen: set[str] = set()
    shares: set[str] = set()
    for name in held:
        device = by_name.get(name)
        if device is None:
            if name in pool.other_consumers:
                shares.add(name)
            continue
        if name in seen or not counted.fits(device.consumes):
            for set_name in device.consumes:
                counted.left[set_name] = {c: Fraction(0) for c in counted.left.get(set_name, {})}
            continue
        seen.add(name)
        counted.take(device.consumes)
    for name in sorted(shares):
        consumes = pool.other_consumers[name]
        if counted.fits(consumes):
            counted.take(consumes)
        else:
            for set_name in consumes:
                counted.left[set_name] = {c: Fraction(0) for c in counted.left.get(set_name, {})}
    return counted


def _ask(request: claims.Request) -> mig_partitions.MigAsk | None:
    """The request as a MIG ask (None: it names a capacity a MIG instance lacks)."""
    memory_mib = 0
    for name, amount in request.capacity.items():
        if name.removeprefix(f"{dra.DRIVER}/") != dra.MEMORY:
            return None
        memory_mib = int(-(-amount // dra.MIB))
    return mig_partitions.MigAsk(memory_mib=memory_mib)


def held_memory_mib(node: MigNode, devices: Iterable[str]) -> int:
    """The memory of the MIG instances among ``devices`` (a hold's, for the quota)."""
    by_name = node.pool.by_name
    return sum(by_name[d].memory_mib for d in devices if d in by_name)


def _allowed(
    claim: claims.Claim, request: claims.Request, node: MigNode, cache: claim_cel.SelectorCache
) -> frozenset[str] | claim_fit.ClaimsOutcome:
    """The instances the request's taints and selectors allow; or the outcome when a
    selector fails or waits for its verdict (as in ``claim_fit``)."""
    where = f"ResourceClaim {claim.key}, request {request.name!r}"
    try:
        return frozenset(
            d.name
            for d in node.pool.devices
            if dra_pool.tolerated(node.devices[d.name].taints, request.tolerations)
            and claim_cel.all_select(
                request.selectors,
                cache,
                node.devices[d.name].key,
                node.devices[d.name].view,
                request.written,
            )
        )
    except claim_cel.CelRuntimeError as exc:
        return claim_fit.ClaimsOutcome(False, error=claim_cel.refusal(where, exc))
    except claim_cel.CelPending as exc:
        return claim_fit.ClaimsOutcome(False, error=f"{where}: selector evaluation pending: {exc}")


def fit_mig_claims(
    job: placement.Job,
    pending: Sequence[claims.Claim],
    node: MigNode | None,
    held: Iterable[str],
    cache: claim_cel.SelectorCache,
) -> claim_fit.ClaimsOutcome:
    """Instances for every MIG request of ``pending`` on this node, each within the
    namespace's quota (an instance counts its memory, as HAMi counts a MIG card's; the
    picks' ``consumption.memory_mib`` carries it on to the pod's other claims). A
    selector that fails, runs out of bounds or waits for its verdict is the outcome's
    error, as in ``claim_fit``."""
    outcome = claim_fit.ClaimsOutcome(True)
    factor = job.memory_factors.get(dra.VENDOR, 1)
    limited = job.quota.has_limits(job.namespace)
    taken_mib = 0
    if not pending:
        return outcome
    if node is None:
        return claim_fit.ClaimsOutcome(False, reasons=Counter({Reason.NODE_NO_MIG_DEVICE: 1}))
    counted = ledger(node, held)
    devices = node.pool.devices
    for claim in pending:
        picks: list[claim_fit.DevicePick] = []
        for request in claim.requests:
            ask = _ask(request)
            allowed = _allowed(claim, request, node, cache) if ask is not None else frozenset()
            if isinstance(allowed, claim_fit.ClaimsOutcome):
                return allowed
            if not allowed:
                # Every placement ruled out by the request's selectors or capacity.
                return claim_fit.ClaimsOutcome(
                    False, reasons=Counter({Reason.DEVICE_NOT_SELECTED: len(devices)})
                )
            assert ask is not None
            ask = mig_partitions.MigAsk(ask.profile, ask.memory_mib, allowed)
            for _ in range(request.count):
                chosen = mig_partitions.choose(ask, devices, counted)
                if chosen is None:
                    least = min((d.memory_mib for d in devices if ask.matches(d)), default=0)
                    if limited and not job.quota.fits(
                        job.namespace, dra.VENDOR, taken_mib + least, 0, factor
                    ):
                        # No room, and the quota refuses even the smallest instance the
                        # request allows: room freed would not help, the quota would.
                        return claim_fit.ClaimsOutcome(
                            False, reasons=Counter({Reason.RESOURCE_QUOTA_NOT_FIT: 1})
                        )
                    # HAMi v2.10's name: no card has room for the instance; per card.
                    cards = len({d.card for d in devices if d.name in allowed})
                    return claim_fit.ClaimsOutcome(
                        False, reasons=Counter({Reason.CARD_MIG_TOPOLOGY_INFEASIBLE: cards})
                    )
                # The chosen profile is the smallest the request allows: if its memory
                # breaks the quota, every other would too.
                if limited and not job.quota.fits(
                    job.namespace, dra.VENDOR, taken_mib + chosen.memory_mib, 0, factor
                ):
                    return claim_fit.ClaimsOutcome(
                        False, reasons=Counter({Reason.RESOURCE_QUOTA_NOT_FIT: 1})
                    )
                taken_mib += chosen.memory_mib
                counted.take(chosen.consumes)
                consumption = claims.Consumption(None, chosen.memory_mib, 0, 1)
                picks.append(
                    claim_fit.DevicePick(request.name, node.devices[chosen.name], consumption)
                )
        outcome.picks[claim.key] = picks
    return outcome
