"""The operator's DRA writes: a claim's finalizer, allocation and reservation
(``resource.k8s.io/v1``), and the paths its watches list.

As kube-scheduler writes them: the delete-protection finalizer in a normal update of the
claim (so the claim is not deleted while allocated), then ``status.allocation`` with the
pod in ``status.reservedFor`` in one update of the status subresource. Both carry the
resourceVersion of the copy the decision read, so a concurrent change (another allocator,
the claim controller) makes them fail with 409 rather than overwrite it.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final, cast
from urllib.parse import quote

import orjson

from vgpu_operator.kube import listing, raw_finalizer, requests
from vgpu_operator.kube.requests import ApiClient, ApiError, request_json
from vgpu_operator.scheduling.dialects.claims import claim_admission, claim_routing
from vgpu_operator.timestamps import format_rfc3339, parse_rfc3339
from vgpu_operator.wire import (
    AllocationResult,
    Pod,
    ResourceClaim,
    ResourceClaimConsumer,
    ResourceClaimStatus,
    ResourceClaimTemplate,
    meta_of,
)

BASE: Final = "/apis/resource.k8s.io/v1"
RESOURCE_SLICES: Final = f"{BASE}/resourceslices"
RESOURCE_CLAIMS: Final = f"{BASE}/resourceclaims"
DEVICE_CLASSES: Final = f"{BASE}/deviceclasses"
DEVICE_TAINT_RULES: Final = f"{BASE}/devicetaintrules"
#: Keeps an allocated claim from being deleted before it is deallocated.
FINALIZER: Final = "resource.kubernetes.io/delete-protection"


class WriteOutcome(enum.Enum):
    WRITTEN = "written"
    CONFLICT = "conflict"  # changed meanwhile (or allocated elsewhere): decide again
    GONE = "gone"


def claim_path(namespace: str, name: str) -> str:
    return f"{BASE}/namespaces/{quote(namespace)}/resourceclaims/{quote(name)}"


async def _patch(api: ApiClient, path: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        return await request_json(api, "PATCH", path, body=body, content_type=requests.MERGE_PATCH)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


async def _add_finalizer(
    api: ApiClient, path: str, finalizers: list[str], version: str
) -> dict[str, Any] | None:
    """The delete-protection finalizer added to the claim at ``version`` (a changed claim
    raises a 409 ApiError); None: the claim is gone.

    A merge patch first. The API server applies it to the claim decoded into plain maps,
    which re-encodes the spec's opaque parameters compactly; where the client that made
    the claim sent them with spaces, the stored bytes differ and the immutable spec reads
    as changed (422). Then the claim is read and written in protobuf, its raw parameters
    byte for byte as stored, as a Go client's update carries them (``raw_finalizer``)."""
    body = {"metadata": {"finalizers": [*finalizers, FINALIZER], "resourceVersion": version}}
    try:
        return await _patch(api, path, body)
    except ApiError as exc:
        if exc.status != 422 or "immutable" not in exc.body:
            raise
    try:
        stored = await requests.request_bytes(api, "GET", path, accept=raw_finalizer.CONTENT_TYPE)
        spliced = raw_finalizer.with_finalizer(stored, FINALIZER, version)
        if spliced is None:
            raise ApiError("PUT", path, 409, "the claim changed since it was read")
        written = await requests.request_bytes(
            api, "PUT", path, data=spliced, content_type=raw_finalizer.CONTENT_TYPE
        )
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    decoded = orjson.loads(written)
    return decoded if isinstance(decoded, dict) else None


async def allocate(
    api: ApiClient,
    claim: ResourceClaim,
    allocation: Mapping[str, Any] | None,
    consumer: Mapping[str, str],
    *,
    now: datetime.datetime | None = None,
) -> WriteOutcome:
    """Write ``allocation`` (None: keep the claim's) and reserve the claim for
    ``consumer``, on the claim as ``claim`` shows it (its resourceVersion is the
    precondition). The allocation is written with its ``allocationTimestamp``
    (``stamped_allocation``)."""
    meta = meta_of(claim)
    path = claim_path(str(meta.get("namespace")), str(meta.get("name")))
    version = meta.get("resourceVersion", "")
    claim_status = claim.get("status", {})
    try:
        if allocation is not None:
            if claim_status.get("allocation"):
                return WriteOutcome.CONFLICT
            finalizers = list(meta.get("finalizers") or ())
            if FINALIZER not in finalizers:
                updated = await _add_finalizer(api, path, finalizers, version)
                if updated is None:
                    return WriteOutcome.GONE
                version = str(updated["metadata"]["resourceVersion"])
        reserved = list(claim_status.get("reservedFor") or ())
        if not any(r.get("uid") == consumer.get("uid") for r in reserved):
            reserved.append(cast(ResourceClaimConsumer, dict(consumer)))
        status: ResourceClaimStatus = {"reservedFor": reserved}
        if allocation is not None:
            status["allocation"] = stamped_allocation(allocation, now)
        written = await _patch(
            api, f"{path}/status", {"metadata": {"resourceVersion": version}, "status": status}
        )
    except ApiError as exc:
        if exc.status == 409:
            return WriteOutcome.CONFLICT
        raise
    return WriteOutcome.WRITTEN if written is not None else WriteOutcome.GONE


def stamped_allocation(
    allocation: Mapping[str, Any], now: datetime.datetime | None = None
) -> AllocationResult:
    """The allocation as kube-scheduler writes it: with ``allocationTimestamp``.

    kube-scheduler (1.37, device binding conditions on) sets the timestamp on a claim it
    joins when the allocation lacks one, in the same status update as its reservation:
    without it here, the first kube-scheduler pod to share a claim the engine allocated
    rewrote ``status.allocation`` (issue 33 item 6)."""
    stamp = format_rfc3339(now or datetime.datetime.now(datetime.UTC))
    stamped = {**allocation, "allocationTimestamp": allocation.get("allocationTimestamp") or stamp}
    return cast(AllocationResult, stamped)


async def release(
    api: ApiClient, namespace: str, name: str, consumer_uid: str, deallocate: bool
) -> None:
    """Undo a reservation whose pod was not bound: the pod leaves ``reservedFor``, and the
    allocation goes too when ``deallocate`` (we made it, and no other pod holds it)."""
    path = claim_path(namespace, name)
    async for current in _fresh_copies(api, path):
        status = current.get("status") or {}
        reserved = [r for r in status.get("reservedFor") or () if r.get("uid") != consumer_uid]
        body: dict[str, Any] = {
            "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
            "status": {"reservedFor": reserved or None},
        }
        if deallocate and not reserved:
            body["status"]["allocation"] = None
        try:
            await _patch(api, f"{path}/status", body)
            return
        except ApiError as exc:
            if exc.status != 409:
                raise


async def _fresh_copies(api: ApiClient, path: str) -> AsyncIterator[dict[str, Any]]:
    """The object as the API server has it now, read again for each of five tries (a
    try that meets a conflict reads it anew); none once it is gone."""
    for _attempt in range(5):
        current = await _get(api, path)
        if current is None:
            return
        yield current


async def _get(api: ApiClient, path: str) -> dict[str, Any] | None:
    try:
        return await request_json(api, "GET", path)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


async def create_claim(api: ApiClient, claim: Mapping[str, Any]) -> ResourceClaim | None:
    """Create the claim (a pod's special claim: ``extended_claims``); None when one of
    its name exists already. The uid and resourceVersion the decision gave it in memory
    are not sent."""
    meta = dict(claim.get("metadata") or {})
    meta.pop("uid", None)
    meta.pop("resourceVersion", None)
    body = {**claim, "metadata": meta}
    path = f"{BASE}/namespaces/{quote(str(meta.get('namespace')))}/resourceclaims"
    try:
        created = await request_json(api, "POST", path, body=body)
    except ApiError as exc:
        if exc.status == 409:
            return None
        raise
    return cast(ResourceClaim, created)


async def discard_claim(api: ApiClient, namespace: str, name: str) -> None:
    """Delete a claim the operator created for a pod that was not bound: its
    allocation and reservations and our finalizer go first (nothing else removes the
    finalizer of a claim whose pod never ran), then the claim."""
    path = claim_path(namespace, name)
    async for current in _fresh_copies(api, path):
        meta = current.get("metadata") or {}
        version = meta.get("resourceVersion")
        try:
            if (current.get("status") or {}).get("allocation") or (current.get("status") or {}).get(
                "reservedFor"
            ):
                cleared = {"reservedFor": None, "allocation": None}
                body = {"metadata": {"resourceVersion": version}, "status": cleared}
                await _patch(api, f"{path}/status", body)
                continue
            finalizers = [f for f in meta.get("finalizers") or () if f != FINALIZER]
            if finalizers != list(meta.get("finalizers") or ()):
                body = {"metadata": {"resourceVersion": version, "finalizers": finalizers or None}}
                await _patch(api, path, body)
                continue
            await request_json(api, "DELETE", path)
            return
        except ApiError as exc:
            if exc.status == 404:
                return
            if exc.status != 409:
                raise


async def write_extended_status(
    api: ApiClient, namespace: str, pod: str, status: Mapping[str, Any]
) -> bool:
    """``status.extendedResourceClaimStatus`` of the pod (a merge patch of its status);
    False when the pod is gone."""
    path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/status"
    written = await _patch(api, path, {"status": {"extendedResourceClaimStatus": dict(status)}})
    return written is not None


#: A webhook-made template reused at admission is stamped (``LAST_ADMITTED``) when its
#: stamp is older than this: the collector keeps a template for its grace period after
#: the last pod admitted with it, whose create may not have landed yet.
STAMP_AFTER_S: Final = 60.0
LAST_ADMITTED: Final = "vgpu-operator.io/last-admitted"


def templates_path(namespace: str | None = None) -> str:
    if namespace is None:
        return f"{BASE}/resourceclaimtemplates"
    return f"{BASE}/namespaces/{quote(namespace)}/resourceclaimtemplates"


async def read_template(api: ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """One ResourceClaimTemplate, or None when it does not exist."""
    return await _get(api, f"{templates_path(namespace)}/{quote(name)}")


async def ensure_template(
    api: ApiClient,
    template: Mapping[str, Any],
    *,
    dry_run: bool = False,
    now: datetime.datetime | None = None,
) -> str | None:
    """Create the ResourceClaimTemplate, or find it made already asking the same
    (``claim_admission.same_template``); a sentence when one of that name asks something
    else. ``dry_run`` (the AdmissionReview's): nothing is written, the API server only
    validates the template (``dryRun=All``)."""
    meta = template["metadata"]
    path = templates_path(str(meta["namespace"]))
    now = now or datetime.datetime.now(datetime.UTC)
    stamped = {
        **template,
        "metadata": {
            **meta,
            "annotations": {**(meta.get("annotations") or {}), LAST_ADMITTED: format_rfc3339(now)},
        },
    }
    query = {"dryRun": "All"} if dry_run else None
    try:
        await request_json(api, "POST", path, body=stamped, query=query)
        return None
    except ApiError as exc:
        if exc.status != 409:
            raise
    name_path = f"{path}/{quote(str(meta['name']))}"
    existing = cast(ResourceClaimTemplate | None, await _get(api, name_path))
    wanted = cast(ResourceClaimTemplate, template)  # as claim_admission.template_for made it
    if existing is None or not claim_admission.same_template(existing, wanted):
        return (
            f"ResourceClaimTemplate {meta['namespace']}/{meta['name']} exists with another "
            "spec; delete it (the webhook makes it again)"
        )
    if not dry_run and _stamp_is_old(existing, now):
        # Best effort: a failed stamp costs at most a template made again later.
        with contextlib.suppress(ApiError):
            await _patch(
                api,
                name_path,
                {"metadata": {"annotations": {LAST_ADMITTED: format_rfc3339(now)}}},
            )
    return None


def _stamp_is_old(template: ResourceClaimTemplate, now: datetime.datetime) -> bool:
    annotations = meta_of(template).get("annotations") or {}
    stamped = parse_rfc3339(annotations.get(LAST_ADMITTED))
    return stamped is None or (now - stamped).total_seconds() > STAMP_AFTER_S


async def read_pod_claims(
    api: ApiClient, namespace: str, refs: Sequence[claim_routing.ClaimRef]
) -> list[tuple[claim_routing.ClaimRef, ResourceClaim | ResourceClaimTemplate | None]]:
    """The claims and templates a pod names, read one by one (None: not found), up to
    the first that asks for our DeviceClasses (the webhook's answer is then known).
    The caller bounds the count (``claim_routing.too_many``) and the time."""
    out: list[tuple[claim_routing.ClaimRef, ResourceClaim | ResourceClaimTemplate | None]] = []
    for ref in refs[: claim_routing.MAX_CLAIM_READS]:
        if ref.kind == claim_routing.CLAIM:
            path = claim_path(namespace, ref.name)
        else:
            path = f"{templates_path(namespace)}/{quote(ref.name)}"
        obj = cast(ResourceClaim | ResourceClaimTemplate | None, await _get(api, path))
        out.append((ref, obj))
        if obj is not None and claim_routing.asks_our_classes(obj, ref.kind):
            break
    return out


async def list_webhook_templates(api: ApiClient) -> list[ResourceClaimTemplate]:
    """Every ResourceClaimTemplate carrying the webhook's label, cluster-wide (whether
    each is really ours is ``claim_admission.made_by_webhook``'s question)."""
    key, value = claim_admission.MANAGED_BY
    found = await listing.list_all(api, templates_path(), label_selector=f"{key}={value}")
    return cast(list[ResourceClaimTemplate], found.items)


async def templates_named_by_pods(api: ApiClient, namespace: str) -> set[str]:
    """The templates the namespace's pods (any phase: a finished Job's pod still names
    its template) name."""
    found = await listing.list_all(api, f"/api/v1/namespaces/{quote(namespace)}/pods")
    pods = cast(list[Pod], found.items)
    return {
        template
        for pod in pods
        for entry in pod.get("spec", {}).get("resourceClaims") or ()
        if (template := entry.get("resourceClaimTemplateName"))
    }


async def delete_template(api: ApiClient, template: ResourceClaimTemplate) -> bool:
    """Delete the template as listed: preconditions on its uid and resourceVersion, so
    one stamped by the webhook (or made again) since is left. False when it changed or
    went meanwhile."""
    meta = meta_of(template)
    path = f"{templates_path(str(meta.get('namespace')))}/{quote(str(meta.get('name')))}"
    body = {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
    }
    try:
        await request_json(api, "DELETE", path, body=body)
    except ApiError as exc:
        if exc.status in (404, 409):
            return False
        raise
    return True


class ApiClaimWriter:
    """``control.claim_binding.ClaimWriter`` over one ApiClient."""

    def __init__(self, api: ApiClient) -> None:
        self._api = api

    async def allocate(
        self,
        claim: ResourceClaim,
        allocation: Mapping[str, Any] | None,
        consumer: Mapping[str, str],
    ) -> WriteOutcome:
        return await allocate(self._api, claim, allocation, consumer)

    async def release(self, namespace: str, name: str, consumer_uid: str, deallocate: bool) -> None:
        await release(self._api, namespace, name, consumer_uid, deallocate)

    async def create(self, claim: Mapping[str, Any]) -> ResourceClaim | None:
        return await create_claim(self._api, claim)

    async def discard(self, namespace: str, name: str) -> None:
        await discard_claim(self._api, namespace, name)

    async def write_pod_status(self, namespace: str, pod: str, status: Mapping[str, Any]) -> bool:
        return await write_extended_status(self._api, namespace, pod, status)
