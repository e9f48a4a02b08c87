"""Why a simple claim does not fit a node, judged by the node's class: the DRA dialect's
``card_classes``.

A claim request is *simple* when it is the pod's one claim to allocate, one request of
one device, without ``firstAvailable`` alternatives, constraints, MIG or ``adminAccess``,
in a namespace no quota limits. Its fit on a node fails exactly when every card fails on
its own: each card is refused by the first check it fails (its selectors, its taints,
the request policy of its capacity, then the annotation path's checks: health, cordon,
type, UUID, slots, memory, cores), whatever the order of the cards. So the failure is
a function of what each card is as those checks read it, which is the node's *profile*:
per card, whether the request's selectors select its device and its tolerations
tolerate the device's taints, its capacity shape (what a request consumes of it, and
whether it can give the request at all: ``claims.eligible``, ``claim_taints``), and the
card's fields (type, mode, health, cordon, slots, memory and cores, total and used, and
its UUID where restrictions name UUIDs); with the node layer's restrictions and GPU
policy. Nodes of equal profiles, for equal requests, fail alike: in a cluster of a few
machine types most nodes share a profile with many others.

``Classes`` keeps each node's profile while the node does not change (the books' change
log numbers a node's changes; the epoch, the config and quota limits) and each failure
judged by a full fit, per profile and request. A fit that succeeds on a node is not kept
(which card it takes depends on their order); on one card (a preemption trial's card
alone) it is: the card is the one taken, and what it consumes is the profile's. The
differential test fits in full and compares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from vgpu_operator.devices import model
from vgpu_operator.scheduling.cel import claim_cel
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import claim_mig, claims, dra_pool
from vgpu_operator.scheduling.dialects.claims.claim_fit import ClaimsOutcome, DevicePick
from vgpu_operator.scheduling.policies import node_layer

#: Bounds on what is kept (profiles per node and selector set; failures per profile):
#: past them, everything is judged afresh.
MAX_PROFILES: Final = 65_536
MAX_FAILURES: Final = 65_536

Profile = tuple[object, ...]


def simple_request(pending: Sequence[claims.Claim], job: placement.Job) -> claims.Request | None:
    """The one request of a simple claim (see the module docstring), or None."""
    if len(pending) != 1:
        return None
    claim = pending[0]
    if len(claim.requests) != 1 or claim.choices or claim.match_attributes:
        return None
    if claim.distinct_attributes or claim_mig.is_mig(claim):
        return None
    [request] = claim.requests
    if request.count != 1 or request.admin_access or job.quota.has_limits(job.namespace):
        return None  # an adminAccess request takes a device whatever it holds
    return request


def selection_key(request: claims.Request) -> tuple[object, ...]:
    """What the profile's per-card answers depend on of the request."""
    return (tuple(s.expression for s in request.selectors), repr(request.tolerations))


def request_key(request: claims.Request, whole: bool, job: placement.Job) -> tuple[object, ...]:
    """What a failure depends on of the request, beyond the profile (what it consumes of
    each capacity shape; its GPU policy, whose ``mutex`` refuses used cards)."""
    capacity = tuple(sorted(request.capacity.items()))
    return (selection_key(request), capacity, whole, job.gpu_policy, job.default_gpu_policy)


def profile(
    pool: dra_pool.Pool,
    cards: Sequence[model.DeviceUsage],
    cordoned: frozenset[str],
    layer: node_layer.NodeLayer,
    request: claims.Request,
    cache: claim_cel.SelectorCache,
    with_ids: bool,
) -> Profile | None:
    """The node's profile for ``request`` (see the module docstring); None when a
    selector's verdict on one of its devices is not known (the full fit reports it).
    ``with_ids``: the node layer restricts cards by UUID (each card is its own then)."""
    rows = []
    try:
        for card in cards:
            device = pool.devices.get(card.id)
            if device is None:
                continue
            selected = claim_cel.all_select(
                request.selectors, cache, device.key, device.view, request.written
            )
            rows.append(
                (
                    selected,
                    dra_pool.tolerated(device.taints, request.tolerations),
                    device.capacity_shape,
                    card.vendor,
                    card.type,
                    card.mode,
                    card.health,
                    card.id in cordoned,
                    card.count,
                    card.total_memory_mib,
                    card.total_cores,
                    card.used,
                    card.used_memory_mib,
                    card.used_cores,
                    card.mig is not None,
                    card.id if with_ids else "",
                )
            )
    except (claim_cel.CelRuntimeError, claim_cel.CelPending):
        return None
    restrictions = tuple(sorted(layer.restrictions.items()))
    return (tuple(sorted(rows)), restrictions, layer.gpu_policy)


class Classes:
    """Profiles kept per node, and failures per profile (see the module docstring).
    Profiles and request keys are numbered once (``number``): a profile is a tuple of a
    few dozen fields, and a dictionary hashes a tuple afresh at each lookup."""

    def __init__(self) -> None:
        #: (node, selection key) -> (the node's stamp, its profile's number).
        self._profiles: dict[tuple[str, object], tuple[object, int | None]] = {}
        #: Profiles and request keys by number.
        self._numbers: dict[object, int] = {}
        #: (request key's number, profile's number) -> the failure a full fit found.
        self._failures: dict[tuple[int, int], ClaimsOutcome] = {}
        #: The same, for one card that took the request: what it consumed, its score.
        self._taken: dict[tuple[int, int], tuple[claims.Consumption, tuple[float, ...]]] = {}
        self._last_selection: tuple[claims.Request, object] | None = None

    def number(self, key: object) -> int:
        """The number of a profile or request key (equal keys, equal numbers)."""
        found = self._numbers.get(key)
        if found is None:
            if len(self._numbers) >= MAX_PROFILES:
                self._numbers.clear()
                self._profiles.clear()
                self._failures.clear()
                self._taken.clear()
            found = self._numbers[key] = len(self._numbers)
        return found

    def profile_of(
        self,
        node: str,
        stamp: object,
        request: claims.Request,
        make: Callable[[], Profile | None],
    ) -> int | None:
        """The number of the node's profile for the request's selectors as of ``stamp``
        (the node's change), made (``make``) once per stamp."""
        key = (node, self._selection_key(request))
        kept = self._profiles.get(key)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        if len(self._profiles) >= MAX_PROFILES:
            self._profiles.clear()
        made = make()
        found = None if made is None else self.number(made)
        self._profiles[key] = (stamp, found)
        return found

    def _selection_key(self, request: claims.Request) -> object:
        """``selection_key``, made once per request object (asked for every node)."""
        last = self._last_selection
        if last is not None and last[0] is request:
            return last[1]
        key = selection_key(request)
        self._last_selection = (request, key)
        return key

    def failure(self, request_key: int, found: int) -> ClaimsOutcome | None:
        """The failure of a node of profile ``found`` for the request, if judged already:
        one object for every such node (read only, as every fit's outcome is read)."""
        return self._failures.get((request_key, found))

    def taken(
        self, request_key: int, found: int, claim: str, request: str, device: dra_pool.PoolDevice
    ) -> ClaimsOutcome | None:
        """The fit of one card of profile ``found`` (the ``device``) that took the request
        (named ``request``, of claim ``claim``) already, or None."""
        kept = self._taken.get((request_key, found))
        if kept is None:
            return None
        consumption, scores = kept
        pick = DevicePick(request, device, consumption)
        return ClaimsOutcome(True, picks={claim: [pick]}, card_scores=scores)

    def learn(
        self, request_key: int, found: int, outcome: ClaimsOutcome, one_card: bool = False
    ) -> None:
        """A full fit's outcome on a node (or, ``one_card``, a card) of profile ``found``:
        a failure is kept, and a success on one card (an error is the whole attempt's)."""
        if outcome.error is not None:
            return
        if len(self._failures) + len(self._taken) >= MAX_FAILURES:
            self._failures.clear()
            self._taken.clear()
        if not outcome.ok:
            self._failures[(request_key, found)] = outcome
        elif one_card and len(outcome.picks) == 1:
            [picks] = outcome.picks.values()
            if len(picks) == 1:
                self._taken[(request_key, found)] = (picks[0].consumption, outcome.card_scores)
