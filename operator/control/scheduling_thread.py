"""The scheduling work on a thread of its own, with its own event loop (issue 44).

The process does two kinds of work. The serving loop (Kopf's: the webhook, peering and
login, and ``serving.HttpServer``: ``/metrics``, ``/healthz``, ``/readyz``) answers callers
who wait with a deadline: the API server gives an admission answer 3 s, the kubelet a
probe 1 s. The scheduling loop (``operator.Operator``: the watches, the feed, the
worker's decisions, Bindings, Events, the CEL evaluator's queue) does work whose length
depends on what tenants write. On one loop, a slow decision delayed every answer: a
tenant's selector kept ``/healthz`` from answering for 140 s, the leader lost its peering
and the webhook's answers came too late. So the ``Operator`` runs here, and the serving
loop reads it only through what is safe to read from another thread: the engine's
``AdmissionView`` (replaced, never changed), an event's ``is_set``, a task's ``done``, the
heartbeat's time; the metrics' copy of the engine's figures is made on the scheduling
loop (``metrics.OperatorMetrics.render_beside_the_loop``).

The two threads share the interpreter lock, which the interpreter hands over every 5 ms
(``sys.getswitchinterval``): a long stretch of decisions delays an answer by milliseconds,
not by its own length.

The heartbeat: a task on the scheduling loop notes the time every ``HEARTBEAT_S``.
``liveness`` (the ``/healthz`` answer) says the process should be restarted when a
background task has died, or when the heartbeat is older than ``stuck_after_s`` (the
loop has not turned for that long: nothing is decided); it logs that once, as one
structured line (``scheduling_stuck``), and ``scheduling_unstuck`` if the loop turns again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Final, Generic, Protocol, TypeVar

import structlog

log = structlog.get_logger("vgpu_operator.operator")

#: How often the scheduling loop notes that it turns.
HEARTBEAT_S: Final = 1.0
#: How long the scheduling loop may go without turning before /healthz fails: far
#: beyond any decision (CEL runs elsewhere), short enough that the kubelet restarts a
#: stuck operator within a couple of minutes (probe every 10 s, 3 failures).
STUCK_AFTER_S: Final = 60.0
#: How long stopping waits for the scheduling thread.
STOP_TIMEOUT_S: Final = 30.0


class Heartbeat:
    """The time the scheduling loop last turned (written there, read anywhere)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.last = clock()

    def age_s(self) -> float:
        return self._clock() - self.last

    async def run(self) -> None:
        while True:
            self.last = self._clock()
            await asyncio.sleep(HEARTBEAT_S)


class Scheduling(Protocol):
    """What runs on the scheduling thread (``operator.Operator``)."""

    heartbeat: Heartbeat

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def healthy(self) -> bool: ...


S = TypeVar("S", bound=Scheduling)


class SchedulingThread(Generic[S]):
    """Builds (``build``, on the thread's loop), starts and stops one ``Scheduling`` on a
    daemon thread; ``start`` and ``stop`` are awaited on the serving loop."""

    def __init__(
        self,
        build: Callable[[], Awaitable[S]],
        *,
        stuck_after_s: float = STUCK_AFTER_S,
    ) -> None:
        self._build = build
        self.stuck_after_s = stuck_after_s
        self.running: S | None = None
        self._started: concurrent.futures.Future[S] = concurrent.futures.Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._stuck = False
        self._thread = threading.Thread(target=self._main, name="vgpu-scheduling", daemon=True)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The scheduling loop, while it runs (diagnostics, tests)."""
        return self._loop

    async def start(self) -> S:
        """Start the thread; returns once the scheduling work has started (raises what
        building or starting it raised)."""
        self._thread.start()
        self.running = await asyncio.wrap_future(self._started)
        return self.running

    async def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # its loop has ended already
                loop.call_soon_threadsafe(stopping.set)
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, STOP_TIMEOUT_S)
        if self._thread.is_alive():
            log.error("scheduling_thread_did_not_stop", timeout_s=STOP_TIMEOUT_S)

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # handed to start(); a later one is logged there
            if not self._started.done():
                self._started.set_exception(exc)

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        running = await self._build()
        try:
            await running.start()
        except BaseException:
            await running.stop()
            raise
        self._started.set_result(running)
        try:
            await self._stopping.wait()
        finally:
            await running.stop()

    def liveness(self) -> str | None:
        """None while the scheduling work is alive; else why the process should be
        restarted (``/healthz``). Before it has started it is alive (starting)."""
        running = self.running
        if running is None:
            return None
        if not self._thread.is_alive():
            return "the scheduling thread has stopped"
        if not running.healthy():
            return "a background task has stopped"
        age = running.heartbeat.age_s()
        stuck = age > self.stuck_after_s
        if stuck != self._stuck:
            self._stuck = stuck
            if stuck:
                log.error("scheduling_stuck", seconds=round(age, 1), bound_s=self.stuck_after_s)
            else:
                log.warning("scheduling_unstuck", seconds=round(age, 1))
        if stuck:
            return (
                f"the scheduling loop has not turned for {age:.0f} s (more than "
                f"{self.stuck_after_s:g} s): nothing is being decided"
            )
        return None
