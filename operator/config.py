"""The device configuration (the ``device-config.yaml`` of the operator's ConfigMap).

Keys and defaults follow HAMi's chart (seed 003 §2.3, §4.1), so an existing HAMi
``device-config.yaml`` is accepted as it is; sections for vendors we do not implement
are ignored. Precedence when a pod is scheduled: pod annotation > node annotation or
per-node entry > this global config.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vgpu_operator.errors import ConfigError

#: The policy vocabulary, here once: node policies, and the GPU policy tokens (a GPU
#: policy is one token or HAMi v2.10's comma chain of them).
BINPACK: Final = "binpack"
SPREAD: Final = "spread"
TOPOLOGY: Final = "topology-aware"
MUTEX: Final = "mutex"
NUMA: Final = "numa"
#: Not a HAMi value: place where fragmentation rises least
#: (``scheduling/policies/fragmentation.py``).
FRAGMENTATION: Final = "fragmentation"
NODE_POLICIES: Final = (BINPACK, SPREAD, FRAGMENTATION)
GPU_POLICY_TOKENS: Final = (BINPACK, SPREAD, TOPOLOGY, MUTEX, NUMA, FRAGMENTATION)
CORE_POLICIES: Final = ("default", "force", "disable")


class _Section(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


class MigTemplateConfig(_Section):
    name: str
    memory: int = Field(ge=0)
    core: int = Field(ge=0, le=100)
    count: int = Field(ge=1)


class MigGeometryConfig(_Section):
    """One ``knownMigGeometries`` entry: card models and the geometries they allow."""

    models: tuple[str, ...] = Field(min_length=1)
    allowed_geometries: tuple[tuple[MigTemplateConfig, ...], ...] = Field(
        alias="allowedGeometries", min_length=1
    )


class VendorConfig(_Section):
    """Resource names and defaults shared by every vendor section. Each vendor's own
    section type (in ``devices/``, its row of the vendor table) names its resources."""

    resource_count_name: str = Field(alias="resourceCountName")
    resource_memory_name: str = Field(alias="resourceMemoryName")
    resource_memory_percentage_name: str = Field("", alias="resourceMemoryPercentageName")
    resource_core_name: str = Field(alias="resourceCoreName")
    resource_priority_name: str = Field("", alias="resourcePriorityName")
    default_memory: int = Field(0, alias="defaultMemory", ge=0)
    default_cores: int = Field(0, alias="defaultCores", ge=0, le=100)
    default_gpu_num: int = Field(1, alias="defaultGPUNum", ge=0)
    memory_factor: int = Field(1, alias="memoryFactor", ge=0)
    device_split_count: int = Field(10, alias="deviceSplitCount", ge=1)
    device_memory_scaling: float = Field(1.0, alias="deviceMemoryScaling", gt=0)
    device_core_scaling: float = Field(1.0, alias="deviceCoreScaling", gt=0)
    #: Only vendors whose spec supports MIG read it (NVIDIA).
    known_mig_geometries: tuple[MigGeometryConfig, ...] = Field((), alias="knownMigGeometries")

    @property
    def effective_memory_factor(self) -> int:
        """HAMi reads a memoryFactor of 0 as 1."""
        return max(self.memory_factor, 1)


class SchedulerConfig(_Section):
    node_scheduler_policy: Literal["binpack", "spread", "fragmentation"] = Field(
        "binpack", alias="nodeSchedulerPolicy"
    )
    gpu_scheduler_policy: str = Field("spread", alias="gpuSchedulerPolicy")
    scheduler_name: str = Field("vgpu-scheduler", alias="schedulerName", min_length=1)
    #: Not a HAMi key. Other schedulers whose pods' allocations the books count and the
    #: device plugin serves, where an administrator opts in (HAMi's own scheduler, during a
    #: migration: manifests/hami-scheduler-opt-in.yaml). Pods of any other scheduler hold
    #: nothing here, whatever their annotations say.
    trusted_scheduler_names: tuple[str, ...] = Field((), alias="trustedSchedulerNames")

    def trusted_names(self) -> frozenset[str]:
        """The schedulers whose placements are believed: this one and the opted-in."""
        return frozenset((self.scheduler_name, *self.trusted_scheduler_names))

    @field_validator("gpu_scheduler_policy")
    @classmethod
    def _known_gpu_policy(cls, value: str) -> str:
        parse_gpu_policy(value)
        return value


class DraConfig(_Section):
    """Not a HAMi key. The DRA path's settings."""

    #: Namespaces whose HAMi-style GPU pods the webhook turns into ResourceClaims (their
    #: pods then run on nodes on the DRA path only); ``"*"``: every namespace.
    claim_namespaces: tuple[str, ...] = Field((), alias="claimNamespaces")

    def converts(self, namespace: str) -> bool:
        return "*" in self.claim_namespaces or namespace in self.claim_namespaces


class FilterDevices(_Section):
    uuid: tuple[str, ...] = ()
    index: tuple[int, ...] = ()


class NodeOverride(_Section):
    """A ``nodeconfig`` entry: per-node device-plugin settings (HAMi's lower-case keys)."""

    name: str = Field(min_length=1)
    operating_mode: str | None = Field(None, alias="operatingmode")
    mig_strategy: str | None = Field(None, alias="migstrategy")
    device_split_count: int | None = Field(None, alias="devicesplitcount", ge=1)
    device_memory_scaling: float | None = Field(None, alias="devicememoryscaling", gt=0)
    device_core_scaling: float | None = Field(None, alias="devicecorescaling", gt=0)
    filter_devices: FilterDevices = Field(FilterDevices(), alias="filterdevices")


class DeviceConfig(_Section):
    """The whole file. Each vendor's section is kept as given and read with its spec's
    config type (``section``), so a vendor added to the table needs no field here;
    ``devices.catalog.load_config`` checks every vendor's section when the file is read."""

    model_config = ConfigDict(populate_by_name=True, extra="allow", frozen=True)

    scheduler: SchedulerConfig = SchedulerConfig()
    node_config: tuple[NodeOverride, ...] = Field((), alias="nodeconfig")
    dra: DraConfig = DraConfig()

    def section(self, key: str, config_type: type[VendorConfig]) -> VendorConfig:
        """A vendor's section: the typed field when there is one, else the raw section
        (or the defaults) validated as ``config_type``; a bad value names its field."""
        declared = getattr(self, key, None) if key in type(self).model_fields else None
        if isinstance(declared, VendorConfig):
            return declared
        raw = (self.model_extra or {}).get(key) or {}
        try:
            return config_type.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ConfigError(_field_path((key, *first["loc"])), first["msg"]) from exc

    def node_override(self, node_name: str) -> NodeOverride | None:
        for entry in self.node_config:
            if entry.name == node_name:
                return entry
        return None


@functools.lru_cache(maxsize=256)
def parse_gpu_policy(value: str) -> tuple[str, ...]:
    """Split a GPU policy (a name or HAMi v2.10's comma chain) into known tokens.

    Cached: the engine asks for the same few policy strings on every node and card, and
    each distinct string is parsed once (a bad one raises every time: errors are not
    cached)."""
    tokens = tuple(t.strip() for t in value.split(",") if t.strip())
    for token in tokens:
        if token not in GPU_POLICY_TOKENS:
            raise ValueError(
                f"unknown GPU scheduler policy {token!r} (known: {', '.join(GPU_POLICY_TOKENS)})"
            )
    return tokens


def _field_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "<root>"


#: The vendors' section types by key (``devices.catalog.vendor_sections``).
Sections = Mapping[str, type[VendorConfig]]


def load_config(data: Mapping[str, Any] | None, sections: Sections | None = None) -> DeviceConfig:
    """Validate a parsed device config, the vendor ``sections`` named included (the whole
    table's: ``devices.catalog.load_config``); a bad value raises ConfigError naming its
    field."""
    try:
        config = DeviceConfig.model_validate(dict(data or {}))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(_field_path(first["loc"]), first["msg"]) from exc
    for key, config_type in (sections or {}).items():
        config.section(key, config_type)
    return config


def load_config_yaml(text: str, sections: Sections | None = None) -> DeviceConfig:
    """Parse ``device-config.yaml`` text (YAML or JSON); ``sections`` as in ``load_config``."""
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise ConfigError("device-config.yaml", f"not valid YAML: {exc}") from exc
    if data is not None and not isinstance(data, Mapping):
        raise ConfigError("device-config.yaml", "must be a mapping of sections")
    return load_config(data, sections)
