"""Writes that may wait: held while the hot path is busy, written when it is idle or
once they are old enough, oldest dropped beyond the bound."""

from __future__ import annotations

import asyncio

from manual_clock import ManualClock

from vgpu_operator.control.deferred import DeferredWrites, Write


def _writer(done: list[str], name: str) -> Write:
    async def write() -> None:
        done.append(name)

    return write


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_writes_wait_while_busy_and_go_when_idle() -> None:
    async def scenario() -> tuple[list[str], list[str], list[str]]:
        busy = True
        clock = ManualClock(100.0)
        writes = DeferredWrites(busy=lambda: busy, max_delay_s=5.0, clock=clock)
        done: list[str] = []
        task = asyncio.create_task(writes.run(on_error=lambda exc: None))
        writes.put(_writer(done, "a"))
        writes.put(_writer(done, "b"))
        await asyncio.sleep(0.12)
        while_busy = list(done)
        busy = False
        await asyncio.sleep(0.12)
        when_idle = list(done)
        busy = True
        writes.put(_writer(done, "c"))
        clock.now += 5.0  # waited long enough: goes even though the hot path is busy
        await asyncio.sleep(0.12)
        task.cancel()
        return while_busy, when_idle, done

    while_busy, when_idle, done = asyncio.run(scenario())
    assert while_busy == []
    assert when_idle == ["a", "b"]
    assert done == ["a", "b", "c"]


def test_the_oldest_are_dropped_beyond_the_limit() -> None:
    async def scenario() -> tuple[list[str], int]:
        writes = DeferredWrites(limit=2)
        done: list[str] = []
        for name in ("a", "b", "c"):
            writes.put(_writer(done, name))
        task = asyncio.create_task(writes.run(on_error=lambda exc: None))
        await _settle()
        task.cancel()
        return done, writes.dropped

    done, dropped = asyncio.run(scenario())
    assert done == ["b", "c"]
    assert dropped == 1


def test_a_failed_write_is_reported_and_the_rest_go_on() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        writes = DeferredWrites()
        done: list[str] = []
        errors: list[str] = []

        async def broken() -> None:
            raise RuntimeError("HTTP 500")

        writes.put(broken)
        writes.put(_writer(done, "after"))
        task = asyncio.create_task(writes.run(on_error=lambda exc: errors.append(str(exc))))
        await _settle()
        task.cancel()
        return done, errors

    done, errors = asyncio.run(scenario())
    assert done == ["after"]
    assert errors == ["HTTP 500"]
