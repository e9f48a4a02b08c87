"""The Devices interface of seed 001: the 13 operations every vendor offers.

Names are HAMi's in Python style. Operations with side effects in HAMi (locking a
node, cleaning it up) return the annotation patch as data instead; handlers apply it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from vgpu_operator.devices import model
from vgpu_operator.devices.vendor import ResourceNames


@dataclass(frozen=True, slots=True)
class FitVerdict:
    """Fit's answer: the devices chosen, or HAMi's reason string (``"1/4 Reason, ..."``)."""

    ok: bool
    devices: model.ContainerDevices
    reason: str = ""


@runtime_checkable
class DeviceVendor(Protocol):
    def common_word(self) -> str:
        """The vendor's key in the registry and in pod device maps (``NVIDIA``, ``DCU``)."""

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        """Fill admission defaults in place; True when the container asks for devices."""

    def check_health(self, device_type: str, node: Mapping[str, Any]) -> tuple[bool, bool]:
        """(healthy, devices need re-reading) for a node, from its GPU count."""

    def node_cleanup(self, node_name: str) -> dict[str, str | None]:
        """The node annotation patch that forgets this vendor's handshake."""

    def resource_names(self) -> ResourceNames:
        """Count, memory, percentage and core resource names."""

    def node_devices(self, node: Mapping[str, Any]) -> list[model.DeviceInfo]:
        """The cards a node registers in its annotations (CodecError when malformed)."""

    def lock_node(
        self, node: Mapping[str, Any], pod: Mapping[str, Any], now: float
    ) -> dict[str, str]:
        """The node annotation patch that takes the node lock for a pod."""

    def release_node_lock(
        self, node: Mapping[str, Any], pod: Mapping[str, Any]
    ) -> dict[str, str | None]:
        """The patch that releases the lock if this pod holds it (empty otherwise)."""

    def resource_requests(self, container: Mapping[str, Any]) -> model.ContainerRequest | None:
        """What one container asks of this vendor, or None."""

    def patch_annotations(
        self, pod: Mapping[str, Any], annotations: dict[str, str], devices: model.PodDevices
    ) -> dict[str, str]:
        """Add this vendor's allocation annotations for a placed pod."""

    def score_node(
        self,
        node: Mapping[str, Any],
        devices: model.PodSingleDevice,
        previous: Sequence[model.DeviceUsage],
        policy: str,
    ) -> float:
        """A vendor-specific addition to the node score (HAMi's NVIDIA returns 0)."""

    def add_resource_usage(
        self, pod: Mapping[str, Any], card: model.DeviceUsage, device: model.ContainerDevice
    ) -> model.ContainerDevice:
        """Book a chosen device on its card; returns the device as actually booked."""

    def fit(
        self,
        cards: Sequence[model.DeviceUsage],
        request: model.ContainerRequest,
        pod: Mapping[str, Any],
        node: Mapping[str, Any],
        allocated: model.PodDevices,
    ) -> FitVerdict:
        """Choose cards for one container request, in HAMi's check order."""
