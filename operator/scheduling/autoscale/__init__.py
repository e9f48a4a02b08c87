"""Autoscaling: which nodes to add so that the pods waiting for this scheduler can run.

For the GPU pods that fit nowhere (preemption included), a what-if on an overlay of the books
(``overlay.Overlay``) with nodes that do not exist yet, one per instance type a NodePool
allows: the fewest nodes (then the cheapest, by the offering's price) on which the decision
cycle itself places every waiting pod, gangs whole (``gangs.decide_group``), in bounded time.
``catalogue``: instance types and NodePools as the engine reads them; ``hypothetical``: the
books' record of a node that may be added; ``whatif``: one trial of a set of nodes;
``search``: the set chosen (``assign``: every assignment, for a small queue).
``docs/autoscaling.md`` tells the whole story. The room sits above the gangs room and the
cycle (it decides on them); others use what ``__all__`` names.
"""

from vgpu_operator.scheduling.autoscale.catalogue import (
    InstanceType,
    NodeOption,
    NodePool,
    NodePoolError,
    Offering,
    options,
    read_node_pool,
)
from vgpu_operator.scheduling.autoscale.search import ScalePlan, SearchBudget, plan
from vgpu_operator.scheduling.autoscale.whatif import Slot, Unit

__all__ = [
    "InstanceType",
    "NodeOption",
    "NodePool",
    "NodePoolError",
    "Offering",
    "ScalePlan",
    "SearchBudget",
    "Slot",
    "Unit",
    "options",
    "plan",
    "read_node_pool",
]
