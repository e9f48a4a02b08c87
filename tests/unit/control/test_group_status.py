"""A PodGroup's condition writes: one in flight per group, the newest written last."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from vgpu_operator.control.group_status import GroupConditionWrites


def test_a_newer_condition_is_written_after_the_one_in_flight_never_before() -> None:
    async def scenario() -> list[tuple[str, object]]:
        written: list[tuple[str, object]] = []
        release = asyncio.Event()

        async def slow_write(group: str, condition: Mapping[str, object]) -> None:
            if condition["message"] == "first":
                await release.wait()  # the first write is slow to land
            written.append((group, condition["message"]))

        writes = GroupConditionWrites(slow_write)
        first = asyncio.create_task(writes("ns/g", {"message": "first"}))
        await asyncio.sleep(0)
        # Two more while the first is in flight: only the newest of them is written.
        await writes("ns/g", {"message": "second"})
        await writes("ns/g", {"message": "third"})
        # Another group is not held up by this one's slow write.
        await writes("ns/other", {"message": "elsewhere"})
        release.set()
        await first
        return written

    assert asyncio.run(scenario()) == [
        ("ns/other", "elsewhere"),
        ("ns/g", "first"),
        ("ns/g", "third"),
    ]
