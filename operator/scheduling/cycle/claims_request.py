"""What a pod on the DRA path asks, read at each attempt (the claims plugin's request).

Its claims are read as the books hold them now (they change on their own:
``claims.read_pod_claims``), with the special claim of a pod that asks an extended
resource one of our classes serves (``extended_claims``) and its PodGroup's claims
(``group_claims``: reserved for the group; one another member's decision is allocating is
read as allocated where that decision put it); a claim not made yet is a wait for it, one
the engine does not allocate a refusal that says what to change.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from vgpu_operator import names
from vgpu_operator.devices import dra
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.books import group_claims
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.cycle.plugin import Unread
from vgpu_operator.scheduling.cycle.pod_read import PodRead
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import claim_mig, claims, extended_claims
from vgpu_operator.wire import Pod


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


#: A simple claim's one request, and the number of the key its failures are kept by.
Classed = tuple[claims.Request, int]


@dataclass(frozen=True, slots=True)
class ClaimsRequest:
    """What a pod on the DRA path asks, read at one attempt."""

    #: The pod as decided: with its special claim named, if it gets one.
    pod: Pod
    #: Its CPU, memory and node terms, its namespace's quota (the pod read once).
    job: placement.Job
    wanted: claims.PodClaims
    special: extended_claims.Special | None = None
    #: Its group claims, reserved for its PodGroup (a group claim another member's
    #: decision is allocating is read as allocated where that decision put it).
    sharing: Sharing = field(default_factory=Sharing)
    #: A simple claim's request and what its failures are kept by (``claim_classes``);
    #: None: the claims are judged by full fits only.
    classed: Classed | None = None

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
            for c in self.wanted.claims
        ]
        return "+claims:" + hashlib.blake2b(repr(read).encode(), digest_size=16).hexdigest()


def read_request(
    view: BooksView,
    attempt: PodRead,
    resources: Mapping[str, str],
    classed: Callable[[claims.PodClaims, placement.Job], Classed | None],
) -> ClaimsRequest | Unread:
    """The pod's claims, or why they cannot be read. ``resources``: the extended resources
    our classes serve; ``classed``: a simple claim's request and key (``claim_classes``)."""
    job = attempt.job
    if job is None:
        return Unread(attempt.error)
    pod, objects = attempt.source, view.claims.objects
    special: extended_claims.Special | None = None
    if extended_claims.asks(pod, resources):
        try:
            special = extended_claims.special(pod, resources, objects, view.vendors)
        except extended_claims.ExtendedRefusal as exc:
            return Unread(str(exc))
        pod, objects = extended_claims.with_special(pod, objects, special)
    try:
        wanted = claims.read_pod_claims(
            pod, objects, view.claims.classes, view.claims.selector_cache
        )
        group = group_claims.of_pod(pod, view.group_claims)
        shared = frozenset() if group is None else group_claims.claim_keys(pod, group[1])
        wanted, pinned = group_claims.pin_to_decided(wanted, shared, attempt.key, view.claims)
    except claims.Waiting as exc:
        return Unread(str(exc), waits_for_claims=True)
    except (claims.Refusal, CodecError) as exc:
        return Unread(str(exc))
    refused = _admin_access_refusal(wanted.pending, view.claims.admin_namespaces)
    if refused is not None:
        return Unread(refused)
    sharing = Sharing(None if group is None else group[0], shared, pinned)
    return ClaimsRequest(pod, job, wanted, special, sharing, classed(wanted, job))


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
