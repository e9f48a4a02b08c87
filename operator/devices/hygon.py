"""Hygon DCU, the second vendor: same protocol, its own names, no MIG or topology."""

from __future__ import annotations

from typing import Final

from vgpu_operator import names
from vgpu_operator.config import HygonConfig
from vgpu_operator.devices import vendor

COMMON_WORD: Final = "DCU"

SPEC: Final = vendor.VendorSpec(
    common_word=COMMON_WORD,
    config_key="hygon",
    config_type=HygonConfig,
    type_marker="DCU",
    register_annotation=names.NODE_HYGON_REGISTER,
    score_annotation=None,
    to_allocate_annotation=names.HYGON_DEVICES_TO_ALLOCATE,
    allocated_annotation=names.HYGON_DEVICES_ALLOCATED,
    use_type_annotation=names.HYGON_USE_TYPE,
    nouse_type_annotation=names.HYGON_NOUSE_TYPE,
    use_uuid_annotation=names.HYGON_USE_UUID,
    nouse_uuid_annotation=names.HYGON_NOUSE_UUID,
)
