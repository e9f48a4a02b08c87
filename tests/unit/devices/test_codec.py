"""HAMi's annotation wire formats: the spec's examples, good inputs and malformed ones."""

from __future__ import annotations

import dataclasses

import pytest

from vgpu_operator import errors, names
from vgpu_operator.devices import codec, hygon, model, nvidia

A100_ID = "GPU-0e6b3b2a-5c1d-4f7e-9a10-1c2d3e4f5a60"
A40_A = "GPU-03f69c50-207a-2038-9b45-23cac89cb67d"
A40_B = "GPU-1afede84-4e70-2174-49af-f07ebb94d1ae"
P4_ID = "GPU-ebe7c3f7-303d-558d-435e-99a160631fe4"


def card(
    id: str = "GPU-a0",
    *,
    index: int = 0,
    count: int = 10,
    memory_mib: int = 81920,
    cores: int = 100,
    type: str = "NVIDIA A100-SXM4-80GB",
    numa: int = 0,
    health: bool = True,
    mode: str = model.MODE_HAMI_CORE,
    vendor: str = "NVIDIA",
) -> model.DeviceInfo:
    return model.DeviceInfo(id, index, count, memory_mib, cores, type, numa, health, mode, vendor)


def dev(uuid: str, memory_mib: int, cores: int, vendor: str = "NVIDIA") -> model.ContainerDevice:
    return model.ContainerDevice(uuid, vendor, memory_mib, cores)


# --- node register ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(
            f'[{{"id":"{A100_ID}","index":0,"count":10,"devmem":81920,'
            '"devcore":100,"type":"NVIDIA A100-SXM4-80GB","numa":0,"mode":"hami-core",'
            '"health":true}]',
            [card(A100_ID)],
            id="spec-4.1-example",
        ),
        pytest.param(
            '[{"id":"GPU-a0","count":10,"devmem":1024,"devcore":100,"type":"T4"}]',
            [card(memory_mib=1024, type="T4", health=False, mode="")],
            id="missing-health-is-unhealthy-missing-mode-is-empty",
        ),
        pytest.param(
            '[{"id":"GPU-a0"}]',
            [card(count=0, memory_mib=0, cores=0, type="", health=False, mode="")],
            id="missing-numbers-are-zero",
        ),
        pytest.param(
            '[{"id":"GPU-a0","index":3,"count":7,"devmem":40960,"devcore":100,"type":"A100",'
            '"numa":1,"mode":"mig","health":true,"migProfiles":[{"name":"1g.10gb",'
            '"memoryMB":9728,"core":15,"sliceCount":1,"placements":[{"start":0,"size":1}]}],'
            '"custominfo":{"x":1},"devicevendor":"NVIDIA"}]',
            [
                dataclasses.replace(
                    card(index=3, count=7, memory_mib=40960, type="A100", numa=1, mode="mig"),
                    mig_profiles=(model.MigProfile("1g.10gb", 9728, 15, 1, ((0, 1),)),),
                )
            ],
            id="unknown-fields-ignored-mig-profiles-read",
        ),
        pytest.param(
            '[{"ID":"GPU-a0","Count":10,"DEVMEM":81920,"devCore":100,"Type":"T","Health":true,'
            '"Mode":"hami-core"}]',
            [card(type="T")],
            id="keys-match-case-insensitively-like-go",
        ),
        pytest.param(
            '[{"id":"GPU-a0","count":10,"devmem":81920,"devcore":100,"type":"T",'
            '"health":true,"mode":"hami-core","numa":null,"index":null}]',
            [card(type="T")],
            id="null-leaves-zero-value",
        ),
        pytest.param("[]", [], id="empty-list"),
        pytest.param("  \n[]", [], id="leading-space-before-json"),
        pytest.param(
            f"{P4_ID},10,7680,100,NVIDIA-Tesla P4,0,true,1,hami-core:",
            [card(P4_ID, index=1, memory_mib=7680, type="NVIDIA-Tesla P4")],
            id="spec-4.1-colon-9-fields",
        ),
        pytest.param(
            f"{A40_A},10,46068,100,NVIDIA-NVIDIA A40,0,true:"
            f"{A40_B},10,46068,100,NVIDIA-NVIDIA A40,0,true:",
            [
                card(A40_A, memory_mib=46068, type="NVIDIA-NVIDIA A40"),
                card(A40_B, memory_mib=46068, type="NVIDIA-NVIDIA A40"),
            ],
            id="seed-004-colon-7-fields-index-0-mode-hami-core",
        ),
        pytest.param(
            "GPU-UUID-1,10,32768,100,Tesla-V100,0,true,0,hami-core:"
            "GPU-UUID-2,10,16384,100,Tesla-T4,1,true,1,hami-core:",
            [
                card("GPU-UUID-1", memory_mib=32768, type="Tesla-V100"),
                card("GPU-UUID-2", index=1, memory_mib=16384, type="Tesla-T4", numa=1),
            ],
            id="seed-001-colon-example",
        ),
        pytest.param(
            "GPU-a0,10,1024,100,T,0,F,2,mig:GPU-a1,10,1024,100,T,0,1,3,mps",
            [
                card(index=2, memory_mib=1024, type="T", health=False, mode="mig"),
                card("GPU-a1", index=3, memory_mib=1024, type="T", mode="mps"),
            ],
            id="go-parsebool-forms-and-last-segment-without-colon",
        ),
        pytest.param(
            "GPU-a0,+10,-1,100,T,-1,TRUE,0,:",
            [card(count=10, memory_mib=-1, type="T", numa=-1, mode="")],
            id="go-signed-integers-and-empty-mode",
        ),
    ],
)
def test_decode_node_devices_good_input_decodes(
    value: str, expected: list[model.DeviceInfo]
) -> None:
    assert codec.decode_node_devices(value) == expected


def test_decode_node_devices_vendor_is_stamped_on_every_card() -> None:
    decoded = codec.decode_node_devices(
        '[{"id":"DCU-0","health":true}]', field=hygon.REGISTER_ANNOTATION, vendor="DCU"
    )
    assert [d.vendor for d in decoded] == ["DCU"]


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("", id="empty-string"),
        pytest.param("GPU-a0,10,1024,100,T,0,true,0,hami-core", id="no-colon"),
        pytest.param("null", id="json-null-is-not-a-list"),
        pytest.param("[", id="truncated-json"),
        pytest.param('[{"id":"a"}] x', id="json-trailing-garbage"),
        pytest.param("[null]", id="null-entry"),
        pytest.param('["GPU-a0"]', id="entry-not-object"),
        pytest.param('[{"id":7}]', id="id-not-string"),
        pytest.param('[{"count":"10"}]', id="count-is-string"),
        pytest.param('[{"devmem":1.5}]', id="devmem-float"),
        pytest.param('[{"devmem":1e3}]', id="devmem-exponent"),
        pytest.param('[{"devcore":true}]', id="devcore-bool"),
        pytest.param('[{"count":2147483648}]', id="count-over-int32"),
        pytest.param('[{"index":-1}]', id="json-negative-index"),
        pytest.param('[{"health":"true"}]', id="health-is-string"),
        pytest.param('[{"mode":1}]', id="mode-not-string"),
        pytest.param('[{"numa":NaN}]', id="nan"),
        pytest.param('[{"migProfiles":{}}]', id="mig-profiles-not-a-list"),
        pytest.param('[{"migProfiles":[7]}]', id="mig-profile-not-an-object"),
        pytest.param('[{"migProfiles":[{"name":1}]}]', id="mig-profile-name-not-string"),
        pytest.param('[{"migProfiles":[{"memoryMB":true}]}]', id="mig-profile-memory-bool"),
        pytest.param('[{"migProfiles":[{"placements":{}}]}]', id="mig-placements-not-a-list"),
        pytest.param(
            '[{"migProfiles":[{"placements":[{"start":-1,"size":1}]}]}]',
            id="mig-placement-negative-start",
        ),
        pytest.param(
            '[{"migProfiles":[{"placements":[{"start":0,"size":4294967296}]}]}]',
            id="mig-placement-size-over-uint32",
        ),
        pytest.param("GPU-a0,10,1024,100,T,0,true,0:", id="eight-fields"),
        pytest.param("GPU-a0,10,1024,100,T,0:", id="six-fields"),
        pytest.param("GPU-a0,10,1024,100,T,0,true,0,m,x:", id="ten-fields"),
        pytest.param("GPU-a0:", id="segment-without-comma"),
        pytest.param("GPU-a0,ten,1024,100,T,0,true:", id="count-not-integer"),
        pytest.param("GPU-a0,10,1.5,100,T,0,true:", id="devmem-not-integer"),
        pytest.param("GPU-a0,10,1024, 100,T,0,true:", id="space-in-integer"),
        pytest.param("GPU-a0,10,1_024,100,T,0,true:", id="underscore-in-integer"),
        pytest.param("GPU-a0,10,1024,100,T,x,true:", id="numa-not-integer"),
        pytest.param("GPU-a0,10,1024,100,T,0,yes:", id="bad-bool"),
        pytest.param("GPU-a0,10,1024,100,T,0,true,-1,hami-core:", id="negative-index"),
        pytest.param("GPU-a0,10,1024,100,T,0,true,x,hami-core:", id="index-not-integer"),
        pytest.param("GPU-a0,10,4294967296,100,T,0,true:", id="devmem-over-int32"),
    ],
)
def test_decode_node_devices_malformed_raises_codec_error_naming_key(value: str) -> None:
    with pytest.raises(errors.CodecError) as caught:
        codec.decode_node_devices(value)
    assert caught.value.field == nvidia.REGISTER_ANNOTATION


def test_decode_node_devices_error_names_given_field() -> None:
    with pytest.raises(errors.CodecError) as caught:
        codec.decode_node_devices("garbage", field=hygon.REGISTER_ANNOTATION)
    assert caught.value.field == hygon.REGISTER_ANNOTATION


def test_encode_node_devices_json_matches_hami_marshal() -> None:
    devices = [
        card(A100_ID),
        card("GPU-a1", index=1, numa=1, health=False, mode="mig", type="A<&>B"),
    ]
    assert codec.encode_node_devices_json(devices) == (
        f'[{{"id":"{A100_ID}","count":10,"devmem":81920,"devcore":100,'
        '"type":"NVIDIA A100-SXM4-80GB","mode":"hami-core","health":true},'
        '{"id":"GPU-a1","index":1,"count":10,"devmem":81920,"devcore":100,'
        '"type":"A\\u003c\\u0026\\u003eB","numa":1,"mode":"mig"}]'
    )


def test_mig_profiles_are_written_as_hami_v2_10_marshals_them_and_read_back() -> None:
    profiles = (
        model.MigProfile("1g.10gb", 9728, 15, 1, ((0, 1), (6, 1))),
        model.MigProfile("7g.80gb", 80896, 100, 8),
    )
    devices = [dataclasses.replace(card(mode="mig"), mig_profiles=profiles)]
    encoded = codec.encode_node_devices_json(devices)
    assert (
        '"mode":"mig","migProfiles":[{"name":"1g.10gb","memoryMB":9728,"core":15,'
        '"sliceCount":1,"placements":[{"start":0,"size":1},{"start":6,"size":1}]},'
        '{"name":"7g.80gb","memoryMB":80896,"core":100,"sliceCount":8,"placements":null}],'
        '"health":true'
    ) in encoded
    assert codec.decode_node_devices(encoded) == devices


def test_encode_node_devices_json_unhealthy_card_decodes_unhealthy() -> None:
    devices = [card(health=False)]
    encoded = codec.encode_node_devices_json(devices)
    assert '"health"' not in encoded
    assert codec.decode_node_devices(encoded) == devices


def test_encode_node_devices_json_empty_is_empty_list() -> None:
    assert codec.encode_node_devices_json([]) == "[]"


def test_encode_node_devices_legacy_writes_nine_fields() -> None:
    devices = [card(P4_ID, index=1, memory_mib=7680, type="NVIDIA-Tesla P4"), card(health=False)]
    assert codec.encode_node_devices_legacy(devices) == (
        f"{P4_ID},10,7680,100,NVIDIA-Tesla P4,0,true,1,hami-core:"
        "GPU-a0,10,81920,100,NVIDIA A100-SXM4-80GB,0,false,0,hami-core:"
    )


@pytest.mark.parametrize(
    "devices",
    [
        pytest.param([card("GPU,a0")], id="comma-in-id"),
        pytest.param([card(type="A100:80GB")], id="colon-in-type"),
        pytest.param([card(mode="a,b")], id="comma-in-mode"),
        pytest.param([card("[GPU")], id="id-would-read-as-json"),
        pytest.param([card(index=-1)], id="negative-index"),
        pytest.param([card(count=2**31)], id="count-over-int32"),
        pytest.param([], id="no-cards"),
    ],
)
def test_encode_node_devices_legacy_unrepresentable_raises(
    devices: list[model.DeviceInfo],
) -> None:
    with pytest.raises(errors.CodecError) as caught:
        codec.encode_node_devices_legacy(devices)
    assert caught.value.field == nvidia.REGISTER_ANNOTATION


# --- pair scores -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(
            '[{"uuid":"GPU-a0","score":{"GPU-a1":1230,"GPU-a2":20}},'
            '{"uuid":"GPU-a1","score":{"GPU-a0":1230,"GPU-a2":20}}]',
            {"GPU-a0": {"GPU-a1": 1230, "GPU-a2": 20}, "GPU-a1": {"GPU-a0": 1230, "GPU-a2": 20}},
            id="spec-4.1-example",
        ),
        pytest.param(
            '[{"uuid":"GPU-a0","score":{"GPU-a1":1}},{"uuid":"GPU-a0","score":{"GPU-a1":99}}]',
            {"GPU-a0": {"GPU-a1": 1}},
            id="first-entry-wins",
        ),
        pytest.param('[{"uuid":"GPU-a0"}]', {"GPU-a0": {}}, id="missing-score-is-empty"),
        pytest.param('[{"UUID":"GPU-a0","Score":{"b":2}}]', {"GPU-a0": {"b": 2}}, id="key-case"),
        pytest.param("[]", {}, id="empty-list"),
        pytest.param("null", {}, id="null"),
        pytest.param('[null,{"uuid":"a","extra":1}]', {"a": {}}, id="null-entry-skipped"),
    ],
)
def test_decode_pair_scores_good_input_decodes(
    value: str, expected: dict[str, dict[str, int]]
) -> None:
    assert codec.decode_pair_scores(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("", id="empty-string"),
        pytest.param("{}", id="object-not-list"),
        pytest.param("[1]", id="entry-not-object"),
        pytest.param('[{"uuid":1}]', id="uuid-not-string"),
        pytest.param('[{"uuid":"a","score":[1]}]', id="score-not-object"),
        pytest.param('[{"uuid":"a","score":{"b":"1"}}]', id="score-value-string"),
        pytest.param('[{"uuid":"a","score":{"b":1.5}}]', id="score-value-float"),
        pytest.param('[{"uuid":"a","score":{"b":true}}]', id="score-value-bool"),
        pytest.param("[" * 100_000, id="deeply-nested"),
    ],
)
def test_decode_pair_scores_malformed_raises_codec_error_naming_key(value: str) -> None:
    with pytest.raises(errors.CodecError) as caught:
        codec.decode_pair_scores(value)
    assert caught.value.field == nvidia.SCORE_ANNOTATION


def test_encode_pair_scores_sorts_peers_and_omits_empty() -> None:
    encoded = codec.encode_pair_scores({"GPU-a0": {"GPU-b": 2, "GPU-a": 1}, "GPU-a1": {}})
    assert encoded == '[{"uuid":"GPU-a0","score":{"GPU-a":1,"GPU-b":2}},{"uuid":"GPU-a1"}]'


# --- pod devices -----------------------------------------------------------------------

SPEC_POD_DEVICES = "GPU-a0,NVIDIA,4096,30:GPU-a1,NVIDIA,4096,30:;;GPU-a2,NVIDIA,8192,0:;"
SPEC_POD_SINGLE: model.PodSingleDevice = (
    (dev("GPU-a0", 4096, 30), dev("GPU-a1", 4096, 30)),
    (),
    (dev("GPU-a2", 8192, 0),),
)


def test_encode_pod_single_device_spec_example() -> None:
    assert codec.encode_pod_single_device(SPEC_POD_SINGLE) == SPEC_POD_DEVICES


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(SPEC_POD_DEVICES, SPEC_POD_SINGLE, id="spec-11-example"),
        pytest.param(
            f"{A40_B},NVIDIA,20000,30:;",
            ((dev(A40_B, 20000, 30),),),
            id="seed-004-example",
        ),
        pytest.param(
            "GPU-a0[0-2],NVIDIA,5120,14:;",
            ((dev("GPU-a0[0-2]", 5120, 14),),),
            id="mig-suffix-kept",
        ),
        pytest.param("GPU-a0,NVIDIA,1,2:", ((dev("GPU-a0", 1, 2),),), id="no-trailing-semicolon"),
        pytest.param("", (), id="empty-is-no-containers"),
        pytest.param(";", ((),), id="one-empty-container"),
        pytest.param(";;", ((), ()), id="two-empty-containers"),
        pytest.param(
            "junk:GPU-a0,NVIDIA,1,2:;", ((dev("GPU-a0", 1, 2),),), id="part-without-comma-skipped"
        ),
        pytest.param(
            "GPU-a0,NVIDIA,1,2,extra:;", ((dev("GPU-a0", 1, 2),),), id="extra-fields-ignored"
        ),
    ],
)
def test_decode_pod_single_device_good_input_decodes(
    value: str, expected: model.PodSingleDevice
) -> None:
    assert codec.decode_pod_single_device(value, nvidia.ALLOCATED_ANNOTATION) == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("GPU-a0,NVIDIA,4096:;", id="three-fields"),
        pytest.param("GPU-a0,NVIDIA,4k,30:;", id="memory-not-integer"),
        pytest.param("GPU-a0,NVIDIA,4096,3.5:;", id="cores-not-integer"),
        pytest.param("GPU-a0,NVIDIA,-1,30:;", id="negative-memory"),
        pytest.param("GPU-a0,NVIDIA,1,-30:;", id="negative-cores"),
        pytest.param(",NVIDIA,1,30:;", id="empty-uuid"),
        pytest.param("GPU-a0,,1,30:;", id="empty-type"),
        pytest.param("GPU-a0,NVIDIA,2147483648,0:;", id="memory-over-int32"),
    ],
)
def test_decode_pod_single_device_malformed_raises_codec_error_naming_key(value: str) -> None:
    with pytest.raises(errors.CodecError) as caught:
        codec.decode_pod_single_device(value, nvidia.TO_ALLOCATE_ANNOTATION)
    assert caught.value.field == nvidia.TO_ALLOCATE_ANNOTATION


@pytest.mark.parametrize(
    "pd",
    [
        pytest.param(((dev("GPU,a0", 1, 2),),), id="comma-in-uuid"),
        pytest.param(((dev("GPU-a0", 1, 2, vendor="NV;IDIA"),),), id="semicolon-in-type"),
        pytest.param(((dev("", 1, 2),),), id="empty-uuid"),
        pytest.param(((dev("GPU-a0", -1, 2),),), id="negative-memory"),
    ],
)
def test_encode_pod_single_device_unrepresentable_raises(pd: model.PodSingleDevice) -> None:
    with pytest.raises(errors.CodecError) as caught:
        codec.encode_pod_single_device(pd)
    assert caught.value.field == nvidia.ALLOCATED_ANNOTATION


def test_decode_pod_devices_reads_present_vendors_only() -> None:
    keys = {"NVIDIA": nvidia.ALLOCATED_ANNOTATION, "DCU": hygon.ALLOCATED_ANNOTATION}
    annotations = {nvidia.ALLOCATED_ANNOTATION: SPEC_POD_DEVICES, "other": "x"}
    assert codec.decode_pod_devices(annotations, keys) == {"NVIDIA": SPEC_POD_SINGLE}


def test_decode_pod_devices_error_names_the_failing_key() -> None:
    keys = {"NVIDIA": nvidia.ALLOCATED_ANNOTATION, "DCU": hygon.ALLOCATED_ANNOTATION}
    annotations = {
        nvidia.ALLOCATED_ANNOTATION: SPEC_POD_DEVICES,
        hygon.ALLOCATED_ANNOTATION: "DCU-0,DCU,x,1:;",
    }
    with pytest.raises(errors.CodecError) as caught:
        codec.decode_pod_devices(annotations, keys)
    assert caught.value.field == hygon.ALLOCATED_ANNOTATION


def test_encode_pod_devices_uses_vendor_keys() -> None:
    keys = {"NVIDIA": nvidia.TO_ALLOCATE_ANNOTATION}
    assert codec.encode_pod_devices({"NVIDIA": SPEC_POD_SINGLE}, keys) == {
        nvidia.TO_ALLOCATE_ANNOTATION: SPEC_POD_DEVICES
    }
    with pytest.raises(errors.CodecError) as caught:
        codec.encode_pod_devices({"DCU": ((),)}, keys)
    assert caught.value.field == "DCU"


# --- MIG suffix, times, bind phase -----------------------------------------------------


@pytest.mark.parametrize(
    ("uuid", "expected"),
    [
        pytest.param("GPU-a0[1-3]", ("GPU-a0", (1, 3)), id="suffix"),
        pytest.param("GPU-a0[0-12]", ("GPU-a0", (0, 12)), id="two-digit-slot"),
        pytest.param("GPU-a0", ("GPU-a0", None), id="no-suffix"),
    ],
)
def test_split_mig_uuid_good_input_splits(
    uuid: str, expected: tuple[str, tuple[int, int] | None]
) -> None:
    assert codec.split_mig_uuid(uuid) == expected


@pytest.mark.parametrize(
    "uuid",
    [
        pytest.param("GPU-a0[1-3", id="unclosed"),
        pytest.param("GPU-a0]1-3[", id="reversed"),
        pytest.param("GPU-a0[1]", id="one-number"),
        pytest.param("GPU-a0[1-2-3]", id="three-numbers"),
        pytest.param("GPU-a0[a-1]", id="not-a-number"),
        pytest.param("GPU-a0[-1-1]", id="negative"),
        pytest.param("GPU-a0[1-2]x", id="text-after-suffix"),
        pytest.param("[1-2]", id="no-base"),
        pytest.param("GPU-a0[1-2][3-4]", id="two-suffixes"),
    ],
)
def test_split_mig_uuid_malformed_raises(uuid: str) -> None:
    with pytest.raises(errors.CodecError) as caught:
        codec.split_mig_uuid(uuid)
    assert caught.value.field == nvidia.ALLOCATED_ANNOTATION


def test_join_mig_uuid_inverts_split() -> None:
    joined = codec.join_mig_uuid("GPU-a0", 2, 5)
    assert joined == "GPU-a0[2-5]"
    assert codec.split_mig_uuid(joined) == ("GPU-a0", (2, 5))


@pytest.mark.parametrize(
    ("base", "geometry", "slot"),
    [
        pytest.param("GPU-a0[0-1]", 1, 1, id="already-suffixed"),
        pytest.param("", 0, 0, id="empty-base"),
        pytest.param("GPU-a0", -1, 0, id="negative-geometry"),
        pytest.param("GPU-a0", 0, -1, id="negative-slot"),
    ],
)
def test_join_mig_uuid_invalid_raises(base: str, geometry: int, slot: int) -> None:
    with pytest.raises(errors.CodecError):
        codec.join_mig_uuid(base, geometry, slot)


@pytest.mark.parametrize(
    ("ts", "expected"),
    [
        pytest.param(1732072495.0, "1732072495", id="seed-004-example"),
        pytest.param(1732072495.999, "1732072495", id="fraction-dropped"),
        pytest.param(0.0, "0", id="epoch"),
    ],
)
def test_encode_vgpu_time_whole_seconds(ts: float, expected: str) -> None:
    assert codec.encode_vgpu_time(ts) == expected
    assert codec.decode_vgpu_time(expected) == int(expected)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("", id="empty"),
        pytest.param("1732072495.5", id="fraction"),
        pytest.param("-1", id="negative"),
        pytest.param("+1", id="sign"),
        pytest.param("2025-07-30T10:15:04Z", id="rfc3339"),
        pytest.param("99999999999999999999", id="over-int64"),
    ],
)
def test_decode_vgpu_time_malformed_raises(value: str) -> None:
    with pytest.raises(errors.CodecError) as caught:
        codec.decode_vgpu_time(value, field=names.BIND_TIME)
    assert caught.value.field == names.BIND_TIME


@pytest.mark.parametrize("ts", [float("nan"), float("inf")])
def test_encode_vgpu_time_not_finite_raises(ts: float) -> None:
    with pytest.raises(errors.CodecError):
        codec.encode_vgpu_time(ts)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("allocating", codec.BindPhase.ALLOCATING, id="allocating"),
        pytest.param("success", codec.BindPhase.SUCCESS, id="success"),
        pytest.param("failed", codec.BindPhase.FAILED, id="failed"),
    ],
)
def test_decode_bind_phase_known_values(value: str, expected: codec.BindPhase) -> None:
    assert codec.decode_bind_phase(value) is expected
    assert str(expected) == value


@pytest.mark.parametrize("value", ["", "Success", "allocated", " success"])
def test_decode_bind_phase_unknown_raises(value: str) -> None:
    with pytest.raises(errors.CodecError) as caught:
        codec.decode_bind_phase(value)
    assert caught.value.field == names.BIND_PHASE


# --- quantities ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("32768", 32768, id="plain"),
        pytest.param(32768, 32768, id="int"),
        pytest.param(4.0, 4, id="integral-float"),
        pytest.param("1k", 1000, id="decimal-k"),
        pytest.param("1Ki", 1024, id="binary-ki"),
        pytest.param("32Gi", 32 * 2**30, id="binary-gi"),
        pytest.param("1.5Ki", 1536, id="fraction-times-binary-is-whole"),
        pytest.param("2000m", 2, id="milli-whole"),
        pytest.param("2e3", 2000, id="exponent"),
        pytest.param("1E", 10**18, id="exa-not-exponent"),
        pytest.param("+7", 7, id="plus-sign"),
        pytest.param("0", 0, id="zero"),
        pytest.param("-5", -5, id="negative"),
        pytest.param(".5k", 500, id="leading-dot"),
    ],
)
def test_parse_integer_quantity_good_input(value: object, expected: int) -> None:
    assert codec.parse_integer_quantity(value, "spec.hard.x") == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("1.5", id="fraction"),
        pytest.param("500m", id="milli-fraction"),
        pytest.param(1.5, id="float-fraction"),
        pytest.param("", id="empty"),
        pytest.param("1 Gi", id="space"),
        pytest.param("1GB", id="unknown-suffix"),
        pytest.param("1e999999999", id="huge-exponent"),
        pytest.param("16Ei", id="over-int64"),
        pytest.param(True, id="bool"),
        pytest.param(None, id="none"),
        pytest.param(float("inf"), id="infinite"),
        pytest.param(["1"], id="list"),
    ],
)
def test_parse_integer_quantity_malformed_raises_naming_field(value: object) -> None:
    with pytest.raises(errors.CodecError) as caught:
        codec.parse_integer_quantity(value, "spec.hard.limits.nvidia.com/gpumem")
    assert caught.value.field == "spec.hard.limits.nvidia.com/gpumem"
