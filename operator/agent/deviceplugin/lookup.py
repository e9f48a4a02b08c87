"""Which pod an Allocate is for: exact, never guessed (issue 13).

kubelet tells Allocate only device IDs. The pod is the one bound to this node whose
allocation still has an entry to hand out, with as many devices as kubelet asks for; when
more than one pod could be it, the call is refused rather than served with another pod's
devices (the operator's per-node allocation gate prevents that: it binds the next GPU pod
to a node only once the previous one is settled), and every pod that could be it is
marked failed (``AmbiguousAllocation``): a pod whose devices cannot be told apart from
another's must not start on either's.

Only pods a trusted scheduler placed are served (issue 22): the pod names one
(``scheduler.trustedSchedulerNames`` and this scheduler) and its ``hami.io/vgpu-node`` is
this node. A pod its creator bound to the node, or another scheduler placed, gets
nothing here whatever its annotations say (the books do not count it either).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Final

from vgpu_operator import names
from vgpu_operator.agent.deviceplugin.allocation import AllocationError
from vgpu_operator.devices import codec, model, nvidia
from vgpu_operator.errors import CodecError
from vgpu_operator.wire import Pod, meta_of

_WAITING_PHASES = (codec.BindPhase.ALLOCATING.value, codec.BindPhase.SUCCESS.value)

#: The schedulers served when the device config names no other.
DEFAULT_SCHEDULERS: Final = frozenset({names.SCHEDULER_NAME})


class AmbiguousAllocation(AllocationError):
    """Several pods could be the one an Allocate is for: each is to be marked failed."""

    def __init__(self, message: str, pods: Sequence[Pod]) -> None:
        super().__init__(message)
        self.pods = tuple(pods)


def next_entry(pod: Pod) -> model.ContainerDevices | None:
    """The pod's next allocation entry still to hand out, or None."""
    annotations = meta_of(pod).get("annotations") or {}
    raw = annotations.get(nvidia.TO_ALLOCATE_ANNOTATION)
    if not raw:
        return None
    try:
        entries = codec.decode_pod_single_device(raw, nvidia.TO_ALLOCATE_ANNOTATION)
    except CodecError:
        return None
    return next((entry for entry in entries if entry), None)


def placed_by_trusted(pod: Pod, node: str, schedulers: Collection[str]) -> bool:
    """A trusted scheduler placed the pod on this node (not its creator, nor another)."""
    spec = pod.get("spec") or {}
    annotations = meta_of(pod).get("annotations") or {}
    scheduler = spec.get("schedulerName") or "default-scheduler"
    return scheduler in schedulers and annotations.get(names.ASSIGNED_NODE) == node


def awaiting(pod: Pod, node: str, schedulers: Collection[str] = DEFAULT_SCHEDULERS) -> bool:
    """Bound here by a trusted scheduler, not finished, and the scheduler's allocation not
    yet all handed out."""
    meta = meta_of(pod)
    annotations = meta.get("annotations") or {}
    if (pod.get("spec") or {}).get("nodeName") != node or meta.get("deletionTimestamp"):
        return False
    if (pod.get("status") or {}).get("phase") in names.TERMINAL_PHASES:
        return False
    if annotations.get(names.BIND_PHASE) not in _WAITING_PHASES:
        return False
    if not placed_by_trusted(pod, node, schedulers):
        return False
    return next_entry(pod) is not None


def _key(pod: Pod) -> str:
    meta = meta_of(pod)
    return f"{meta.get('namespace')}/{meta.get('name')}"


def pod_for(
    pods: Iterable[Pod],
    node: str,
    count: int,
    schedulers: Collection[str] = DEFAULT_SCHEDULERS,
) -> Pod:
    """The one pod this Allocate of ``count`` devices belongs to; raises
    ``AllocationError`` when none does, ``AmbiguousAllocation`` when several do."""
    listed = list(pods)
    candidates = [p for p in listed if awaiting(p, node, schedulers)]
    sized = [p for p in candidates if len(next_entry(p) or ()) == count]
    if not sized:
        untrusted = sum(
            1
            for p in listed
            if next_entry(p) is not None
            and (p.get("spec") or {}).get("nodeName") == node
            and not placed_by_trusted(p, node, schedulers)
        )
        ignored = (
            f"; {untrusted} pod(s) with an allocation here were not placed by "
            f"{', '.join(sorted(schedulers))} and are not served"
            if untrusted
            else ""
        )
        raise AllocationError(
            f"no pod bound to {node} awaits {count} device(s) "
            f"({len(candidates)} pod(s) await other counts{ignored})"
        )
    if len(sized) > 1:
        # Even identical next entries are refused: the pods' later entries, container
        # names and cache directories differ, so serving the wrong one would hand the
        # next container the other pod's remainder (the property tests find such cases).
        keys = sorted(_key(p) for p in sized)
        raise AmbiguousAllocation(
            f"{len(sized)} pods bound to {node} await {count} device(s) "
            f"({', '.join(keys)}); refusing to guess which one this is, and marking each "
            "failed (the operator's allocation gate keeps one pod per node waiting; is it "
            "off?)",
            sized,
        )
    return sized[0]
