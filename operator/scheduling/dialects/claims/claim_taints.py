"""Why a device a claim's request may not use was ruled out: selectors, taints, capacity.

``claims.eligible`` answers only yes or no (the selectors, the device's taints against the
request's tolerations, the capacity policy). A pod kept off a card because the card is
sick must be told so: "the devices are tainted" asks for a different fix (wait for the
card, or tolerate the taint) than "no device matches your selector". So a refused device
whose selectors all pass and one of whose NoSchedule/NoExecute taints the request does not
tolerate counts under ``DeviceUntoleratedTaint``; upstream's allocator also checks the
selectors first, so a device the request never selected is not reported as tainted.

When tainted devices are all that kept a request off a node, they are the news: the
devices its selectors or request policy rule out are then left out of the count (a
request aimed at one card by its selector would otherwise be told mostly
``DeviceNotSelected`` about the cards it never wanted), as the Fit leaves them out when
some device is eligible.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cel import claim_cel
from vgpu_operator.scheduling.dialects.claims import claims, dra_pool
from vgpu_operator.scheduling.status import Reason


def refusal(
    request: claims.Request, device: dra_pool.PoolDevice, cache: claim_cel.SelectorCache
) -> Reason:
    """The reason to count for a device ``claims.eligible`` refused ``request``: its
    selectors, an untolerated taint, or a capacity the device cannot give whatever it
    holds (a request larger than the card: the card's memory or cores, as the
    annotation path names it). The selectors' verdicts are cached by then (eligible asked
    them first)."""
    if not claim_cel.all_select(request.selectors, cache, device.key, device.view, request.written):
        return Reason.DEVICE_NOT_SELECTED
    if not dra_pool.tolerated(device.taints, request.tolerations):
        return Reason.DEVICE_UNTOLERATED_TAINT
    for asked, amount in request.capacity.items():
        key = device.capacity_named(asked)
        policy = None if key is None else device.capacity.get(key)
        if policy is None or amount <= policy.value:
            continue
        if key == dra.MEMORY:
            return Reason.CARD_INSUFFICIENT_MEMORY
        if key == dra.CORES:
            return Reason.CARD_INSUFFICIENT_CORE
    return Reason.DEVICE_NOT_SELECTED


#: What a device's selectors or capacity rule out for good (not the news next to taints).
_RULED_OUT: Final = (
    Reason.DEVICE_NOT_SELECTED,
    Reason.CARD_INSUFFICIENT_MEMORY,
    Reason.CARD_INSUFFICIENT_CORE,
)


def only_the_news(reasons: Counter[Reason]) -> None:
    """With no device eligible for a request: keep the tainted ones' count alone, if any."""
    if reasons.get(Reason.DEVICE_UNTOLERATED_TAINT):
        for ruled_out in _RULED_OUT:
            reasons.pop(ruled_out, None)
