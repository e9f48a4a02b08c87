"""heap: the collector off while the listing comes in; then what is alive is frozen,
and still freed by its reference counts."""

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
    gc.enable()


def test_the_collector_is_off_from_hold_to_settle() -> None:
    heap.hold()
    assert not gc.isenabled()
    heap.settle()
    assert gc.isenabled()


def test_settle_freezes_what_is_alive() -> None:
    kept = Card()
    frozen = heap.settle()
    assert frozen > 0
    assert not any(obj is kept for obj in gc.get_objects())  # no longer walked
    made_later = Card()
    assert any(obj is made_later for obj in gc.get_objects())


def test_a_frozen_object_is_still_freed_when_let_go() -> None:
    kept = Card()
    heap.settle()
    alive = weakref.ref(kept)
    del kept
    assert alive() is None


def test_refreeze_freezes_what_survived_since_and_collects_young_cycles_first() -> None:
    heap.settle()
    made_since = Card()
    cycle: list[object] = []
    cycle.append(cycle)  # young cyclic garbage: collected, not frozen for good
    ring = Card()
    ring.me = ring  # type: ignore[attr-defined]
    ring_ref = weakref.ref(ring)
    del cycle, ring
    before = gc.get_freeze_count()
    after = heap.refreeze()
    assert after > before
    assert not any(obj is made_since for obj in gc.get_objects())  # no longer walked
    assert ring_ref() is None  # the young collection freed the cycle before the freeze
