"""A finalizer added to a claim in the API server's protobuf, its raw parts byte for byte
(``kube.raw_finalizer``). The sample is a ResourceClaim as kube-apiserver 1.37 served it,
created with opaque parameters sent with spaces (``{"note": "spaced out", "n": 1}``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vgpu_operator.kube import raw_finalizer as rf

SAMPLE = (Path(__file__).parent / "data" / "resourceclaim-spaced-parameters.pb").read_bytes()
FINALIZER = "resource.kubernetes.io/delete-protection"


def _meta(stored: bytes) -> dict[int, list[bytes]]:
    unknown = stored[len(rf.MAGIC) :]
    obj = rf._only_field(unknown, 2)
    meta = rf._only_field(obj, 1)
    out: dict[int, list[bytes]] = {}
    for number, wire, start, end in rf.fields(meta):
        if wire == 2:
            out.setdefault(number, []).append(rf._payload(meta, start, end))
    return out


def _version(stored: bytes) -> str:
    return _meta(stored)[6][0].decode()


def test_the_finalizer_is_added_and_the_raw_parameters_stay_as_stored() -> None:
    assert b'"note": "spaced out"' in SAMPLE
    out = rf.with_finalizer(SAMPLE, FINALIZER, _version(SAMPLE))
    assert out is not None
    assert _meta(out)[14] == [FINALIZER.encode()]
    assert b'"note": "spaced out"' in out
    # Everything but the metadata is as it was: the spec after it, byte for byte.
    spec_at = SAMPLE.index(b'"note"')
    assert out.endswith(SAMPLE[spec_at:]) or SAMPLE[spec_at:] in out
    # Adding it again changes nothing.
    assert rf.with_finalizer(out, FINALIZER, _version(out)) == out


def test_a_claim_changed_since_the_decision_is_not_written() -> None:
    assert rf.with_finalizer(SAMPLE, FINALIZER, "1") is None


def test_finalizers_already_there_are_kept() -> None:
    meta = rf.encode_field(1, b"c") + rf.encode_field(6, b"42") + rf.encode_field(14, b"other")
    obj = rf.encode_field(1, meta) + rf.encode_field(2, b"\x0a\x03raw")
    stored = rf.MAGIC + rf.encode_field(1, b"\x0a\x02v1") + rf.encode_field(2, obj)
    out = rf.with_finalizer(stored, FINALIZER, "42")
    assert out is not None
    assert _meta(out)[14] == [b"other", FINALIZER.encode()]


@pytest.mark.parametrize(
    "stored",
    [
        b"",
        b"{}",
        rf.MAGIC + b"\xff\xff\xff",
        rf.MAGIC + rf.encode_field(1, b"x"),
        rf.MAGIC + b"\x13",
    ],
)
def test_what_is_not_the_api_servers_protobuf_is_refused(stored: bytes) -> None:
    with pytest.raises(rf.Unreadable):
        rf.with_finalizer(stored, FINALIZER, "1")


def test_varints_round_trip() -> None:
    for value in (0, 1, 127, 128, 300, 2**32, 2**63 - 1):
        encoded = rf.encode_varint(value)
        assert rf._varint(encoded, 0) == (value, len(encoded))
