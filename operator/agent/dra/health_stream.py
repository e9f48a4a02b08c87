"""kubelet's DRA health stream: each published card's health, as the agent reads it.

kubelet (``ResourceHealthStatus``, beta in 1.37) opens ``NodeWatchResources`` on a DRA
plugin that lists ``v1.DRAResourceHealth`` among its services at registration, and copies
what the stream says about the devices a pod's claims hold into the pod's
``status.containerStatuses[].allocatedResourcesStatus`` (``Healthy``/``Unhealthy``/
``Unknown``, with the message where ``ResourceHealthStatusMessage`` is on).

Every report is the whole pool: kubelet reads a device missing from a report, or not
reported again within its ``health_check_timeout_seconds``, as ``Unknown``. So a report
is sent when the stream opens, at once when a card's health changes (``changed``, called
with every status the agent writes), and every ``resend_s`` in between; the timeout given
is three resends, so one lost or late report does not turn a card Unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Final

import grpc
import structlog

from vgpu_operator.agent.dra import drahealth_pb2, drahealth_pb2_grpc
from vgpu_operator.devices import dra

log = structlog.get_logger("vgpu_operator.dra")

#: The service name kubelet looks for in the registration's supported versions.
HEALTH_SERVICE: Final = "v1.DRAResourceHealth"
#: kubelet truncates longer messages.
MAX_MESSAGE: Final = 1024

#: The cards this node publishes now (device name -> shape).
CardSource = Callable[[], Mapping[str, dra.CardShape]]


def device_health(
    pool: str, card: dra.CardShape, now_s: int, timeout_s: int
) -> drahealth_pb2.DeviceHealth:
    """One card's entry: Healthy, or Unhealthy with the agent's reason (a lost card says
    so first: its work cannot go on)."""
    if card.healthy:
        health, message = drahealth_pb2.HEALTHY, ""
    else:
        reason = card.health_reason or "unhealthy"
        health = drahealth_pb2.UNHEALTHY
        message = f"card lost: {reason}" if card.lost else reason
    return drahealth_pb2.DeviceHealth(
        device=drahealth_pb2.DeviceIdentifier(pool_name=pool, device_name=card.name),
        health=health,
        last_updated_time=now_s,
        health_check_timeout_seconds=timeout_s,
        message=message[:MAX_MESSAGE],
    )


class HealthStream(drahealth_pb2_grpc.DRAResourceHealthServicer):
    """``NodeWatchResources`` for this node's pool (named after the node)."""

    def __init__(
        self,
        node: str,
        cards: CardSource,
        *,
        resend_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self._cards = cards
        self.resend_s = resend_s
        self._clock = clock
        # Set (and replaced by a fresh one) on every status: each open stream waits on
        # the one it saw, so no change between two reports is missed.
        self._moved = asyncio.Event()
        #: Reports sent so far, all streams together.
        self.reports = 0

    def changed(self) -> None:
        """The agent wrote a status: send a report on every open stream now."""
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    def report(self) -> drahealth_pb2.NodeWatchResourcesResponse:
        """The whole pool's health now."""
        now = int(self._clock())
        timeout = max(1, round(3 * self.resend_s))
        return drahealth_pb2.NodeWatchResourcesResponse(
            devices=[
                device_health(self.node, card, now, timeout)
                for _, card in sorted(self._cards().items())
            ]
        )

    async def NodeWatchResources(
        self,
        request: drahealth_pb2.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[drahealth_pb2.NodeWatchResourcesResponse]:
        log.info("dra_health_stream_opened", node=self.node)
        try:
            while True:
                moved = self._moved
                answer = self.report()
                self.reports += 1
                yield answer
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(moved.wait(), timeout=self.resend_s)
        finally:
            log.info("dra_health_stream_closed", node=self.node)
