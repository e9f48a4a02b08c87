"""Why a pod does not fit a node, judged by classes of identical cards.

A node that a pod does not fit gives, for most pods, the same reason counts whatever the
order of its cards: each card is ruled out by the first of Fit's checks it fails, and the
cards that pass every check are too few. Cards alike in every field a check reads (type,
mode, health, cordon, slots, memory and cores, total and used) fail the same check, so a
node's cards fall into a few classes (an idle eight-card node into one) and each class is
judged once, with Fit's own check on one card of it. A node is then judged by its
``NodeProfile``, and nodes with equal profiles alike: in a cluster of a few machine types
most nodes share a profile with many others.

"Most pods" are those whose reason counts cannot depend on card order (``Simple``): one
device request in the whole pod (one container, one vendor), without NUMA binding, in a
namespace no quota limits (Fit's quota check counts the cards already picked). Nodes with
MIG cards are not judged by classes (an instance choice depends on the ones before). For
the others the caller runs the full Fit; ``judge`` says so by returning ``UNJUDGED``.

The class is judged in two steps: first its static part (health, cordon, type, mode,
UUID), which no share change can alter, then, only if that passes, with its usage.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from vgpu_operator.devices import model, vendor
from vgpu_operator.scheduling.dialects.annotation import fit, placement
from vgpu_operator.scheduling.policies import node_layer, policies
from vgpu_operator.scheduling.status import NodeFailure, Reason

#: Reasons a card gets from what it is, not from what it holds.
STATIC_CARD_REASONS: Final = frozenset(
    {
        Reason.CARD_NOT_HEALTH,
        Reason.CARD_CORDONED,
        Reason.CARD_TYPE_MISMATCH,
        Reason.CARD_UUID_MISMATCH,
    }
)


@dataclass(frozen=True, slots=True)
class CardClass:
    """``count`` cards of a node alike in every field a Fit check reads; ``card`` is one
    of them. ``static`` is the part no booking changes (with the card's UUID only when
    the profile was built for UUID restrictions), ``key`` the whole."""

    card: model.DeviceUsage
    cordoned: bool
    count: int
    static: tuple[object, ...]
    key: tuple[object, ...]
    #: The card type in upper case (a vendor sees the cards whose type names its marker).
    type_upper: str
    #: A number for ``key`` (``ident``): classes with equal numbers have equal keys.
    ident: int = 0


@dataclass(frozen=True, slots=True, eq=False)
class NodeProfile:
    """A node's cards as classes, with the rest of what judging them reads (the node
    layer's GPU policy and card restrictions). Profiles with equal keys judge alike."""

    key: tuple[object, ...]
    classes: tuple[CardClass, ...]
    layer: node_layer.NodeLayer
    #: The node layer as far as judging a card reads it (GPU policy, restrictions).
    layer_key: tuple[object, ...]
    has_mig: bool
    _hash: int
    #: A number for ``layer_key`` (``ident``).
    layer_ident: int = 0

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NodeProfile) and self.key == other.key


def profile(
    cards: Sequence[model.DeviceUsage],
    cordoned: frozenset[str],
    layer: node_layer.NodeLayer,
    *,
    with_ids: bool,
) -> NodeProfile:
    """The node's profile. ``with_ids``: each card is a class of its own (for pods or
    nodes that restrict cards by UUID)."""
    counts: Counter[tuple[object, ...]] = Counter()
    first: dict[tuple[object, ...], tuple[model.DeviceUsage, bool, tuple[object, ...]]] = {}
    has_mig = False
    for card in cards:
        if card.mode == model.MODE_MIG or card.mig is not None:
            has_mig = True
        banned = card.id in cordoned
        static = (
            card.vendor,
            card.type,
            card.mode,
            card.health,
            banned,
            card.count,
            card.total_memory_mib,
            card.total_cores,
            card.id if with_ids else "",
        )
        key = (*static, card.used, card.used_memory_mib, card.used_cores)
        counts[key] += 1
        if key not in first:
            first[key] = (card, banned, static)
    classes = tuple(
        CardClass(
            first[key][0].copy(),
            first[key][1],
            n,
            first[key][2],
            key,
            str(key[1]).upper(),
            ident(key),
        )
        for key, n in sorted(counts.items())
    )
    layer_key = (layer.gpu_policy, tuple(sorted(layer.restrictions.items())))
    whole = (layer_key, has_mig, tuple((c.key, c.count) for c in classes))
    return NodeProfile(whole, classes, layer, layer_key, has_mig, hash(whole), ident(layer_key))


#: Numbers handed out to keys (``ident``); forgotten past ``_MAX_IDENTS``.
_IDENTS: dict[tuple[object, ...], int] = {}
_NEXT_IDENT = itertools.count(1)
_MAX_IDENTS: Final = 1 << 16


def ident(key: tuple[object, ...]) -> int:
    """A number for ``key``, made once per node change (``profile``) so that every job's
    judging looks its classes up by a small int instead of hashing their keys. A number
    is never given to two different keys: forgotten keys get new numbers."""
    number = _IDENTS.get(key)
    if number is None:
        if len(_IDENTS) >= _MAX_IDENTS:
            _IDENTS.clear()
        number = _IDENTS[key] = next(_NEXT_IDENT)
    return number


class _Unjudged:
    """The marker ``judge`` returns where classes cannot decide (run the full Fit)."""

    def __repr__(self) -> str:
        return "UNJUDGED"


UNJUDGED: Final = _Unjudged()
#: A node's judgement by classes: its failure, None (the job fits), or ``UNJUDGED``.
Judgement = NodeFailure | _Unjudged | None

#: A card class's verdict: None (it passes every check) or the check it fails, with the
#: Node annotations that ruled it out there.
_CardVerdict = tuple[Reason, frozenset[str]] | None


class _Marker:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: An idle card of the class passes every check.
_IDLE_FITS: Final = _Marker("IDLE_FITS")
#: Even idle, a card of the class fails a share check (the request is larger than it).
_NEVER: Final = _Marker("NEVER")


class Simple:
    """The judgements of one simple job (see the module docstring), remembered per card
    class and per node profile; ``Simple.of`` says whether a job is one."""

    #: Profiles remembered at most (one per distinct node state met); then started again.
    MAX_PROFILES: Final = 8192
    #: Class verdicts remembered at most; then started again.
    MAX_CLASSES: Final = 1 << 16

    def __init__(self, job: placement.Job) -> None:
        ((vendor_word, request),) = [
            (word, req)
            for requests in (*job.init_requests, *job.app_requests)
            for word, req in requests.items()
        ]
        self._job = job
        self._vendor = vendor_word
        self._spec = job.vendors.spec(vendor_word)
        self._marker = self._spec.type_marker.upper()
        self._count = request.count
        self._one = dataclasses.replace(request, count=1)
        self._memory_mib = request.memory_mib
        self._percent = request.memory_percent if request.uses_percentage else -1
        self._cores = min(request.cores, 100)
        card_filter = job.card_filters.get(vendor_word)
        self._filter = card_filter
        #: Whether the pod restricts cards by UUID (then cards are judged one by one).
        self.by_uuid = bool(card_filter and (card_filter.use_uuids or card_filter.nouse_uuids))
        #: Everything the judgements read of the job (what ``_check`` and ``_judge``
        #: pass to Fit): two jobs with equal keys judge every card and node alike, so a
        #: new shape may start from the judgements of an older one (``verdict_kin``).
        self.key: tuple[object, ...] = (
            vendor_word,
            request,
            card_filter or vendor.CardFilter.read(self._spec, job.annotations),
            job.gpu_policy,
            job.default_gpu_policy,
        )
        self._static: dict[tuple[object, ...], _CardVerdict | _Marker] = {}
        self._dynamic: dict[tuple[object, ...], _CardVerdict] = {}
        self._nodes: dict[NodeProfile, NodeFailure | None] = {}
        #: Each class's verdict by (layer number, class number) (``_card``).
        self._classes: dict[tuple[int, int], _CardVerdict] = {}
        self._uuid_allows: dict[int, Callable[[str], bool] | None] = {}

    @staticmethod
    def of(job: placement.Job) -> Simple | None:
        """The job's class judge, or None when its reasons may depend on card order."""
        if len(job.needs) != 1:
            return None
        vendor_word = job.needs[0][0]
        card_filter = job.card_filters.get(vendor_word)
        if card_filter is not None and card_filter.numa_bind:
            return None
        if job.quota.has_limits(job.namespace):
            return None
        return Simple(job)

    def room_request(self) -> tuple[int, int, int]:
        """What the share checks compare with a card's free memory and cores: the
        memory in MiB, the percentage of each card (-1: none) and the cores
        (``card_groups``)."""
        return self._memory_mib, self._percent, self._cores

    def uuid_restriction_keys(self) -> frozenset[str]:
        """The node annotations that restrict this vendor's cards by UUID."""
        return frozenset((self._spec.use_uuid_annotation, self._spec.nouse_uuid_annotation))

    def wants_ids(self, layer: node_layer.NodeLayer) -> bool:
        """Whether this node must be profiled card by card (UUID restrictions)."""
        if self.by_uuid:
            return True
        spec = self._spec
        return any(
            key in layer.restrictions
            for key in (spec.use_uuid_annotation, spec.nouse_uuid_annotation)
        )

    def judge(self, node: NodeProfile) -> Judgement:
        """The node's failure (None: the job fits it), or ``UNJUDGED`` (MIG cards)."""
        if node.has_mig:
            return UNJUDGED
        known = self._nodes.get(node, UNJUDGED)
        if known is not UNJUDGED:
            return known
        failure = self._judge(node)
        if len(self._nodes) >= self.MAX_PROFILES:
            self._nodes.clear()
        self._nodes[node] = failure
        return failure

    def _judge(self, node: NodeProfile) -> NodeFailure | None:
        marker, layer, known = self._marker, node.layer_ident, self._classes
        visible = [c for c in node.classes if marker in c.type_upper]
        if self._count > sum(c.count for c in visible):
            return NodeFailure({Reason.NODE_INSUFFICIENT_DEVICE: 1})
        reasons: dict[Reason, int] = {}
        refused_by: dict[Reason, set[str]] = {}
        # With UUID restrictions the node is profiled card by card (``wants_ids``), so
        # a class's card is the card; what the allowed ones fail is the node's cause.
        allows = self._allows(node)
        allowed_reasons: dict[Reason, int] = {}
        passing = 0
        for card_class in visible:
            verdict = known.get((layer, card_class.ident), UNJUDGED)
            if verdict is UNJUDGED:
                verdict = self._card(card_class, node)
            if verdict is None:
                passing += card_class.count
                continue
            reason, keys = verdict  # type: ignore[misc]
            reasons[reason] = reasons.get(reason, 0) + card_class.count
            if keys:
                refused_by.setdefault(reason, set()).update(keys)
            if allows is not None and allows(card_class.card.id):
                allowed_reasons[reason] = allowed_reasons.get(reason, 0) + card_class.count
        if passing >= self._count:
            return None
        if passing:
            reasons[Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = passing
        if not reasons:
            reasons[Reason.NODE_INSUFFICIENT_DEVICE] = 1
        return NodeFailure(
            reasons, {r: frozenset(k) for r, k in refused_by.items()}, allowed_reasons
        )

    def _allows(self, node: NodeProfile) -> Callable[[str], bool] | None:
        """Whether the UUID restrictions (the pod's and the node layer's) allow a card,
        made once per node layer."""
        layer = node.layer_ident
        if layer not in self._uuid_allows:
            pod_filter = self._filter or vendor.CardFilter.read(self._spec, self._job.annotations)
            self._uuid_allows[layer] = fit.uuid_allows(
                self._spec, pod_filter, node.layer.restrictions
            )
        return self._uuid_allows[layer]

    def could_ever(self, node: NodeProfile) -> bool:
        """Whether the job could fit the node were every share on it free: False when
        too few of its cards pass the checks even idle (the wrong type, or smaller in
        all than the request). No release of shares can make such a node fit."""
        if node.has_mig:
            return True
        able = 0
        for card_class in node.classes:
            visible = self._marker in card_class.type_upper
            if visible and self._static_of(card_class, node) is _IDLE_FITS:
                able += card_class.count
        return able >= self._count

    def _card(self, card_class: CardClass, node: NodeProfile) -> _CardVerdict:
        """The class's verdict, looked up by its number and its layer's (equal numbers,
        equal keys: the same verdict), else judged."""
        known = self._classes.get((node.layer_ident, card_class.ident), UNJUDGED)
        if known is not UNJUDGED:
            return known  # type: ignore[return-value]
        verdict = self._card_judged(card_class, node)
        if len(self._classes) >= self.MAX_CLASSES:
            self._classes.clear()
        self._classes[node.layer_ident, card_class.ident] = verdict
        return verdict

    def _card_judged(self, card_class: CardClass, node: NodeProfile) -> _CardVerdict:
        static = self._static_of(card_class, node)
        if static is not _IDLE_FITS and static is not _NEVER:
            return static  # type: ignore[return-value]
        # What Fit's share checks compare, for this request (``fit.fit_container``): a
        # card differs from another of the same static class only in these answers.
        card = card_class.card
        memory = self._memory_mib
        if self._percent >= 0:
            memory = card.total_memory_mib * self._percent // 100
        answers = (
            card.count <= card.used,
            card.used > 0,
            card.total_memory_mib - card.used_memory_mib < memory,
            card.total_cores - card.used_cores < self._cores,
            card.used_cores == card.total_cores,
        )
        dynamic_key = (node.layer_key, card_class.static, answers)
        if dynamic_key not in self._dynamic:
            self._dynamic[dynamic_key] = self._check(
                card_class.card, card_class.cordoned, node.layer
            )
        return self._dynamic[dynamic_key]

    def _static_of(self, card_class: CardClass, node: NodeProfile) -> _CardVerdict | _Marker:
        """The class judged idle: its static reason (final whatever it holds), or
        ``_IDLE_FITS``, or ``_NEVER`` (it fails a share check even idle)."""
        static_key = (node.layer_key, card_class.static)
        static = self._static.get(static_key)
        if static is None:
            idle = card_class.card.copy()
            idle.used = idle.used_memory_mib = idle.used_cores = 0
            verdict = self._check(idle, card_class.cordoned, node.layer)
            if verdict is None:
                static = _IDLE_FITS
            elif verdict[0] in STATIC_CARD_REASONS:
                static = verdict
            else:
                static = _NEVER
            self._static[static_key] = static
        return static

    def _check(
        self, card: model.DeviceUsage, cordoned: bool, layer: node_layer.NodeLayer
    ) -> _CardVerdict:
        """Fit's own checks on one card, for one card's worth of the request."""
        job = self._job
        policy = job.policy_on(layer)
        options = fit.FitOptions(
            spec=self._spec,
            annotations=job.annotations,
            policy=policy,
            topology_aware=False,  # one card: nothing to choose among
            mutex=policies.policy_has(policy, policies.MUTEX),
            cordoned=frozenset({card.id}) if cordoned else frozenset(),
            node_restrictions=layer.restrictions,
            card_filter=self._filter,
        )
        result = fit.fit_container([card.copy()], self._one, options)
        if result.ok:
            return None
        ((reason, _n),) = result.reasons.items()
        return reason, frozenset(result.refused_by.get(reason, ()))
