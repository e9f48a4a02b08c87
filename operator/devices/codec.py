"""HAMi's annotation wire formats, both directions, and nothing else.

Every decoder here is total over strings: malformed input raises ``errors.CodecError``
whose ``field`` is the annotation key (or the wire field) it came from, never a bare
``ValueError``/``KeyError``/``IndexError``/``TypeError`` or a ``json`` error. Encoders
refuse values their decoder could not read back, so ``decode(encode(x)) == x`` holds for
everything an encoder accepts.

Formats (hami-semantics.md §4.1, §11, §12.1; seed 001 §4 and §6):

* node register: a JSON list of cards, or the legacy colon form
  ``id,count,devmem,devcore,type,numa,health,index,mode:`` (7 fields in the oldest form);
* pair scores: ``[{"uuid": ..., "score": {peer: n}}]``;
* pod devices: ``uuid,type,usedmem,usedcores:`` per device, ``;`` after every container;
* seed-form MIG UUIDs ``GPU-x[geometry-slot]``; Unix-seconds times; the bind phase;
* the ``"n/m Reason"`` text of HAMi's ``GenReason``;
* Kubernetes quantities that must be whole numbers (quota limits, resource values).

JSON is read the way Go's ``encoding/json`` reads it into HAMi's structs: object keys
match field names case-insensitively, ``null`` leaves a field at its zero value, unknown
keys are ignored, and numbers must be integers in the Go field's range.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from vgpu_operator import errors, names
from vgpu_operator.devices import go_wire, model, nvidia, quantity

# Separators of the colon forms (HAMi's OneContainerMultiDeviceSplitSymbol and
# OnePodMultiContainerSplitSymbol); ',' separates the fields of one entry.
DEVICE_SEPARATOR: Final = ":"
CONTAINER_SEPARATOR: Final = ";"
FIELD_SEPARATOR: Final = ","

_LEGACY_FIELDS_OLD: Final = 7
_LEGACY_FIELDS: Final = 9
_POD_DEVICE_MIN_FIELDS: Final = 4

_MIG_UUID_RE: Final = re.compile(r"([^\[\]]+)\[([0-9]+)-([0-9]+)\]")


class BindPhase(enum.StrEnum):
    """Values of ``hami.io/bind-phase``: the scheduler writes ``allocating`` in Bind, the
    device plugin ``success`` or ``failed`` once it has (not) mounted the devices."""

    ALLOCATING = "allocating"
    SUCCESS = "success"
    FAILED = "failed"


# --- node register: hami.io/node-nvidia-register ---------------------------------------

_DEVICE_JSON_FIELDS: Final = (
    "id",
    "index",
    "count",
    "devmem",
    "devcore",
    "type",
    "numa",
    "mode",
    "migProfiles",
    "health",
)


def decode_node_devices(
    value: str, field: str = nvidia.REGISTER_ANNOTATION, vendor: str = "NVIDIA"
) -> list[model.DeviceInfo]:
    """Decode a node's register annotation, JSON or legacy colon form.

    The form is chosen by the first non-space character: ``[`` means JSON. In JSON every
    field is optional as HAMi's ``omitempty`` makes it: a missing ``health`` is *false*
    (an unhealthy card), a missing ``mode`` is ``""``, missing numbers are 0. Unknown keys
    (``migtemplate``, ``custominfo``...) are ignored; HAMi v2.10's ``migProfiles`` (per
    profile: ``name``, ``memoryMB``, ``core``, ``sliceCount`` and ``placements``, each a
    ``start`` and ``size``) are read. ``vendor`` is stamped on each card: the wire format
    does not carry it.
    """
    if value.lstrip().startswith("["):
        return _decode_node_devices_json(value, field, vendor)
    return _decode_node_devices_legacy(value, field, vendor)


def _decode_node_devices_json(value: str, field: str, vendor: str) -> list[model.DeviceInfo]:
    entries = go_wire.load_json(value, field)
    if not isinstance(entries, list):
        raise errors.CodecError(field, "expected a JSON list of devices", value)
    devices: list[model.DeviceInfo] = []
    for position, entry in enumerate(entries):
        where = f"device {position}"
        if not isinstance(entry, dict):
            raise errors.CodecError(field, f"{where} must be a JSON object, got {entry!r}")
        raw = go_wire.go_fields(entry, _DEVICE_JSON_FIELDS)
        devices.append(
            model.DeviceInfo(
                id=go_wire.json_str(raw.get("id", ""), field, f"{where} id"),
                index=go_wire.json_int(
                    raw.get("index", 0), field, f"{where} index", 0, go_wire.UINT64_MAX
                ),
                count=go_wire.json_int(
                    raw.get("count", 0),
                    field,
                    f"{where} count",
                    go_wire.INT32_MIN,
                    go_wire.INT32_MAX,
                ),
                memory_mib=go_wire.json_int(
                    raw.get("devmem", 0),
                    field,
                    f"{where} devmem",
                    go_wire.INT32_MIN,
                    go_wire.INT32_MAX,
                ),
                cores=go_wire.json_int(
                    raw.get("devcore", 0),
                    field,
                    f"{where} devcore",
                    go_wire.INT32_MIN,
                    go_wire.INT32_MAX,
                ),
                type=go_wire.json_str(raw.get("type", ""), field, f"{where} type"),
                numa=go_wire.json_int(
                    raw.get("numa", 0), field, f"{where} numa", go_wire.INT64_MIN, go_wire.INT64_MAX
                ),
                health=go_wire.json_bool(raw.get("health", False), field, f"{where} health"),
                mode=go_wire.json_str(raw.get("mode", ""), field, f"{where} mode"),
                vendor=vendor,
                mig_profiles=_decode_mig_profiles(
                    raw.get("migProfiles", []), field, f"{where} migProfiles"
                ),
            )
        )
    return devices


_MIG_PROFILE_JSON_FIELDS: Final = ("name", "memoryMB", "core", "sliceCount", "placements")
_MIG_PLACEMENT_JSON_FIELDS: Final = ("start", "size")


def _decode_mig_profiles(raw: Any, field: str, where: str) -> tuple[model.MigProfile, ...]:
    """HAMi v2.10's ``migProfiles`` of one card (Go's types: int32 memory and cores,
    uint32 slice counts and placements)."""
    if not isinstance(raw, list):
        raise errors.CodecError(field, f"{where} must be a JSON list, got {raw!r}")
    profiles: list[model.MigProfile] = []
    for position, entry in enumerate(raw):
        at = f"{where}[{position}]"
        if not isinstance(entry, dict):
            raise errors.CodecError(field, f"{at} must be a JSON object, got {entry!r}")
        fields = go_wire.go_fields(entry, _MIG_PROFILE_JSON_FIELDS)
        placements = fields.get("placements", [])
        if not isinstance(placements, list):
            raise errors.CodecError(field, f"{at} placements must be a JSON list")
        spots: list[model.MigPlacement] = []
        for k, spot in enumerate(placements):
            if not isinstance(spot, dict):
                raise errors.CodecError(field, f"{at} placement {k} must be a JSON object")
            place = go_wire.go_fields(spot, _MIG_PLACEMENT_JSON_FIELDS)
            spots.append(
                (
                    go_wire.json_int(
                        place.get("start", 0),
                        field,
                        f"{at} placement {k} start",
                        0,
                        go_wire.UINT32_MAX,
                    ),
                    go_wire.json_int(
                        place.get("size", 0),
                        field,
                        f"{at} placement {k} size",
                        0,
                        go_wire.UINT32_MAX,
                    ),
                )
            )
        profiles.append(
            model.MigProfile(
                name=go_wire.json_str(fields.get("name", ""), field, f"{at} name"),
                memory_mib=go_wire.json_int(
                    fields.get("memoryMB", 0),
                    field,
                    f"{at} memoryMB",
                    go_wire.INT32_MIN,
                    go_wire.INT32_MAX,
                ),
                cores=go_wire.json_int(
                    fields.get("core", 0), field, f"{at} core", go_wire.INT32_MIN, go_wire.INT32_MAX
                ),
                slice_count=go_wire.json_int(
                    fields.get("sliceCount", 0), field, f"{at} sliceCount", 0, go_wire.UINT32_MAX
                ),
                placements=tuple(spots),
            )
        )
    return tuple(profiles)


def _decode_node_devices_legacy(value: str, field: str, vendor: str) -> list[model.DeviceInfo]:
    if DEVICE_SEPARATOR not in value:
        raise errors.CodecError(field, "neither a JSON list nor the colon form", value)
    devices: list[model.DeviceInfo] = []
    for segment in value.split(DEVICE_SEPARATOR):
        if segment == "":
            continue
        items = segment.split(FIELD_SEPARATOR)
        if len(items) not in (_LEGACY_FIELDS_OLD, _LEGACY_FIELDS):
            raise errors.CodecError(
                field, f"device entry has {len(items)} fields, expected 7 or 9: {segment!r}"
            )
        where = f"device {items[0]!r}"
        index, mode = 0, model.MODE_HAMI_CORE
        if len(items) == _LEGACY_FIELDS:
            index = go_wire.parse_go_int(items[7], field, f"{where} index", 0, go_wire.INT64_MAX)
            mode = items[8]
        devices.append(
            model.DeviceInfo(
                id=items[0],
                index=index,
                count=go_wire.parse_go_int(
                    items[1], field, f"{where} count", go_wire.INT32_MIN, go_wire.INT32_MAX
                ),
                memory_mib=go_wire.parse_go_int(
                    items[2], field, f"{where} devmem", go_wire.INT32_MIN, go_wire.INT32_MAX
                ),
                cores=go_wire.parse_go_int(
                    items[3], field, f"{where} devcore", go_wire.INT32_MIN, go_wire.INT32_MAX
                ),
                type=items[4],
                numa=go_wire.parse_go_int(
                    items[5], field, f"{where} numa", go_wire.INT64_MIN, go_wire.INT64_MAX
                ),
                health=go_wire.parse_go_bool(items[6], field, f"{where} health"),
                mode=mode,
                vendor=vendor,
            )
        )
    return devices


def _check_device_ranges(device: model.DeviceInfo, field: str) -> None:
    where = f"device {device.id!r}"
    for what, number, low, high in (
        ("index", device.index, 0, go_wire.UINT64_MAX),
        ("count", device.count, go_wire.INT32_MIN, go_wire.INT32_MAX),
        ("devmem", device.memory_mib, go_wire.INT32_MIN, go_wire.INT32_MAX),
        ("devcore", device.cores, go_wire.INT32_MIN, go_wire.INT32_MAX),
        ("numa", device.numa, go_wire.INT64_MIN, go_wire.INT64_MAX),
    ):
        if not low <= number <= high:
            raise errors.CodecError(field, f"{where} {what} {number} is out of range")


def encode_node_devices_json(
    devices: Iterable[model.DeviceInfo], field: str = nvidia.REGISTER_ANNOTATION
) -> str:
    """Encode cards as HAMi's ``MarshalNodeDevices`` does.

    Keys in HAMi's struct order; like Go's ``omitempty`` every zero value is left out, so
    an unhealthy card has no ``health`` key at all (and decodes back as unhealthy). The
    vendor is not encoded.
    """
    entries: list[dict[str, Any]] = []
    for device in devices:
        _check_device_ranges(device, field)
        full: dict[str, Any] = {
            "id": device.id,
            "index": device.index,
            "count": device.count,
            "devmem": device.memory_mib,
            "devcore": device.cores,
            "type": device.type,
            "numa": device.numa,
            "mode": device.mode,
            "migProfiles": [
                {
                    "name": p.name,
                    "memoryMB": p.memory_mib,
                    "core": p.cores,
                    "sliceCount": p.slice_count,
                    # Go writes an empty slice of placements as null.
                    "placements": [{"start": a, "size": b} for a, b in p.placements] or None,
                }
                for p in device.mig_profiles
            ],
            "health": device.health,
        }
        entries.append({key: raw for key, raw in full.items() if raw})
    return go_wire.dump_json_like_go(entries)


def encode_node_devices_legacy(
    devices: Iterable[model.DeviceInfo], field: str = nvidia.REGISTER_ANNOTATION
) -> str:
    """Encode cards in the 9-field colon form of HAMi's ``EncodeNodeDevices``.

    What the form cannot carry raises ``CodecError``: strings containing ``,`` or ``:``,
    an index beyond int64, a first id starting with ``[`` (it would read as JSON), and
    an empty list (HAMi writes ``""``, which no decoder accepts; use JSON for no cards).
    """
    parts: list[str] = []
    for device in devices:
        _check_device_ranges(device, field)
        if device.index > go_wire.INT64_MAX:
            raise errors.CodecError(field, f"index {device.index} does not fit the colon form")
        for what, text in (("id", device.id), ("type", device.type), ("mode", device.mode)):
            go_wire.forbid_separators(text, FIELD_SEPARATOR + DEVICE_SEPARATOR, field, what)
        health = "true" if device.health else "false"
        parts.append(
            f"{device.id},{device.count},{device.memory_mib},{device.cores},{device.type},"
            f"{device.numa},{health},{device.index},{device.mode}{DEVICE_SEPARATOR}"
        )
    encoded = "".join(parts)
    if encoded == "":
        raise errors.CodecError(field, "the colon form cannot express a node without cards")
    if encoded.lstrip().startswith("["):
        raise errors.CodecError(field, "a first id starting with '[' would read as JSON")
    return encoded


# --- pair scores: hami.io/node-nvidia-score --------------------------------------------


def decode_pair_scores(
    value: str, field: str = nvidia.SCORE_ANNOTATION
) -> dict[str, dict[str, int]]:
    """Decode topology scores: card UUID -> peer UUID -> score.

    When a UUID appears more than once, its first entry wins (as HAMi's lookup does).
    A ``null`` list is empty; ``null`` entries are skipped.
    """
    entries = go_wire.load_json(value, field)
    if entries is None:
        return {}
    if not isinstance(entries, list):
        raise errors.CodecError(field, "expected a JSON list of score entries", value)
    scores: dict[str, dict[str, int]] = {}
    for position, entry in enumerate(entries):
        where = f"score entry {position}"
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise errors.CodecError(field, f"{where} must be a JSON object, got {entry!r}")
        raw = go_wire.go_fields(entry, ("uuid", "score"))
        uuid = go_wire.json_str(raw.get("uuid", ""), field, f"{where} uuid")
        peers = raw.get("score", {})
        if not isinstance(peers, dict):
            raise errors.CodecError(field, f"{where} score must be a JSON object")
        decoded = {
            peer: go_wire.json_int(
                0 if n is None else n,
                field,
                f"{where} score {peer!r}",
                go_wire.INT64_MIN,
                go_wire.INT64_MAX,
            )
            for peer, n in peers.items()
        }
        scores.setdefault(uuid, decoded)
    return scores


def encode_pair_scores(
    scores: Mapping[str, Mapping[str, int]], field: str = nvidia.SCORE_ANNOTATION
) -> str:
    """Encode topology scores as the device plugin writes them (peers sorted, as Go
    sorts map keys; empty values left out, as ``omitempty`` does)."""
    entries: list[dict[str, Any]] = []
    for uuid, peers in scores.items():
        for peer, n in peers.items():
            if not go_wire.INT64_MIN <= n <= go_wire.INT64_MAX:
                raise errors.CodecError(field, f"score {uuid!r}->{peer!r} {n} is out of range")
        entry: dict[str, Any] = {}
        if uuid:
            entry["uuid"] = uuid
        if peers:
            entry["score"] = dict(sorted(peers.items()))
        entries.append(entry)
    return go_wire.dump_json_like_go(entries)


# --- pod devices: hami.io/vgpu-devices-{to-allocate,allocated} -------------------------


def encode_pod_single_device(
    pd: model.PodSingleDevice, field: str = nvidia.ALLOCATED_ANNOTATION
) -> str:
    """Encode one vendor's allocation of a pod (HAMi's ``EncodePodSingleDevice``).

    Each device is ``uuid,type,usedmem,usedcores:``; a ``;`` follows every container,
    empty ones and the last one included, so container positions survive the trip.
    """
    out: list[str] = []
    for container in pd:
        for device in container:
            for what, text in (("uuid", device.uuid), ("type", device.vendor)):
                if text == "":
                    raise errors.CodecError(field, f"device {what} is empty")
                go_wire.forbid_separators(
                    text, FIELD_SEPARATOR + DEVICE_SEPARATOR + CONTAINER_SEPARATOR, field, what
                )
            for what, number in (("usedmem", device.memory_mib), ("usedcores", device.cores)):
                if not 0 <= number <= go_wire.INT32_MAX:
                    raise errors.CodecError(field, f"{what} {number} is out of range")
            out.append(
                f"{device.uuid},{device.vendor},{device.memory_mib},{device.cores}"
                f"{DEVICE_SEPARATOR}"
            )
        out.append(CONTAINER_SEPARATOR)
    return "".join(out)


def decode_pod_single_device(value: str, field: str) -> model.PodSingleDevice:
    """Decode one vendor's allocation of a pod; ``field`` is the annotation key.

    Containers are split on ``;`` keeping empty ones (they keep container positions);
    the empty part after the trailing ``;`` is dropped so that the result has exactly one
    entry per encoded container. Device parts without ``,`` are skipped as HAMi skips
    them. A UUID may carry a seed-form MIG suffix (``GPU-a0[0-2]``), kept as is.
    """
    parts = value.split(CONTAINER_SEPARATOR)
    if parts[-1] == "":
        parts.pop()
    return tuple(_decode_container_devices(part, field) for part in parts)


def _decode_container_devices(part: str, field: str) -> model.ContainerDevices:
    devices: list[model.ContainerDevice] = []
    for segment in part.split(DEVICE_SEPARATOR):
        if FIELD_SEPARATOR not in segment:
            continue
        items = segment.split(FIELD_SEPARATOR)
        if len(items) < _POD_DEVICE_MIN_FIELDS:
            raise errors.CodecError(
                field, f"device entry {segment!r} has {len(items)} fields, expected 4"
            )
        uuid, vendor = items[0], items[1]
        if uuid == "" or vendor == "":
            raise errors.CodecError(field, f"device entry {segment!r} lacks a uuid or type")
        devices.append(
            model.ContainerDevice(
                uuid=uuid,
                vendor=vendor,
                # Negative usage is rejected (newer HAMi does too): it would credit capacity.
                memory_mib=go_wire.parse_go_int(
                    items[2], field, f"{uuid} usedmem", 0, go_wire.INT32_MAX
                ),
                cores=go_wire.parse_go_int(
                    items[3], field, f"{uuid} usedcores", 0, go_wire.INT32_MAX
                ),
            )
        )
    return tuple(devices)


def decode_pod_devices(
    annotations: Mapping[str, str], keys: Mapping[str, str]
) -> dict[str, model.PodSingleDevice]:
    """Decode a pod's allocation for every vendor whose annotation is present.

    ``keys`` maps a vendor's common word to its annotation key, e.g.
    ``{"NVIDIA": nvidia.ALLOCATED_ANNOTATION}``.
    """
    return {
        vendor: decode_pod_single_device(annotations[key], key)
        for vendor, key in keys.items()
        if key in annotations
    }


def encode_pod_devices(pod_devices: model.PodDevices, keys: Mapping[str, str]) -> dict[str, str]:
    """Encode a pod's allocation into annotations: annotation key -> value.

    Raises ``CodecError`` (field = the vendor) for a vendor without an annotation key.
    """
    out: dict[str, str] = {}
    for vendor, single in pod_devices.items():
        key = keys.get(vendor)
        if key is None:
            raise errors.CodecError(vendor, "no annotation key for this vendor")
        out[key] = encode_pod_single_device(single, key)
    return out


# --- seed-form MIG UUIDs ---------------------------------------------------------------


def split_mig_uuid(
    uuid: str, field: str = nvidia.ALLOCATED_ANNOTATION
) -> tuple[str, tuple[int, int] | None]:
    """``GPU-a0[1-3]`` -> ``("GPU-a0", (1, 3))`` (geometry, slot); no brackets -> None."""
    if "[" not in uuid and "]" not in uuid:
        return uuid, None
    match = _MIG_UUID_RE.fullmatch(uuid)
    if match is None:
        raise errors.CodecError(field, f"malformed MIG UUID {uuid!r}", uuid)
    return match.group(1), (int(match.group(2)), int(match.group(3)))


def join_mig_uuid(
    base: str, geometry: int, slot: int, field: str = nvidia.ALLOCATED_ANNOTATION
) -> str:
    """``("GPU-a0", 1, 3)`` -> ``GPU-a0[1-3]``, the inverse of ``split_mig_uuid``."""
    if base == "" or "[" in base or "]" in base:
        raise errors.CodecError(field, f"cannot put a MIG suffix on {base!r}", base)
    if geometry < 0 or slot < 0:
        raise errors.CodecError(field, f"negative MIG geometry {geometry} or slot {slot}")
    return f"{base}[{geometry}-{slot}]"


# --- times and the bind phase ----------------------------------------------------------


def encode_vgpu_time(ts: float, field: str = names.ASSIGNED_TIME) -> str:
    """Unix seconds as integer text (fractions dropped, like Go's ``Time.Unix``)."""
    if not math.isfinite(ts):
        raise errors.CodecError(field, f"time {ts!r} is not finite")
    return str(math.floor(ts))


def decode_vgpu_time(value: str, field: str = names.ASSIGNED_TIME) -> int:
    """Read ``hami.io/vgpu-time`` or ``hami.io/bind-time``: non-negative Unix seconds."""
    if go_wire.UNSIGNED_RE.fullmatch(value) is None:
        raise errors.CodecError(field, "not a Unix time in whole seconds", value)
    return go_wire.parse_go_int(value, field, "time", 0, go_wire.INT64_MAX)


def decode_bind_phase(value: str, field: str = names.BIND_PHASE) -> BindPhase:
    """Read ``hami.io/bind-phase``; anything but the three known phases is an error."""
    try:
        return BindPhase(value)
    except ValueError as exc:
        raise errors.CodecError(field, "unknown bind phase", value) from exc


# --- Kubernetes quantities -------------------------------------------------------------


def parse_integer_quantity(value: object, field: str) -> int:
    """A whole-number quantity (``quantity.parse_whole``, the one integer reader)."""
    return quantity.parse_whole(value, field)


__all__ = [
    "CONTAINER_SEPARATOR",
    "DEVICE_SEPARATOR",
    "FIELD_SEPARATOR",
    "BindPhase",
    "decode_bind_phase",
    "decode_node_devices",
    "decode_pair_scores",
    "decode_pod_devices",
    "decode_pod_single_device",
    "decode_vgpu_time",
    "encode_node_devices_json",
    "encode_node_devices_legacy",
    "encode_pair_scores",
    "encode_pod_devices",
    "encode_pod_single_device",
    "encode_vgpu_time",
    "join_mig_uuid",
    "parse_integer_quantity",
    "split_mig_uuid",
]
