"""HAMi-style pods on the DRA path: a container's ``nvidia.com/gpu`` request and the pod's
card annotations, turned into a ResourceClaimTemplate the pod names.

Where an administrator has put a namespace on the DRA path (the device config's
``dra.claimNamespaces``), the webhook converts each GPU container of an admitted pod:

- ``nvidia.com/gpu: N`` -> one request of N devices of class ``gpu.vgpu-operator.io``;
- ``nvidia.com/gpumem`` (MiB) -> ``capacity.requests.memory``; none -> the slice's
  default (``defaultMemory``, or the whole card); ``gpumem-percentage: 100`` -> the same;
- ``nvidia.com/gpucores`` -> ``capacity.requests.cores`` (a count-only request asks 100,
  as HAMi's webhook makes it exclusive);
- ``nvidia.com/use-gputype`` / ``nouse-gputype`` -> a CEL selector on the ``type``
  attribute (an item contained, case-insensitive, as HAMi compares);
- ``nvidia.com/use-gpuuuid`` / ``nouse-gpuuuid`` -> a CEL selector on ``uuid`` (exact);
- ``nvidia.com/numa-bind: "true"`` -> a ``matchAttribute`` constraint on
  ``resource.kubernetes.io/numaNode`` (several cards of one request on one NUMA node);

and removes the extended resources from the container, which names the claim instead.
What cannot be said in a claim is refused with a sentence (``Unmappable``): a
``gpumem-percentage`` below 100 (a share of a card whose size is not known until the card
is chosen), ``vgpu-mode`` other than ``hami-core`` (the DRA path offers HAMi-core cards
only), a vendor other than NVIDIA.

A template, not a claim: the pod has no uid at admission, so a claim could not be owned
by it; kube-controller-manager makes each pod its claim from the template, owned by the
pod and deleted with it. The template's name is a digest of its spec, so identical
requests share one template, and one that exists with other content is refused rather
than used. "Other content" is judged semantically (``same_template``): the API server
returns the template with defaults filled in (``allocationMode: ExactCount``) and
quantities in canonical form (``8192Mi`` reads back as ``8Gi``), which is the same request.

Each template carries the label ``MANAGED_BY`` and the annotation ``DIGEST_ANNOTATION`` (the
whole digest its name was cut from): the template collector (``control/template_collector``)
deletes only templates that say they are ours, and only once no pod names them.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from vgpu_operator.devices import dra, model, vendor
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.vendors import Vendors
from vgpu_operator.wire import (
    Container,
    DeviceClaim,
    ExactDeviceRequest,
    Pod,
    ResourceClaimTemplate,
)

#: The prefix of the templates the webhook makes (and the entries it adds to a pod).
TEMPLATE_PREFIX: Final = "vgpu-"
ENTRY_PREFIX: Final = "vgpu-gpu-"
#: The label every webhook-made template carries (and the collector lists by).
MANAGED_BY: Final = ("app.kubernetes.io/managed-by", "vgpu-operator")
#: The whole digest of the template's spec; its name carries the first 16 characters.
DIGEST_ANNOTATION: Final = "vgpu-operator.io/template-digest"


class Unmappable(Exception):
    """The request cannot be expressed as a claim; the message says what to change."""


@dataclass(frozen=True, slots=True)
class Conversion:
    pod: dict[str, Any]
    templates: tuple[dict[str, Any], ...]


def _quoted(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def selectors(spec: vendor.VendorSpec, annotations: Mapping[str, str]) -> list[str]:
    """The CEL selectors that say what the pod's card annotations say."""
    card_filter = vendor.CardFilter.read(spec, annotations)
    attributes = f'device.attributes["{dra.DRIVER}"]'
    out = []
    if card_filter.use_types:
        wanted = _quoted([t.lower() for t in card_filter.use_types])
        out.append(f"{wanted}.exists(t, {attributes}.type.lowerAscii().contains(t))")
    if card_filter.nouse_types:
        unwanted = _quoted([t.lower() for t in card_filter.nouse_types])
        out.append(f"!{unwanted}.exists(t, {attributes}.type.lowerAscii().contains(t))")
    if card_filter.use_uuids:
        out.append(f"{attributes}.uuid in {_quoted(list(card_filter.use_uuids))}")
    if card_filter.nouse_uuids:
        out.append(f"!({attributes}.uuid in {_quoted(list(card_filter.nouse_uuids))})")
    return out


def exact_request(
    container: Container,
    ask: model.ContainerRequest,
    spec: vendor.VendorSpec,
    annotations: Mapping[str, str],
    resources: vendor.ResourceNames,
) -> ExactDeviceRequest:
    name = container.get("name", "")
    card_filter = vendor.CardFilter.read(spec, annotations)
    if card_filter.mode is not None and card_filter.mode.strip() != model.MODE_HAMI_CORE:
        raise Unmappable(
            f"container {name!r}: {spec.mode_annotation}={card_filter.mode!r} cannot be "
            "served on the DRA path, which offers HAMi-core cards only; remove the annotation "
            "or run the pod in a namespace on the device-plugin path"
        )
    capacity: dict[str, str] = {}
    if ask.uses_percentage:
        if ask.memory_percent != 100:
            raise Unmappable(
                f"container {name!r}: {resources.memory_percentage}={ask.memory_percent} "
                "cannot be expressed as a DRA claim (the card's size is not known before it "
                f"is chosen); give {resources.memory} in MiB instead"
            )
    elif ask.memory_mib > 0:
        capacity[dra.MEMORY] = f"{ask.memory_mib}Mi"
    if ask.cores > 0:
        capacity[dra.CORES] = str(min(ask.cores, dra.FULL_CORES))
    exactly: ExactDeviceRequest = {"deviceClassName": dra.SHARED_CLASS, "count": ask.count}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    cel = selectors(spec, annotations)
    if cel:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in cel]
    return exactly


def template_for(exactly: ExactDeviceRequest, numa_bind: bool, namespace: str) -> dict[str, Any]:
    devices: DeviceClaim = {"requests": [{"name": "gpu", "exactly": exactly.copy()}]}
    if numa_bind and int(exactly.get("count", 1)) > 1:
        devices["constraints"] = [{"requests": ["gpu"], "matchAttribute": dra.ATTR_NUMA_NODE}]
    spec = {"spec": {"devices": devices}}
    digest = spec_digest(spec)
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": f"{TEMPLATE_PREFIX}{digest[:16]}",
            "namespace": namespace,
            "labels": {MANAGED_BY[0]: MANAGED_BY[1]},
            "annotations": {DIGEST_ANNOTATION: digest},
        },
        "spec": spec,
    }


def spec_digest(spec: Mapping[str, object]) -> str:
    """The digest of a template spec as the webhook writes it."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def made_by_webhook(template: ResourceClaimTemplate) -> bool:
    """Whether a template says it is one the webhook made: our label, our name prefix, and
    a digest annotation whose head is its name (a template anyone else made lacks them)."""
    meta = template.get("metadata") or {}
    name = str(meta.get("name") or "")
    labels = meta.get("labels") or {}
    digest = str((meta.get("annotations") or {}).get(DIGEST_ANNOTATION) or "")
    return (
        labels.get(MANAGED_BY[0]) == MANAGED_BY[1]
        and name.startswith(TEMPLATE_PREFIX)
        and len(digest) == 64
        and name == f"{TEMPLATE_PREFIX}{digest[:16]}"
    )


def convert(pod: Pod, vendors: Vendors) -> Conversion | None:
    """The admitted pod with its GPU containers naming claims, and the templates to make;
    None when no container asks for a GPU. Raises Unmappable."""
    out: dict[str, Any] = copy.deepcopy(dict(pod))  # the working copy, written below
    meta = out.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    spec = vendors.spec(dra.VENDOR)
    numa_bind = vendor.CardFilter.read(spec, annotations).numa_bind
    pod_spec = out.setdefault("spec", {})
    templates: dict[str, dict[str, Any]] = {}
    entries = list(pod_spec.get("resourceClaims") or ())
    converted = False
    groups = (("initContainers", "init-"), ("containers", ""))
    for field, prefix in groups:
        for position, container in enumerate(pod_spec.get(field) or ()):
            asked = vendors.requests(container)
            if not asked:
                continue
            others = sorted(set(asked) - {dra.VENDOR})
            if others:
                raise Unmappable(
                    f"container {container.get('name', '')!r} asks {', '.join(others)} devices, "
                    "which the DRA path does not offer"
                )
            names = vendor.resource_names(vendors.config_for(dra.VENDOR))
            exactly = exact_request(container, asked[dra.VENDOR], spec, annotations, names)
            template = template_for(exactly, numa_bind, namespace)
            templates[template["metadata"]["name"]] = template
            entry = f"{ENTRY_PREFIX}{prefix}{position}"
            entries.append(
                {"name": entry, "resourceClaimTemplateName": template["metadata"]["name"]}
            )
            _name_claim(container, entry, vendors)
            converted = True
    if not converted:
        return None
    pod_spec["resourceClaims"] = entries
    return Conversion(out, tuple(templates.values()))


def _name_claim(container: dict[str, Any], entry: str, vendors: Vendors) -> None:
    """The container names its claim; the extended resources it asked go."""
    names = vendor.resource_names(vendors.config_for(dra.VENDOR))
    gone = {names.count, names.memory, names.memory_percentage, names.cores} - {""}
    resources = container.setdefault("resources", {})
    for key in ("limits", "requests"):
        values = resources.get(key)
        if isinstance(values, dict):
            for name in gone:
                values.pop(name, None)
            if not values:
                resources.pop(key)
    resources["claims"] = [*(resources.get("claims") or ()), {"name": entry}]


def same_template(existing: ResourceClaimTemplate, wanted: ResourceClaimTemplate) -> bool:
    """Whether a template found under the wanted name asks what we would write: equal
    once the API server's defaults and quantity spellings are read away (``canonical``)."""
    return bool(canonical(existing.get("spec")) == canonical(wanted.get("spec")))


def canonical(spec: Any) -> Any:
    """A template spec as a request, not as spelled: what the API server fills in by
    default is dropped (``allocationMode: ExactCount``, ``count: 1`` with it, empty claim
    metadata) and capacity quantities become numbers (``8192Mi`` == ``8Gi``). Anything
    else stays, so any other difference (a selector, a constraint, a toleration, admin
    access, a config) still tells the templates apart."""
    if not isinstance(spec, Mapping):
        return spec
    out = copy.deepcopy(dict(spec))
    if out.get("metadata") is None or _empty_metadata(out.get("metadata")):
        out.pop("metadata", None)
    inner = out.get("spec")
    if isinstance(inner, dict):
        devices = inner.get("devices")
        if isinstance(devices, dict):
            for request in devices.get("requests") or ():
                if isinstance(request, dict):
                    _canonical_exactly(request.get("exactly"))
                    for sub in request.get("firstAvailable") or ():
                        _canonical_exactly(sub)
    return out


def _empty_metadata(meta: Any) -> bool:
    # The API server serialises an empty ObjectMeta as {"creationTimestamp": null} in
    # some versions.
    return isinstance(meta, Mapping) and all(v in (None, {}, [], "") for v in meta.values())


def _canonical_exactly(exactly: Any) -> None:
    if not isinstance(exactly, dict):
        return
    if exactly.get("allocationMode", "ExactCount") == "ExactCount":
        exactly.pop("allocationMode", None)
        if exactly.get("count", 1) == 1:
            exactly.pop("count", None)
    requests = (exactly.get("capacity") or {}).get("requests")
    if isinstance(requests, dict):
        for name, value in list(requests.items()):
            # An unreadable quantity is left as written: compared as text.
            with contextlib.suppress(CodecError):
                requests[name] = str(parse_quantity(value))
