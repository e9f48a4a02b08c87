"""The mutating webhook's answers (``handlers/app.py`` hands them to Kopf).

``PodAdmission`` answers once the operator is assembled: the engine's admission
(``scheduling.dialects.annotation.admission``), the routing of pods that name ResourceClaims
(``claim_routing``) and the conversion of a DRA namespace's pods to claims
(``claim_admission``). Before that, ``NotReady`` lets every pod through unchanged
(the webhook's failurePolicy is Ignore: a pod waiting on us would wait for nothing).

The webhook is served on the serving loop, apart from the scheduling loop (issue 44:
no decision, however slow, may delay an answer): it reads the engine only through
``AdmissionView``, which the scheduling thread replaces, never changes, and it makes its
API requests with a client of its own loop.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import structlog

from vgpu_operator.kube import claims
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.metrics import OperatorMetrics, WebhookResult
from vgpu_operator.scheduling.cycle import cluster
from vgpu_operator.scheduling.dialects.annotation import admission as scheduling_admission
from vgpu_operator.scheduling.dialects.claims import claim_admission, claim_routing
from vgpu_operator.scheduling.vendors import Vendors
from vgpu_operator.wire import Pod, meta_of

log = structlog.get_logger("vgpu_operator.operator")

#: How long the webhook reads a pod's claims at most (manifests/webhook.yaml's
#: timeoutSeconds is 3: the answer must come before it).
CLAIM_READ_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class AdmissionAnswer:
    """The webhook's answer for one pod: refused with ``message``, or allowed, with the
    pod as it should be created (``pod``; None: unchanged) and warnings for its creator."""

    allowed: bool = True
    message: str = ""
    pod: Mapping[str, Any] | None = None
    warnings: tuple[str, ...] = ()


class NotReady:
    """The webhook before the operator is assembled: every pod passes unchanged."""

    def __init__(self, metrics: OperatorMetrics) -> None:
        self.metrics = metrics

    async def admit_pod(self, pod: Pod, *, dry_run: bool = False) -> AdmissionAnswer:
        self.metrics.webhook_answered(WebhookResult.NOT_READY, 0.0)
        return AdmissionAnswer()


class PodAdmission:
    """See the module docstring."""

    def __init__(
        self,
        view: Callable[[], scheduling_admission.AdmissionView],
        api: ApiClient,
        metrics: OperatorMetrics,
    ) -> None:
        self.view = view
        self.api = api
        self.metrics = metrics

    async def admit_pod(self, pod: Pod, *, dry_run: bool = False) -> AdmissionAnswer:
        """What the mutating webhook answers for ``pod`` (counted in the metrics); in a
        dry run (the AdmissionReview's ``dryRun``) nothing is written, the answer is the
        same."""
        started = time.monotonic()

        def answered(result: WebhookResult) -> None:
            self.metrics.webhook_answered(result, time.monotonic() - started)

        view = self.view()  # one view for the whole answer
        result = view.admit(pod)
        if not result.handled:
            routed = await self._route_by_claims(pod, view.config.scheduler.scheduler_name)
            if routed.action is claim_routing.Action.REFUSE:
                log.info("pod_denied", pod=cluster.pod_key(pod), reason=routed.message)
                answered(WebhookResult.DENIED)
                return AdmissionAnswer(allowed=False, message=routed.message)
            if routed.action is claim_routing.Action.ROUTE:
                answered(WebhookResult.MUTATED)
                routed_pod = copy.deepcopy(pod)
                routed_pod.setdefault("spec", {})["schedulerName"] = (
                    view.config.scheduler.scheduler_name
                )
                return AdmissionAnswer(pod=routed_pod)
            answered(WebhookResult.PASSED)
            return AdmissionAnswer()
        if not result.allowed:
            # An ordinary answer, not a fault: info (Kopf's own error line is filtered out).
            log.info("pod_denied", pod=cluster.pod_key(pod), reason=result.message)
            answered(WebhookResult.DENIED)
            return AdmissionAnswer(allowed=False, message=result.message)
        mutated = result.pod
        namespace = str(meta_of(mutated).get("namespace") or "default")
        if view.config.dra.converts(namespace):
            converted = await self._to_claims(mutated, view.vendors, dry_run=dry_run)
            if isinstance(converted, str):
                log.info("pod_denied", pod=cluster.pod_key(pod), reason=converted)
                answered(WebhookResult.DENIED)
                return AdmissionAnswer(allowed=False, message=converted)
            mutated = converted
        answered(WebhookResult.MUTATED)
        # kubectl prints the warnings to whoever created the pod (e.g. gpucores above 100).
        return AdmissionAnswer(pod=mutated, warnings=tuple(result.warnings))

    async def _route_by_claims(self, pod: Pod, scheduler: str) -> claim_routing.Routing:
        """Where a pod naming ResourceClaims goes (``claim_routing``): the claims and
        templates it names are read (bounded in count and in time: the API server waits
        ``timeoutSeconds`` for the answer)."""
        refs = claim_routing.claim_refs(pod)
        if not refs or claim_routing.settled_without_reading(pod, scheduler):
            return claim_routing.Routing(claim_routing.Action.PASS)
        too_many = claim_routing.too_many(refs)
        if too_many is not None:
            return claim_routing.Routing(claim_routing.Action.REFUSE, too_many)
        namespace = str(meta_of(pod).get("namespace") or "default")
        try:
            async with asyncio.timeout(CLAIM_READ_TIMEOUT_S):
                found = await claims.read_pod_claims(self.api, namespace, refs)
        except Exception as exc:
            self.metrics.api_error("webhook_claims")
            return claim_routing.Routing(
                claim_routing.Action.REFUSE,
                f"the pod's ResourceClaims could not be read to route it ({exc!r}); try again",
            )
        return claim_routing.route(pod, found, scheduler)

    async def _to_claims(self, pod: Pod, vendors: Vendors, *, dry_run: bool = False) -> Pod | str:
        """A pod of a namespace on the DRA path: its GPU containers name claims made from
        templates (``claim_admission``), which are created first (in a dry run only
        validated: ``dryRun=All``). Returns the refusal's message when the request cannot
        be a claim or a template cannot be made."""
        try:
            converted = claim_admission.convert(pod, vendors)
        except claim_admission.Unmappable as exc:
            return str(exc)
        if converted is None:
            return pod
        for template in converted.templates:
            try:
                problem = await claims.ensure_template(self.api, template, dry_run=dry_run)
            except Exception as exc:
                problem = f"the pod's ResourceClaimTemplate could not be made: {exc}"
            if problem is not None:
                return problem
        return cast(Pod, converted.pod)  # the pod as given, its GPU asks made claims
