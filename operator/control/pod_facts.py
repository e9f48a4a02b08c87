"""Facts about Pod, Node and other objects that decide what the operator does with them.

Pure functions over the plain dicts the API returns; no engine decisions here, only
"is this pod ours and waiting", "does it hold devices", "did anything that matters to a
decision change" (fingerprints, so that routine status updates wake nobody).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final, TypeVar, cast

from vgpu_operator import names
from vgpu_operator.scheduling import node_annotations
from vgpu_operator.timestamps import unix_time
from vgpu_operator.wire import KubeObject, ObjectMeta, Pod, PodCondition, PodSpec, PodStatus

#: The Node annotations whose change wakes waiting pods: declared, with what reads each,
#: in ``scheduling.node_annotations`` (the engine sees no other key).
_NODE_ANNOTATIONS_THAT_MATTER: Final = node_annotations.waking_keys()


# The API server validates the shapes below; the guards keep a hand-made object (a test's,
# a fuzzer's) from raising where the server's could not.
def _meta(obj: KubeObject) -> ObjectMeta:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _spec(pod: Pod) -> PodSpec:
    spec = pod.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _status(pod: Pod) -> PodStatus:
    st = pod.get("status")
    return st if isinstance(st, Mapping) else {}


def _any_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The spec of a kind without a declared shape here (Node, ResourceQuota)."""
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def uid_of(obj: KubeObject) -> str:
    return str(_meta(obj).get("uid") or "")


def annotations_of(obj: KubeObject) -> Mapping[str, str]:
    annotations = _meta(obj).get("annotations")
    return annotations if isinstance(annotations, Mapping) else {}


_Obj = TypeVar("_Obj", bound=Mapping[str, Any])


def slim(obj: _Obj) -> _Obj:
    """A shallow copy without ``metadata.managedFields`` (large, and never needed)."""
    out = dict(obj)
    meta = out.get("metadata")
    if isinstance(meta, Mapping) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return cast(_Obj, out)


def node_name_of(pod: Pod) -> str | None:
    """The node the pod is bound to (``spec.nodeName``), if any."""
    node = _spec(pod).get("nodeName")
    return node if isinstance(node, str) and node else None


def is_terminal(pod: Pod) -> bool:
    return _status(pod).get("phase") in names.TERMINAL_PHASES


def is_deleting(obj: KubeObject) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def holds_devices(pod: Pod) -> bool:
    """Whether the pod was placed by a HAMi-style scheduler (it books devices)."""
    return names.ASSIGNED_NODE in annotations_of(pod)


def awaits_devices(pod: Pod) -> bool:
    """Bound, alive, and its device plugin has not answered yet (``bind-phase``
    ``allocating``): it holds its node's allocation gate."""
    return (
        node_name_of(pod) is not None
        and annotations_of(pod).get(names.BIND_PHASE) == "allocating"
        and not is_terminal(pod)
        and not is_deleting(pod)
    )


def is_waiting_for_scheduler(pod: Pod) -> bool:
    """Unbound, alive, and not held back by scheduling gates: some scheduler must place it."""
    if node_name_of(pod) is not None or is_deleting(pod) or is_terminal(pod):
        return False
    phase = _status(pod).get("phase")
    if phase not in (None, "", "Pending"):
        return False
    return not _spec(pod).get("schedulingGates")


def awaits_its_claims(pod: Pod) -> bool:
    """Whether a claim the pod's templates make is not named in its status yet (by
    kube-controller-manager): nothing can be decided for it until then (kube-scheduler's
    PreEnqueue holds such a pod back the same way)."""
    made = {
        s.get("name")
        for s in _status(pod).get("resourceClaimStatuses") or ()
        if isinstance(s, Mapping)
    }
    return any(
        isinstance(entry, Mapping)
        and entry.get("resourceClaimTemplateName")
        and entry.get("name") not in made
        for entry in _spec(pod).get("resourceClaims") or ()
    )


def created_at(pod: Pod) -> float | None:
    """``metadata.creationTimestamp`` as a Unix time, if present and readable."""
    return unix_time(_meta(pod).get("creationTimestamp"))


def scheduler_name_of(pod: Pod) -> str:
    return str(_spec(pod).get("schedulerName") or names.DEFAULT_SCHEDULER)


def extended_resources_of(pod: Pod) -> set[str]:
    """Domain-qualified resource names (``nvidia.com/gpu``...) any container asks for."""
    spec = _spec(pod)
    found: set[str] = set()
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = (container.get("resources") or {}) if isinstance(container, Mapping) else {}
        found.update(k for k in resources.get("limits") or {} if "/" in k)
        found.update(k for k in resources.get("requests") or {} if "/" in k)
    return found


def condition_of(pod: Pod, kind: str) -> PodCondition | None:
    """The pod's status condition of type ``kind``, if it has one."""
    for condition in _status(pod).get("conditions") or ():
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            return condition
    return None


def priority_of(pod: Pod) -> int:
    value = _spec(pod).get("priority")
    return value if isinstance(value, int) else 0


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def pod_fingerprint(pod: Pod) -> str:
    """Changes when what a decision reads of the pod changes (spec, labels, annotations,
    the claims made for it); not when only the rest of its status does (for example the
    condition the operator writes)."""
    meta = _meta(pod)
    claims = _status(pod).get("resourceClaimStatuses")
    return _digest([_spec(pod), meta.get("labels"), meta.get("annotations"), claims])


def node_fingerprint(node: KubeObject) -> str:
    """Changes when a node's schedulable facts change, not with its routine heartbeats."""
    meta = _meta(node)
    annotations = annotations_of(node)
    st = node.get("status")
    st = st if isinstance(st, Mapping) else {}
    conditions = st.get("conditions")
    ready = None
    if isinstance(conditions, list):
        for cond in conditions:
            if isinstance(cond, Mapping) and cond.get("type") == "Ready":
                ready = cond.get("status")
    return _digest(
        [
            meta.get("labels"),
            {k: annotations.get(k) for k in _NODE_ANNOTATIONS_THAT_MATTER},
            _any_spec(node).get("unschedulable"),
            _any_spec(node).get("taints"),
            st.get("allocatable"),
            ready,
        ]
    )


def quota_fingerprint(quota: Mapping[str, Any]) -> str:
    """Changes when a ResourceQuota's limits change (its status churns with usage)."""
    return _digest(_any_spec(quota))


def digest(data: Any) -> str:
    """A stable short hash of JSON-like data (used for inventory contents)."""
    return _digest(data)
