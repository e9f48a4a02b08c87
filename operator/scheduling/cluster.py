"""The engine's entry point: ``ClusterState`` (see ``decision``) over ``ClusterBooks``
(see ``books``). Handlers and ``simulate`` import from here."""

from vgpu_operator.scheduling.books import (
    DEFAULT_NOMINATION_TIMEOUT_S,
    ClusterBooks,
    DeviceUsageRow,
    PodKey,
    pod_key,
)
from vgpu_operator.scheduling.decision import AdmissionResult, ClusterState, Decision

__all__ = [
    "DEFAULT_NOMINATION_TIMEOUT_S",
    "AdmissionResult",
    "ClusterBooks",
    "ClusterState",
    "Decision",
    "DeviceUsageRow",
    "PodKey",
    "pod_key",
]
