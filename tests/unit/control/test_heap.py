"""heap.settle: garbage collected, the survivors frozen, frozen garbage freed next time."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from vgpu_operator.control import heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


@pytest.fixture(autouse=True)
def _unfrozen_after() -> Iterator[None]:
    yield
    gc.unfreeze()


def test_settle_freezes_the_survivors_and_frees_cycles() -> None:
    garbage = Node()
    gone = weakref.ref(garbage)
    del garbage
    kept = Node()
    frozen = heap.settle()
    assert gone() is None
    assert frozen == gc.get_freeze_count() > 0
    assert not any(obj is kept for obj in gc.get_objects())  # no longer walked

    held = weakref.ref(kept)
    del kept
    gc.collect()
    assert held() is not None  # a frozen cycle waits for the next settle
    heap.settle()
    assert held() is None
