"""A group claim's writes before a member's Binding (issue 47 item 3, ``group_claims``): a
member whose group claim another member's decision is allocating writes nothing and waits
until the watch shows the allocation with the group in ``reservedFor``; it gives up when
that decision does; and a failed Binding never takes the group's claim back."""

from __future__ import annotations

import asyncio
from typing import Any

from unit.control.test_claim_binding import ALLOCATION, Books, Writer

from vgpu_operator.control.claim_binding import ClaimBinding
from vgpu_operator.scheduling.cycle import ClaimWrite

GROUP = {"apiGroup": "scheduling.k8s.io", "resource": "podgroups", "name": "train", "uid": "g"}


def awaiting() -> ClaimWrite:
    return ClaimWrite("ns", "c", "u", "7", None, GROUP, awaits_allocation=True)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0


def binding(books: Books, writer: Writer, clock: Clock, on_sleep: Any = None) -> ClaimBinding:
    async def sleep(seconds: float) -> None:
        clock.now += seconds
        if on_sleep is not None:
            on_sleep()

    return ClaimBinding(
        books, writer, other_allocator_seen=lambda: None, clock=lambda: clock.now, sleep=sleep
    )


def test_a_later_member_waits_for_the_groups_allocation_then_binds() -> None:
    books, writer, clock = Books(over=[]), Writer(), Clock()

    def allocation_lands() -> None:
        if clock.now >= 0.2:
            books.claims["ns/c"] = {
                "metadata": {"uid": "u", "resourceVersion": "8"},
                "status": {"allocation": ALLOCATION, "reservedFor": [GROUP]},
            }

    bound = binding(books, writer, clock, allocation_lands)
    assert asyncio.run(bound.reserve("ns/w1", "node", [awaiting()])) is None
    assert 0.2 <= clock.now < 1.0
    assert bound.writes == 0  # nothing written for it: the group is reserved already


def test_a_member_gives_up_when_the_allocating_decision_does() -> None:
    books, writer, clock = Books(over=[]), Writer(), Clock()
    bound = binding(books, writer, clock, lambda: books.claims.pop("ns/c", None))
    problem = asyncio.run(bound.reserve("ns/w1", "node", [awaiting()]))
    assert problem == "ResourceClaim ns/c is gone or was replaced"


def test_the_wait_is_bounded() -> None:
    books, writer, clock = Books(over=[]), Writer(), Clock()
    problem = asyncio.run(binding(books, writer, clock).reserve("ns/w1", "node", [awaiting()]))
    assert problem == "ResourceClaim ns/c: its allocation for the group did not come"


def test_a_failed_binding_leaves_the_groups_claim_allocated() -> None:
    writer = Writer()
    bound = binding(Books(over=[]), writer, Clock())
    allocated = ClaimWrite("ns", "c", "u", "7", ALLOCATION, GROUP)
    own = ClaimWrite("ns", "d", "v", "7", ALLOCATION, {"resource": "pods", "uid": "pod"})
    asyncio.run(bound.undo([allocated, own, awaiting()]))
    assert writer.released == [("ns/d", True)]
