"""Which replica decides: Kopf peering, read back so the worker can follow it.

Kopf pauses its watch streams on a replica that sees a live peer of higher or equal
priority, but it does not tell the handlers, and our scheduling worker is not a Kopf
handler. ``PeeringGate`` therefore reads the same peering object and applies Kopf's
rule: this replica is active while no other live peer has a priority >= its own.

Priorities are chosen so that the *oldest* replica wins (``peering_priority``): a new
replica (a rolling update, a restart) waits until the old one is gone (its record removed
at a clean exit, or expired after the peering lifetime) instead of taking over while the
old one may still be writing Bindings. The gate also opens only after our own record
has been visible for a grace period, so two replicas starting together see each other
before either decides.
"""

from __future__ import annotations

import asyncio
import datetime
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

import structlog

from vgpu_operator.timestamps import parse_rfc3339

log = structlog.get_logger("vgpu_operator.leadership")

#: 2100-01-01T00:00:00Z; priorities count down from it, so older replicas rank higher.
_PRIORITY_EPOCH_S: Final = 4_102_444_800
#: Kopf assumes this lifetime for peers that do not state theirs.
DEFAULT_LIFETIME_S: Final = 60


class Gate(Protocol):
    """Whether this replica may decide (peering), with a count of openings."""

    def is_open(self) -> bool: ...
    async def wait_open(self) -> int: ...


class AlwaysOpen:
    """The gate of a standalone operator."""

    def is_open(self) -> bool:
        return True

    async def wait_open(self) -> int:
        return 1


def peering_priority(started_at_s: float, rng: random.Random | None = None) -> int:
    """A priority that ranks replicas by start time (older first), ties broken at random."""
    tail = (rng or random.SystemRandom()).randrange(1000)
    return (_PRIORITY_EPOCH_S - int(started_at_s)) * 1000 + tail


def is_active(
    peers: Mapping[str, Any], identity: str, priority: int, now: datetime.datetime
) -> bool:
    """Kopf's rule over a peering object's ``status``: no other live peer has a priority
    greater than or equal to ours."""
    for peer_id, info in peers.items():
        if peer_id == identity or not isinstance(info, Mapping):
            continue
        lifetime = info.get("lifetime", DEFAULT_LIFETIME_S)
        lastseen = parse_rfc3339(info.get("lastseen"))
        alive_until = (
            lastseen + datetime.timedelta(seconds=lifetime)
            if lastseen is not None and isinstance(lifetime, int | float)
            else None
        )
        if alive_until is not None and alive_until <= now:
            continue  # dead
        other = info.get("priority", 0)
        if isinstance(other, int) and other >= priority:
            return False
    return True


class PeeringGate:
    """Follows the peering object (a ``Gate``); ``run`` polls it until cancelled."""

    def __init__(
        self,
        read_peering: Callable[[], Awaitable[Mapping[str, Any] | None]],
        identity: str,
        priority: int,
        *,
        poll_s: float = 2.0,
        grace_s: float = 5.0,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read_peering
        self._identity = identity
        self._priority = priority
        self._poll_s = poll_s
        self._grace_s = grace_s
        self._on_change = on_change or (lambda active: None)
        self._clock = clock
        self._open = asyncio.Event()
        self._openings = 0
        self._own_record_since: float | None = None

    def is_open(self) -> bool:
        return self._open.is_set()

    async def wait_open(self) -> int:
        await self._open.wait()
        return self._openings

    def observe(self, peering: Mapping[str, Any] | None, now: datetime.datetime) -> bool:
        """Update the gate from one reading of the peering object; returns is_open()."""
        peers = (peering or {}).get("status") or {}
        if not isinstance(peers, Mapping):
            peers = {}
        if self._identity in peers:
            if self._own_record_since is None:
                self._own_record_since = self._clock()
        else:
            self._own_record_since = None
        settled = (
            self._own_record_since is not None
            and self._clock() - self._own_record_since >= self._grace_s
        )
        active = settled and is_active(peers, self._identity, self._priority, now)
        if active and not self._open.is_set():
            self._openings += 1
            self._open.set()
            log.info("leadership_acquired", identity=self._identity, priority=self._priority)
            self._on_change(True)
        elif not active and self._open.is_set():
            self._open.clear()
            log.info("leadership_lost", identity=self._identity)
            self._on_change(False)
        return active

    async def run(self) -> None:
        while True:
            try:
                peering = await self._read()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Cannot tell whether another replica took over: stop deciding.
                log.warning("peering_unreadable", error=str(exc))
                peering = None
            self.observe(peering, datetime.datetime.now(datetime.UTC))
            await asyncio.sleep(self._poll_s)
