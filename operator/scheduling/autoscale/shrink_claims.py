"""Scale-down's movers among pods that hold their GPUs through ResourceClaims.

A pod of the claims dialect books nothing itself: its shares are its claims' allocations
(``claim_books``), so the defragmentation planner's rule (``defrag.mover_of``: a pod with
bookings) would never move it, and a node of such pods would always be kept. Here such a
pod may move when every one of its claims is one the claim controller makes again for its
replacement: a claim made from a ResourceClaimTemplate for this pod (owned by it, reserved
for it alone), which goes with the pod and is made afresh, from the template as it is now,
for the pod that replaces it (``claim_templates``). Its replacement is then judged with
those new claims by the claims dialect's one walk (``decision.Cycle.schedule``).

A pod that uses a claim made apart from it (``resourceClaimName``), or a template's
claim that is shared (reserved for other pods too, or not owned by the pod), is not
moved: its allocation would have to move with it, and nothing makes it again (a claim
named by the pod is the same claim for its replacement, freed only once the pod is gone
and then still shared by the others). Said in the node's reason.

The old claims stay held on the node being emptied throughout the what-if (they go only
once their pod has): harmless for where the replacements go (the node is ruled out), but
the namespace's quota counts them twice meanwhile, so a quota at its limit keeps the node
(as live, where the claims controller deletes the old claims only after the pod is gone).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from vgpu_operator.scheduling import defrag
from vgpu_operator.scheduling.books import claim_ledger
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import claim_templates, claims
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.wire import Pod, ResourceClaim, ResourceClaimTemplate

Templates = Mapping[str, ResourceClaimTemplate]


@dataclass(frozen=True, slots=True)
class Remade:
    """A claims pod's replacement, as its controller and the claim controller make it:
    the pod (its claims named in its status) and the claims made from the templates."""

    pod: Pod
    claims: tuple[ResourceClaim, ...]


def uses_claims(pod: Pod) -> bool:
    return claims.uses_claims(pod)


def template_keys(pods: Iterable[Pod]) -> list[str]:
    """The ``namespace/name`` of every ResourceClaimTemplate the pods' claims come from,
    each once (what scale-down reads to remake them)."""
    found: dict[str, None] = {}
    for pod in pods:
        namespace = (pod.get("metadata") or {}).get("namespace") or "default"
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
            if isinstance(entry, Mapping) and isinstance(
                entry.get("resourceClaimTemplateName"), str
            ):
                found[f"{namespace}/{entry['resourceClaimTemplateName']}"] = None
    return list(found)


def claim_mover(
    books: defrag.DefragBooks,
    key: PodKey,
    pod: Pod,
    options: defrag.PlanOptions,
    templates: Templates,
) -> tuple[defrag.Mover, Remade] | str:
    """The claims pod ``key`` as scale-down may move it, with its replacement; or why not."""
    entry = books.entry(key)
    node = None if entry is None else entry.node
    if entry is None or node is None:
        return f"pod {key} is not bound in the books"
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    own = _own_claims(books, key, pod, uid)
    if isinstance(own, str):
        return own
    held = _held_on(books, node, own)
    if not held:
        return f"pod {key}: its claims hold nothing on node {node}"
    mover = defrag.mover_of(books, key, pod, options, through_claims=held)
    if mover is None:
        return f"pod {key} may not be moved (not this scheduler's, no controller, a gang's)"
    written = defrag.scheduler_written(books.state)
    made = claim_templates.with_template_claims(defrag.replacement_pod(pod, written), templates)
    if isinstance(made, str):
        return f"pod {key}: {made}; its claims cannot be made again"
    return mover, Remade(made[0], tuple(made[1]))


def _own_claims(books: defrag.DefragBooks, key: PodKey, pod: Pod, uid: str) -> list[str] | str:
    """The keys of the pod's claims, each one made from a template for this pod alone;
    else why the pod stays (a standalone or shared claim's allocation would have to move)."""
    namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if isinstance(entry, Mapping) and entry.get("resourceClaimName"):
            return (
                f"pod {key} uses ResourceClaim {namespace}/{entry['resourceClaimName']}, "
                "made apart from the pod: its allocation would have to move with it "
                "(a standalone claim is not made again for a replacement)"
            )
    keys = claims.pod_claim_keys(pod)
    if isinstance(keys, str):
        return f"pod {key}: {keys}"
    objects = books.view.claims.objects
    for claim_key in keys:
        obj = objects.get(claim_key)
        if obj is None:
            return f"pod {key}: its ResourceClaim {claim_key} is not in the books"
        meta = obj.get("metadata") or {}
        owned = uid and any(
            isinstance(ref, Mapping) and ref.get("uid") == uid and ref.get("controller") is True
            for ref in meta.get("ownerReferences") or ()
        )
        if not owned:
            return (
                f"pod {key}: its ResourceClaim {claim_key} is not owned by the pod "
                "(not made again for a replacement): its allocation would have to move"
            )
        if _shared(obj, uid):
            return (
                f"pod {key}: its ResourceClaim {claim_key} is shared with other pods: "
                "its allocation would have to move with them"
            )
    return keys


def _shared(obj: ResourceClaim, uid: str) -> bool:
    """Whether the claim is reserved for anything but the pod (other pods, a PodGroup)."""
    reserved = (obj.get("status") or {}).get("reservedFor")
    if not isinstance(reserved, list):
        return False
    return any(
        not isinstance(r, Mapping) or r.get("uid") != uid or r.get("resource", "pods") != "pods"
        for r in reserved
    )


def _held_on(books: defrag.DefragBooks, node: str, keys: Sequence[str]) -> list[placement.Booking]:
    """What the claims ``keys`` hold of the node's cards (a hold of a claim reserved for
    the pod; a hold still being written by a decision is not the pod's yet)."""
    wanted = set(keys)
    cards = {card.id: card for card in books.cards(node)}
    out: list[placement.Booking] = []
    for hold, holders in books.view.claims.holders_on(node):
        if hold.key in wanted and holders:
            out.extend(claim_ledger.bookings(hold, cards))
    return out
