"""Health rules of the agent: which XIDs matter, and what a change in the GPU count means.

Pure functions; the NVML reader and the agent loop apply them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final

from vgpu_operator import dra_shapes
from vgpu_operator.agent.readings import GpuReading

# Why a card is unhealthy, and which reasons say it is lost: defined with the slices whose
# taints they choose (``dra_shapes``), used here by the readers.
DISAPPEARED_REASON: Final = dra_shapes.DISAPPEARED_REASON
OFF_THE_BUS_REASON: Final = dra_shapes.OFF_THE_BUS_REASON
LOST_REASONS: Final = dra_shapes.LOST_REASONS
is_lost = dra_shapes.is_lost

#: XIDs HAMi's device plugin treats as application errors, not card failures
#: (hami-semantics / control-plane §7.4): 13 graphics engine exception, 31 memory page
#: fault, 43 stopped channel, 45 preemptive cleanup, 68 video decoder exception, 109
#: context switch timeout.
IGNORED_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})


def is_critical_xid(xid: int) -> bool:
    """A critical-XID event that should take the card out of service."""
    return xid not in IGNORED_XIDS


@dataclass(frozen=True, slots=True)
class CountCheck:
    """The outcome of comparing the GPU count with the last one reported."""

    healthy: bool
    refresh: bool
    reported: int


def check_gpu_count(reported: int, current: int) -> CountCheck:
    """Seed 000 §9, applied to what the agent itself sees.

    ============  =========  =======================================================
    current       reported   outcome
    ============  =========  =======================================================
    0             0          healthy, nothing to refresh (waiting for devices)
    0             > 0        unhealthy: every GPU vanished; remember 0
    > 0           != current healthy, refresh the device readings; remember current
    > 0           = current  healthy, nothing to refresh
    ============  =========  =======================================================
    """
    if current == 0:
        return CountCheck(healthy=reported == 0, refresh=False, reported=0)
    if current != reported:
        return CountCheck(healthy=True, refresh=True, reported=current)
    return CountCheck(healthy=True, refresh=False, reported=current)


def carry_disappeared(
    present: Iterable[GpuReading], last_seen: Mapping[str, GpuReading]
) -> tuple[GpuReading, ...]:
    """The cards read now plus, marked unhealthy, the cards seen before but gone now.

    A card that falls off the bus must not vanish silently from the inventory: pods may
    still hold it, and the scheduler must see it as unhealthy rather than unknown.
    Result order: present cards in reading order, then the vanished ones by old index.
    """
    now = tuple(present)
    seen_now = {gpu.uuid for gpu in now}
    gone = sorted(
        (gpu for uuid, gpu in last_seen.items() if uuid not in seen_now),
        key=lambda gpu: (gpu.index, gpu.uuid),
    )
    # Unlike other reasons, a loss replaces an earlier one: the card is gone whatever
    # made it sick before, and that is what the cluster must act on.
    return now + tuple(
        replace(gpu, healthy=False, health_reason=DISAPPEARED_REASON, present=False) for gpu in gone
    )
