"""The scheduling queues: active order, backoff, unschedulable pods grouped by hint, waking
and flushing (fake clock, no sleeps)."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from manual_clock import ManualClock

from vgpu_operator.control.queue import (
    OWN_CHANGE_ONLY,
    QueueName,
    SchedulingQueue,
    WaitsForVictims,
)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(100.0)


@pytest.fixture
def q(clock: ManualClock) -> SchedulingQueue:
    return SchedulingQueue(initial_backoff_s=1.0, max_backoff_s=8.0, flush_after_s=300, clock=clock)


def _any(_hint: Hashable | None) -> bool:
    return True


def test_new_pod_is_due_at_once_and_popped_once(q: SchedulingQueue) -> None:
    assert q.add("ns/a", "uid-a")
    assert q.pop() == "ns/a"
    assert q.pop() is None
    assert q.is_in_flight("ns/a")


def test_pods_come_out_by_priority_then_arrival(q: SchedulingQueue, clock: ManualClock) -> None:
    q.add("ns/low", "1", priority=0)
    clock.now += 0.1
    q.add("ns/high", "2", priority=100)
    q.add("ns/low2", "3", priority=0)
    clock.now += 0.1
    assert [q.pop(), q.pop(), q.pop()] == ["ns/high", "ns/low", "ns/low2"]


def test_a_new_priority_moves_an_active_pod_and_leaves_a_parked_one_parked(
    q: SchedulingQueue, clock: ManualClock
) -> None:
    q.add("ns/member", "1", priority=100)
    q.add("ns/other", "2", priority=50)
    q.add("ns/parked", "3", priority=100)
    assert q.pop() == "ns/member"
    q.park("ns/member")
    q.set_priority("ns/parked", 10)  # its PodGroup's class is lower: behind ns/other
    q.set_priority("ns/member", 0)
    assert q.parked_count == 1
    assert [q.pop(), q.pop(), q.pop()] == ["ns/other", "ns/parked", None]


def test_readding_same_pod_keeps_it_unschedulable(q: SchedulingQueue) -> None:
    q.add("ns/a", "uid-a")
    q.pop()
    q.park("ns/a")
    assert not q.add("ns/a", "uid-a")  # e.g. our own condition update arrives
    assert q.parked_count == 1
    assert q.pop() is None


def test_same_name_new_uid_starts_over(q: SchedulingQueue) -> None:
    q.add("ns/a", "uid-1")
    q.pop()
    q.park("ns/a")
    assert q.add("ns/a", "uid-2")
    assert q.attempts("ns/a") == 0
    assert q.parked_count == 0
    assert q.pop() == "ns/a"


@pytest.mark.parametrize(
    ("failures", "expected_backoff_s"),
    [
        pytest.param(1, 1.0, id="first"),
        pytest.param(2, 2.0, id="doubles"),
        pytest.param(4, 8.0, id="reaches-cap"),
        pytest.param(6, 8.0, id="stays-capped"),
    ],
)
def test_backoff_doubles_up_to_the_cap(
    q: SchedulingQueue, clock: ManualClock, failures: int, expected_backoff_s: float
) -> None:
    q.add("ns/a", "u")
    assert q.pop() == "ns/a"
    backoff = 0.0
    for attempt in range(failures):
        backoff = q.park("ns/a")
        if attempt < failures - 1:
            q.wake(_any)
            clock.now += backoff
            assert q.pop() == "ns/a"
    assert backoff == expected_backoff_s


def test_the_default_backoff_is_kube_schedulers(clock: ManualClock) -> None:
    q = SchedulingQueue(clock=clock)
    q.add("ns/a", "u")
    backoffs = []
    for _ in range(6):
        assert q.pop() == "ns/a"
        backoffs.append(q.retry_later("ns/a"))
        clock.now += backoffs[-1]
    assert backoffs == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_unschedulable_pod_waits_for_an_event_even_after_backoff(
    q: SchedulingQueue, clock: ManualClock
) -> None:
    q.add("ns/a", "u")
    q.pop()
    q.park("ns/a")
    clock.now += 299
    assert q.pop() is None
    assert q.next_due_at() is None


def test_woken_pod_goes_to_backoff_until_its_backoff_ends(
    q: SchedulingQueue, clock: ManualClock
) -> None:
    q.add("ns/a", "u")
    q.pop()
    q.park("ns/a")  # backoff 1 s
    assert q.wake(_any) == 1
    assert q.census().pods[QueueName.BACKOFF] == 1
    assert q.pop() is None
    assert q.next_due_at() == pytest.approx(clock.now + 1.0)
    clock.now += 1.0
    assert q.pop() == "ns/a"


def test_woken_after_its_backoff_the_pod_is_active_at_once(
    q: SchedulingQueue, clock: ManualClock
) -> None:
    q.add("ns/a", "u")
    q.pop()
    q.park("ns/a")
    clock.now += 5
    q.wake(_any)
    assert q.census().pods[QueueName.ACTIVE] == 1
    assert q.pop() == "ns/a"


def test_an_event_is_weighed_once_per_hint_and_wakes_its_pods_only(q: SchedulingQueue) -> None:
    for name in ("a1", "a2", "a3", "b"):
        q.add(f"ns/{name}", name)
    for _ in range(4):
        key = q.pop()
        assert key is not None
        q.park(key, hint="shape-b" if key == "ns/b" else "shape-a")
    asked: list[Hashable | None] = []

    def helps(hint: Hashable | None) -> bool:
        asked.append(hint)
        return hint == "shape-a"

    assert q.wake(helps) == 3
    assert sorted(asked, key=str) == ["shape-a", "shape-b"]
    assert q.parked_count == 1
    assert q.hint_of("ns/b") == "shape-b"
    assert q.hints() == ["shape-b"]


def test_waking_one_pod_leaves_the_rest_of_its_group(q: SchedulingQueue) -> None:
    for name in ("a", "b"):
        q.add(f"ns/{name}", name)
        assert q.pop() == f"ns/{name}"
        q.park(f"ns/{name}", hint=WaitsForVictims("n1"))
    q.wake_one("ns/a")
    assert q.parked_count == 1
    assert q.wake(lambda h: h == WaitsForVictims("n1")) == 1


def test_retry_later_comes_back_after_backoff_without_an_event(
    q: SchedulingQueue, clock: ManualClock
) -> None:
    q.add("ns/a", "u")
    q.pop()
    assert q.retry_later("ns/a") == 1.0
    assert q.pop() is None
    clock.now += 1.0
    assert q.pop() == "ns/a"


def test_removed_pod_is_never_popped_nor_woken(q: SchedulingQueue) -> None:
    q.add("ns/a", "u")
    q.add("ns/b", "u")
    q.pop()
    q.park("ns/a", hint=OWN_CHANGE_ONLY)
    q.remove("ns/a")
    q.remove("ns/b")
    assert q.pop() is None
    assert q.wake(_any) == 0
    assert q.hints() == []
    assert len(q) == 0


def test_wake_all_moves_every_unschedulable_pod(q: SchedulingQueue, clock: ManualClock) -> None:
    for name in ("a", "b"):
        q.add(f"ns/{name}", name)
    for hint in ("x", OWN_CHANGE_ONLY):
        key = q.pop()
        assert key is not None
        q.park(key, hint=hint)
    assert q.wake_all() == 2
    clock.now += 1.0
    assert {q.pop(), q.pop()} == {"ns/a", "ns/b"}


def test_flush_moves_pods_unschedulable_for_too_long(
    q: SchedulingQueue, clock: ManualClock
) -> None:
    q.add("ns/old", "1")
    q.pop()
    q.park("ns/old", hint=OWN_CHANGE_ONLY)
    clock.now += 200
    q.add("ns/new", "2")
    q.pop()
    q.park("ns/new", hint=OWN_CHANGE_ONLY)
    assert q.flush() == 0
    clock.now += 100
    assert q.flush() == 1
    assert q.pop() == "ns/old"
    assert q.is_unschedulable("ns/new")


def test_notify_is_called_when_something_may_be_due(clock: ManualClock) -> None:
    calls: list[int] = []
    q = SchedulingQueue(clock=clock, notify=lambda: calls.append(1))
    q.add("ns/a", "u")
    assert calls


def test_has_ready_follows_the_active_queue(q: SchedulingQueue, clock: ManualClock) -> None:
    assert not q.has_ready()
    q.add("ns/a", "u")
    assert q.has_ready()
    q.pop()
    assert not q.has_ready()
    q.retry_later("ns/a")
    assert not q.has_ready()
    clock.now += 1
    assert q.has_ready()


def test_the_census_names_kube_schedulers_queues(q: SchedulingQueue, clock: ManualClock) -> None:
    """active: due now; backoff: waiting for its backoff; unschedulable: waiting for an
    event, with the reasons it waits for; a pod being decided is in none."""
    for name in ("a", "b", "c", "d"):
        q.add(f"ns/{name}", name)
    assert q.pop() == "ns/a"
    q.park("ns/a", reasons=("CardInsufficientMemory", "NodeUntoleratedTaint"))
    assert q.pop() == "ns/b"
    q.retry_later("ns/b")  # backing off for 1 s
    assert q.pop() == "ns/c"  # in flight
    census = q.census()
    assert census.pods == {"active": 1, "backoff": 1, "unschedulable": 1}
    assert census.unschedulable_reasons == {"CardInsufficientMemory": 1, "NodeUntoleratedTaint": 1}
    # Woken before its backoff ends, the unschedulable pod backs off; its reasons are gone.
    q.wake(_any)
    census = q.census()
    assert census.pods == {"active": 1, "backoff": 2, "unschedulable": 0}
    assert census.unschedulable_reasons == {}
    clock.now += 2
    assert q.census().pods == {"active": 3, "backoff": 0, "unschedulable": 0}
