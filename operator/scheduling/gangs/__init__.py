"""The gangs room: the pods of an upstream PodGroup decided as one unit (``gangs``),
and a gang that fits only by preempting (``gang_preemption``). On top of the cycle.

Others use what ``__all__`` names.
"""

from vgpu_operator.scheduling.gangs.gangs import (
    INITIALLY_SCHEDULED,
    REASON_SCHEDULED,
    REASON_SCHEDULER_ERROR,
    REASON_UNSCHEDULABLE,
    GroupDecision,
    GroupEngine,
    GroupError,
    GroupSpec,
    decide_group,
    group_of,
    read_pod_group,
    refuse,
    release,
)

__all__ = [
    "INITIALLY_SCHEDULED",
    "REASON_SCHEDULED",
    "REASON_SCHEDULER_ERROR",
    "REASON_UNSCHEDULABLE",
    "GroupDecision",
    "GroupEngine",
    "GroupError",
    "GroupSpec",
    "decide_group",
    "group_of",
    "read_pod_group",
    "refuse",
    "release",
]
