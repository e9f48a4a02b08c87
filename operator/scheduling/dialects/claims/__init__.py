"""The claims dialect (DRA): a pod's ResourceClaims read for the engine
(``claims``), a node's cards read from its ResourceSlices (``dra_pool``), device taints and
DeviceTaintRules (``taint_rules``, ``claim_taints``), Fit of a pod's claims on one node
(``claim_fit``, with ``claim_variants`` and ``claim_best_fit``), MIG claims (``claim_mig``),
the allocation as written (``claim_wire``), which pods go to this scheduler
(``claim_routing``), the webhook's claim templates (``claim_admission``) and extended
resources backed by DRA (``extended_claims``), and what a claim's opaque configs of this
driver say (``claim_configs``: ``hamiCore``).

The cycle calls this dialect at fixed points (``cycle.claims_plugin``: its request, node
order, fit on one node, what a victim's removal frees, its reservation), as it calls the
annotation dialect, through one walk. Others use what ``__all__`` names.
"""

from vgpu_operator.scheduling.dialects.claims.claim_admission import (
    MANAGED_BY,
    Unmappable,
    convert,
    made_by_webhook,
    same_template,
)
from vgpu_operator.scheduling.dialects.claims.claim_best_fit import Want, tightest_first
from vgpu_operator.scheduling.dialects.claims.claim_configs import (
    CONFIG_HAMI_CORE,
    hami_core_problem,
    turn_hami_core_off,
)
from vgpu_operator.scheduling.dialects.claims.claim_fit import ClaimsOutcome, DevicePick, fit_claims
from vgpu_operator.scheduling.dialects.claims.claim_mig import (
    MigNode,
    fit_mig_claims,
    held_memory_mib,
    is_mig,
    read_mig_node,
)
from vgpu_operator.scheduling.dialects.claims.claim_routing import (
    CLAIM,
    MAX_CLAIM_READS,
    OUR_CLASSES,
    Action,
    ClaimRef,
    Routing,
    asks_our_classes,
    claim_refs,
    route,
    settled_without_reading,
    too_many,
)
from vgpu_operator.scheduling.dialects.claims.claim_wire import allocation, consumer
from vgpu_operator.scheduling.dialects.claims.claims import (
    AllocatedShare,
    Claim,
    DeviceClass,
    PodClaims,
    Refusal,
    Request,
    Waiting,
    read_allocated,
    read_pod_claims,
    uses_claims,
)
from vgpu_operator.scheduling.dialects.claims.dra_pool import Pool, pair_scores, read_pool
from vgpu_operator.scheduling.dialects.claims.extended_claims import (
    Special,
    asks,
    mapping,
    special,
    with_special,
    without_extended,
)
from vgpu_operator.scheduling.dialects.claims.taint_rules import TaintRule, read_rule, tainted_slice

__all__ = [
    "CLAIM",
    "CONFIG_HAMI_CORE",
    "MANAGED_BY",
    "MAX_CLAIM_READS",
    "OUR_CLASSES",
    "Action",
    "AllocatedShare",
    "Claim",
    "ClaimRef",
    "ClaimsOutcome",
    "DeviceClass",
    "DevicePick",
    "MigNode",
    "PodClaims",
    "Pool",
    "Refusal",
    "Request",
    "Routing",
    "Special",
    "TaintRule",
    "Unmappable",
    "Waiting",
    "Want",
    "allocation",
    "asks",
    "asks_our_classes",
    "claim_refs",
    "consumer",
    "convert",
    "fit_claims",
    "fit_mig_claims",
    "hami_core_problem",
    "held_memory_mib",
    "is_mig",
    "made_by_webhook",
    "mapping",
    "pair_scores",
    "read_allocated",
    "read_mig_node",
    "read_pod_claims",
    "read_pool",
    "read_rule",
    "route",
    "same_template",
    "settled_without_reading",
    "special",
    "tainted_slice",
    "tightest_first",
    "too_many",
    "turn_hami_core_off",
    "uses_claims",
    "with_special",
    "without_extended",
]
