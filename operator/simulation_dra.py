"""The DRA part of a ``simulate`` scenario (docs/scenario-format.md, "DRA").

A scenario may carry ResourceSlices (``resourceSlices``, or a node's ``draCards``, from
which the slice is built with the driver's own ``devices.dra.slice_wire``),
ResourceClaims (``resourceClaims``; allocated ones hold their shares whoever allocated
them), ResourceClaimTemplates (``resourceClaimTemplates``: a pod naming one gets its own
claim, ``<pod>-<entry>``, as kube-controller-manager would make it), DeviceClasses
(``deviceClasses``; the project's two by default) and DeviceTaintRules
(``deviceTaintRules``: their taints added to the slices' devices they select, as the
operator's feed adds them). After a DRA decision the claims are
written as the operator writes them (allocation and ``reservedFor``), so later pods see
them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, cast

from vgpu_operator.devices import dra
from vgpu_operator.errors import ScenarioError
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision
from vgpu_operator.scheduling.dialects.claims import taint_rules
from vgpu_operator.wire import DeviceClass, DeviceTaintRule, Pod, PodClaimStatus, ResourceClaim

LISTS = (
    "resourceSlices",
    "resourceClaims",
    "resourceClaimTemplates",
    "deviceClasses",
    "deviceTaintRules",
)


def card_shape(raw: Mapping[str, Any], where: str) -> dra.CardShape:
    """A node's ``draCards`` entry as the driver's card shape."""
    for key, kind in (("uuid", str), ("index", int), ("memoryMiB", int)):
        if not isinstance(raw.get(key), kind):
            raise ScenarioError(f"{where}.{key}", f"must be a {kind.__name__}")
    product = str(raw.get("product") or dra.VENDOR)
    unhealthy = raw.get("unhealthy")
    return dra.CardShape(
        uuid=str(raw["uuid"]),
        index=int(raw["index"]),
        product=product,
        hami_type=str(raw.get("type") or f"{dra.VENDOR}-{product}"),
        memory_mib=int(raw["memoryMiB"]),
        cores=int(raw.get("cores", dra.FULL_CORES)),
        split_count=int(raw.get("splitCount", 10)),
        mode="hami-core",
        healthy=not unhealthy,
        health_reason=unhealthy if isinstance(unhealthy, str) else None,
        lost=bool(unhealthy) and bool(raw.get("lost")),
        numa_node=raw.get("numaNode"),
        nvlink_island=raw.get("nvlinkIsland"),
        default_memory_mib=int(raw.get("defaultMemoryMiB", 0)),
        default_cores=int(raw.get("defaultCores", 0)),
    )


def load(scenario: Mapping[str, Any], state: ClusterState) -> None:
    """Feed the scenario's DRA objects to the engine."""
    for key in LISTS:
        if key in scenario and not isinstance(scenario[key], list):
            raise ScenarioError(key, "must be a list")
    rules = []
    for position, raw in enumerate(scenario.get("deviceTaintRules") or []):
        rule = (
            taint_rules.read_rule(cast(DeviceTaintRule, raw)) if isinstance(raw, Mapping) else None
        )
        if rule is None:
            raise ScenarioError(
                f"deviceTaintRules[{position}]",
                "needs spec.deviceSelector and spec.taint with a key and an effect "
                "(NoSchedule, NoExecute or None)",
            )
        rules.append(rule)
    classes = scenario.get("deviceClasses") or dra.device_classes()
    for device_class in classes:
        state.set_device_class(cast(DeviceClass, device_class))  # a scenario's, or ours
    for position, node in enumerate(scenario.get("nodes") or []):
        cards = node.get("draCards")
        if cards is None:
            continue
        where = f"nodes[{position}].draCards"
        if not isinstance(cards, list):
            raise ScenarioError(where, "must be a list")
        shapes = [card_shape(c, f"{where}[{i}]") for i, c in enumerate(cards)]
        slice_ = dra.slice_wire(node["metadata"]["name"], shapes, 1, None)
        state.set_slice(taint_rules.tainted_slice(slice_, rules))
    for item in scenario.get("resourceSlices") or []:
        state.set_slice(taint_rules.tainted_slice(item, rules))
    for claim in scenario.get("resourceClaims") or []:
        state.set_claim(_with_defaults(claim))


def _with_defaults(claim: Mapping[str, Any]) -> ResourceClaim:
    """A scenario's claim as the API server hands one over (namespace, uid, version)."""
    out: dict[str, Any] = copy.deepcopy(dict(claim))
    meta = out.setdefault("metadata", {})
    meta.setdefault("namespace", "default")
    meta.setdefault("uid", f"uid-{meta['namespace']}-{meta.get('name', '')}")
    meta.setdefault("resourceVersion", "1")
    return cast(ResourceClaim, out)


def with_template_claims(scenario: Mapping[str, Any], pod: Pod, state: ClusterState) -> Pod:
    """The pod as the claim controller leaves it: each template entry's claim made (and
    given to the engine), and named in ``status.resourceClaimStatuses``."""
    spec = pod.get("spec") or {}
    entries = [e for e in spec.get("resourceClaims") or () if e.get("resourceClaimTemplateName")]
    if not entries:
        return pod
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    templates = {
        ((t.get("metadata") or {}).get("namespace") or "default", t["metadata"]["name"]): t
        for t in scenario.get("resourceClaimTemplates") or []
    }
    statuses: list[PodClaimStatus] = []
    for entry in entries:
        template = templates.get((namespace, entry["resourceClaimTemplateName"]))
        if template is None:
            raise ScenarioError(
                "resourceClaimTemplates",
                f"pod {namespace}/{meta.get('name')} names template "
                f"{entry['resourceClaimTemplateName']!r}, which the scenario does not have",
            )
        name = f"{meta.get('name')}-{entry['name']}"
        state.set_claim(
            _with_defaults(
                {
                    "apiVersion": dra.API_VERSION,
                    "kind": "ResourceClaim",
                    "metadata": {"namespace": namespace, "name": name},
                    "spec": copy.deepcopy((template.get("spec") or {}).get("spec") or {}),
                }
            )
        )
        statuses.append({"name": str(entry["name"]), "resourceClaimName": name})
    out = copy.deepcopy(pod)
    meta_out = out.setdefault("metadata", {})
    meta_out.setdefault("uid", f"uid-{namespace}-{meta.get('name')}")
    out.setdefault("status", {})["resourceClaimStatuses"] = statuses
    return out


def write_claims(decision: Decision, state: ClusterState) -> None:
    """What the operator writes after a DRA decision: each claim's allocation and the
    pod in its ``reservedFor``."""
    for write in decision.claim_writes:
        # A pod's special claim (extended resources backed by DRA) is made first.
        made = None if write.create is None else _with_defaults(write.create)
        current = made or state.claim_object(write.key)
        if current is None:
            continue
        updated: dict[str, Any] = copy.deepcopy(dict(current))
        status = updated.setdefault("status", {})
        if write.allocation is not None:
            status["allocation"] = copy.deepcopy(dict(write.allocation))
        status["reservedFor"] = [*(status.get("reservedFor") or []), dict(write.consumer)]
        state.set_claim(cast(ResourceClaim, updated))


def render_claims(decision: Decision) -> list[dict[str, Any]]:
    """The claims a decision allocates or reserves, as ``simulate`` prints them."""
    out = []
    for write in decision.claim_writes:
        entry: dict[str, Any] = {"claim": write.key}
        if write.allocation is not None:
            entry["results"] = [
                {k: r[k] for k in ("request", "pool", "device", "consumedCapacity") if k in r}
                for r in write.allocation["devices"]["results"]
            ]
        else:
            entry["reserved"] = True
        out.append(entry)
    return out


def check_claims(key: str, expected: Mapping[str, Any], got: Mapping[str, Any]) -> list[str]:
    """``expect.claims``: per claim, the devices its allocation names (a list, in any
    order), or ``{"devices": [...], "consumedCapacity": [...], "requests": [...]}`` to
    compare what each result consumes and the request (or ``<request>/<subrequest>``) it
    names too (results in order)."""
    problems = []
    made = {c["claim"]: c.get("results") or [] for c in got.get("claims", [])}
    for claim, want in (expected.get("claims") or {}).items():
        results = made.get(claim)
        devices = None if results is None else sorted(r["device"] for r in results)
        wanted = want.get("devices", []) if isinstance(want, Mapping) else want
        if sorted(wanted) != devices:
            problems.append(f"{key}: claim {claim} devices={devices} (expected {sorted(wanted)})")
        if isinstance(want, Mapping) and "consumedCapacity" in want:
            have = [r.get("consumedCapacity") for r in results or []]
            if have != want["consumedCapacity"]:
                problems.append(
                    f"{key}: claim {claim} consumedCapacity={have} "
                    f"(expected {want['consumedCapacity']})"
                )
        if isinstance(want, Mapping) and "requests" in want:
            named = [r.get("request") for r in results or []]
            if named != want["requests"]:
                problems.append(
                    f"{key}: claim {claim} requests={named} (expected {want['requests']})"
                )
    return problems


def release_victims(decision: Decision, state: ClusterState) -> bool:
    """What kube-controller-manager's claim controller does once a preemption's victims
    are gone: each takes them out of its claims' ``reservedFor`` and deallocates a claim
    reserved for nobody. Returns whether any claim was released (the preemptor is then
    decided again, as the operator decides it once the victims' claims are gone)."""
    uids = {uid for uid in decision.victim_uids.values() if uid}
    released = False
    for key in sorted(state.claims_reserved_for(uids)):
        current = state.claim_object(key)
        if current is None:
            continue
        updated: dict[str, Any] = copy.deepcopy(dict(current))
        status = updated.setdefault("status", {})
        status["reservedFor"] = [
            r for r in status.get("reservedFor") or [] if str(r.get("uid")) not in uids
        ]
        if not status["reservedFor"]:
            status.pop("allocation", None)
            released = True
        state.set_claim(cast(ResourceClaim, updated))
    return released
