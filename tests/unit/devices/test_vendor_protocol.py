"""Both vendors implement the seed-001 Devices interface and schedule through it."""

from __future__ import annotations

import pytest

from vgpu_operator.config import load_config
from vgpu_operator.devices import codec, model
from vgpu_operator.devices.protocol import DeviceVendor
from vgpu_operator.devices.registry import VendorRegistry
from vgpu_operator.scheduling.vendor_devices import registry


def _card(uuid: str, vendor: str, type_: str, memory: int = 16384) -> model.DeviceUsage:
    info = model.DeviceInfo(uuid, 0, 4, memory, 100, type_, 0, True, "hami-core", vendor=vendor)
    return model.DeviceUsage.from_info(info)


def test_registry_holds_both_vendors_in_scan_order() -> None:
    vendors = registry(load_config({}))
    assert vendors.words() == ["NVIDIA", "DCU"]
    assert all(isinstance(v, DeviceVendor) for v in vendors)


def test_registering_a_common_word_twice_is_refused() -> None:
    vendors = registry(load_config({}))
    again = VendorRegistry()
    again.register(vendors.get("NVIDIA"))
    with pytest.raises(ValueError, match="already registered"):
        again.register(vendors.get("NVIDIA"))


@pytest.mark.parametrize(
    ("word", "limits", "card_type", "expected_memory"),
    [
        pytest.param(
            "NVIDIA",
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000},
            "NVIDIA A10",
            2000,
            id="nvidia",
        ),
        pytest.param(
            "DCU", {"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000}, "DCU-Z100", 2000, id="hygon"
        ),
    ],
)
def test_each_vendor_fits_its_own_cards_only(
    word: str, limits: dict[str, int], card_type: str, expected_memory: int
) -> None:
    vendor = registry(load_config({})).get(word)
    request = vendor.resource_requests({"resources": {"limits": limits}})
    assert request is not None
    assert request.vendor == word
    own = _card("own-0", word, card_type)
    foreign = _card("foreign-0", "X", "Other-Card")
    verdict = vendor.fit([foreign, own], request, {}, {}, {})
    assert verdict.ok
    assert [d.uuid for d in verdict.devices] == ["own-0"]
    assert verdict.devices[0].memory_mib == expected_memory


def test_fit_failure_uses_hamis_reason_string() -> None:
    vendor = registry(load_config({})).get("DCU")
    request = vendor.resource_requests(
        {"resources": {"limits": {"hygon.com/dcunum": 1, "hygon.com/dcumem": 99999}}}
    )
    assert request is not None
    verdict = vendor.fit([_card("d0", "DCU", "DCU-Z100")], request, {}, {}, {})
    assert not verdict.ok
    assert verdict.reason == "1/1 CardInsufficientMemory"


def test_patch_annotations_writes_both_allocation_keys() -> None:
    vendor = registry(load_config({})).get("NVIDIA")
    devices = {"NVIDIA": ((model.ContainerDevice("GPU-a", "NVIDIA", 1024, 10),),)}
    annotations = vendor.patch_annotations({}, {}, devices)
    assert annotations == {
        "hami.io/vgpu-devices-to-allocate": "GPU-a,NVIDIA,1024,10:;",
        "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,1024,10:;",
    }
    assert (
        codec.decode_pod_single_device(annotations["hami.io/vgpu-devices-allocated"], "k")
        == (devices["NVIDIA"])
    )


def test_node_lock_is_released_only_by_its_holder() -> None:
    vendor = registry(load_config({})).get("NVIDIA")
    pod = {"metadata": {"namespace": "ns", "name": "p"}}
    lock = vendor.lock_node({}, pod, 0.0)
    assert lock == {"hami.io/mutex.lock": "1970-01-01T00:00:00Z,ns,p"}
    node = {"metadata": {"annotations": lock}}
    assert vendor.release_node_lock(node, pod) == {"hami.io/mutex.lock": None}
    other = {"metadata": {"namespace": "ns", "name": "q"}}
    assert vendor.release_node_lock(node, other) == {}


def test_health_follows_the_gpu_count_as_seed_000_describes() -> None:
    vendor = registry(load_config({})).get("NVIDIA")

    def node(count: int) -> dict[str, object]:
        return {"metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": count}}}

    assert vendor.check_health("NVIDIA", node(0)) == (True, False)
    assert vendor.check_health("NVIDIA", node(4)) == (True, True)
    assert vendor.check_health("NVIDIA", node(4)) == (True, False)
    assert vendor.check_health("NVIDIA", node(0)) == (False, False)
