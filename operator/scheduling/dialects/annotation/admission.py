"""What the mutating webhook does to a pod (hami-semantics §3), as a pure function.

Defaults are filled in (count, exclusive cores, env, runtime class), GPU pods are routed
to this scheduler, and pods that can never be placed are refused: privileged GPU pods and
pods whose own demand exceeds their namespace quota. Pods bound by their creator or
named for another scheduler are passed unchanged: whether a GPU pod may do that is the
namespace's administrator's choice, which ``manifests/gpu-pod-policy.yaml`` reads.
Unlike HAMi, a pod that exceeds the quota only because of what others hold is admitted
and waits (it is rejected by Fit with ResourceQuotaNotFit until usage falls).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

from vgpu_operator import names
from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices.vendor import card_filter_problem
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.policies import policies
from vgpu_operator.scheduling.vendors import PodReads, Vendors
from vgpu_operator.wire import Pod


class QuotaLimits(Protocol):
    """The quota limits admission reads (``quota.QuotaLedger``, ``AdmissionView``)."""

    def limit(self, namespace: str, resource: str) -> int: ...


@dataclass(frozen=True, slots=True)
class AdmissionView:
    """What the webhook reads of the books, safe to read on another thread than the one
    that changes them (the webhook is served apart from the scheduling loop): the config
    and the vendors, immutable and replaced whole when the config changes, and each
    namespace's effective quota limits, each namespace's replaced whole when one of its
    quotas changes (``limits.get`` is one atomic read; nothing here is iterated)."""

    config: DeviceConfig
    vendors: Vendors
    #: namespace -> managed resource -> the effective limit (0 or absent: unlimited).
    limits: dict[str, Mapping[str, int]] = field(default_factory=dict)

    def limit(self, namespace: str, resource: str) -> int:
        return self.limits.get(namespace, {}).get(resource, 0)

    def admit(self, pod: Pod) -> AdmissionResult:
        return admit(pod, self.config, self.vendors, self)


@dataclass(frozen=True, slots=True)
class AdmissionResult:
    """What the mutating webhook answers: the mutated pod, or a denial message."""

    allowed: bool
    pod: Pod
    message: str = ""
    handled: bool = False  # the pod asks for a device this operator schedules
    #: Admitted, but the user should know (the API server passes these to kubectl).
    warnings: tuple[str, ...] = ()
    #: The admitted pod's containers as read (init containers', then app containers'),
    #: each vendor's request read once: the Job is built from these (``placement``).
    reads: PodReads | None = None


#: The longest refusal: it quotes values anyone may write (a 200 kB annotation), and goes
#: back to the API server, into the pod's condition and Event, and into the log.
MESSAGE_LIMIT = 1000


def bounded(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """``message`` cut to ``limit`` characters in its middle, saying how much was cut: a
    refusal quotes the value first and says why after it, so the end must stay."""
    if len(message) <= limit:
        return message
    head = limit // 2
    cut = len(message) - limit
    return f"{message[:head]}… ({cut} more characters) …{message[len(message) - (limit - head) :]}"


def admit(pod: Pod, config: DeviceConfig, vendors: Vendors, quota: QuotaLimits) -> AdmissionResult:
    """What the webhook answers for ``pod`` (see the module docstring); a refusal's
    message is bounded (``MESSAGE_LIMIT``)."""
    result = _admit(pod, config, vendors, quota)
    if len(result.message) > MESSAGE_LIMIT:
        return replace(result, message=bounded(result.message))
    return result


def _admit(pod: Pod, config: DeviceConfig, vendors: Vendors, quota: QuotaLimits) -> AdmissionResult:
    # A working copy the vendors' admission defaults write into (plain JSON); the same
    # object is the admitted pod.
    mutated: dict[str, Any] = copy.deepcopy(dict(pod))
    admitted = cast(Pod, mutated)
    spec = mutated.setdefault("spec", {})
    containers = spec.get("containers") or []
    if not containers:
        return AdmissionResult(False, admitted, "pod has no containers", handled=True)
    ours = config.scheduler.scheduler_name
    named = spec.get("schedulerName")
    if named and named not in (ours, names.DEFAULT_SCHEDULER):
        # Another scheduler's pod. A GPU pod may name one only where an administrator
        # allows it (manifests/gpu-pod-policy.yaml reads the namespace's labels, which
        # this operator does not); the books and the device plugin give it nothing.
        return AdmissionResult(True, admitted)
    if spec.get("nodeName"):
        # Bound by its creator, so nothing to route: refused by gpu-pod-policy.yaml unless
        # an administrator allows it for the namespace, and given nothing by the books or
        # the device plugin either way (they serve only pods this scheduler bound).
        return AdmissionResult(True, admitted)
    wants: set[str] = set()
    for container in [*(spec.get("initContainers") or []), *containers]:
        for spec_ in vendors.specs():
            try:
                if vendors.mutate(spec_.common_word, container, mutated):
                    wants.add(spec_.common_word)
            except ValueError as exc:
                return AdmissionResult(False, admitted, str(exc), handled=True)
    reads: PodReads = (
        tuple(vendors.read(c) for c in spec.get("initContainers") or []),
        tuple(vendors.read(c) for c in containers),
    )
    if not wants:
        return AdmissionResult(True, admitted, reads=reads)
    for read in (*reads[0], *reads[1]):
        for word in sorted(wants):
            unreadable = read.problems.get(word)
            if unreadable is not None:
                return AdmissionResult(False, admitted, str(unreadable), handled=True)
    annotations = (mutated.get("metadata") or {}).get("annotations") or {}
    problem = annotation_problem(annotations) or next(
        (p for w in sorted(wants) if (p := card_filter_problem(vendors.spec(w), annotations))),
        None,
    )
    if problem is not None:
        return AdmissionResult(False, admitted, problem, handled=True)
    for container in [*(spec.get("initContainers") or []), *containers]:
        if (container.get("securityContext") or {}).get("privileged"):
            name = container.get("name", "")
            return AdmissionResult(False, admitted, f"container {name} is privileged", handled=True)
    spec["schedulerName"] = ours
    refusal = _over_quota(admitted, reads, vendors, quota)
    if refusal:
        return AdmissionResult(False, admitted, refusal, handled=True, reads=reads)
    warnings = tuple(
        warning
        for read in (*reads[0], *reads[1])
        for word in sorted(wants)
        if (warning := read.warnings.get(word)) is not None
    )
    return AdmissionResult(True, admitted, handled=True, warnings=warnings, reads=reads)


def annotation_problem(annotations: Mapping[str, str]) -> str | None:
    """Why a scheduling annotation the engine cannot read must be refused (it would wait
    forever), naming the accepted form; None when every one is readable.

    Policy names are not refused: like HAMi, the engine reads an unknown GPU policy as
    ``spread`` and an unknown node policy as none given.
    """
    weights = annotations.get(names.DEVICE_SCORING_WEIGHTS)
    if weights is not None:
        try:
            policies.parse_scoring_weights(str(weights))
        except CodecError as exc:
            return f"annotation {names.DEVICE_SCORING_WEIGHTS}={weights!r}: {exc.message}"
    return None


def _over_quota(pod: Pod, reads: PodReads, vendors: Vendors, quota: QuotaLimits) -> str:
    """A refusal when the pod's own demand exceeds a limit, whatever else is running.

    Cores are counted as requested, not capped at 100 per card, as HAMi's webhook does.
    """
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    inits = [read.requests for read in reads[0]]
    apps = [read.requests for read in reads[1]]
    for word, memory_name in vendors.memory_resources().items():
        core_name = vendors.core_resources()[word]
        app_memory = sum(r[word].memory_mib * r[word].count for r in apps if word in r)
        app_cores = sum(r[word].cores * r[word].count for r in apps if word in r)
        init_memory = max(
            (r[word].memory_mib * r[word].count for r in inits if word in r), default=0
        )
        init_cores = max((r[word].cores * r[word].count for r in inits if word in r), default=0)
        memory, cores = max(app_memory, init_memory), max(app_cores, init_cores)
        factor = vendors.memory_factors()[word]
        memory_limit = quota.limit(namespace, memory_name) * (factor if factor > 1 else 1)
        if memory_limit and memory > memory_limit:
            return (
                f"exceeding resource quota: {memory_name} {memory} requested, "
                f"limit {memory_limit} in namespace {namespace}"
            )
        core_limit = quota.limit(namespace, core_name)
        if core_limit and cores > core_limit:
            return (
                f"exceeding resource quota: {core_name} {cores} requested, "
                f"limit {core_limit} in namespace {namespace}"
            )
    return ""
