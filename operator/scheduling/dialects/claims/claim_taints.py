"""Why a device a claim's request may not use was ruled out: its taints, or the rest.

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

from vgpu_operator.scheduling.cel import claim_cel
from vgpu_operator.scheduling.dialects.claims import claims, dra_pool
from vgpu_operator.scheduling.status import Reason


def refusal(
    request: claims.Request, device: dra_pool.PoolDevice, cache: claim_cel.SelectorCache
) -> Reason:
    """The reason to count for a device ``claims.eligible`` refused ``request``.
    The selectors' verdicts are cached by then (eligible asked them first)."""
    if dra_pool.tolerated(device.taints, request.tolerations):
        return Reason.DEVICE_NOT_SELECTED
    for selector in request.selectors:
        if not cache.matches(selector, device.key, device.view):
            return Reason.DEVICE_NOT_SELECTED
    return Reason.DEVICE_UNTOLERATED_TAINT


def only_the_news(reasons: Counter[Reason]) -> None:
    """With no device eligible for a request: keep the tainted ones' count alone, if any."""
    if reasons.get(Reason.DEVICE_UNTOLERATED_TAINT):
        reasons.pop(Reason.DEVICE_NOT_SELECTED, None)
