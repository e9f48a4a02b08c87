"""The operator's long-lived objects kept out of the garbage collector's full passes.

After the first listing the books hold every node, card and pod of the cluster (165,000
Python objects at 1,000 nodes before any pod), nearly all of them alive until their
object leaves the cluster. CPython's full collection walks all of them whenever enough
new objects have survived: up to a quarter of a second each in the bench at 1,000 nodes,
every decision and Binding stopped meanwhile. So once the listing is in, the garbage is
collected and the survivors are frozen (``gc.freeze``): later full passes walk only
objects made since. Frozen objects are still freed by their reference counts when the
books let them go; a frozen cycle that becomes garbage waits for the next ``settle``
(each opening of the gate, after its listing), which unfreezes everything first.
"""

from __future__ import annotations

import gc
import time

import structlog

log = structlog.get_logger("vgpu_operator.heap")


def settle() -> int:
    """Collect what is garbage now (frozen objects included) and freeze the rest;
    returns the number of objects frozen."""
    started = time.perf_counter()
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("heap_settled", frozen=frozen, duration_s=round(time.perf_counter() - started, 3))
    return frozen
