"""Kueue's Workloads and AdmissionChecks (``kueue.x-k8s.io/v1beta2``): the paths the
admission check controller watches and the two status writes it makes.

Both writes are server-side apply with a field manager of our own and ``force``: the
lists written (``status.admissionChecks``, keyed by name; ``status.conditions``, keyed by
type) are merged by the API server entry by entry, so an entry of another check, or a
condition Kueue writes, is never overwritten with a stale copy (a merge patch would
replace the whole list).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Final

from kubernetes_asyncio import client

from vgpu_operator.kube import requests

GROUP_VERSION: Final = "kueue.x-k8s.io/v1beta2"
WORKLOADS: Final = f"/apis/{GROUP_VERSION}/workloads"
ADMISSION_CHECKS: Final = f"/apis/{GROUP_VERSION}/admissionchecks"
#: The field manager of our writes (kubectl shows it in managedFields).
FIELD_MANAGER: Final = "vgpu-operator-placeable"
_APPLY: Final = "application/apply-patch+yaml"
_QUERY: Final = {"fieldManager": FIELD_MANAGER, "force": "true"}


def rfc3339(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def condition_true(obj: Mapping[str, Any], kind: str) -> bool:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            return condition.get("status") == "True"
    return False


def check_states(workload: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The workload's ``status.admissionChecks`` by check name."""
    found: dict[str, Mapping[str, Any]] = {}
    for state in (workload.get("status") or {}).get("admissionChecks") or ():
        if isinstance(state, Mapping) and isinstance(state.get("name"), str):
            found[state["name"]] = state
    return found


async def set_check_state(
    api: client.ApiClient,
    workload: Mapping[str, Any],
    check: str,
    state: str,
    message: str,
    now: float,
    *,
    requeue_after_s: int | None = None,
) -> None:
    """Write one check's state on the workload (its ``status`` subresource), only if it is
    still the version judged: its ``resourceVersion`` goes with the apply as a
    precondition, so an answer never lands on a workload Kueue has meanwhile evicted and
    reset (a 409 ``ApiError`` then; the newer version comes as its own event)."""
    meta = _meta(workload)
    namespace, name = meta.get("namespace") or "default", meta.get("name", "")
    entry: dict[str, Any] = {
        "name": check,
        "state": state,
        # Kueue's own limit on the message (the CRD's maxLength).
        "message": message[:32768],
        "lastTransitionTime": rfc3339(now),
    }
    if requeue_after_s is not None:
        entry["requeueAfterSeconds"] = requeue_after_s
    body = {
        "apiVersion": GROUP_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "resourceVersion": str(meta.get("resourceVersion") or ""),
        },
        "status": {"admissionChecks": [entry]},
    }
    path = f"/apis/{GROUP_VERSION}/namespaces/{namespace}/workloads/{name}/status"
    await requests.request_json(api, "PATCH", path, query=_QUERY, body=body, content_type=_APPLY)


async def set_check_active(api: client.ApiClient, check: str, now: float) -> None:
    """Mark an AdmissionCheck of ours Active (Kueue uses a ClusterQueue only while every
    check it names is Active)."""
    body = {
        "apiVersion": GROUP_VERSION,
        "kind": "AdmissionCheck",
        "metadata": {"name": check},
        "status": {
            "conditions": [
                {
                    "type": "Active",
                    "status": "True",
                    "reason": "Active",
                    "message": "vgpu-operator answers this check",
                    "lastTransitionTime": rfc3339(now),
                }
            ]
        },
    }
    path = f"{ADMISSION_CHECKS}/{check}/status"
    await requests.request_json(api, "PATCH", path, query=_QUERY, body=body, content_type=_APPLY)
