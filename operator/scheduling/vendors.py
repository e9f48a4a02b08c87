"""The vendors the engine schedules, configured: names, requests and card preparation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vgpu_operator.config import DeviceConfig, VendorConfig
from vgpu_operator.devices import hygon, model, nvidia, vendor
from vgpu_operator.scheduling import mig


class Vendors:
    """NVIDIA and Hygon DCU with the current config; looked up by common word."""

    def __init__(self, config: DeviceConfig) -> None:
        self._config = config
        self._specs: dict[str, vendor.VendorSpec] = {
            nvidia.COMMON_WORD: nvidia.SPEC,
            hygon.COMMON_WORD: hygon.SPEC,
        }
        self._configs: dict[str, VendorConfig] = {
            nvidia.COMMON_WORD: config.nvidia,
            hygon.COMMON_WORD: config.hygon,
        }
        self._mig_tables = tuple(
            mig.KnownGeometries(
                entry.models,
                tuple(
                    tuple(model.MigTemplate(t.name, t.memory, t.core, t.count) for t in geometry)
                    for geometry in entry.allowed_geometries
                ),
            )
            for entry in config.nvidia.known_mig_geometries
        )

    def specs(self) -> list[vendor.VendorSpec]:
        return list(self._specs.values())

    def spec(self, common_word: str) -> vendor.VendorSpec:
        return self._specs[common_word]

    def config_for(self, common_word: str) -> VendorConfig:
        return self._configs[common_word]

    def memory_resources(self) -> dict[str, str]:
        return {w: c.resource_memory_name for w, c in self._configs.items()}

    def core_resources(self) -> dict[str, str]:
        return {w: c.resource_core_name for w, c in self._configs.items()}

    def memory_factors(self) -> dict[str, int]:
        return {w: c.effective_memory_factor for w, c in self._configs.items()}

    def allocated_keys(self) -> dict[str, str]:
        return {w: s.allocated_annotation for w, s in self._specs.items()}

    def requests(self, container: Mapping[str, Any]) -> dict[str, model.ContainerRequest]:
        """What one container asks of each vendor (vendors it does not ask are absent)."""
        out: dict[str, model.ContainerRequest] = {}
        for word, spec in self._specs.items():
            request = vendor.container_request(spec, self._configs[word], container)
            if request is not None:
                out[word] = request
        return out

    def mutate(self, common_word: str, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        """Admission defaults for one container; True if it asks this vendor for devices."""
        if common_word == nvidia.COMMON_WORD:
            return nvidia.mutate_container(self._config.nvidia, container, pod)
        return _mutate_plain(self._configs[common_word], container)

    def mig_geometries(self, card_type: str) -> tuple[model.Geometry, ...]:
        """The MIG geometries configured for a card model (none when it has no entry)."""
        return mig.geometries_for(card_type, self._mig_tables)

    def prepare_card(self, card: model.DeviceUsage) -> None:
        """Give a MIG card its geometry table before usage is booked on it."""
        if card.vendor == nvidia.COMMON_WORD and card.mode == model.MODE_MIG:
            mig.attach(card, self._mig_tables)


def _mutate_plain(config: VendorConfig, container: dict[str, Any]) -> bool:
    """A vendor without HAMi-core extras: only the default count is filled in."""
    limits = container.setdefault("resources", {}).setdefault("limits", {})
    if config.resource_count_name in limits:
        return True
    wanted = (config.resource_memory_name, config.resource_core_name)
    if config.default_gpu_num > 0 and any(n in limits for n in wanted if n):
        limits[config.resource_count_name] = config.default_gpu_num
        return True
    return vendor.has_resource(container, config.resource_count_name)
