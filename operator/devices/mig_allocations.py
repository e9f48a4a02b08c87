"""HAMi v2.10's ``hami.io/vgpu-mig-allocations``: the MIG instance of each allocated device.

A JSON list, one entry per MIG device of the pod, as HAMi v2.10's ``EncodeMigAllocations``
writes it (Go's ``encoding/json``: no spaces, fields in struct order)::

    [{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.10gb",
      "placement":{"start":6,"size":1}}]

``containerIndex`` and ``deviceIndex`` locate the device in the pod's allocation
(``hami.io/vgpu-devices-allocated``: init containers first); ``gpuUUID`` is the physical
card. HAMi's device plugin adds ``migUUID``, ``gpuInstanceID`` and ``computeInstanceID``
once the instance exists; they are read (all three or none, as HAMi requires) and not
needed here. Decoding follows HAMi's ``DecodeMigAllocations``: incomplete or duplicate
entries make the whole annotation unreadable.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from vgpu_operator import errors, names

FIELD: Final = names.MIG_ALLOCATIONS
_UINT32_MAX: Final = 2**32 - 1


@dataclass(frozen=True, slots=True)
class MigAllocation:
    """Which instance (profile and placement on the card) one allocated device is."""

    container_index: int
    device_index: int
    gpu_uuid: str
    profile: str
    start: int
    size: int


def encode(allocations: Iterable[MigAllocation]) -> str:
    """The annotation value; raises CodecError for an entry HAMi would refuse to read."""
    listed = list(allocations)
    for allocation in listed:
        _check(allocation)
    _check_unique(_keys(listed))
    out = []
    for allocation in listed:
        out.append(
            {
                "containerIndex": allocation.container_index,
                "deviceIndex": allocation.device_index,
                "gpuUUID": allocation.gpu_uuid,
                "profile": allocation.profile,
                "placement": {"start": allocation.start, "size": allocation.size},
            }
        )
    return json.dumps(out, separators=(",", ":"))


def decode(raw: str) -> list[MigAllocation]:
    """The entries of an annotation value ("" reads as none); raises CodecError."""
    if raw == "":
        return []
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise errors.CodecError(FIELD, f"not JSON: {exc.msg}", raw) from None
    if data is None:
        return []
    if not isinstance(data, list):
        raise errors.CodecError(FIELD, "must be a JSON list", raw)
    allocations = _from_wire(data)
    for allocation in allocations:
        _check(allocation)
    _check_unique(_keys(allocations))
    return allocations


def _from_wire(data: Sequence[Any]) -> list[MigAllocation]:
    out = []
    for position, entry in enumerate(data):
        if not isinstance(entry, Mapping):
            raise errors.CodecError(FIELD, f"entry {position} is not an object")
        fields = {str(k).lower(): v for k, v in entry.items()}
        placement = fields.get("placement") or {}
        if not isinstance(placement, Mapping):
            raise errors.CodecError(FIELD, f"entry {position}: placement is not an object")
        placement = {str(k).lower(): v for k, v in placement.items()}
        runtime = [fields.get(k) not in (None, "") for k in ("miguuid",)]
        runtime += [fields.get(k) is not None for k in ("gpuinstanceid", "computeinstanceid")]
        if any(runtime) and not all(runtime):
            raise errors.CodecError(FIELD, f"entry {position} has a partial runtime identity")
        out.append(
            MigAllocation(
                container_index=_integer(fields.get("containerindex"), position, -(2**63)),
                device_index=_integer(fields.get("deviceindex"), position, -(2**63)),
                gpu_uuid=_text(fields.get("gpuuuid"), position),
                profile=_text(fields.get("profile"), position),
                start=_integer(placement.get("start"), position, 0, _UINT32_MAX),
                size=_integer(placement.get("size"), position, 0, _UINT32_MAX),
            )
        )
    return out


def _keys(allocations: Iterable[MigAllocation]) -> list[tuple[int, int]]:
    return [(a.container_index, a.device_index) for a in allocations]


def _check(allocation: MigAllocation) -> None:
    if (
        allocation.container_index < 0
        or allocation.device_index < 0
        or not allocation.gpu_uuid
        or not allocation.profile
        or allocation.size == 0
    ):
        raise errors.CodecError(FIELD, f"MIG allocation {allocation} is incomplete")


def _check_unique(keys: Sequence[tuple[int, int]]) -> None:
    seen: set[tuple[int, int]] = set()
    for key in keys:
        if key in seen:
            raise errors.CodecError(
                FIELD, f"duplicate MIG allocation for container {key[0]} device {key[1]}"
            )
        seen.add(key)


def _integer(value: Any, position: int, low: int, high: int = 2**63 - 1) -> int:
    if value is None:
        return 0  # Go's zero value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise errors.CodecError(FIELD, f"entry {position}: {value!r} is not an integer")
    if isinstance(value, float) and not value.is_integer():
        raise errors.CodecError(FIELD, f"entry {position}: {value!r} is not an integer")
    number = int(value)
    if not low <= number <= high:
        raise errors.CodecError(FIELD, f"entry {position}: {number} is out of range")
    return number


def _text(value: Any, position: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise errors.CodecError(FIELD, f"entry {position}: {value!r} is not a string")
    return value
