"""The scheduling work on its own thread and loop (``scheduling_thread``): probes and
scrapes are answered while the scheduling loop is blocked, and ``/healthz`` fails only
when that loop has not turned for longer than its bound, said once in the log."""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import pytest
from structlog.testing import capture_logs

from vgpu_operator.control import scheduling_thread
from vgpu_operator.control.serving import HttpServer
from vgpu_operator.metrics import OperatorMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Blocking:
    """Scheduling work whose loop, once started, is blocked (a decision that does not
    end) until ``release`` is set."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.heartbeat = scheduling_thread.Heartbeat(clock or Clock())
        self.blocked = threading.Event()
        self.release = threading.Event()
        self.started = asyncio.Event()
        self.stopped = False
        self.fail_start = False
        self.loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        if self.fail_start:
            raise RuntimeError("no API server")

        def block() -> None:
            self.blocked.set()
            self.release.wait(60)

        self.loop = asyncio.get_running_loop()
        self.loop.call_soon(block)
        self.started.set()

    async def stop(self) -> None:
        self.stopped = True

    def healthy(self) -> bool:
        return True


async def _get(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


def test_probes_and_scrapes_are_answered_while_the_scheduling_loop_is_blocked() -> None:
    work = Blocking()

    async def build() -> Blocking:
        return work

    async def scenario() -> list[tuple[str, int, bool]]:
        thread = scheduling_thread.SchedulingThread(build)
        metrics = OperatorMetrics()
        server = HttpServer(metrics, ready=work.started.is_set, leader=lambda: True,
                            live=thread.liveness)  # fmt: skip
        await server.start("127.0.0.1", 0)
        assert server.port is not None
        seen = []
        try:
            await thread.start()
            # The engine's figures are copied on the scheduling loop, as the operator's.
            metrics.read_state_from(list, dict, loop=work.loop)
            # Started: the scheduling loop is blocked from now until released.
            assert await asyncio.to_thread(work.blocked.wait, 30)
            for path in ("/healthz", "/readyz", "/metrics"):
                status, body = await _get(server.port, path)
                # Answered while the scheduling loop is still blocked: an ordering, not
                # a timing (the blocked loop is released only after every answer).
                seen.append((path, status, not work.release.is_set()))
            # The scrape could not copy the engine's figures: it served the last copy.
            assert "vgpu_operator_engine_figures_stale 1.0" in body
        finally:
            work.release.set()
            await thread.stop()
            await server.stop()
        return seen

    seen = asyncio.run(scenario())
    assert seen == [("/healthz", 200, True), ("/readyz", 200, True), ("/metrics", 200, True)]
    assert work.stopped


def test_healthz_fails_once_the_scheduling_loop_is_stuck_past_its_bound_said_once() -> None:
    clock = Clock()
    work = Blocking(clock)

    async def build() -> Blocking:
        return work

    async def scenario() -> list[str | None]:
        thread = scheduling_thread.SchedulingThread(build, stuck_after_s=60.0)
        await thread.start()
        assert await asyncio.to_thread(work.blocked.wait, 30)
        answers = []
        try:
            for advance in (10.0, 55.0, 10.0, 10.0):
                clock.now += advance
                answers.append(thread.liveness())
            work.heartbeat.last = clock.now  # the loop turned again
            answers.append(thread.liveness())
        finally:
            work.release.set()
            await thread.stop()
        return answers

    with capture_logs() as logs:
        answers = asyncio.run(scenario())
    assert answers[:2] == [None, "the scheduling loop has not turned for 65 s (more than 60 s): "
                           "nothing is being decided"]  # fmt: skip
    assert answers[2] is not None
    assert answers[3] is not None
    assert answers[4] is None
    stuck = [entry for entry in logs if entry["event"] == "scheduling_stuck"]
    assert len(stuck) == 1  # one structured line, not one per probe
    assert stuck[0]["seconds"] == 65.0
    assert [e["event"] for e in logs if e["event"] == "scheduling_unstuck"] == [
        "scheduling_unstuck"
    ]


def test_a_start_that_fails_is_raised_on_the_serving_loop_and_stopped() -> None:
    work = Blocking()
    work.fail_start = True

    async def build() -> Blocking:
        return work

    async def scenario() -> None:
        thread = scheduling_thread.SchedulingThread(build)
        with pytest.raises(RuntimeError, match="no API server"):
            await thread.start()
        await thread.stop()

    asyncio.run(scenario())
    assert work.stopped


def test_the_heartbeat_notes_each_turn_of_its_loop() -> None:
    clock = Clock()
    heartbeat = scheduling_thread.Heartbeat(clock)

    async def scenario() -> float:
        task = asyncio.create_task(heartbeat.run())
        await asyncio.sleep(0)
        clock.now += 5.0
        before = heartbeat.age_s()
        task.cancel()
        return before

    assert asyncio.run(scenario()) == 5.0
