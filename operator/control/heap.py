"""The operator's long-lived objects kept out of the garbage collector's full passes.

After the first listing the books hold every node, card and pod of the cluster (165,000
Python objects at 1,000 nodes before any pod, 383,000 with 10,000 pods), nearly all of
them alive until their object leaves the cluster. CPython's full collection walks all of
them whenever enough new objects have survived: up to a quarter of a second each in the
bench at 1,000 nodes without pods, 0.8 s with 10,000, every decision and Binding stopped
meanwhile. So once the listing is in, they are frozen (``gc.freeze``): later full passes
walk only objects made since.

While the first listing comes in, the collector is off (``hold``): a heap growing from
nothing to 383,000 objects set off one full pass after another, each walking all that
was listed so far (with 10,000 pods the first bind after a start came 2.3 s later than
with the collector off: 10.4 against 8.1 s, three starts each). Nothing is collected
before the freeze either: that one pass would cost the same 0.8 s on the way to the
first bind. The books hold no reference cycles (dropping them leaves the collector
nothing to find), so frozen objects are freed by their reference counts when the books
let them go; only cyclic garbage that exists at the moment of freezing is kept for good,
a small amount left over from the start.

Under churn the objects made since (new pods' entries, rebuilt cards) grow back into a
heap that full passes walk. Defragmentation's planning, which makes many short-lived
objects, set those passes off in the middle of its steps (``docs/benchmarks.md``), so
the runner freezes again before each planning round (``refreeze``): a young collection
first (cheap: only objects made since the last one), so that the cyclic garbage frozen
for good is at most what has survived two collections.
"""

from __future__ import annotations

import gc

import structlog

log = structlog.get_logger("vgpu_operator.heap")


def hold() -> None:
    """Stop automatic collection until ``settle`` (the first listing is coming)."""
    gc.disable()


def settle() -> int:
    """Freeze every object alive now and collect automatically again; returns the
    number of objects frozen in all."""
    gc.freeze()
    gc.enable()
    frozen = gc.get_freeze_count()
    log.info("heap_settled", frozen=frozen)
    return frozen


def refreeze() -> int:
    """Freeze what survived since the last freeze, after a collection of the young
    generations; returns the number of objects frozen in all."""
    gc.collect(1)
    gc.freeze()
    return gc.get_freeze_count()
