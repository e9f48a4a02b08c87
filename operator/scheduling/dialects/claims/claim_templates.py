"""A pod's template claims as the claim controller would make them (pure).

kube-controller-manager's resourceclaim controller makes, for each ``resourceClaims``
entry of a pod that names a ResourceClaimTemplate, a claim with the template's spec (and
its labels and annotations), owned by the pod, and names it in the pod's
``status.resourceClaimStatuses``. Until it has, the engine cannot read the pod's claims
(``claims.pod_claim_keys``: it waits for them). A what-if that must judge such a pod now
(autoscaling: which node would hold it) takes the claims as the controller would make
them: ``with_template_claims`` gives the pod as the controller leaves it and the claims,
under names no real object can have (``#`` is not allowed in an object's name), so that
they never stand for, nor are mistaken for, a claim of the cluster.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Final

from vgpu_operator.devices import dra
from vgpu_operator.wire import Pod, PodClaimStatus, ResourceClaim, ResourceClaimTemplate

#: Joins the pod's name and the entry's in a what-if claim's name (never a real name).
MARK: Final = "#"


def pending_templates(pod: Pod) -> dict[str, str]:
    """The pod's ``resourceClaims`` entries that name a template whose claim is not named
    in its status yet: entry name -> template name."""
    made = {
        str(s.get("name"))
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        if isinstance(s, Mapping)
    }
    out: dict[str, str] = {}
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if not isinstance(entry, Mapping):
            continue
        template = entry.get("resourceClaimTemplateName")
        name = entry.get("name")
        if isinstance(template, str) and isinstance(name, str) and name not in made:
            out[name] = template
    return out


def claim_from_template(
    pod: Pod, entry: str, template: ResourceClaimTemplate, name: str
) -> ResourceClaim:
    """The claim ``name`` the controller makes for the pod's entry ``entry`` from
    ``template``: the template's spec, labels and annotations, in the pod's namespace."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    tmeta = (template.get("spec") or {}).get("metadata") or {}
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {
            "namespace": namespace,
            "name": name,
            "uid": f"{meta.get('uid') or ''}{MARK}{entry}",
            "resourceVersion": "0",
            "labels": dict(tmeta.get("labels") or {}),
            "annotations": dict(tmeta.get("annotations") or {}),
        },
        "spec": copy.deepcopy((template.get("spec") or {}).get("spec") or {}),
    }


def with_template_claims(
    pod: Pod, templates: Mapping[str, ResourceClaimTemplate]
) -> tuple[Pod, list[ResourceClaim]] | str:
    """The pod as the claim controller leaves it (each pending template entry's claim
    named in its status) and those claims, as a what-if reads them; ``templates`` by
    ``namespace/name``. A sentence when a template the pod names is not there."""
    pending = pending_templates(pod)
    out = copy.deepcopy(pod)
    if not pending:
        return out, []
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    claims: list[ResourceClaim] = []
    statuses: list[PodClaimStatus] = list(
        (out.get("status") or {}).get("resourceClaimStatuses") or ()
    )
    for entry, template_name in pending.items():
        template = templates.get(f"{namespace}/{template_name}")
        if template is None:
            return f"ResourceClaimTemplate {namespace}/{template_name} not found"
        name = f"{meta.get('name', '')}{MARK}{entry}"
        claims.append(claim_from_template(pod, entry, template, name))
        statuses.append({"name": entry, "resourceClaimName": name})
    out.setdefault("status", {})["resourceClaimStatuses"] = statuses
    return out, claims
