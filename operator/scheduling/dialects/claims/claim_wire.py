"""A claim's ``status.allocation`` as the engine writes it (``resource.k8s.io/v1``).

The same shape kube-scheduler writes, so that kubelet, the node's driver and every other
allocator read it alike: one result per chosen device (request, driver, pool, device; for
a device shared through consumable capacity, ``consumedCapacity`` of every capacity, as
upstream rounds it, and a ``shareID``), the configs of the classes and of the claim, and
a node selector naming the node.

The share ID is derived from the claim's uid and the result's place (a UUID, version 5):
unique per claim and device, and the same when the same decision is written again (a
retried write does not mint a new one). ``consumer`` is the ``reservedFor`` entry of a pod;
``ClaimWrite`` what the runtime writes on one claim before a pod's Binding.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

from vgpu_operator.devices import dra
from vgpu_operator.scheduling.dialects.claims import claim_fit, claims
from vgpu_operator.wire import (
    AllocationResult,
    DeviceAllocation,
    DeviceAllocationConfiguration,
    DeviceRequestAllocationResult,
    NodeSelector,
    Pod,
    PodExtendedResourceClaimStatus,
    ResourceClaim,
)


@dataclass(frozen=True, slots=True)
class ClaimWrite:
    """What to write on one claim before the pod's Binding."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    #: ``status.allocation`` to write; None when the claim is allocated already.
    allocation: AllocationResult | None
    consumer: Mapping[str, str]
    #: The claim to create first: the pod's special claim (``extended_claims``).
    create: ResourceClaim | None = None
    #: ``status.extendedResourceClaimStatus`` to write on the pod once the claim is.
    pod_status: PodExtendedResourceClaimStatus | None = None
    #: A group claim another member's decision is allocating: nothing to write, the
    #: Binding waits until that allocation is (``group_claims``).
    awaits_allocation: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


#: The namespace of the share IDs' UUIDs.
_SHARE_NAMESPACE: Final = uuid.uuid5(uuid.NAMESPACE_DNS, f"shares.{dra.DRIVER}")
_UNITS: Final = (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def quantity_text(value: Fraction, name: str) -> str:
    """A quantity as the API server keeps it: binary suffixes for memory, plain integers,
    milli-units for fractions."""
    if value.denominator != 1:
        milli = value * 1000
        if milli.denominator == 1:
            return f"{milli.numerator}m"
        return str(float(value))
    whole = value.numerator
    if name == dra.MEMORY and whole:
        for suffix, size in _UNITS:
            if whole % size == 0:
                return f"{whole // size}{suffix}"
    return str(whole)


def node_selector(node: str) -> NodeSelector:
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }


def share_id(claim_uid: str, position: int, request: str, device: str) -> str:
    return str(uuid.uuid5(_SHARE_NAMESPACE, f"{claim_uid}/{position}/{request}/{device}"))


def allocation(
    claim: claims.Claim,
    node: str,
    picks: Sequence[claim_fit.DevicePick],
    classes: Mapping[str, claims.DeviceClass],
) -> AllocationResult:
    # The requests as chosen: for a firstAvailable request, the alternative the picks
    # name (``<request>/<subrequest>``, as the results and the class configs name it).
    named = {r.name: r for choice in claim.choices for r in choice}
    named.update((r.name, r) for r in claim.requests if r.name not in named)
    requests = [named[n] for n in dict.fromkeys(p.request for p in picks) if n in named]
    results: list[DeviceRequestAllocationResult] = []
    for position, pick in enumerate(picks):
        result: DeviceRequestAllocationResult = {
            "request": pick.request,
            "driver": pick.device.driver,
            "pool": pick.device.pool,
            "device": pick.device.name,
        }
        capacity = pick.consumption.capacity
        if pick.admin:
            result["adminAccess"] = True  # upstream: no consumedCapacity, no shareID
        elif capacity is not None:
            result["consumedCapacity"] = {k: quantity_text(v, k) for k, v in capacity.items()}
            result["shareID"] = share_id(claim.uid, position, pick.request, pick.device.name)
        request = named[pick.request]
        if pick.device.taints and request.tolerations:
            result["tolerations"] = [t.copy() for t in request.tolerations]
        results.append(result)
    config: list[DeviceAllocationConfiguration] = []
    for class_name in dict.fromkeys(r.device_class for r in requests):
        device_class = classes.get(class_name)
        if device_class is None:
            continue
        names = [r.name for r in requests if r.device_class == class_name]
        for entry in device_class.config:
            if "opaque" in entry:
                config.append({"source": "FromClass", "requests": names, "opaque": entry["opaque"]})
    for entry in claim.config:
        if "opaque" in entry:
            item: DeviceAllocationConfiguration = {"source": "FromClaim", "opaque": entry["opaque"]}
            if entry.get("requests"):
                item["requests"] = list(entry["requests"])
            config.append(item)
    devices: DeviceAllocation = {"results": results}
    if config:
        devices["config"] = config
    return {"devices": devices, "nodeSelector": node_selector(node)}


def consumer(pod: Pod) -> dict[str, str]:
    """The pod as a ``reservedFor`` entry."""
    meta = pod.get("metadata") or {}
    return {"resource": "pods", "name": str(meta.get("name", "")), "uid": str(meta.get("uid", ""))}
