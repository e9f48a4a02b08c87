"""The seed-001 Devices interface implemented for NVIDIA and Hygon over the engine.

The engine itself calls the pieces directly (``placement``, ``fit``); this adapter is the
vendor-shaped face of the same code, for callers that work vendor by vendor and for the
registry, so that a third vendor needs a ``VendorSpec`` and little else.
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from vgpu_operator import names
from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import codec, model, nvidia, vendor
from vgpu_operator.devices.protocol import FitVerdict
from vgpu_operator.devices.registry import VendorRegistry
from vgpu_operator.scheduling import fit, placement, policies
from vgpu_operator.scheduling.vendors import Vendors


class EngineVendor:
    """One vendor, configured, implementing ``devices.protocol.DeviceVendor``."""

    def __init__(self, spec: vendor.VendorSpec, vendors: Vendors) -> None:
        self._spec = spec
        self._vendors = vendors
        self._config = vendors.config_for(spec.common_word)
        self._trackers: dict[str, nvidia.GpuCountTracker] = {}

    def common_word(self) -> str:
        return self._spec.common_word

    def mutate_admission(self, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        return self._vendors.mutate(self._spec.common_word, container, pod)

    def check_health(self, device_type: str, node: Mapping[str, Any]) -> tuple[bool, bool]:
        name = (node.get("metadata") or {}).get("name", "")
        allocatable = ((node.get("status") or {}).get("allocatable") or {}).get(
            self._config.resource_count_name, 0
        )
        count = vendor.as_int_or_none(allocatable) or 0
        return self._trackers.setdefault(name, nvidia.GpuCountTracker()).observe(count)

    def node_cleanup(self, node_name: str) -> dict[str, str | None]:
        self._trackers.pop(node_name, None)
        return {names.NODE_HANDSHAKE: None}

    def resource_names(self) -> vendor.ResourceNames:
        return vendor.resource_names(self._config)

    def node_devices(self, node: Mapping[str, Any]) -> list[model.DeviceInfo]:
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        raw = annotations.get(self._spec.register_annotation)
        if not raw:
            return []
        return codec.decode_node_devices(
            raw, self._spec.register_annotation, self._spec.common_word
        )

    def lock_node(
        self, node: Mapping[str, Any], pod: Mapping[str, Any], now: float
    ) -> dict[str, str]:
        meta = pod.get("metadata") or {}
        stamp = datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {names.NODE_LOCK: f"{stamp},{meta.get('namespace', '')},{meta.get('name', '')}"}

    def release_node_lock(
        self, node: Mapping[str, Any], pod: Mapping[str, Any]
    ) -> dict[str, str | None]:
        held = ((node.get("metadata") or {}).get("annotations") or {}).get(names.NODE_LOCK)
        if held is None:
            return {}
        meta = pod.get("metadata") or {}
        parts = held.split(",")
        if len(parts) == 1 or parts[1:] == [meta.get("namespace", ""), meta.get("name", "")]:
            return {names.NODE_LOCK: None}
        return {}

    def resource_requests(self, container: Mapping[str, Any]) -> model.ContainerRequest | None:
        return vendor.container_request(self._spec, self._config, container)

    def patch_annotations(
        self, pod: Mapping[str, Any], annotations: dict[str, str], devices: model.PodDevices
    ) -> dict[str, str]:
        single = devices.get(self._spec.common_word)
        if single:
            value = codec.encode_pod_single_device(single, self._spec.to_allocate_annotation)
            annotations[self._spec.to_allocate_annotation] = value
            annotations[self._spec.allocated_annotation] = value
        return annotations

    def score_node(
        self,
        node: Mapping[str, Any],
        devices: model.PodSingleDevice,
        previous: Sequence[model.DeviceUsage],
        policy: str,
    ) -> float:
        return 0.0  # as HAMi's vendors: the node score comes from usage alone

    def add_resource_usage(
        self, pod: Mapping[str, Any], card: model.DeviceUsage, device: model.ContainerDevice
    ) -> model.ContainerDevice:
        return placement.add_usage(card, device.memory_mib, device.cores, self._spec.common_word)

    def fit(
        self,
        cards: Sequence[model.DeviceUsage],
        request: model.ContainerRequest,
        pod: Mapping[str, Any],
        node: Mapping[str, Any],
        allocated: model.PodDevices,
    ) -> FitVerdict:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        node_annotations = (node.get("metadata") or {}).get("annotations") or {}
        policy = policies.normalize_gpu_policy(
            annotations.get(
                names.GPU_SCHEDULER_POLICY,
                node_annotations.get(names.GPU_SCHEDULER_POLICY, "spread"),
            )
        )
        options = fit.FitOptions(
            spec=self._spec,
            annotations=annotations,
            policy=policy,
            numa_bind=vendor.numa_bind(self._spec, annotations),
            topology_aware=self._spec.supports_topology
            and policies.policy_has(policy, policies.TOPOLOGY),
            mutex=policies.policy_has(policy, policies.MUTEX),
            cordoned=frozenset(vendor.split_list(node_annotations.get(names.NODE_DEVICE_CORDON))),
        )
        result = fit.fit_container(cards, request, options)
        if result.ok:
            chosen = tuple(
                model.ContainerDevice(p.card.id, self._spec.common_word, p.memory_mib, p.cores)
                for p in result.picks
            )
            return FitVerdict(True, chosen)
        total = len(fit.visible_cards(self._spec, cards))
        reasons = Counter({r.value: n for r, n in result.reasons.items()})
        return FitVerdict(False, (), codec.format_fit_reasons(reasons, total))


def registry(config: DeviceConfig) -> VendorRegistry:
    """Both vendors, configured, in scan order."""
    vendors = Vendors(config)
    out = VendorRegistry()
    for spec in vendors.specs():
        out.register(EngineVendor(spec, vendors))
    return out
