"""Why a device a claim's request may not use was ruled out: its taints, or the rest.

``claims.eligible`` answers only yes or no (the selectors, the device's taints against the
request's tolerations, the capacity policy). A pod kept off a card because the card is
sick must be told so: "the devices are tainted" asks for a different fix (wait for the
card, or tolerate the taint) than "no device matches your selector". So a refused device
whose selectors all pass and one of whose NoSchedule/NoExecute taints the request does not
tolerate counts under ``DeviceUntoleratedTaint``; upstream's allocator also checks the
selectors first, so a device the request never selected is not reported as tainted.
"""

from __future__ import annotations

from vgpu_operator.scheduling import claim_cel, claims, dra_pool
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
