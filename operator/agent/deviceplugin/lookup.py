"""Which pod an Allocate is for: exact, never guessed (issue 13).

kubelet tells Allocate only device IDs. The pod is the one bound to this node whose
allocation still has an entry to hand out, with as many devices as kubelet asks for; when
more than one pod could be it, the call is refused rather than served with another pod's
devices (the operator's per-node allocation gate prevents that: it binds the next GPU pod
to a node only once the previous one is settled).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from vgpu_operator import names
from vgpu_operator.agent.deviceplugin.allocation import AllocationError
from vgpu_operator.devices import codec, model
from vgpu_operator.errors import CodecError

_WAITING_PHASES = (codec.BindPhase.ALLOCATING.value, codec.BindPhase.SUCCESS.value)


def next_entry(pod: Mapping[str, Any]) -> model.ContainerDevices | None:
    """The pod's next allocation entry still to hand out, or None."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(names.NVIDIA_DEVICES_TO_ALLOCATE)
    if not raw:
        return None
    try:
        entries = codec.decode_pod_single_device(raw, names.NVIDIA_DEVICES_TO_ALLOCATE)
    except CodecError:
        return None
    return next((entry for entry in entries if entry), None)


def awaiting(pod: Mapping[str, Any], node: str) -> bool:
    """Bound here, not finished, and the scheduler's allocation not yet all handed out."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if (pod.get("spec") or {}).get("nodeName") != node or meta.get("deletionTimestamp"):
        return False
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    if annotations.get(names.BIND_PHASE) not in _WAITING_PHASES:
        return False
    return next_entry(pod) is not None


def pod_for(pods: Iterable[Mapping[str, Any]], node: str, count: int) -> Mapping[str, Any]:
    """The one pod this Allocate of ``count`` devices belongs to; raises
    ``AllocationError`` when none does, or several do with different next entries."""
    candidates = [p for p in pods if awaiting(p, node)]
    sized = [p for p in candidates if len(next_entry(p) or ()) == count]
    if not sized:
        raise AllocationError(
            f"no pod bound to {node} awaits {count} device(s) "
            f"({len(candidates)} pod(s) await other counts)"
        )
    if len(sized) > 1:
        # Even identical next entries are refused: the pods' later entries, container
        # names and cache directories differ, so serving the wrong one would hand the
        # next container the other pod's remainder (the property tests find such cases).
        keys = sorted(
            f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}"
            for p in sized
        )
        raise AllocationError(
            f"{len(sized)} pods bound to {node} await {count} device(s) "
            f"({', '.join(keys)}); refusing to guess which one this is (the operator's "
            "allocation gate keeps one pod per node waiting; is it off?)"
        )
    return sized[0]
