"""The engine's entry point: ``ClusterState`` (see ``decision``) over ``ClusterBooks``
(see ``books``). Handlers and ``simulate`` import from here."""

from vgpu_operator.scheduling.books import (
    DEFAULT_NOMINATION_TIMEOUT_S,
    ClusterBooks,
    DeviceUsageRow,
)
from vgpu_operator.scheduling.decision import AdmissionResult, ClusterState, Decision
from vgpu_operator.scheduling.pod_key import PodKey, pod_key

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
