"""Extended resources backed by DRA (KEP-5004): a plain ``nvidia.com/gpu: 1`` pod served
by this driver's devices, through the pod's special claim.

A DeviceClass of ours that names ``spec.extendedResourceName`` (or, implicitly, any of our
classes as ``deviceclass.resource.kubernetes.io/<class>``) maps that resource to the
class. For a pod of this scheduler asking such a resource the engine does what
kube-scheduler does for its own pods:

- it makes the pod's special claim: owned by the pod (controller), annotated
  ``resource.kubernetes.io/extended-resource-claim: "true"``, one request per container
  and mapped resource, named ``container-<i>-request-<j>`` (``i`` the container's index in
  init containers then containers, ``j`` the resource's index in the container's sorted
  requests), ``count`` the quantity asked;
- HAMi's ``gpumem``/``gpucores`` beside the NVIDIA count resource become the request's
  capacity, as the webhook's conversion maps them (``claim_admission.exact_request``), and
  what a claim cannot say (``gpumem-percentage`` below 100, a mode other than HAMi-core)
  is refused with its sentence;
- the claim is allocated like any claim of the pod (the engine's scores), created on the
  API server before its allocation is written, and the pod's
  ``status.extendedResourceClaimStatus`` names it and maps each request to its container.

Where upstream names the claim by ``generateName`` (a random suffix), the engine derives
the five-character suffix from the pod's uid: the name is known at the decision, so the
books hold the decision's shares under the claim's own key until the claim comes back
allocated, and a decision retried for the same pod names the same claim. A special claim
of the pod that exists already (a retry whose clean-up did not land) is read as one of the
pod's claims and not made again.

Pure: the classes and claims are the books'; the writes are ``control/claim_binding``'s.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from vgpu_operator.devices import dra, vendor
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.dialects.claims import claim_admission
from vgpu_operator.scheduling.vendors import Vendors
from vgpu_operator.wire import (
    Container,
    ContainerExtendedResourceRequest,
    DeviceClaim,
    DeviceConstraint,
    DeviceRequest,
    ExactDeviceRequest,
    Pod,
    PodExtendedResourceClaimStatus,
    PodResourceClaim,
    ResourceClaim,
)

#: The annotation that marks a pod's special claim (upstream's ExtendedResourceClaimAnnotation).
ANNOTATION: Final = "resource.kubernetes.io/extended-resource-claim"
#: Every DeviceClass maps ``<prefix><class name>`` implicitly.
IMPLICIT_PREFIX: Final = "deviceclass.resource.kubernetes.io/"
#: The entry the special claim takes among the pod's claims while the decision reads it.
ENTRY: Final = "<extended-resources>"
#: A generated name's base is cut to this length, then five characters follow (as the
#: API server's ``generateName``: 63 - 5).
_BASE_LENGTH: Final = 58
_SUFFIX_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"


class ExtendedRefusal(Exception):
    """The pod's extended resources cannot be served through a claim; the message says
    what to change."""


@dataclass(frozen=True, slots=True)
class Special:
    """The pod's special claim as the decision reads it."""

    #: The claim object (as it will be created, or as it exists).
    claim: ResourceClaim
    #: True when the claim is still to be created.
    new: bool
    #: ``status.extendedResourceClaimStatus`` to write on the pod.
    status: PodExtendedResourceClaimStatus

    @property
    def name(self) -> str:
        return str((self.claim.get("metadata") or {}).get("name", ""))


def mapping(classes: Iterable[tuple[str, str | None]]) -> dict[str, str]:
    """Resource name -> class, from (class name, ``extendedResourceName``) of our classes.
    An explicit name wins over an implicit one; two classes naming one resource: the
    first by name (upstream, too, takes one of them)."""
    out: dict[str, str] = {}
    explicit: dict[str, str] = {}
    for name, extended in sorted(classes, key=lambda c: c[0]):
        out.setdefault(IMPLICIT_PREFIX + name, name)
        if extended:
            explicit.setdefault(extended, name)
    out.update(explicit)
    return out


def _effective_requests(container: Container) -> dict[str, str]:
    """The container's requests as the API server defaults them (limits fill in)."""
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    if not isinstance(limits, Mapping) or not isinstance(requests, Mapping):
        return {}
    return {**limits, **requests}


def _containers(pod: Pod) -> list[Container]:
    spec = pod.get("spec") or {}
    every = [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]
    return [c for c in every if _is_object(c)]


def _is_object(value: object) -> bool:
    """A container that is a JSON object (a careless scenario may hold anything)."""
    return isinstance(value, Mapping)


def _count(raw: Any, where: str) -> int:
    try:
        value = parse_quantity(raw, where)
    except CodecError as exc:
        raise ExtendedRefusal(str(exc)) from None
    if value.denominator != 1 or value < 0:
        raise ExtendedRefusal(f"{where}: {raw!r} is not a whole number of devices")
    return int(value)


def asks(pod: Pod, resources: Mapping[str, str]) -> bool:
    """Whether a container of the pod asks a resource ``resources`` maps (non-zero)."""
    if not resources:
        return False
    for container in _containers(pod):
        for name, raw in _effective_requests(container).items():
            if name in resources and str(raw).strip() not in ("0", ""):
                return True
    return False


def claim_name(pod: Pod) -> str:
    """``<pod>-extended-resources-<suffix>``, the suffix derived from the pod's uid."""
    meta = pod.get("metadata") or {}
    base = f"{meta.get('name', '')}-extended-resources-"[:_BASE_LENGTH]
    digest = hashlib.sha256(str(meta.get("uid", "")).encode()).digest()
    suffix = "".join(_SUFFIX_ALPHABET[b % len(_SUFFIX_ALPHABET)] for b in digest[:5])
    return base + suffix


def existing(pod: Pod, claims: Mapping[str, ResourceClaim]) -> str | None:
    """The key of the pod's special claim in ``claims``, if one exists: of the name this
    module gives it (the engine makes every special claim of its pods, so one lookup, not
    a scan of every claim), annotated, and the pod its controller."""
    meta = pod.get("metadata") or {}
    key = f"{meta.get('namespace') or 'default'}/{claim_name(pod)}"
    obj = claims.get(key)
    if obj is None:
        return None
    claim_meta = obj.get("metadata") or {}
    if (claim_meta.get("annotations") or {}).get(ANNOTATION) != "true":
        return None
    for owner in claim_meta.get("ownerReferences") or ():
        if owner.get("controller") and owner.get("uid") == meta.get("uid"):
            return key
    return None


def requests_of(
    pod: Pod, resources: Mapping[str, str], vendors: Vendors
) -> tuple[list[DeviceRequest], list[ContainerExtendedResourceRequest]]:
    """The special claim's requests and the pod's request mappings (sorted by name, as
    upstream). Raises ExtendedRefusal."""
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    spec = vendors.spec(dra.VENDOR)
    names = vendor.resource_names(vendors.config_for(dra.VENDOR))
    hami_extras = {names.memory, names.memory_percentage, names.cores} - {""}
    requests: list[DeviceRequest] = []
    mappings: list[ContainerExtendedResourceRequest] = []
    for i, container in enumerate(_containers(pod)):
        effective = _effective_requests(container)
        keys = sorted(effective)
        cname = str(container.get("name", ""))
        for resource in keys:
            class_name = resources.get(resource)
            if class_name is None:
                continue
            count = _count(effective[resource], f"container {cname!r}: {resource}")
            if count == 0:
                continue
            request_name = f"container-{i}-request-{keys.index(resource)}"
            if resource == names.count:
                exactly = _hami_request(container, spec, annotations, names, vendors)
            else:
                exactly = {"count": count}
            exactly = {**exactly, "deviceClassName": class_name, "count": count}
            exactly.setdefault("allocationMode", "ExactCount")
            requests.append({"name": request_name, "exactly": exactly})
            mappings.append(
                {"containerName": cname, "resourceName": resource, "requestName": request_name}
            )
        if any(k in hami_extras for k in keys) and names.count not in resources:
            raise ExtendedRefusal(
                f"container {cname!r} asks {', '.join(sorted(hami_extras & set(keys)))} "
                f"but no DeviceClass of this driver maps {names.count}; ask the class's "
                "extended resource only, or name a ResourceClaim"
            )
    requests.sort(key=lambda r: str(r.get("name", "")))
    return requests, mappings


def _hami_request(
    container: Container,
    spec: vendor.VendorSpec,
    annotations: Mapping[str, str],
    names: vendor.ResourceNames,
    vendors: Vendors,
) -> ExactDeviceRequest:
    """The count resource with HAMi's memory and cores, as the webhook maps them."""
    try:
        asked = vendors.requests(_with_limits(container))
    except CodecError as exc:
        raise ExtendedRefusal(str(exc)) from None
    ask = asked.get(dra.VENDOR)
    if ask is None:
        return {}
    try:
        return claim_admission.exact_request(container, ask, spec, annotations, names)
    except claim_admission.Unmappable as exc:
        raise ExtendedRefusal(str(exc)) from None


def _with_limits(container: Container) -> Container:
    """The container with its effective requests as limits (HAMi reads limits)."""
    out = copy.deepcopy(container)
    out.setdefault("resources", {})["limits"] = _effective_requests(container)
    return out


def special(
    pod: Pod,
    resources: Mapping[str, str],
    claims: Mapping[str, ResourceClaim],
    vendors: Vendors,
) -> Special:
    """The pod's special claim: the one that exists, else the one to create. Raises
    ExtendedRefusal."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    requests, mappings = requests_of(pod, resources, vendors)
    devices = _devices(pod, requests, vendors)
    found = existing(pod, claims)
    if found is not None:
        there = claims[found]
        name = str((there.get("metadata") or {}).get("name", ""))
        wanted = {"spec": {"devices": devices}}
        if claim_admission.canonical({"spec": there.get("spec")}) != claim_admission.canonical(
            wanted
        ):
            # Written by someone else under the pod's name, or for a class mapping that
            # changed since: upstream, too, refuses such a claim and deletes it.
            raise ExtendedRefusal(
                f"ResourceClaim {found}, the pod's special claim, asks other devices than "
                "the pod's extended resources; delete it and the pod is placed again"
            )
        return Special(there, False, _status(name, mappings))
    name = claim_name(pod)
    claim: ResourceClaim = {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            # Not the uid the API server gives it: the decision's share IDs derive from
            # this one (any stable UUID-like string serves).
            "uid": f"{meta.get('uid', '')}-extended-resources",
            "resourceVersion": "",
            "annotations": {ANNOTATION: "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": str(meta.get("name", "")),
                    "uid": str(meta.get("uid", "")),
                    "controller": True,
                    # Upstream sets blockOwnerDeletion too, which (with the API server's
                    # OwnerReferencesPermissionEnforcement) needs update on
                    # pods/finalizers: a pod write the operator's role does not hold.
                }
            ],
        },
        "spec": {"devices": devices},
    }
    return Special(claim, True, _status(name, mappings))


def _devices(pod: Pod, requests: list[DeviceRequest], vendors: Vendors) -> DeviceClaim:
    """The claim's ``spec.devices``: the requests, and as the webhook's conversion does,
    for ``nvidia.com/numa-bind: "true"`` a request's several cards on one NUMA node."""
    annotations: Mapping[str, str] = (pod.get("metadata") or {}).get("annotations") or {}
    devices: DeviceClaim = {"requests": requests}
    if vendor.CardFilter.read(vendors.spec(dra.VENDOR), annotations).numa_bind:
        constraints: list[DeviceConstraint] = [
            {"requests": [r.get("name", "")], "matchAttribute": dra.ATTR_NUMA_NODE}
            for r in requests
            if (exactly := r.get("exactly") or {}).get("count", 1) > 1
            and exactly.get("deviceClassName") in (dra.SHARED_CLASS, dra.EXCLUSIVE_CLASS)
        ]
        if constraints:
            devices["constraints"] = constraints
    return devices


def _status(
    name: str, mappings: list[ContainerExtendedResourceRequest]
) -> PodExtendedResourceClaimStatus:
    return {"resourceClaimName": name, "requestMappings": mappings}


def with_special(
    pod: Pod, claims: Mapping[str, ResourceClaim], found: Special
) -> tuple[Pod, dict[str, ResourceClaim]]:
    """The pod as the claims reader sees it (naming the special claim) and the claims
    with the special one among them."""
    spec = (pod.get("spec") or {}).copy()
    entry: PodResourceClaim = {"name": ENTRY, "resourceClaimName": found.name}
    spec["resourceClaims"] = [*(spec.get("resourceClaims") or ()), entry]
    out = pod.copy()
    out["spec"] = spec
    namespace = str((found.claim.get("metadata") or {}).get("namespace", ""))
    together = dict(claims)
    together[f"{namespace}/{found.name}"] = found.claim
    return out, together


def without_extended(pod: Pod, resources: Mapping[str, str], vendors: Vendors) -> Pod:
    """The pod without the resources its special claim serves (and HAMi's extras beside
    the NVIDIA count): what the Job (CPU, memory, node checks) is read from, so the
    annotation path's reading of ``nvidia.com/gpu`` does not count the cards twice."""
    names = vendor.resource_names(vendors.config_for(dra.VENDOR))
    gone = set(resources)
    if names.count in resources:
        gone |= {names.memory, names.memory_percentage, names.cores} - {""}
    out = copy.deepcopy(pod)
    spec = out.get("spec") or {}
    for container in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ())):
        res = container.get("resources") if isinstance(container, dict) else None
        if not isinstance(res, dict):
            continue
        for values in (res.get("limits"), res.get("requests")):
            if isinstance(values, dict):
                for name in gone:
                    values.pop(name, None)
    return out
