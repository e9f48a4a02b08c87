"""The CEL room: DRA's device selectors evaluated as kube-scheduler evaluates them
(``claim_cel``, with Kubernetes' CEL library in ``cel_functions``), a selector's static
cost estimated as the API server estimates it (``claim_cel_cost``), and the shapes of
selector evaluated on the scheduling loop (``claim_cel_shapes``).

Floor 1 of the engine: it imports no other room. Others use what ``__all__`` names.
"""

from vgpu_operator.scheduling.cel.claim_cel import (
    CelPending,
    CelRefused,
    CelRuntimeError,
    CelTooCostly,
    DeviceView,
    Selector,
    SelectorCache,
    Verdict,
    shown,
)

__all__ = [
    "CelPending",
    "CelRefused",
    "CelRuntimeError",
    "CelTooCostly",
    "DeviceView",
    "Selector",
    "SelectorCache",
    "Verdict",
    "shown",
]
