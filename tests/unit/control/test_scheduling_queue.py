"""The scheduling queue: due order, backoff, parking and waking (fake clock, no sleeps)."""

from __future__ import annotations

import pytest

from vgpu_operator.control.queue import ClusterEvent, SchedulingQueue, release_could_help
from vgpu_operator.scheduling.status import Diagnosis, NodeFailure, Reason


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def q(clock: Clock) -> SchedulingQueue:
    return SchedulingQueue(initial_backoff_s=1.0, max_backoff_s=8.0, clock=clock)


def test_new_pod_is_due_at_once_and_popped_once(q: SchedulingQueue) -> None:
    assert q.add("ns/a", "uid-a")
    assert q.pop() == "ns/a"
    assert q.pop() is None
    assert q.is_in_flight("ns/a")


def test_pods_come_out_by_priority_then_arrival(q: SchedulingQueue, clock: Clock) -> None:
    q.add("ns/low", "1", priority=0)
    clock.now += 0.1
    q.add("ns/high", "2", priority=100)
    q.add("ns/low2", "3", priority=0)
    clock.now += 0.1
    assert [q.pop(), q.pop(), q.pop()] == ["ns/high", "ns/low", "ns/low2"]


def test_readding_same_pod_keeps_its_parking(q: SchedulingQueue) -> None:
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
    q: SchedulingQueue, clock: Clock, failures: int, expected_backoff_s: float
) -> None:
    q.add("ns/a", "u")
    assert q.pop() == "ns/a"
    backoff = 0.0
    for attempt in range(failures):
        backoff = q.park("ns/a")
        if attempt < failures - 1:
            q.wake(ClusterEvent.NODE_CHANGED)
            clock.now += backoff
            assert q.pop() == "ns/a"
    assert backoff == expected_backoff_s


def test_parked_pod_waits_for_an_event_even_after_backoff(q: SchedulingQueue, clock: Clock) -> None:
    q.add("ns/a", "u")
    q.pop()
    q.park("ns/a")
    clock.now += 1000
    assert q.pop() is None
    assert q.next_due_at() is None


def test_woken_pod_still_waits_for_its_backoff(q: SchedulingQueue, clock: Clock) -> None:
    q.add("ns/a", "u")
    q.pop()
    q.park("ns/a")  # backoff 1 s
    assert q.wake(ClusterEvent.NODE_CHANGED) == 1
    assert q.pop() is None
    assert q.next_due_at() == pytest.approx(clock.now + 1.0)
    clock.now += 1.0
    assert q.pop() == "ns/a"


@pytest.mark.parametrize(
    ("event", "release_helps", "woken"),
    [
        pytest.param(ClusterEvent.POD_RELEASED, True, 1, id="release-helps-capacity-shortage"),
        pytest.param(ClusterEvent.POD_RELEASED, False, 0, id="release-cannot-fix-type-mismatch"),
        pytest.param(ClusterEvent.QUOTA_CHANGED, False, 0, id="quota-cannot-fix-type-mismatch"),
        pytest.param(ClusterEvent.NODE_CHANGED, False, 1, id="node-change-may-fix-anything"),
        pytest.param(ClusterEvent.INVENTORY_CHANGED, False, 1, id="inventory-change"),
        pytest.param(ClusterEvent.CONFIG_CHANGED, False, 1, id="config-change"),
    ],
)
def test_wake_only_pods_the_event_could_help(
    q: SchedulingQueue, event: ClusterEvent, release_helps: bool, woken: int
) -> None:
    q.add("ns/a", "u")
    q.pop()
    q.park("ns/a", release_helps=release_helps)
    assert q.wake(event) == woken
    assert q.parked_count == 1 - woken


def test_retry_later_comes_back_after_backoff_without_an_event(
    q: SchedulingQueue, clock: Clock
) -> None:
    q.add("ns/a", "u")
    q.pop()
    assert q.retry_later("ns/a") == 1.0
    assert q.pop() is None
    clock.now += 1.0
    assert q.pop() == "ns/a"


def test_removed_pod_is_never_popped(q: SchedulingQueue) -> None:
    q.add("ns/a", "u")
    q.remove("ns/a")
    assert q.pop() is None
    assert len(q) == 0


def test_wake_all_unparks_everything(q: SchedulingQueue, clock: Clock) -> None:
    for name in ("a", "b"):
        q.add(f"ns/{name}", name)
    for _ in range(2):
        key = q.pop()
        assert key is not None
        q.park(key, release_helps=False)
    assert q.wake_all() == 2
    clock.now += 1.0
    assert {q.pop(), q.pop()} == {"ns/a", "ns/b"}


def test_notify_is_called_when_something_may_be_due(clock: Clock) -> None:
    calls: list[int] = []
    q = SchedulingQueue(clock=clock, notify=lambda: calls.append(1))
    q.add("ns/a", "u")
    assert calls


def _diagnosis(*reasons: dict[Reason, int]) -> Diagnosis:
    return Diagnosis({f"n{i}": NodeFailure(r) for i, r in enumerate(reasons)}, len(reasons))


@pytest.mark.parametrize(
    ("diagnosis", "helps"),
    [
        pytest.param(_diagnosis({Reason.CARD_INSUFFICIENT_MEMORY: 2}), True, id="memory"),
        pytest.param(_diagnosis({Reason.CARD_TYPE_MISMATCH: 4}), False, id="type-mismatch"),
        pytest.param(
            _diagnosis({Reason.CARD_TYPE_MISMATCH: 4}, {Reason.CARD_INSUFFICIENT_CORE: 1}),
            True,
            id="one-node-could-free-up",
        ),
        pytest.param(Diagnosis({}, 0), False, id="no-nodes"),
        pytest.param(Diagnosis({}, 2, error="bad annotation"), False, id="error"),
    ],
)
def test_release_could_help(diagnosis: Diagnosis, helps: bool) -> None:
    assert release_could_help(diagnosis) is helps


def test_the_census_names_kube_schedulers_queues(q: SchedulingQueue, clock: Clock) -> None:
    """active: due now; backoff: waiting for its backoff; unschedulable: parked, with the
    reasons it was parked with; a pod being decided is in none."""
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
    # Woken before its backoff ends, the parked pod backs off; its reasons are gone.
    q.wake(ClusterEvent.NODE_CHANGED)
    census = q.census()
    assert census.pods == {"active": 1, "backoff": 2, "unschedulable": 0}
    assert census.unschedulable_reasons == {}
    clock.now += 2
    assert q.census().pods == {"active": 3, "backoff": 0, "unschedulable": 0}
