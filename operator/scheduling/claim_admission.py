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
than used.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from vgpu_operator.devices import dra, model, vendor
from vgpu_operator.scheduling.vendors import Vendors

_VENDOR: Final = "NVIDIA"
#: The prefix of the templates the webhook makes (and the entries it adds to a pod).
TEMPLATE_PREFIX: Final = "vgpu-"
ENTRY_PREFIX: Final = "vgpu-gpu-"


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


def _request(
    container: Mapping[str, Any],
    ask: model.ContainerRequest,
    spec: vendor.VendorSpec,
    annotations: Mapping[str, str],
) -> dict[str, Any]:
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
                f"container {name!r}: nvidia.com/gpumem-percentage={ask.memory_percent} cannot "
                "be expressed as a DRA claim (the card's size is not known before it is "
                "chosen); give nvidia.com/gpumem in MiB instead"
            )
    elif ask.memory_mib > 0:
        capacity[dra.MEMORY] = f"{ask.memory_mib}Mi"
    if ask.cores > 0:
        capacity[dra.CORES] = str(min(ask.cores, dra.FULL_CORES))
    exactly: dict[str, Any] = {"deviceClassName": dra.SHARED_CLASS, "count": ask.count}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    cel = selectors(spec, annotations)
    if cel:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in cel]
    return exactly


def template_for(exactly: Mapping[str, Any], numa_bind: bool, namespace: str) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": dict(exactly)}]}
    if numa_bind and int(exactly.get("count", 1)) > 1:
        devices["constraints"] = [{"requests": ["gpu"], "matchAttribute": dra.ATTR_NUMA_NODE}]
    spec = {"spec": {"devices": devices}}
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": f"{TEMPLATE_PREFIX}{digest}",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "vgpu-operator"},
        },
        "spec": spec,
    }


def convert(pod: Mapping[str, Any], vendors: Vendors) -> Conversion | None:
    """The admitted pod with its GPU containers naming claims, and the templates to make;
    None when no container asks for a GPU. Raises Unmappable."""
    out = copy.deepcopy(dict(pod))
    meta = out.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    spec = vendors.spec(_VENDOR)
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
            others = sorted(set(asked) - {_VENDOR})
            if others:
                raise Unmappable(
                    f"container {container.get('name', '')!r} asks {', '.join(others)} devices, "
                    "which the DRA path does not offer"
                )
            exactly = _request(container, asked[_VENDOR], spec, annotations)
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
    names = vendor.resource_names(vendors.config_for(_VENDOR))
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


def same_template(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a template found under the wanted name says what we would write."""
    return existing.get("spec") == wanted.get("spec")
