"""The ``PodScheduled=False`` condition for a pod that does not fit, as kube-scheduler
writes it, applied with a strategic merge patch on ``pods/status`` (conditions merge by
``type``, so other writers' conditions are kept)."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Final

from kubernetes_asyncio import client

from vgpu_operator.kube import pods, requests
from vgpu_operator.timestamps import format_rfc3339

POD_SCHEDULED: Final = "PodScheduled"
REASON_UNSCHEDULABLE: Final = "Unschedulable"


def current_condition(
    pod: Mapping[str, Any], kind: str = POD_SCHEDULED
) -> Mapping[str, Any] | None:
    status = pod.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    if not isinstance(conditions, list):
        return None
    for cond in conditions:
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def unschedulable_condition(
    pod: Mapping[str, Any], message: str, now: datetime.datetime, reason: str = REASON_UNSCHEDULABLE
) -> dict[str, Any] | None:
    """The condition to write, or None when the pod already carries exactly this one.

    ``lastTransitionTime`` only moves when the status changes (it is the time of the
    transition to False, not of the latest attempt).
    """
    current = current_condition(pod)
    if (
        current is not None
        and current.get("status") == "False"
        and current.get("reason") == reason
        and current.get("message") == message
    ):
        return None
    transition = format_rfc3339(now)
    if (
        current is not None
        and current.get("status") == "False"
        and current.get("lastTransitionTime")
    ):
        transition = str(current["lastTransitionTime"])
    return {
        "type": POD_SCHEDULED,
        "status": "False",
        "reason": reason,
        "message": message,
        "lastProbeTime": None,
        "lastTransitionTime": transition,
    }


async def patch_pod_condition(
    api: client.ApiClient, namespace: str, name: str, condition: Mapping[str, Any]
) -> bool:
    """Write one condition; False when the pod is gone."""
    return await pods.patch_pod_status(
        api,
        namespace,
        name,
        {"conditions": [dict(condition)]},
        requests.STRATEGIC_MERGE_PATCH,
    )
