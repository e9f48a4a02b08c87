"""The decision cycle: the engine's face (``cluster.ClusterState``) and one decision,
top to bottom (``decision.Cycle``). Here too: the pod read once (``pod_read``, ``shapes``),
the one node gate (``node_gate``), the node orders (``fragmentation_order``, the reference
walk), verdicts on pods that fit nowhere (``verdicts``, ``judged``, ``verdict_kin``), the
removal trial of preemption and defragmentation (``removal_trial``) and the annotation
path's Binding (``binding``).

The DRA dialect's own walk (``claim_decision``, ``claim_preemption``, ``claim_verdicts``)
sits here until one walk calls both dialects at fixed points (issue 45). Others use what
``__all__`` names.
"""

from vgpu_operator.scheduling.cycle.claim_decision import ClaimWrite
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.cycle.decision import Cycle, Decision, Settings
from vgpu_operator.scheduling.cycle.removal_trial import RemovalTrial

__all__ = ["ClaimWrite", "ClusterState", "Cycle", "Decision", "RemovalTrial", "Settings"]
