"""The policies room: how cards and nodes are ordered. GPU and node policies and
their scores (``policies``), topology-aware card choice (``topology``), fragmentation as
FGD measures it (``fragmentation``), stranded memory (``stranded``) and the node layer of
configuration, an administrator's Node annotations (``node_layer``).

Floor 1 of the engine: it imports no other room. Others use what ``__all__`` names.
"""

from vgpu_operator.scheduling.policies.fragmentation import (
    PRIOR,
    CardState,
    Classes,
    Klass,
    Measure,
    Need,
    Vector,
    WorkloadMix,
    card_order_key,
    klass_of,
    state_of,
)
from vgpu_operator.scheduling.policies.node_layer import EMPTY, NodeLayer, read
from vgpu_operator.scheduling.policies.policies import (
    ScoringWeights,
    card_score,
    card_sort_key,
    node_preference,
    node_score,
    normalize_gpu_policy,
    parse_scoring_weights,
    policy_has,
)
from vgpu_operator.scheduling.policies.stranded import CardRequest, offered, stranded_memory_mib
from vgpu_operator.scheduling.policies.topology import best_combination, worst_single_card

__all__ = [
    "EMPTY",
    "PRIOR",
    "CardRequest",
    "CardState",
    "Classes",
    "Klass",
    "Measure",
    "Need",
    "NodeLayer",
    "ScoringWeights",
    "Vector",
    "WorkloadMix",
    "best_combination",
    "card_order_key",
    "card_score",
    "card_sort_key",
    "klass_of",
    "node_preference",
    "node_score",
    "normalize_gpu_policy",
    "offered",
    "parse_scoring_weights",
    "policy_has",
    "read",
    "state_of",
    "stranded_memory_mib",
    "worst_single_card",
]
