"""Hygon DCU, the second vendor: same protocol, its own names, no MIG or topology."""

from __future__ import annotations

from typing import Final

from pydantic import Field

from vgpu_operator.config import VendorConfig
from vgpu_operator.devices import vendor

COMMON_WORD: Final = "DCU"
#: Where its resources are named (the Kueue check knows a device pod by it).
RESOURCE_PREFIX: Final = "hygon.com/"

# HAMi's Hygon keys, byte for byte (no link scores: no topology).
REGISTER_ANNOTATION: Final = "hami.io/node-dcu-register"
TO_ALLOCATE_ANNOTATION: Final = "hami.io/dcu-devices-to-allocate"
ALLOCATED_ANNOTATION: Final = "hami.io/dcu-devices-allocated"
USE_TYPE_ANNOTATION: Final = "hygon.com/use-dcutype"
NOUSE_TYPE_ANNOTATION: Final = "hygon.com/nouse-dcutype"
USE_UUID_ANNOTATION: Final = "hygon.com/use-gpuuuid"
NOUSE_UUID_ANNOTATION: Final = "hygon.com/nouse-gpuuuid"


class HygonConfig(VendorConfig):
    """The ``hygon`` section of ``device-config.yaml`` (HAMi's chart's keys and defaults)."""

    resource_count_name: str = Field(f"{RESOURCE_PREFIX}dcunum", alias="resourceCountName")
    resource_memory_name: str = Field(f"{RESOURCE_PREFIX}dcumem", alias="resourceMemoryName")
    resource_memory_percentage_name: str = Field("", alias="resourceMemoryPercentageName")
    resource_core_name: str = Field(f"{RESOURCE_PREFIX}dcucores", alias="resourceCoreName")


SPEC: Final = vendor.VendorSpec(
    common_word=COMMON_WORD,
    config_key="hygon",
    config_type=HygonConfig,
    type_marker="DCU",
    register_annotation=REGISTER_ANNOTATION,
    score_annotation=None,
    to_allocate_annotation=TO_ALLOCATE_ANNOTATION,
    allocated_annotation=ALLOCATED_ANNOTATION,
    use_type_annotation=USE_TYPE_ANNOTATION,
    nouse_type_annotation=NOUSE_TYPE_ANNOTATION,
    use_uuid_annotation=USE_UUID_ANNOTATION,
    nouse_uuid_annotation=NOUSE_UUID_ANNOTATION,
)
