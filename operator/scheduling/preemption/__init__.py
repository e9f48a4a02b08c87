"""The preemption room: kube-scheduler's DefaultPreemption rules as pure functions
over an abstract "does the preemptor fit with these pods removed" (``preemption``: priority,
eligible victims, the fewest victims, the node picked) and PodDisruptionBudgets as it reads
them (``disruption``).

The candidate loops that call these rules are in the cycle (``cycle.decision`` for
annotation pods, ``cycle.claim_preemption`` for claims) until one walk serves both
(issue 45).
"""
