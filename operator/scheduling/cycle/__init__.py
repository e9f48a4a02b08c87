"""The decision cycle: the engine's face (``cluster.ClusterState``) and one decision,
top to bottom (``decision.Cycle``), for every dialect through one walk. Here: the pod
read once (``pod_read``, ``shapes``), the dialects as plugins (``plugin``: the interface;
``annotation_plugin``, ``claims_plugin``, and what each frees for a trial:
``annotation_freeing``, ``claims_freeing``), the one walk and the diagnosis (``walk``),
the one node gate (``node_gate``), the node orders (``fragmentation_order``,
``reference_walk``), verdicts on pods that fit nowhere (``verdicts``, ``judged``,
``verdict_kin``), preemption over the books (``preempting``: trials, the candidate loop,
the nomination check) and the annotation dialect's Binding (``binding``). Others use what
``__all__`` names.
"""

from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.cycle.decision import Cycle, Decision, Settings
from vgpu_operator.scheduling.cycle.preempting import Trial
from vgpu_operator.scheduling.dialects.claims.claim_wire import ClaimWrite

__all__ = ["ClaimWrite", "ClusterState", "Cycle", "Decision", "Settings", "Trial"]
