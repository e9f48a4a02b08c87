"""One pod on one node: every container through Fit, booking as it goes (hami-semantics §5).

Also the two views of a placed pod's devices that accounting needs: ``collapse`` (per
card: app containers summed, init containers at their peak, §4.3) and ``book`` (apply
that to a node's cards), and ``Summary``, a node's free capacity in a few numbers so
that a node that cannot fit is skipped without looking at its cards.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from vgpu_operator import names
from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import codec, model, vendor
from vgpu_operator.scheduling import node_annotations, node_basics
from vgpu_operator.scheduling.dialects.annotation import fit
from vgpu_operator.scheduling.mig import mig
from vgpu_operator.scheduling.policies import fragmentation, node_layer, policies
from vgpu_operator.scheduling.quota import QuotaReads
from vgpu_operator.scheduling.status import Reason
from vgpu_operator.scheduling.vendors import PodReads, Vendors
from vgpu_operator.wire import Pod

#: Per container: vendor common word -> request.
ContainerRequests = Mapping[str, model.ContainerRequest]


@dataclass(frozen=True, slots=True)
class Booking:
    """What one pod holds of one card (or one MIG instance, named by its suffixed id).

    ``spots`` are MIG instances on the card known only by their slices (``mig_records``).
    """

    uuid: str
    vendor: str
    memory_mib: int
    cores: int
    slots: int
    spots: tuple[model.MigPlacement, ...] = ()


@dataclass(frozen=True, slots=True)
class Job:
    """A pending pod, parsed once for all the nodes it is tried on."""

    pod: Pod
    namespace: str
    annotations: Mapping[str, str]
    resources: node_basics.PodResources
    init_requests: tuple[ContainerRequests, ...]
    app_requests: tuple[ContainerRequests, ...]
    #: The pod's own node policy; None when it names none (then each node's own, from
    #: its annotation or the ConfigMap, ranks it: ``ClusterState``).
    pod_node_policy: str | None
    gpu_policy: str | None
    default_gpu_policy: str
    weights: policies.ScoringWeights
    vendors: Vendors
    quota: QuotaReads
    memory_factors: Mapping[str, int]
    #: Per vendor, the pod's card restrictions, read once for every card of every node.
    card_filters: Mapping[str, vendor.CardFilter] = field(default_factory=dict)
    #: What the pod asks of any node (tolerations, selector, affinity), read once.
    node_terms: node_basics.PodNodeTerms = field(default_factory=node_basics.PodNodeTerms)

    #: Every device request of every container, flattened for ``Summary.may_fit``, which
    #: runs for each node the search passes: (vendor, count, MiB, percent or -1, cores).
    needs: tuple[tuple[str, int, int, int, int], ...] = ()
    #: The requests the cluster has seen, which the GPU policy ``fragmentation`` orders
    #: cards against (the cycle's ``fragmentation_order.Placer`` sets it; None: the prior).
    mix: fragmentation.WorkloadMix | None = field(default=None, compare=False)

    @property
    def init_count(self) -> int:
        return len(self.init_requests)

    @property
    def wants_devices(self) -> bool:
        return bool(self.needs)

    @classmethod
    def from_pod(
        cls,
        pod: Pod,
        config: DeviceConfig,
        vendors: Vendors,
        quota: QuotaReads,
        reads: PodReads | None = None,
    ) -> Job:
        """Raises CodecError for a malformed scheduling annotation or request. ``reads``:
        the pod's containers as admission read them (``Vendors.read``), not read again."""
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        annotations: Mapping[str, str] = meta.get("annotations") or {}
        node_policy: str | None = annotations.get(names.NODE_SCHEDULER_POLICY, "").strip()
        if node_policy not in (policies.BINPACK, policies.SPREAD, policies.FRAGMENTATION):
            node_policy = None
        gpu_policy = annotations.get(names.GPU_SCHEDULER_POLICY)
        if reads is None:
            reads = (
                tuple(vendors.read(c) for c in spec.get("initContainers") or []),
                tuple(vendors.read(c) for c in spec.get("containers") or []),
            )
        init_requests = tuple(read.checked() for read in reads[0])
        app_requests = tuple(read.checked() for read in reads[1])
        return cls(
            pod=pod,
            namespace=meta.get("namespace") or "default",
            annotations=annotations,
            resources=node_basics.pod_requests(pod),
            init_requests=init_requests,
            app_requests=app_requests,
            pod_node_policy=node_policy,
            gpu_policy=None if gpu_policy is None else policies.normalize_gpu_policy(gpu_policy),
            default_gpu_policy=config.scheduler.gpu_scheduler_policy,
            weights=policies.parse_scoring_weights(annotations.get(names.DEVICE_SCORING_WEIGHTS)),
            vendors=vendors,
            quota=quota,
            memory_factors=vendors.memory_factors(),
            card_filters={
                spec.common_word: vendor.CardFilter.read(spec, annotations)
                for spec in vendors.specs()
            },
            node_terms=node_basics.PodNodeTerms.of(pod),
            needs=_needs((*init_requests, *app_requests)),
        )

    def policy_on(self, layer: node_layer.NodeLayer) -> str:
        """The GPU policy on a node: the pod's annotation, else the node's, else the
        ConfigMap's (seed 003 §2.3; HAMi v2.10 reads the pod and the ConfigMap only)."""
        if self.gpu_policy is not None:
            return self.gpu_policy
        if layer.gpu_policy is not None:
            return layer.gpu_policy
        return self.default_gpu_policy


def _needs(
    containers: Sequence[ContainerRequests],
) -> tuple[tuple[str, int, int, int, int], ...]:
    """The requests as ``Job.needs`` lists them: the cores capped at 100 as Fit caps them,
    the percentage -1 where the request is in MiB."""
    return tuple(
        (
            vendor_word,
            request.count,
            request.memory_mib,
            request.memory_percent if request.uses_percentage else -1,
            min(request.cores, 100),
        )
        for requests in containers
        for vendor_word, request in requests.items()
    )


@dataclass(slots=True)
class Outcome:
    ok: bool
    devices: dict[str, model.PodSingleDevice] = field(default_factory=dict)
    reasons: Counter[Reason] = field(default_factory=Counter)
    #: Per reason, the Node annotations that refused cards under it (the node layer).
    refused_by: Mapping[Reason, set[str]] = field(default_factory=dict)
    #: What the cards UUID restrictions allow were refused for (``fit.FitResult``).
    allowed_reasons: Mapping[Reason, int] = field(default_factory=dict)
    #: Per vendor and container, the score of each chosen card (aligned with
    #: ``devices``) as the container's card order saw it (HAMi's DeviceListsScore).
    card_scores: dict[str, tuple[tuple[float, ...], ...]] = field(default_factory=dict)

    @classmethod
    def rejected(cls, reasons: Mapping[Reason, int]) -> Outcome:
        return cls(False, {}, Counter(reasons))

    @property
    def error(self) -> None:
        """A Fit on annotations does not fail otherwise than by its reasons."""
        return None


@dataclass(frozen=True, slots=True)
class VendorSummary:
    """Per vendor: each usable card's free memory MiB, free cores and total memory MiB
    (a percentage request's size depends on the card), and whether MIG is there.

    ``memory_desc`` and ``cores_desc`` are the free memory and the free cores sorted
    from the largest: a request for ``n`` cards of ``m`` MiB needs the ``n``-th largest
    free memory to be at least ``m``, which rules most nodes out without counting cards.
    """

    free: tuple[tuple[int, int, int], ...] = ()
    has_mig: bool = False
    memory_desc: tuple[int, ...] = ()
    cores_desc: tuple[int, ...] = ()

    @classmethod
    def of(cls, free: Sequence[tuple[int, int, int]], has_mig: bool) -> VendorSummary:
        return cls(
            tuple(free),
            has_mig,
            tuple(sorted((m for m, _c, _t in free), reverse=True)),
            tuple(sorted((c for _m, c, _t in free), reverse=True)),
        )


@dataclass(frozen=True, slots=True)
class Summary:
    """A node's free capacity per vendor; ``may_fit`` never rules out a node that fits.

    A card counts when it is healthy and has a free slot; a container's request can only
    fit if at least ``count`` such cards each have its memory and cores free (MIG cards
    can give one container several instances, so only the first test applies to them).
    A request by percentage (a whole-GPU request asks for 100 % by default) is measured
    on each card as Fit measures it, so full cards rule their node out here too.
    """

    vendors: Mapping[str, VendorSummary] = field(default_factory=dict)
    #: ``may_fit``'s answers for the requests asked so far (a summary is replaced, never
    #: changed, when its node changes): a burst of pods alike asks each node once.
    _answers: dict[tuple[tuple[str, int, int, int, int], ...], bool] = field(
        default_factory=dict, compare=False, repr=False
    )

    #: Requests whose answers a summary keeps at most.
    MAX_ANSWERS: ClassVar[int] = 16

    @classmethod
    def of(cls, cards: Sequence[model.DeviceUsage]) -> Summary:
        free: dict[str, list[tuple[int, int, int]]] = {}
        mig_vendors: set[str] = set()
        for card in cards:
            free.setdefault(card.vendor, [])
            if card.mode == model.MODE_MIG:
                mig_vendors.add(card.vendor)
            if card.health and card.used < card.count:
                free[card.vendor].append(
                    (card.free_memory_mib, card.free_cores, card.total_memory_mib)
                )
        return cls({v: VendorSummary.of(f, v in mig_vendors) for v, f in free.items()})

    def has_room(self) -> bool:
        """Whether any card has a free slot and free memory (else ``may_fit`` is False
        for every pod that wants a device: every request asks for at least 1 MiB or
        1 %, which is at least 1 MiB of a card of 100 MiB or more)."""
        return any(
            memory > 0 or total < 100
            for summary in self.vendors.values()
            for memory, _cores, total in summary.free
        )

    def may_fit(self, job: Job) -> bool:
        """False only where no card choice could serve some request of ``job``.

        Runs for every node a search passes, so the answer to a request asked before is
        remembered, and the cheap tests come first: enough usable cards, then the
        ``count``-th largest free memory and cores, and only then a count of the cards
        that have both.
        """
        answers = self._answers
        known = answers.get(job.needs)
        if known is not None:
            return known
        if len(answers) >= self.MAX_ANSWERS:
            answers.clear()
        answer = answers[job.needs] = self._may_fit(job)
        return answer

    def _may_fit(self, job: Job) -> bool:
        vendors = self.vendors
        for vendor_word, count, memory, percent, cores in job.needs:
            have = vendors.get(vendor_word)
            if have is None or not have.free:
                return False
            single = have.has_mig  # MIG: one card may give a container several instances
            wanted = 1 if single else count
            if wanted > len(have.free) or have.cores_desc[wanted - 1] < cores:
                return False
            if percent < 0:
                if have.memory_desc[wanted - 1] < memory:
                    return False
                able = sum(1 for m, c, _total in have.free if m >= memory and c >= cores)
            else:
                able = sum(
                    1 for m, c, total in have.free if m >= total * percent // 100 and c >= cores
                )
            if able < wanted:
                return False
        return True


def collapse(
    devices: Mapping[str, model.PodSingleDevice], init_count: int, init_done: bool = False
) -> dict[str, list[Booking]]:
    """Per card: app containers' memory and cores summed (a slot each), init containers
    at their peak (one slot), and the larger of the two kept (hami-semantics §4.3).
    Once the init containers have all finished (``init_done``, ``init_release``), only
    the app containers hold (HAMi v2.10's ``AppContainersOnlyDeviceUsage``), except
    that an init container's MIG instance keeps its slices until the pod ends, as HAMi
    v2.10 keeps its record (booked with no memory, cores or slot)."""
    out: dict[str, list[Booking]] = {}
    for vendor_word, single in devices.items():
        app: dict[str, list[int]] = {}
        init: dict[str, list[int]] = {}
        for position, container in enumerate(single):
            if init_done and position < init_count:
                for device in container:
                    if codec.split_mig_uuid(device.uuid)[1] is not None:
                        init.setdefault(device.uuid, [0, 0, 0])
                continue
            target = init if position < init_count else app
            for device in container:
                seen = target.setdefault(device.uuid, [0, 0, 0])
                if target is app:
                    seen[0] += device.memory_mib
                    seen[1] += device.cores
                    seen[2] += 1
                else:
                    seen[0] = max(seen[0], device.memory_mib)
                    seen[1] = max(seen[1], device.cores)
                    seen[2] = 1
        bookings: list[Booking] = []
        for uuid in dict.fromkeys([*init, *app]):
            a = app.get(uuid, [0, 0, 0])
            i = init.get(uuid, [0, 0, 0])
            bookings.append(
                Booking(uuid, vendor_word, max(a[0], i[0]), max(a[1], i[1]), max(a[2], i[2]))
            )
        if bookings:
            out[vendor_word] = bookings
    return out


def book(cards: Mapping[str, model.DeviceUsage], bookings: Mapping[str, Sequence[Booking]]) -> None:
    """Add a placed pod's bookings to a node's cards; unknown cards are ignored."""
    for entries in bookings.values():
        for entry in entries:
            base, instance = codec.split_mig_uuid(entry.uuid)
            card = cards.get(base)
            if card is None:
                continue
            card.used += entry.slots
            card.used_memory_mib += entry.memory_mib
            card.used_cores += entry.cores
            if instance is not None:
                if card.mig is None:
                    card.health = False  # a MIG booking on a card without MIG: fail closed
                else:
                    mig.restore(card, instance[0], instance[1])
            for start, size in entry.spots:
                mig.occupy(card, start, size)


def shift(
    cards: Sequence[model.DeviceUsage],
    bookings: Mapping[str, Sequence[Booking]],
    sign: int,
) -> bool:
    """Add (``sign`` 1) or take away (-1) one pod's bookings on a node's current cards in
    place, so that a pod arriving or leaving costs its own bookings rather than a rebuild
    from every pod on the node. Only plain shares add up this way: when a booking names a
    MIG instance or lands on a MIG card (whose geometry the instances decide), nothing is
    changed and False says the cards must be rebuilt (``book`` in pod order)."""
    by_id = {card.id: card for card in cards}
    targets: list[tuple[model.DeviceUsage, Booking]] = []
    for entries in bookings.values():
        for entry in entries:
            card = by_id.get(entry.uuid)
            if card is None:
                if codec.split_mig_uuid(entry.uuid)[1] is not None:
                    return False
                continue  # unknown cards are ignored, as ``book`` ignores them
            if entry.spots:
                return False
            if card.mode == model.MODE_MIG or card.mig is not None:
                return False
            targets.append((card, entry))
    for card, entry in targets:
        card.used += sign * entry.slots
        card.used_memory_mib += sign * entry.memory_mib
        card.used_cores += sign * entry.cores
    return True


def _share_mig_geometry(
    devices: Sequence[model.ContainerDevice], app_cards: Sequence[model.DeviceUsage]
) -> None:
    """An init container's MIG instance fixes the card's geometry for the app containers
    too: without this they would start from an idle card, choose another geometry, and
    the card would end up booked in two geometries at once."""
    by_id = {card.id: card for card in app_cards}
    for device in devices:
        base, instance = codec.split_mig_uuid(device.uuid)
        card = by_id.get(base)
        if instance is not None and card is not None and card.mig is not None:
            mig.restore(card, instance[0], instance[1])


def add_usage(
    card: model.DeviceUsage, memory_mib: int, cores: int, vendor_word: str
) -> model.ContainerDevice:
    """HAMi's AddResourceUsage: book one chosen share on its card and return it as booked
    (a MIG card books the instance it hands out, named with its ``[g-s]`` suffix)."""
    uuid, memory = card.id, memory_mib
    if card.mode == model.MODE_MIG and card.mig is not None:
        uuid, memory, cores = mig.allocate(card, memory_mib)
    card.used += 1
    card.used_memory_mib += memory
    card.used_cores += cores
    return model.ContainerDevice(uuid, vendor_word, memory, cores)


def fit_pod(
    job: Job,
    cards: Sequence[model.DeviceUsage],
    node: node_basics.NodeFacts,
    pair_scores: model.PairScores,
    cordoned: frozenset[str] = frozenset(),
    layer: node_layer.NodeLayer = node_layer.EMPTY,
) -> Outcome:
    """Fit every container of ``job`` on a copy of ``cards``; the cards are not changed.

    Cards are cordoned by the node annotation ``hami.io/device-cordon`` and by
    ``cordoned`` (the DeviceInventory's spec), together. ``layer`` is the node's
    configuration layer: its GPU policy and card restrictions.
    """
    policy = job.policy_on(layer)
    cordoned = node_annotations.cordoned_cards(node.annotations, cordoned)
    per_vendor: dict[str, list[list[model.ContainerDevice]]] = {}
    chosen_scores: dict[str, list[tuple[float, ...]]] = {}
    containers = (*job.init_requests, *job.app_requests)
    app_cards = [c.copy() for c in cards]
    for position, requests in enumerate(containers):
        is_init = position < job.init_count
        work = [c.copy() for c in cards] if is_init else app_cards
        for lists in per_vendor.values():
            lists.append([])
        for score_lists in chosen_scores.values():
            score_lists.append(())
        for vendor_word, request in requests.items():
            lists = per_vendor.setdefault(vendor_word, [[] for _ in range(position + 1)])
            score_lists = chosen_scores.setdefault(vendor_word, [() for _ in range(position + 1)])
            spec = job.vendors.spec(vendor_word)
            if policy == policies.FRAGMENTATION:
                scores = fragmentation.card_order_key(
                    work, _need(vendor_word, request), _classes(job)
                )
            else:
                scores = {
                    c.id: policies.card_score(c, list(requests.values()), job.weights) for c in work
                }
            work.sort(key=policies.card_sort_key(policy, _numa(job, spec), scores))
            options = fit.FitOptions(
                spec=spec,
                annotations=job.annotations,
                policy=policy,
                numa_bind=_numa(job, spec),
                topology_aware=spec.supports_topology
                and policies.policy_has(policy, policies.TOPOLOGY),
                mutex=policies.policy_has(policy, policies.MUTEX),
                cordoned=cordoned,
                pair_scores=pair_scores,
                quota_ok=_quota_check(job, vendor_word, per_vendor, position),
                node_restrictions=layer.restrictions,
                card_filter=job.card_filters.get(vendor_word),
            )
            result = fit.fit_container(work, request, options)
            if not result.ok:
                return Outcome(
                    False,
                    {},
                    Counter(result.reasons),
                    result.refused_by,
                    allowed_reasons=dict(result.allowed_reasons),
                )
            score_lists[position] = tuple(scores[p.card.id] for p in result.picks)
            lists[position] = [
                add_usage(p.card, p.memory_mib, p.cores, vendor_word) for p in result.picks
            ]
            if is_init:
                _share_mig_geometry(lists[position], app_cards)
    devices = {v: tuple(tuple(c) for c in lists) for v, lists in per_vendor.items()}
    return Outcome(True, devices, card_scores={v: tuple(c) for v, c in chosen_scores.items()})


def _need(vendor_word: str, request: model.ContainerRequest) -> fragmentation.Need:
    percent = request.memory_percent if request.uses_percentage else -1
    return (vendor_word, request.count, request.memory_mib, percent, min(request.cores, 100))


def _classes(job: Job) -> fragmentation.Classes:
    return job.mix.weighted if job.mix is not None else fragmentation.PRIOR


def _numa(job: Job, spec: vendor.VendorSpec) -> bool:
    card_filter = job.card_filters.get(spec.common_word)
    if card_filter is None:
        return vendor.numa_bind(spec, job.annotations)
    return card_filter.numa_bind


def _quota_check(
    job: Job,
    vendor_word: str,
    per_vendor: Mapping[str, list[list[model.ContainerDevice]]],
    position: int,
) -> fit.QuotaCheck:
    """Quota as HAMi v2.10 checks it inside Fit: the pod's allocation so far *with* this
    container's candidates, collapsed per card (init peak vs app sum), against the ledger."""
    if not job.quota.has_limits(job.namespace):
        return _no_quota
    earlier = [list(c) for c in per_vendor.get(vendor_word, [])][:position]
    factor = job.memory_factors.get(vendor_word, 1)

    def quota_ok(candidates: Sequence[tuple[str, int, int]]) -> bool:
        current = [model.ContainerDevice(u, vendor_word, m, c) for u, m, c in candidates]
        lists = [*earlier, current]
        bookings = collapse({vendor_word: tuple(tuple(c) for c in lists)}, job.init_count)
        held = bookings.get(vendor_word, [])
        memory = sum(b.memory_mib for b in held)
        cores = sum(b.cores for b in held)
        return job.quota.fits(job.namespace, vendor_word, memory, cores, factor)

    return quota_ok


def _no_quota(candidates: Sequence[tuple[str, int, int]]) -> bool:
    """The check of a namespace that no ResourceQuota limits: every candidate passes."""
    return True
