"""GPU pods left to the default scheduler: told how to fix them, once each.

A pod created while the webhook was down keeps ``default-scheduler``: unbound, it would
wait forever; bound by kube-scheduler (or by its creator), it fails at Allocate, as no
share was booked for it. A pod's scheduler name is immutable, so it cannot be adopted:
its owner is told (a condition, an Event, a log line).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

from vgpu_operator import names
from vgpu_operator.control import feed, pod_facts, reporting
from vgpu_operator.metrics import OperatorMetrics
from vgpu_operator.scheduling.cycle import cluster
from vgpu_operator.scheduling.dialects.claims import claim_routing
from vgpu_operator.scheduling.dialects.claims import claims as claim_reads
from vgpu_operator.wire import Pod, meta_of

log = structlog.get_logger("vgpu_operator.operator")


@dataclass(slots=True)
class NotRoutedReporter:
    """See the module docstring; ``report`` is called by the leader's housekeeping."""

    state: cluster.ClusterState
    state_feed: feed.StateFeed
    reporter: reporting.KubeReporter
    metrics: OperatorMetrics
    #: uids of GPU pods already reported as left to the default scheduler.
    reported: set[str] = field(default_factory=set)

    async def report(self) -> None:
        """GPU pods created while the webhook was down keep ``default-scheduler``: unbound,
        they would wait forever; bound by kube-scheduler (or by their creator), they fail
        at Allocate, as no share was booked for them. Tell their owners (once per pod) how
        to fix them.

        They cannot be adopted: a pod's scheduler name is immutable.
        """
        waiting = self.state_feed.waiting_for(names.DEFAULT_SCHEDULER)
        present = {str(meta_of(pod).get("uid") or "") for pod in waiting}
        # Each bound pod is handed out once (the feed); one reported while it waited (in
        # the set still: it is pruned below) or before a restart (its condition) is not
        # reported again.
        bound = [
            pod
            for pod in self.state_feed.take_bound_by_default()
            if pod_facts.condition_of(pod, reporting.CONDITION_NOT_ROUTED) is None
        ]
        for pod in [*waiting, *bound]:
            uid = str(meta_of(pod).get("uid") or "")
            if uid in self.reported:
                continue
            classes = self._our_claim_classes(pod)
            if not classes and not self._asks_for_gpu(pod):
                continue  # not a GPU pod: the default scheduler's business
            self.reported.add(uid)
            if classes:
                message = reporting.not_routed_claims_message(
                    classes, self.state_feed.scheduler_name
                )
            else:
                wanted = pod_facts.extended_resources_of(pod)
                message = reporting.not_routed_message(pod, wanted, self.state_feed.scheduler_name)
            log.warning(
                "gpu_pod_not_routed",
                pod=cluster.pod_key(pod),
                node=pod_facts.node_name_of(pod),
            )
            self.metrics.not_routed()
            try:
                await self.reporter.not_routed(pod, message)
            except Exception as exc:
                log.warning("event_write_failed", pod=cluster.pod_key(pod), error=str(exc))
                self.metrics.api_error("report")
        self.reported &= present

    def _our_claim_classes(self, pod: Pod) -> set[str]:
        """Our DeviceClasses the pod's claims ask for (the claims as the books hold them):
        such a pod left to kube-scheduler waits forever, since only the operator may
        allocate them (manifests/claim-policy.yaml)."""
        keys = claim_reads.pod_claim_keys(pod)
        objects = self.state.books.claims.objects
        found: set[str] = set()
        for key in keys if isinstance(keys, list) else ():
            obj = objects.get(key)
            if obj is not None:
                found |= claim_routing.asks_our_classes(obj, claim_routing.CLAIM)
        return found

    def _asks_for_gpu(self, pod: Pod) -> bool:
        """Whether the webhook would have taken the pod as a GPU pod, had it seen it
        (a bound pod is one the webhook passes unchanged: asked as if unbound)."""
        spec = (pod.get("spec") or {}).copy()
        spec.pop("nodeName", None)
        spec.pop("schedulerName", None)
        unbound = pod.copy()
        unbound["spec"] = spec
        return self.state.admit(unbound).handled
