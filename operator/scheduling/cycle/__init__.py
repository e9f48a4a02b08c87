"""The decision cycle: the engine's face (``cluster.ClusterState``) and one decision,
top to bottom (``decision.Cycle``). Here too: the pod read once (``pod_read``, ``shapes``),
the one node gate (``node_gate``), the node orders (``fragmentation_order``, the reference
walk), verdicts on pods that fit nowhere (``verdicts``, ``judged``, ``verdict_kin``), the
removal trial of preemption and defragmentation (``removal_trial``) and the annotation
path's Binding (``binding``).

The DRA dialect's own walk (``claim_decision``, ``claim_preemption``, ``claim_verdicts``)
sits here until one walk calls both dialects at fixed points (issue 45).
"""
