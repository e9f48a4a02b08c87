"""The preemption room: kube-scheduler's DefaultPreemption rules as pure functions
over an abstract "does the preemptor fit with these pods removed" (``preemption``: priority,
eligible victims, the fewest victims, the node picked) and PodDisruptionBudgets as it reads
them (``disruption``).

The one candidate loop that calls these rules over the books, for every dialect, is in
the cycle (``cycle.preempting``: trials through the dialect's own fit, the victim search,
the nomination check). Others use what ``__all__`` names.
"""

from vgpu_operator.scheduling.preemption.disruption import (
    Budget,
    PodIdentity,
    blocking_budgets,
    covered,
    split_by_violation,
)
from vgpu_operator.scheduling.preemption.preemption import (
    Candidate,
    Occupant,
    Victims,
    Whole,
    blocked_message,
    candidate_limit,
    eligible,
    identity,
    pick_node,
    priority_of,
    select_victims,
    shielded_message,
    victims_key,
)

__all__ = [
    "Budget",
    "Candidate",
    "Occupant",
    "PodIdentity",
    "Victims",
    "Whole",
    "blocked_message",
    "blocking_budgets",
    "candidate_limit",
    "covered",
    "eligible",
    "identity",
    "pick_node",
    "priority_of",
    "select_victims",
    "shielded_message",
    "split_by_violation",
    "victims_key",
]
