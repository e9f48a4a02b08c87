"""heap.settle: the objects alive are frozen, and still freed by their reference counts."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from vgpu_operator.control import heap


class Card:
    """Stands for an object the books hold."""


@pytest.fixture(autouse=True)
def _unfrozen_after() -> Iterator[None]:
    yield
    gc.unfreeze()


def test_settle_freezes_what_is_alive() -> None:
    kept = Card()
    frozen = heap.settle()
    assert frozen == gc.get_freeze_count() > 0
    assert not any(obj is kept for obj in gc.get_objects())  # no longer walked
    made_later = Card()
    assert any(obj is made_later for obj in gc.get_objects())


def test_a_frozen_object_is_still_freed_when_let_go() -> None:
    kept = Card()
    heap.settle()
    alive = weakref.ref(kept)
    del kept
    assert alive() is None
