"""Autoscaling: which nodes to add so that the pods waiting for this scheduler can run.

For the GPU pods that fit nowhere (preemption included), a what-if on an overlay of the books
(``overlay.Overlay``) with nodes that do not exist yet, one per instance type a NodePool
allows: the fewest nodes (then the cheapest, by the offering's price) on which the decision
cycle itself places every waiting pod, gangs whole (``gangs.decide_group``), in bounded time.
``catalogue``: instance types and NodePools as the engine reads them; ``hypothetical``: the
books' record of a node that may be added; ``whatif``: one trial of a set of nodes;
``search``: the set chosen. ``docs/autoscaling.md`` tells the whole story.
"""
