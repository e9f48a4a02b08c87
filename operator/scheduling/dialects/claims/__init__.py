"""The claims dialect (DRA): a pod's ResourceClaims read for the engine
(``claims``), a node's cards read from its ResourceSlices (``dra_pool``), device taints and
DeviceTaintRules (``taint_rules``, ``claim_taints``), Fit of a pod's claims on one node
(``claim_fit``, with ``claim_variants`` and ``claim_best_fit``), MIG claims (``claim_mig``),
the allocation as written (``claim_wire``), which pods go to this scheduler
(``claim_routing``), the webhook's claim templates (``claim_admission``) and extended
resources backed by DRA (``extended_claims``).

The walk that places claims (``cycle.claim_decision``) is in the cycle until one walk
calls both dialects (issue 45).
"""
