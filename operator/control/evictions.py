"""Evicting a preemptor's victims (the scheduling worker's preemption, over the API).

The preemptor's ``nominatedNodeName`` is set, then its victims are evicted one by one,
in the engine's order: the victims a PodDisruptionBudget covers come first, so that if
the Eviction API refuses one (its budget changed since the engine read it), no other
victim has been evicted for nothing. Each eviction is told on both pods (Events).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import structlog

from vgpu_operator.control import reporting
from vgpu_operator.kube.eviction import EvictOutcome
from vgpu_operator.metrics import OperatorMetrics, PreemptionResult
from vgpu_operator.scheduling.cycle import cluster
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.wire import Pod

log = structlog.get_logger("vgpu_operator.worker")


class Preemptor(Protocol):
    """Preemption's writes: evictions and the preemptor's ``nominatedNodeName``."""

    async def evict(self, victim: PodKey, uid: str) -> EvictOutcome: ...
    async def nominate(self, pod: Pod, node: str | None) -> None: ...
    async def preempted(self, victim: PodKey, preemptor: Pod, node: str) -> None: ...
    async def preempting(self, pod: Pod, node: str, victims: int) -> None: ...


async def evict_victims(
    preemptor: Preemptor,
    metrics: OperatorMetrics,
    key: PodKey,
    pod: Pod,
    node: str,
    decision: cluster.Decision,
) -> str | None:
    """Nominate ``pod`` on ``node`` and evict the decision's victims; None when every
    victim is evicted (or already gone), else what to tell the pod: the eviction that was
    refused, or the API error that stopped it. The ending is counted in ``metrics``."""
    victims = decision.victims
    refused: list[PodKey] = []
    evicted = 0
    ending = PreemptionResult.EVICTED
    current: PodKey | None = None
    failure = ""
    try:
        await preemptor.nominate(pod, node)
        await preemptor.preempting(pod, node, len(victims))
        for victim in victims:
            current = victim
            outcome = await preemptor.evict(victim, decision.victim_uids.get(victim, ""))
            if outcome is EvictOutcome.REFUSED:
                refused.append(victim)
                break
            log.info("pod_preempted", pod=victim, by=key, node=node, outcome=outcome.value)
            if outcome is EvictOutcome.EVICTED:
                evicted += 1
                await preemptor.preempted(victim, pod, node)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("preemption_failed", pod=key, node=node, error=str(exc))
        metrics.api_error("evict")
        refused.append(PodKey(""))
        ending = PreemptionResult.ERROR
        failure = str(exc) or type(exc).__name__
    if refused and ending is PreemptionResult.EVICTED:
        ending = PreemptionResult.REFUSED
    metrics.preemption(ending, len(victims))
    if not refused:
        return None
    log.warning(
        "preemption_refused",
        pod=key,
        node=node,
        refused=[v for v in refused if v],
        evicted=evicted,
    )
    named = [v for v in refused if v]
    if named:
        return reporting.eviction_refused_message(node, named[0], evicted)
    return reporting.preemption_failed_message(node, current, evicted, failure)
