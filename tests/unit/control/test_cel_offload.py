"""CEL verdicts computed off the event loop (``cel_offload``), in the real child process."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import pytest

from vgpu_operator.control import cel_offload, cel_process
from vgpu_operator.scheduling.cel import claim_cel
from vgpu_operator.scheduling.pod_key import PodKey

DEVICE = claim_cel.DeviceView(
    "gpu.vgpu-operator.io",
    True,
    {"gpu.vgpu-operator.io/type": ("string", "A100"), "gpu.vgpu-operator.io/index": ("int", 3)},
    {"gpu.vgpu-operator.io/memory": "40Gi"},
)
BIG = "[" + ",".join("0" for _ in range(570)) + "]"
SLOW = f"{BIG}.all(x, {BIG}.all(y, true))"


def _child_that_hangs(how: str) -> tuple[str, ...]:
    """A child that hangs on a request naming "hang" (working: as in a backtracking
    regular expression; sleeping: as a child the machine gives no CPU), and answers as the
    real one otherwise."""
    return (
        sys.executable,
        "-c",
        "import sys, time, json\n"
        "from vgpu_operator.control import cel_process\n"
        "from vgpu_operator.scheduling.cel import claim_cel\n"
        "print(json.dumps({'ready': True, 'cpu_s': time.process_time()}), flush=True)\n"
        "cache = claim_cel.SelectorCache()\n"
        "for line in sys.stdin:\n"
        "    if 'hang' in line:\n"
        f"        {how}\n"
        "    print(json.dumps(cel_process.answer(cache, json.loads(line))), flush=True)\n",
    )


HANGS_WORKING = _child_that_hangs("while True: pass")
HANGS_SLEEPING = _child_that_hangs("time.sleep(600)")
KEY = PodKey("ns/pod")
#: A deadline the step bound always beats, however busy the machine (the tests that are
#: not about the deadline must not meet it on a loaded CI machine).
UNHURRIED_S = 120.0
#: Two selectors sent off the loop (long: not even parsed on it).
HANGS = " || ".join([f'device.driver == "hang-{i}"' for i in range(30)])
FINE = " || ".join([f'device.driver == "gpu.vgpu-operator.io{i * " "}"' for i in range(30)])


def test_the_wire_carries_a_device_whole() -> None:
    assert cel_process.device_from_wire(cel_process.device_to_wire(DEVICE)) == DEVICE


async def _decide_and_wait(
    cache: claim_cel.SelectorCache, offload: cel_offload.OffLoopSelectors, expressions: list[str]
) -> None:
    for expression in expressions:
        selector = cache.compile(expression)
        with contextlib.suppress(claim_cel.CelPending):
            cache.matches(selector, ("pool", "dev", 1), DEVICE)
    offload.decided(KEY)
    task = offload._task
    assert task is not None
    await task


def test_pending_verdicts_are_computed_in_the_child_and_the_pod_is_woken() -> None:
    woken: list[PodKey] = []

    async def scenario() -> None:
        cache = claim_cel.SelectorCache()
        offload = cel_offload.OffLoopSelectors(cache, woken.append, deadline_s=UNHURRIED_S)
        try:
            await _decide_and_wait(cache, offload, [SLOW, 'device.driver.matches("^gpu")'])
        finally:
            await offload.close()
        regex = cache.compile('device.driver.matches("^gpu")')
        assert cache.matches(regex, ("pool", "dev", 1), DEVICE) is True
        slow = cache.compile(SLOW)
        with pytest.raises(claim_cel.CelTooCostly, match="make the selector cheaper"):
            cache.matches(slow, ("pool", "dev", 1), DEVICE)

    asyncio.run(scenario())
    assert woken == [KEY]


def test_past_the_deadline_the_child_is_killed_and_the_next_pair_still_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A working child is never taken for a starved one here, however loaded the machine
    # (the starved case has its own test below).
    monkeypatch.setattr(cel_offload, "STARVED_SHARE", 0.0)

    async def scenario() -> None:
        cache = claim_cel.SelectorCache()
        offload = cel_offload.OffLoopSelectors(
            cache, lambda _key: None, deadline_s=1.0, command=HANGS_WORKING
        )
        try:
            await _decide_and_wait(cache, offload, [HANGS, FINE])
        finally:
            await offload.close()
        assert offload.timeouts == 1
        stuck = cache.compile(HANGS)
        with pytest.raises(claim_cel.CelTooCostly, match="took longer than 1 s"):
            cache.matches(stuck, ("pool", "dev", 1), DEVICE)
        fine = cache.compile(FINE)  # answered by a new child
        assert cache.matches(fine, ("pool", "dev", 1), DEVICE) is True

    asyncio.run(scenario())


def test_the_event_loop_runs_other_work_while_the_child_evaluates() -> None:
    async def scenario() -> None:
        cache = claim_cel.SelectorCache()
        offload = cel_offload.OffLoopSelectors(cache, lambda _key: None, deadline_s=UNHURRIED_S)
        try:
            selector = cache.compile(SLOW)
            with contextlib.suppress(claim_cel.CelPending):
                cache.matches(selector, ("pool", "dev", 1), DEVICE)
            offload.decided(KEY)
            evaluating = offload._task
            assert evaluating is not None
            other = asyncio.create_task(asyncio.sleep(0))
            done, _ = await asyncio.wait({evaluating, other}, return_when=asyncio.FIRST_COMPLETED)
            # What an inline evaluation would have blocked (a webhook answer) ran first.
            assert done == {other}
            await evaluating
        finally:
            await offload.close()

    asyncio.run(scenario())


def test_a_selector_past_its_bound_on_one_device_costs_one_bound_not_one_per_device() -> None:
    async def scenario() -> None:
        cache = claim_cel.SelectorCache()
        offload = cel_offload.OffLoopSelectors(cache, lambda _key: None, deadline_s=UNHURRIED_S)
        cheap = cache.compile('device.driver != ""')
        for n in range(4):
            cache.matches(cheap, ("pool", "dev", n), DEVICE)  # four devices known
        try:
            await _decide_and_wait(cache, offload, [SLOW])
        finally:
            await offload.close()
        assert offload.evaluated == 1
        slow = cache.compile(SLOW)
        for n in range(4):
            with pytest.raises(claim_cel.CelTooCostly):
                cache.matches(slow, ("pool", "dev", n), DEVICE)

    asyncio.run(scenario())


def test_a_child_starved_at_its_deadline_is_asked_again_later_not_taken_as_a_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On a busy machine the wall deadline passes while the child waits for a core; a
    # refusal is cached until the device changes, so it must not come from the load.
    monkeypatch.setattr(cel_offload, "RETRY_S", 0.05)
    woken: list[PodKey] = []

    async def scenario() -> None:
        cache = claim_cel.SelectorCache()
        offload = cel_offload.OffLoopSelectors(
            cache, woken.append, deadline_s=1.0, command=HANGS_SLEEPING
        )
        try:
            for attempt in range(cel_offload.STARVED_RETRIES):
                await _decide_and_wait(cache, offload, [HANGS])
                assert offload.starved == attempt + 1
                stuck = cache.compile(HANGS)
                with pytest.raises(claim_cel.CelPending):  # no verdict: asked again
                    cache.matches(stuck, ("pool", "dev", 1), DEVICE)
                cache.pending_seen()
                await asyncio.sleep(0.2)
                assert woken == [KEY] * (attempt + 1)  # woken after RETRY_S
            # Starved every time: then the deadline is the expression's own.
            await _decide_and_wait(cache, offload, [HANGS])
            assert offload.starved == cel_offload.STARVED_RETRIES
            with pytest.raises(claim_cel.CelTooCostly, match="took longer than 1 s"):
                cache.matches(cache.compile(HANGS), ("pool", "dev", 1), DEVICE)
        finally:
            await offload.close()

    asyncio.run(scenario())


def test_tenants_are_served_in_turn_and_each_is_woken_when_its_own_queue_is_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tenant with many selectors queued first delays another tenant's one selector by
    one evaluation, not by all of its own; the other tenant's pod is woken at once."""
    monkeypatch.setattr(cel_offload, "MAX_QUEUED_EXPRESSIONS", 32)
    order: list[PodKey] = []
    noisy = [
        " || ".join([f'device.driver == "noisy-{n}-{i}"' for i in range(30)]) for n in range(6)
    ]

    async def scenario() -> None:
        cache = claim_cel.SelectorCache()
        offload = cel_offload.OffLoopSelectors(cache, order.append, deadline_s=UNHURRIED_S)
        try:
            for expression in noisy:
                with contextlib.suppress(claim_cel.CelPending):
                    cache.matches(cache.compile(expression), ("pool", "dev", 1), DEVICE)
            offload.decided(PodKey("noisy/pod"))
            with contextlib.suppress(claim_cel.CelPending):
                cache.matches(cache.compile(FINE), ("pool", "dev", 1), DEVICE)
            offload.decided(PodKey("quiet/pod"))
            assert offload.queued("noisy") == 6
            assert offload.queued("quiet") == 1
            task = offload._task
            assert task is not None
            await task
        finally:
            await offload.close()
        assert offload.evaluated == 7

    asyncio.run(scenario())
    assert order == [PodKey("quiet/pod"), PodKey("noisy/pod")]


def test_a_namespace_queues_a_bounded_number_of_selectors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Selectors past the bound are handed back unevaluated (asked again when the pod is
    decided again), so a tenant cannot grow the queue without end."""
    monkeypatch.setattr(cel_offload, "MAX_QUEUED_EXPRESSIONS", 2)
    many = [" || ".join([f'device.driver == "m-{n}-{i}"' for i in range(30)]) for n in range(5)]

    async def scenario() -> None:
        cache = claim_cel.SelectorCache()
        offload = cel_offload.OffLoopSelectors(cache, lambda _key: None, deadline_s=UNHURRIED_S)
        try:
            for expression in many:
                with contextlib.suppress(claim_cel.CelPending):
                    cache.matches(cache.compile(expression), ("pool", "dev", 1), DEVICE)
            offload.decided(PodKey("tenant/pod"))
            assert offload.queued("tenant") == 2
            task = offload._task
            assert task is not None
            await task
            assert offload.evaluated == 2
            # The handed-back ones are asked again by the next decision that meets them.
            for expression in many[2:]:
                with pytest.raises(claim_cel.CelPending):
                    cache.matches(cache.compile(expression), ("pool", "dev", 1), DEVICE)
            offload.decided(PodKey("tenant/pod"))
            assert offload.queued("tenant") == 2
        finally:
            await offload.close()

    asyncio.run(scenario())
