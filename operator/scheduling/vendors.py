"""The vendor table, configured: what the engine asks of vendors, derived from the table.

The table (``devices.catalog.VENDOR_TABLE`` unless the caller injects another) says what
each vendor is; the device config says how it is set up. Nothing here names a vendor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vgpu_operator.config import DeviceConfig, VendorConfig
from vgpu_operator.devices import model, vendor
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.mig import mig
from vgpu_operator.wire import Container


@dataclass(frozen=True, slots=True)
class ContainerRead:
    """One container's device requests, each vendor's read once (``container_request``):
    what it asks of each vendor, why a vendor's request cannot be read, and what the
    engine will adjust in it (admission's warnings)."""

    requests: Mapping[str, model.ContainerRequest] = field(default_factory=dict)
    problems: Mapping[str, CodecError] = field(default_factory=dict)
    warnings: Mapping[str, str] = field(default_factory=dict)

    def checked(self) -> dict[str, model.ContainerRequest]:
        """The requests; raises the first vendor's CodecError if one cannot be read."""
        for problem in self.problems.values():
            raise problem
        return dict(self.requests)


#: A pod's containers as read: (init containers, app containers).
PodReads = tuple[tuple[ContainerRead, ...], tuple[ContainerRead, ...]]


class Vendors:
    """The table's vendors with the current config; looked up by common word."""

    def __init__(self, config: DeviceConfig, table: Sequence[vendor.VendorSpec]) -> None:
        self._table = tuple(table)
        self._specs = {spec.common_word: spec for spec in self._table}
        self._configs: dict[str, VendorConfig] = {
            spec.common_word: config.section(spec.config_key, spec.config_type)
            for spec in self._table
        }
        self._mig_tables = {
            spec.common_word: geometry_table(self._configs[spec.common_word])
            for spec in self._table
            if spec.supports_mig
        }

    @property
    def table(self) -> tuple[vendor.VendorSpec, ...]:
        return self._table

    def specs(self) -> list[vendor.VendorSpec]:
        return list(self._table)

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

    def requests(self, container: Container) -> dict[str, model.ContainerRequest]:
        """What one container asks of each vendor (vendors it does not ask are absent)."""
        out: dict[str, model.ContainerRequest] = {}
        for word, spec in self._specs.items():
            request = vendor.container_request(spec, self._configs[word], container)
            if request is not None:
                out[word] = request
        return out

    def read(self, container: Container) -> ContainerRead:
        """The container's requests, problems and warnings, each vendor read once."""
        requests: dict[str, model.ContainerRequest] = {}
        problems: dict[str, CodecError] = {}
        warnings: dict[str, str] = {}
        for word, spec in self._specs.items():
            config = self._configs[word]
            try:
                request = vendor.container_request(spec, config, container)
            except CodecError as exc:
                problems[word] = exc
                continue
            if request is None:
                continue
            requests[word] = request
            warning = vendor.request_warning(spec, config, container, request)
            if warning is not None:
                warnings[word] = warning
        return ContainerRead(requests, problems, warnings)

    def admission_problem(self, common_word: str, container: Container) -> str | None:
        """Why the webhook must refuse this container's request for a vendor, or None."""
        spec = self._specs[common_word]
        return vendor.admission_problem(spec, self._configs[common_word], container)

    def admission_warning(self, common_word: str, container: Container) -> str | None:
        """What the engine will adjust in this container's request, for the user to see."""
        spec = self._specs[common_word]
        return vendor.admission_warning(spec, self._configs[common_word], container)

    def mutate(self, common_word: str, container: dict[str, Any], pod: dict[str, Any]) -> bool:
        """Admission defaults for one container; True if it asks this vendor for devices."""
        return self._specs[common_word].mutate(self._configs[common_word], container, pod)

    def mig_geometries(self, card: model.DeviceInfo) -> tuple[model.Geometry, ...]:
        """The MIG geometries configured for a card's model (none when it has no entry)."""
        return mig.geometries_for(card.type, self._mig_tables.get(card.vendor, ()))

    def mig_table(self, card: model.DeviceInfo) -> mig.MigTable | None:
        """What names a MIG card's instances (its published profiles, else its model's
        geometries); None for a card not in MIG mode or of a vendor without MIG."""
        if card.mode != model.MODE_MIG or card.vendor not in self._mig_tables:
            return None
        return mig.MigTable(self.mig_geometries(card), card.mig_profiles)

    def prepare_card(
        self, card: model.DeviceUsage, profiles: Sequence[model.MigProfile] = ()
    ) -> None:
        """Give a MIG card what names its instances (``profiles`` it publishes, else its
        model's geometries) before usage is booked on it."""
        table = self._mig_tables.get(card.vendor)
        if table is not None and card.mode == model.MODE_MIG:
            mig.attach(card, table, profiles)


def geometry_table(config: VendorConfig) -> tuple[mig.KnownGeometries, ...]:
    """A vendor section's ``knownMigGeometries`` as the MIG rules read them (the
    scheduler's and the node agent's one reading)."""
    return tuple(
        mig.KnownGeometries(
            entry.models,
            tuple(
                tuple(model.MigTemplate(t.name, t.memory, t.core, t.count) for t in geometry)
                for geometry in entry.allowed_geometries
            ),
        )
        for entry in config.known_mig_geometries
    )
