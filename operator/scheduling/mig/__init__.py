"""The MIG room: which instance a container gets and what a card's instances occupy
(``mig``, the annotation path), partitionable devices and their shared counters
(``mig_partitions``, the DRA path), the two records of a pod's instances (``mig_records``)
and the churn replay that compares the engine's rule with upstream's (``mig_churn``).

Floor 1 of the engine: it imports no other room.
"""
