"""The defragmentation room: the fewest moves that free room for a pod waiting on
scattered shares (``defrag``), its vocabulary (``defrag_parts``) and the books as the
planner reads and changes them on an overlay (``defrag_books``). On top of the cycle.

Others use what ``__all__`` names.
"""

from vgpu_operator.scheduling.defrag.defrag import plan, plan_steps, recheck
from vgpu_operator.scheduling.defrag.defrag_books import DefragBooks, WhatIf
from vgpu_operator.scheduling.defrag.defrag_parts import (
    Move,
    Mover,
    Plan,
    PlanOptions,
    Report,
    controller_of,
    fragmentation,
    mover_of,
    replacement_pod,
    scheduler_written,
    stays_in_domain,
)

__all__ = [
    "DefragBooks",
    "Move",
    "Mover",
    "Plan",
    "PlanOptions",
    "Report",
    "WhatIf",
    "controller_of",
    "fragmentation",
    "mover_of",
    "plan",
    "plan_steps",
    "recheck",
    "replacement_pod",
    "scheduler_written",
    "stays_in_domain",
]
