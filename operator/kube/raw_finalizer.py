"""A finalizer added to an object whose spec holds raw JSON, byte for byte.

A ResourceClaim's opaque config parameters are a ``RawExtension``: the API server keeps
the bytes the creating client sent. It serves them re-encoded compactly as JSON, and a
merge patch or a JSON update re-encodes them too; where the client sent spaces (most
clients but kubectl do), the immutable spec then differs from the stored one by those
bytes and every such write is refused ("spec: field is immutable"). Go clients such as
kube-scheduler speak protobuf, in which the raw bytes travel as stored. So does this:
the object is read as protobuf, its ``ObjectMeta`` gains the finalizer (a repeated
field may be appended anywhere in a message), and it is written back whole.

The wire format, as far as it is touched (k8s.io/apimachinery ``runtime.Unknown`` and
``ObjectMeta``; both stable): the 4-byte magic ``k8s\\0``, then an Unknown message whose
field 2 is the object's own message, whose field 1 is its ObjectMeta, in which field 6
is the resourceVersion and field 14 the finalizers.
"""

from __future__ import annotations

from typing import Final

MAGIC: Final = b"k8s\x00"
CONTENT_TYPE: Final = "application/vnd.kubernetes.protobuf"
_UNKNOWN_RAW: Final = 2
_OBJECT_META: Final = 1
_RESOURCE_VERSION: Final = 6
_FINALIZERS: Final = 14
_LENGTH_DELIMITED: Final = 2


class Unreadable(ValueError):
    """Not the protobuf encoding this module knows."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise Unreadable("a varint runs past the end")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return encode_varint(number << 3 | _LENGTH_DELIMITED) + encode_varint(len(payload)) + payload


def fields(message: bytes) -> list[tuple[int, int, int, int]]:
    """Each field as (number, wire type, start of the field, end of the field); for a
    length-delimited one the payload is the last ``length`` bytes before the end."""
    out: list[tuple[int, int, int, int]] = []
    at = 0
    while at < len(message):
        start = at
        tag, at = _varint(message, at)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, at = _varint(message, at)
        elif wire == 1:
            at += 8
        elif wire == _LENGTH_DELIMITED:
            length, at = _varint(message, at)
            at += length
        elif wire == 5:
            at += 4
        else:
            raise Unreadable(f"wire type {wire} is not read here")
        if at > len(message):
            raise Unreadable("a field runs past the end")
        out.append((number, wire, start, at))
    return out


def _payload(message: bytes, start: int, end: int) -> bytes:
    _, at = _varint(message, start)
    _, at = _varint(message, at)  # the length: the payload runs to the field's end
    return message[at:end]


def _replace_field(message: bytes, number: int, change: bytes) -> bytes:
    """``message`` with its (single) length-delimited field ``number`` holding ``change``."""
    for found, wire, start, end in fields(message):
        if found == number and wire == _LENGTH_DELIMITED:
            return message[:start] + encode_field(number, change) + message[end:]
    raise Unreadable(f"no field {number}")


def _only_field(message: bytes, number: int) -> bytes:
    for found, wire, start, end in fields(message):
        if found == number and wire == _LENGTH_DELIMITED:
            return _payload(message, start, end)
    raise Unreadable(f"no field {number}")


def with_finalizer(stored: bytes, finalizer: str, version: str) -> bytes | None:
    """The object ``stored`` (as the API server serves it in protobuf) with ``finalizer``
    among its finalizers, every other byte as it was; None when its resourceVersion is
    not ``version`` (it changed since it was decided on). Raises Unreadable."""
    if not stored.startswith(MAGIC):
        raise Unreadable("not the API server's protobuf (no magic)")
    unknown = stored[len(MAGIC) :]
    obj = _only_field(unknown, _UNKNOWN_RAW)
    meta = _only_field(obj, _OBJECT_META)
    found_version = ""
    finalizers: list[str] = []
    for number, wire, start, end in fields(meta):
        if wire != _LENGTH_DELIMITED:
            continue
        if number == _RESOURCE_VERSION:
            found_version = _payload(meta, start, end).decode()
        elif number == _FINALIZERS:
            finalizers.append(_payload(meta, start, end).decode())
    if found_version != version:
        return None
    if finalizer not in finalizers:
        meta += encode_field(_FINALIZERS, finalizer.encode())
    obj = _replace_field(obj, _OBJECT_META, meta)
    return MAGIC + _replace_field(unknown, _UNKNOWN_RAW, obj)
