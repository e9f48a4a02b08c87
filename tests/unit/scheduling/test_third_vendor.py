"""A third vendor, registered in one place (the table below), is scheduled end to end.

The README's "Adding a vendor" promises that a vendor is one ``VendorSpec`` and one
table entry: this test adds "ACME" that way and nothing else, then checks that every
derived list (requests, allocation annotations, quota resources, node annotations,
config section) follows.
"""

from __future__ import annotations

from typing import Any, Final

import pytest
from pydantic import Field

from vgpu_operator.config import VendorConfig, load_config
from vgpu_operator.devices import catalog, codec, model
from vgpu_operator.devices.vendor import VendorSpec
from vgpu_operator.errors import ConfigError
from vgpu_operator.scheduling.cycle.cluster import ClusterState


class AcmeConfig(VendorConfig):
    resource_count_name: str = Field("acme.com/npu", alias="resourceCountName")
    resource_memory_name: str = Field("acme.com/npumem", alias="resourceMemoryName")
    resource_core_name: str = Field("acme.com/npucores", alias="resourceCoreName")


ACME: Final = VendorSpec(
    common_word="ACME",
    config_key="acme",
    config_type=AcmeConfig,
    type_marker="ACME",
    register_annotation="hami.io/node-acme-register",
    score_annotation=None,
    to_allocate_annotation="hami.io/acme-devices-to-allocate",
    allocated_annotation="hami.io/acme-devices-allocated",
    use_type_annotation="acme.com/use-npytype",
    nouse_type_annotation="acme.com/nouse-npytype",
    use_uuid_annotation="acme.com/use-npuuuid",
    nouse_uuid_annotation="acme.com/nouse-npuuuid",
)

#: The one place the vendor is registered.
TABLE: Final = (*catalog.VENDOR_TABLE, ACME)


def _acme_node(name: str, *cards: tuple[str, int]) -> dict[str, Any]:
    devices = [
        model.DeviceInfo(uuid, i, 4, memory, 100, "ACME-N1", 0, True, vendor="ACME")
        for i, (uuid, memory) in enumerate(cards)
    ]
    register = codec.encode_node_devices_json(devices, ACME.register_annotation)
    return {
        "metadata": {"name": name, "annotations": {ACME.register_annotation: register}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _acme_pod(name: str, memory: int, namespace: str = "default") -> dict[str, Any]:
    limits = {"acme.com/npu": 1, "acme.com/npumem": memory}
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }


def _state(config: dict[str, Any] | None = None) -> ClusterState:
    state = ClusterState(load_config(config), vendor_table=TABLE)
    state.set_node(_acme_node("npu-1", ("NPU-a", 8000), ("NPU-b", 16000)))
    return state


def test_a_pod_asking_the_third_vendor_is_placed_and_annotated_with_its_keys() -> None:
    decision = _state().schedule(_acme_pod("p", 12000), now=0.0)
    assert decision.scheduled
    assert decision.node == "npu-1"
    allocated = decision.annotations[ACME.to_allocate_annotation]
    assert allocated == decision.annotations[ACME.allocated_annotation]
    assert "NPU-b" in allocated
    assert "NPU-a" not in allocated


def test_the_third_vendor_never_overcommits_its_cards() -> None:
    state = _state()
    first = state.schedule(_acme_pod("one", 9000), now=0.0)
    second = state.schedule(_acme_pod("two", 9000), now=0.0)
    assert first.scheduled
    assert not second.scheduled


def test_its_config_section_is_read_without_a_field_of_its_own() -> None:
    config = {"acme": {"resourceCountName": "acme.com/card", "defaultMemory": 100}}
    state = _state(config)
    pod = _acme_pod("p", 12000)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    limits["acme.com/card"] = limits.pop("acme.com/npu")
    assert state.schedule(pod, now=0.0).scheduled


def test_a_bad_value_in_its_section_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"acme\.memoryFactor"):
        ClusterState(load_config({"acme": {"memoryFactor": -1}}), vendor_table=TABLE)


def test_its_quota_resources_and_node_annotations_come_from_the_table() -> None:
    quota = {
        "metadata": {"name": "q", "namespace": "team"},
        "spec": {"hard": {"limits.acme.com/npumem": "10000"}},
    }
    state = _state()
    state.set_quota(quota)
    assert state.schedule(_acme_pod("fits", 9000, "team"), now=0.0).scheduled
    assert not state.schedule(_acme_pod("over", 9000, "team"), now=0.0).scheduled
    assert ACME.register_annotation in catalog.node_annotations(TABLE)
    assert ACME.register_annotation not in catalog.node_annotations()


def test_its_section_is_checked_when_the_config_is_read_and_its_prefix_is_known() -> None:
    """The file is refused when read (not when first used), and the Kueue check knows
    the vendor's pods by its resources: both come from the table."""
    with pytest.raises(ConfigError, match=r"acme\.memoryFactor"):
        catalog.load_config({"acme": {"memoryFactor": -1}}, TABLE)
    catalog.load_config({"acme": {"memoryFactor": -1}})  # not a vendor of the shipped table
    assert catalog.resource_prefixes(TABLE) == (*catalog.resource_prefixes(), "acme.com/")
    assert catalog.resource_prefixes() == ("nvidia.com/", "hygon.com/")
