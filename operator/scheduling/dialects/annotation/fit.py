"""Fit: choose cards for one container on one node (hami-semantics §5 fitInDevices, §6 Fit).

The checks run in HAMi's order (health, cordon, type, UUID, time slices, exclusivity,
quota, memory, cores, compute units, MIG geometry) and a card is counted under the first
check it fails (``test_fit_order`` checks it on cards that fail several checks). Cards
are scanned from the end of the policy-sorted list. Topology-aware selection keeps
HAMi's quirks on purpose, because they decide which cards a pod gets (hami-semantics
§14.6): every candidate counts towards the quota check of the next one, and with
numa-bind a change of NUMA node drops the candidates gathered so far. What differs is
only how the best combination is found (exactly, without enumerating every combination).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from vgpu_operator.devices import model, vendor
from vgpu_operator.scheduling.mig import mig
from vgpu_operator.scheduling.policies import topology
from vgpu_operator.scheduling.status import AGGREGATE_REASONS, Reason

#: quota_ok(candidates): does the pod still fit its namespace quota when this container
#: takes these (card id, memory MiB, cores) on top of what earlier containers hold?
QuotaCheck = Callable[[Sequence[tuple[str, int, int]]], bool]


def _always_fits(_candidates: Sequence[tuple[str, int, int]]) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class FitOptions:
    """Everything about the pod and node that Fit consults besides the cards."""

    spec: vendor.VendorSpec
    annotations: Mapping[str, str]
    policy: str = "spread"
    numa_bind: bool = False
    topology_aware: bool = False
    mutex: bool = False
    cordoned: frozenset[str] = frozenset()
    pair_scores: model.PairScores = field(default_factory=dict)
    quota_ok: QuotaCheck = _always_fits
    #: The node layer's restriction annotations (``node_layer.NodeLayer.restrictions``),
    #: checked before the pod's own: both must allow a card.
    node_restrictions: Mapping[str, str] = field(default_factory=dict)
    #: The pod's restrictions for this vendor, read once per pod (read from
    #: ``annotations`` when absent).
    card_filter: vendor.CardFilter | None = None


@dataclass(slots=True)
class CardPick:
    card: model.DeviceUsage
    memory_mib: int
    cores: int


@dataclass(slots=True)
class FitResult:
    """The cards picked for a container, or (``ok`` false) why the node could not serve it."""

    ok: bool
    picks: list[CardPick]
    reasons: Counter[Reason]
    #: Per reason, the Node annotations that refused cards under it (the node layer).
    refused_by: dict[Reason, set[str]] = field(default_factory=dict)
    #: With UUID restrictions (``use-gpuuuid``, ``nouse-gpuuuid``, the node layer's), the
    #: reasons the cards they allow were refused for: the real cause, where ``reasons``
    #: counts most cards under ``CardUuidMismatch`` (HAMi's order checks health and type
    #: first, so a pinned card's own failure cannot be told from the counts).
    allowed_reasons: Counter[Reason] = field(default_factory=Counter)


def visible_cards(
    spec: vendor.VendorSpec, cards: Sequence[model.DeviceUsage]
) -> list[model.DeviceUsage]:
    """Cards whose type names the vendor's marker; others are invisible to it."""
    marker = spec.type_marker.upper()
    return [c for c in cards if marker in c.type.upper()]


def is_mig_request(options: FitOptions, cards: Sequence[model.DeviceUsage]) -> bool:
    if not options.spec.supports_mig:
        return False
    mode = options.annotations.get(options.spec.mode_annotation or "")
    if mode is not None and model.MODE_MIG not in mode:
        return False
    return any(c.mode == model.MODE_MIG for c in cards)


#: A card's refusal: the reason, and the node annotation that refused it (if one did).
Refusal = tuple[Reason, str | None]


def fit_container(
    cards: Sequence[model.DeviceUsage],
    request: model.ContainerRequest,
    options: FitOptions,
) -> FitResult:
    """Choose ``request.count`` cards from ``cards`` (already in policy order).

    Returns the picks, or the per-reason counts of the cards that were ruled out.
    """
    typed = visible_cards(options.spec, cards)
    if request.count > len(typed) and not is_mig_request(options, typed):
        return FitResult(False, [], Counter({Reason.NODE_INSUFFICIENT_DEVICE: 1}))
    nums = origin = request.count
    cores_req = request.cores
    prev_numa: int | None = None
    picked: list[CardPick] = []
    reasons: Counter[Reason] = Counter()
    refused_by: dict[Reason, set[str]] = {}
    pod_filter = options.card_filter or vendor.CardFilter.read(options.spec, options.annotations)
    node_types, node_uuids = _node_filters(options.spec, options.node_restrictions)
    allows = _uuid_allows(pod_filter, node_uuids)
    allowed_reasons: Counter[Reason] = Counter()
    #: The reasons before the card now judged, when the UUID restrictions allow it.
    before: Counter[Reason] | None = None
    i = len(typed) - 1
    while i >= 0:
        if before is not None:
            _note_allowed(allowed_reasons, reasons, before)
            before = None
        card = typed[i]
        i -= 1
        if allows is not None and allows(card.id):
            before = reasons.copy()
        refusal = _kind_refusal(card, options, node_types, pod_filter)
        if refusal is None and options.numa_bind and card.numa != prev_numa:
            if nums != origin:
                reasons[Reason.NUMA_NOT_FIT] += len(picked)
            nums, prev_numa, picked = origin, card.numa, []
        if refusal is None:
            refusal = _share_refusal(card, options, node_uuids, pod_filter)
        if refusal is None:
            cores_req = min(cores_req, 100)
            memory = request.memory_mib
            if request.uses_percentage:
                memory = card.total_memory_mib * request.memory_percent // 100
            candidates = [(p.card.id, p.memory_mib, p.cores) for p in picked]
            candidates.append((card.id, memory, cores_req))
            if not options.quota_ok(candidates):
                refusal = (Reason.RESOURCE_QUOTA_NOT_FIT, None)
            else:
                refusal = _room_refusal(card, memory, cores_req, request, picked)
        if refusal is not None:
            reasons[refusal[0]] += 1
            if refusal[1] is not None:
                refused_by.setdefault(refusal[0], set()).add(refusal[1])
            continue
        if nums > 0:
            if not options.topology_aware:
                nums -= 1
            picked.append(CardPick(card, memory, cores_req))
        if nums == 0 and not options.topology_aware:
            return FitResult(True, picked, Counter())
        if card.mode == model.MODE_MIG:
            i += 1  # a MIG card can give one container several instances
    if before is not None:
        _note_allowed(allowed_reasons, reasons, before)
    return _after_the_scan(picked, origin, options, reasons, refused_by, allowed_reasons)


def _kind_refusal(
    card: model.DeviceUsage,
    options: FitOptions,
    node_types: Sequence[_NodeFilter],
    pod_filter: vendor.CardFilter,
) -> Refusal | None:
    """HAMi's first checks: health, cordon, the card's type (the node layer's, then the
    pod's) and mode."""
    if not card.health:
        return (Reason.CARD_NOT_HEALTH, None)
    if card.id in options.cordoned:
        return (Reason.CARD_CORDONED, None)
    node_refusal = _first_refusal(node_types, card.type, vendor.CardFilter.type_allowed)
    if node_refusal is not None:
        return (Reason.CARD_TYPE_MISMATCH, node_refusal)
    if not pod_filter.type_allowed(card.type) or not pod_filter.mode_allowed(card.mode):
        return (Reason.CARD_TYPE_MISMATCH, None)
    return None


def _share_refusal(
    card: model.DeviceUsage,
    options: FitOptions,
    node_uuids: Sequence[_NodeFilter],
    pod_filter: vendor.CardFilter,
) -> Refusal | None:
    """Then (after a NUMA regrouping): the card's UUID (the node layer's, then the
    pod's), its time slices, and exclusivity."""
    node_refusal = _first_refusal(node_uuids, card.id, vendor.CardFilter.uuid_allowed)
    if node_refusal is not None:
        return (Reason.CARD_UUID_MISMATCH, node_refusal)
    if not pod_filter.uuid_allowed(card.id):
        return (Reason.CARD_UUID_MISMATCH, None)
    if card.count <= card.used:
        return (Reason.CARD_TIME_SLICING_EXHAUSTED, None)
    if options.mutex and card.used > 0:
        return (Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, None)
    return None


def _room_refusal(
    card: model.DeviceUsage,
    memory: int,
    cores_req: int,
    request: model.ContainerRequest,
    picked: Sequence[CardPick],
) -> Refusal | None:
    """Last (after the quota): memory, cores, whole-card exclusivity, compute units and,
    on a MIG card, its geometry."""
    if card.total_memory_mib - card.used_memory_mib < memory:
        return (Reason.CARD_INSUFFICIENT_MEMORY, None)
    if card.total_cores - card.used_cores < cores_req:
        return (Reason.CARD_INSUFFICIENT_CORE, None)
    if card.total_cores == 100 and cores_req == 100 and card.used > 0:
        return (Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, None)
    if card.total_cores != 0 and card.used_cores == card.total_cores and cores_req == 0:
        return (Reason.CARD_COMPUTE_UNITS_EXHAUSTED, None)
    if card.mode != model.MODE_MIG:
        return None
    earlier = [p.memory_mib for p in picked if p.card is card]
    # MIG instances have fixed sizes: a share of a card cannot be honoured, the whole
    # card (100 %, also the default of a count-only request) can.
    partial = request.uses_percentage and request.memory_percent < 100
    if partial or not mig.custom_filter(card, memory, earlier):
        return (Reason.CARD_MIG_TOPOLOGY_INFEASIBLE, None)
    # The card is visited again for the same container, so the slots this container
    # already took count too; HAMi does not re-check (§14.8) and can book more instances
    # than the card registers.
    if card.count <= card.used + len(earlier):
        return (Reason.CARD_TIME_SLICING_EXHAUSTED, None)
    return None


def _after_the_scan(
    picked: list[CardPick],
    origin: int,
    options: FitOptions,
    reasons: Counter[Reason],
    refused_by: dict[Reason, set[str]],
    allowed_reasons: Counter[Reason],
) -> FitResult:
    """Every card scanned without enough picked (or topology-aware: choose among them)."""
    if options.topology_aware:
        chosen = _choose_topology(picked, origin, options)
        if chosen is not None:
            return FitResult(True, chosen, Counter())
    if picked:
        reasons[Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(picked)
    if not reasons:
        reasons[Reason.NODE_INSUFFICIENT_DEVICE] = 1
    return FitResult(False, [], reasons, refused_by, allowed_reasons)


def _note_allowed(
    allowed_reasons: Counter[Reason], reasons: Counter[Reason], before: Counter[Reason]
) -> None:
    """Add what one allowed card was refused for (the reasons it added; none when it
    was picked). Aggregate counts (NUMA regrouping) are not a card's own reason."""
    for reason, count in reasons.items():
        added = count - before.get(reason, 0)
        if added > 0 and reason not in AGGREGATE_REASONS:
            allowed_reasons[reason] += added


def uuid_allows(
    spec: vendor.VendorSpec,
    pod_filter: vendor.CardFilter,
    node_restrictions: Mapping[str, str],
) -> Callable[[str], bool] | None:
    """Whether the UUID restrictions (the pod's and the node layer's) allow a card, or
    None when there are none (``card_classes`` judges by it as Fit does)."""
    return _uuid_allows(pod_filter, _node_filters(spec, node_restrictions)[1])


def _uuid_allows(
    pod_filter: vendor.CardFilter, node_uuids: Sequence[_NodeFilter]
) -> Callable[[str], bool] | None:
    if not (pod_filter.use_uuids or pod_filter.nouse_uuids or node_uuids):
        return None

    def allows(card_id: str) -> bool:
        return pod_filter.uuid_allowed(card_id) and all(
            f.uuid_allowed(card_id) for _key, f in node_uuids
        )

    return allows


#: A node annotation's key and the card filter it makes.
_NodeFilter = tuple[str, vendor.CardFilter]


def _node_filters(
    spec: vendor.VendorSpec, restrictions: Mapping[str, str]
) -> tuple[list[_NodeFilter], list[_NodeFilter]]:
    """The node layer's type and UUID restrictions, each read once, with the annotation
    that sets it (a refusal names it)."""

    def filters(keys: tuple[str, str]) -> list[_NodeFilter]:
        return [
            (k, vendor.CardFilter.read(spec, {k: restrictions[k]}))
            for k in keys
            if k in restrictions
        ]

    if not restrictions:
        return [], []
    types = filters((spec.use_type_annotation, spec.nouse_type_annotation))
    uuids = filters((spec.use_uuid_annotation, spec.nouse_uuid_annotation))
    return types, uuids


def _first_refusal(
    filters: Sequence[_NodeFilter],
    value: str,
    allowed: Callable[[vendor.CardFilter, str], bool],
) -> str | None:
    """The node annotation that rules ``value`` out, or None."""
    for key, card_filter in filters:
        if not allowed(card_filter, value):
            return key
    return None


def _choose_topology(
    picked: list[CardPick], want: int, options: FitOptions
) -> list[CardPick] | None:
    """HAMi §9: all candidates if exactly enough, else the worst single card or the best
    k-combination by pair score; None when there are too few."""
    if len(picked) < want:
        return None
    if len(picked) == want:
        return list(picked)
    by_id = {p.card.id: p for p in picked}
    ids = [p.card.id for p in picked]
    if len(by_id) != len(ids):
        return picked[:want]  # repeated MIG instances of a card: no topology to rank
    if want == 1:
        return [by_id[topology.worst_single_card(ids, options.pair_scores)]]
    return [by_id[c] for c in topology.best_combination(ids, options.pair_scores, want)]
