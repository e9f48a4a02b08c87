"""Pods of other schedulers the operator keeps an eye on (part of ``StateFeed``).

- Unbound pods of another scheduler that use ResourceClaims: another allocator is at
  work on the slices while one waits (``claim_binding`` holds its writes meanwhile).
- Pods the default scheduler (or their creator) bound that ask for a domain-qualified
  resource: GPU pods among them missed the webhook and fail at Allocate (the not-routed
  reporter says so), each handed out once while it lives.
"""

from __future__ import annotations

import time

from vgpu_operator import names
from vgpu_operator.control import pod_facts
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.wire import Pod


class ForeignPods:
    """See the module docstring."""

    def __init__(self) -> None:
        #: Unbound pods of other schedulers that use ResourceClaims, and when one was last
        #: seen waiting (on the monotonic clock).
        self._claim_pods: set[PodKey] = set()
        self._claim_pods_seen: float | None = None
        #: Bound pods of the default scheduler that ask for a domain-qualified resource,
        #: not yet handed out (``take_bound_by_default``), and the uid of each live pod
        #: handed already: each is looked at once.
        self._bound_by_default: dict[PodKey, Pod] = {}
        self._bound_by_default_taken: dict[PodKey, str] = {}

    def note(self, key: PodKey, pod: Pod, scheduler_name: str) -> None:
        """A pod's new copy; ``scheduler_name`` is this operator's."""
        if (
            pod_facts.is_waiting_for_scheduler(pod)
            and (pod.get("spec") or {}).get("resourceClaims")
            and pod_facts.scheduler_name_of(pod) != scheduler_name
        ):
            self._claim_pods.add(key)
            self._claim_pods_seen = time.monotonic()
        elif key in self._claim_pods:
            self._claim_pods.discard(key)
            self._claim_pods_seen = time.monotonic()
        if (
            pod_facts.node_name_of(pod) is not None
            and pod_facts.scheduler_name_of(pod) == names.DEFAULT_SCHEDULER
            and not pod_facts.is_terminal(pod)
            and not pod_facts.is_deleting(pod)
            and self._bound_by_default_taken.get(key) != pod_facts.uid_of(pod)
            and pod_facts.extended_resources_of(pod)
        ):
            self._bound_by_default[key] = pod
        else:
            self._bound_by_default.pop(key, None)

    def forget(self, key: PodKey) -> None:
        self._claim_pods.discard(key)
        self._bound_by_default.pop(key, None)
        self._bound_by_default_taken.pop(key, None)

    def take_bound_by_default(self) -> list[Pod]:
        """The bound-by-default pods not handed out yet (see the module docstring)."""
        taken = list(self._bound_by_default.values())
        for key, pod in self._bound_by_default.items():
            self._bound_by_default_taken[key] = pod_facts.uid_of(pod)
        self._bound_by_default.clear()
        return taken

    def other_allocator_seen(self) -> float | None:
        """When a pod of another scheduler with claims was last waiting (now, while one
        is), on the monotonic clock; None if never."""
        if self._claim_pods:
            return time.monotonic()
        return self._claim_pods_seen
