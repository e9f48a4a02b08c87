"""decode(encode(x)) == x for every annotation format, and decoders fail only cleanly."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from vgpu_operator import errors
from vgpu_operator.devices import codec, hygon, model, nvidia

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
#: Text the colon forms can carry: their separators excluded.
NODE_FIELD_TEXT = st.text(st.characters(exclude_characters=",:"), max_size=12)
POD_FIELD_TEXT = st.text(st.characters(exclude_characters=",:;"), min_size=1, max_size=12)


def device_infos(
    text: st.SearchStrategy[str], max_index: int
) -> st.SearchStrategy[model.DeviceInfo]:
    """Cards with every field drawn over its full wire range."""
    return st.builds(
        model.DeviceInfo,
        id=text,
        index=st.integers(0, max_index),
        count=INT32,
        memory_mib=INT32,
        cores=INT32,
        type=text,
        numa=INT64,
        health=st.booleans(),
        mode=text | st.sampled_from(["hami-core", "mig", "mps"]),
    )


def pod_single_devices() -> st.SearchStrategy[model.PodSingleDevice]:
    """One vendor's allocation: containers (possibly empty) of devices."""
    device = st.builds(
        model.ContainerDevice,
        uuid=POD_FIELD_TEXT,
        vendor=POD_FIELD_TEXT | st.just("NVIDIA"),
        memory_mib=st.integers(0, 2**31 - 1),
        cores=st.integers(0, 2**31 - 1),
    )
    container = st.lists(device, max_size=4).map(tuple)
    return st.lists(container, max_size=5).map(tuple)


@settings(deadline=None)
@given(st.lists(device_infos(st.text(max_size=12), 2**64 - 1), max_size=6))
def test_node_devices_json_round_trips(devices: list[model.DeviceInfo]) -> None:
    assert codec.decode_node_devices(codec.encode_node_devices_json(devices)) == devices


@settings(deadline=None)
@given(
    st.lists(device_infos(NODE_FIELD_TEXT, 2**63 - 1), min_size=1, max_size=6).filter(
        # A first id starting with '[' would make the value read as JSON.
        lambda ds: not ds[0].id.lstrip().startswith("[")
    )
)
def test_node_devices_legacy_round_trips(devices: list[model.DeviceInfo]) -> None:
    assert codec.decode_node_devices(codec.encode_node_devices_legacy(devices)) == devices


@settings(deadline=None)
@given(st.dictionaries(st.text(max_size=8), st.dictionaries(st.text(max_size=8), INT64)))
def test_pair_scores_round_trip(scores: dict[str, dict[str, int]]) -> None:
    assert codec.decode_pair_scores(codec.encode_pair_scores(scores)) == scores


@settings(deadline=None)
@given(pod_single_devices())
def test_pod_single_device_round_trips(pd: model.PodSingleDevice) -> None:
    key = nvidia.ALLOCATED_ANNOTATION
    assert codec.decode_pod_single_device(codec.encode_pod_single_device(pd), key) == pd


@settings(deadline=None)
@given(st.dictionaries(st.sampled_from(["NVIDIA", "DCU"]), pod_single_devices()))
def test_pod_devices_round_trip(pod_devices: dict[str, model.PodSingleDevice]) -> None:
    keys = {"NVIDIA": nvidia.ALLOCATED_ANNOTATION, "DCU": hygon.ALLOCATED_ANNOTATION}
    encoded = codec.encode_pod_devices(pod_devices, keys)
    assert codec.decode_pod_devices(encoded, keys) == pod_devices


@given(
    st.text(st.characters(exclude_characters="[]"), min_size=1),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
)
def test_mig_uuid_round_trips(base: str, geometry: int, slot: int) -> None:
    joined = codec.join_mig_uuid(base, geometry, slot)
    assert codec.split_mig_uuid(joined) == (base, (geometry, slot))


@given(st.integers(0, 2**62))
def test_vgpu_time_round_trips(seconds: int) -> None:
    assert codec.decode_vgpu_time(codec.encode_vgpu_time(float(seconds))) == int(float(seconds))


@given(st.integers(-(2**40), 2**40), st.sampled_from(["", "k", "Ki", "M", "Mi"]))
def test_integer_quantity_scales_by_suffix(number: int, suffix: str) -> None:
    scale = {"": 1, "k": 1000, "Ki": 1024, "M": 10**6, "Mi": 2**20}[suffix]
    assert codec.parse_integer_quantity(f"{number}{suffix}", "q") == number * scale


def _decoders() -> list[Callable[[str], object]]:
    return [
        codec.decode_node_devices,
        codec.decode_pair_scores,
        lambda v: codec.decode_pod_single_device(v, nvidia.ALLOCATED_ANNOTATION),
        codec.split_mig_uuid,
        codec.decode_vgpu_time,
        codec.decode_bind_phase,
        lambda v: codec.parse_integer_quantity(v, "q"),
    ]


#: Inputs built from the formats' own characters reach deeper than random text.
WIRE_TEXT = st.text(st.sampled_from(list('[]{}":,;-+.0123456789eEKimtruefalsnGPU- \n')))


@settings(deadline=None)
@given(st.sampled_from(_decoders()), st.one_of(st.text(), WIRE_TEXT))
def test_decoders_fail_only_with_codec_error(decode: Callable[[str], object], value: str) -> None:
    with contextlib.suppress(errors.CodecError):
        decode(value)
