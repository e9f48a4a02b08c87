"""The vendor table: every vendor the operator knows, in one place.

Every vendor list in the project (resource names for quotas, allocation annotation keys,
node annotations worth watching, admission mutations, card preparation, the sections of
``device-config.yaml``, the resource prefixes the Kueue check knows) is derived from this
table, and no vendor's word is written outside ``devices/`` (``hack/check_structure.py``
keeps it so). The engine receives the table (``ClusterState(..., vendor_table=...)``)
rather than building its own. Adding a vendor is a ``VendorSpec`` (a module beside ``nvidia``)
and one line here; see the README's "Adding a vendor".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from vgpu_operator import config
from vgpu_operator.devices import hygon, nvidia
from vgpu_operator.devices.vendor import VendorSpec

VENDOR_TABLE: Final[tuple[VendorSpec, ...]] = (nvidia.SPEC, hygon.SPEC)


def node_annotations(table: tuple[VendorSpec, ...] = VENDOR_TABLE) -> tuple[str, ...]:
    """The vendors' Node annotations the engine reads, in table order."""
    return tuple(key for spec in table for key in spec.node_annotations())


def vendor_sections(table: tuple[VendorSpec, ...] = VENDOR_TABLE) -> config.Sections:
    """Each vendor's section of ``device-config.yaml`` and the type that reads it."""
    return {spec.config_key: spec.config_type for spec in table}


def load_config(
    data: Mapping[str, Any] | None, table: tuple[VendorSpec, ...] = VENDOR_TABLE
) -> config.DeviceConfig:
    """A parsed device config, every vendor's section of the table checked; a bad value
    raises ``ConfigError`` naming its field (``nvidia.defaultCores``)."""
    return config.load_config(data, vendor_sections(table))


def load_config_yaml(
    text: str, table: tuple[VendorSpec, ...] = VENDOR_TABLE
) -> config.DeviceConfig:
    """``device-config.yaml`` text (YAML or JSON), read as ``load_config`` reads it."""
    return config.load_config_yaml(text, vendor_sections(table))


def resource_prefixes(table: tuple[VendorSpec, ...] = VENDOR_TABLE) -> tuple[str, ...]:
    """Where the vendors name their resources by default (``nvidia.com/``...), in table
    order: a pod that asks a resource under one asks some vendor for devices."""
    found: list[str] = []
    for spec in table:
        count = spec.config_type.model_validate({}).resource_count_name
        domain, slash, _ = count.partition("/")
        if slash and f"{domain}/" not in found:
            found.append(f"{domain}/")
    return tuple(found)


def annotation_domains(table: tuple[VendorSpec, ...] = VENDOR_TABLE) -> tuple[str, ...]:
    """The domains of the vendors' own pod annotations (card types, UUIDs, NUMA binding,
    modes: ``nvidia.com/``...), in table order."""
    found: list[str] = []
    for spec in table:
        keys = (
            spec.use_type_annotation,
            spec.nouse_type_annotation,
            spec.use_uuid_annotation,
            spec.nouse_uuid_annotation,
            spec.mode_annotation,
            spec.numa_bind_annotation,
        )
        for key in keys:
            domain, slash, _ = (key or "").partition("/")
            if slash and f"{domain}/" not in found:
                found.append(f"{domain}/")
    return tuple(found)
