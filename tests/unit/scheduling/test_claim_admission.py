"""HAMi-style requests turned into ResourceClaimTemplates (``claim_admission``): the
mapping table of docs/dra-engine.md, row by row."""

from __future__ import annotations

from typing import Any

import pytest

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import dra
from vgpu_operator.devices.catalog import VENDOR_TABLE
from vgpu_operator.scheduling.cel import claim_cel
from vgpu_operator.scheduling.dialects.claims import claim_admission
from vgpu_operator.scheduling.vendors import Vendors

VENDORS = Vendors(DeviceConfig(), VENDOR_TABLE)
ATTRS = f'device.attributes["{dra.DRIVER}"]'


def pod(limits: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ml", "annotations": annotations or {}},
        "spec": {
            "containers": [
                {"name": "main", "resources": {"limits": {"cpu": "1", **limits}}},
                {"name": "side", "resources": {"limits": {"cpu": "1"}}},
            ]
        },
    }


def request_of(conversion: claim_admission.Conversion) -> dict[str, Any]:
    [template] = conversion.templates
    [request] = template["spec"]["spec"]["devices"]["requests"]
    exactly: dict[str, Any] = request["exactly"]
    return exactly


def test_count_memory_and_cores_become_the_request() -> None:
    converted = claim_admission.convert(
        pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 8192, "nvidia.com/gpucores": 30}),
        VENDORS,
    )
    assert converted is not None
    assert request_of(converted) == {
        "deviceClassName": dra.SHARED_CLASS,
        "count": 2,
        "capacity": {"requests": {"memory": "8192Mi", "cores": "30"}},
    }
    main, side = converted.pod["spec"]["containers"]
    assert main["resources"]["limits"] == {"cpu": "1"}  # the extended resources went
    [entry] = converted.pod["spec"]["resourceClaims"]
    assert main["resources"]["claims"] == [{"name": entry["name"]}]
    assert entry["resourceClaimTemplateName"] == converted.templates[0]["metadata"]["name"]
    assert "claims" not in side["resources"]


def test_identical_requests_share_one_template() -> None:
    one = claim_admission.convert(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100}), VENDORS)
    two = claim_admission.convert(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100}), VENDORS)
    other = claim_admission.convert(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 200}), VENDORS)
    assert one is not None
    assert two is not None
    assert other is not None
    name = one.templates[0]["metadata"]["name"]
    assert name == two.templates[0]["metadata"]["name"] != other.templates[0]["metadata"]["name"]


def test_a_full_card_percentage_asks_the_default_and_a_part_is_refused() -> None:
    whole = claim_admission.convert(
        pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100}), VENDORS
    )
    assert whole is not None
    assert "memory" not in (request_of(whole).get("capacity") or {}).get("requests", {})
    with pytest.raises(claim_admission.Unmappable, match="gpumem-percentage=50"):
        claim_admission.convert(
            pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}), VENDORS
        )


def test_card_annotations_become_selectors_that_the_engine_evaluates() -> None:
    converted = claim_admission.convert(
        pod(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100},
            {
                "nvidia.com/use-gputype": "A100, H100",
                "nvidia.com/nouse-gputype": "PCIE",
                "nvidia.com/use-gpuuuid": "GPU-1,GPU-2",
                "nvidia.com/nouse-gpuuuid": "GPU-2",
            },
        ),
        VENDORS,
    )
    assert converted is not None
    expressions = [s["cel"]["expression"] for s in request_of(converted)["selectors"]]
    selectors = [claim_cel.compile_selector(e) for e in expressions]

    def card(uuid: str, card_type: str) -> claim_cel.DeviceView:
        attributes = {
            f"{dra.DRIVER}/uuid": ("string", uuid),
            f"{dra.DRIVER}/type": ("string", card_type),
        }
        return claim_cel.DeviceView(dra.DRIVER, True, attributes, {})

    def chosen(uuid: str, card_type: str) -> bool:
        return all(s.matches(card(uuid, card_type)) for s in selectors)

    assert chosen("GPU-1", "NVIDIA-NVIDIA A100-SXM4-80GB")
    assert not chosen("GPU-1", "NVIDIA-NVIDIA A100-PCIE-40GB")  # nouse-gputype
    assert not chosen("GPU-2", "NVIDIA-NVIDIA H100")  # nouse-gpuuuid
    assert not chosen("GPU-3", "NVIDIA-NVIDIA H100")  # not in use-gpuuuid
    assert not chosen("GPU-1", "NVIDIA-L40S")  # not a used type


def test_numa_bind_constrains_several_cards_to_one_numa_node() -> None:
    converted = claim_admission.convert(
        pod({"nvidia.com/gpu": 2}, {"nvidia.com/numa-bind": "true"}), VENDORS
    )
    assert converted is not None
    devices = converted.templates[0]["spec"]["spec"]["devices"]
    assert devices["constraints"] == [{"requests": ["gpu"], "matchAttribute": dra.ATTR_NUMA_NODE}]


def test_other_modes_cannot_be_served_on_the_dra_path() -> None:
    with pytest.raises(claim_admission.Unmappable, match="vgpu-mode"):
        claim_admission.convert(
            pod({"nvidia.com/gpu": 1}, {"nvidia.com/vgpu-mode": "mig"}), VENDORS
        )


def test_a_pod_without_gpus_is_left_alone() -> None:
    assert claim_admission.convert(pod({}), VENDORS) is None


def _as_the_api_server_returns(template: dict[str, Any]) -> dict[str, Any]:
    """The template as kube-apiserver gives it back: defaults filled in, quantities in
    canonical form (8192Mi reads back as 8Gi), server metadata added."""
    import copy

    returned = copy.deepcopy(template)
    returned["metadata"].update({"uid": "u", "resourceVersion": "7"})
    returned["spec"]["metadata"] = {"creationTimestamp": None}
    for request in returned["spec"]["spec"]["devices"]["requests"]:
        exactly = request["exactly"]
        exactly["allocationMode"] = "ExactCount"
        exactly.setdefault("count", 1)
        memory = exactly.get("capacity", {}).get("requests", {}).get("memory")
        if memory == "8192Mi":
            exactly["capacity"]["requests"]["memory"] = "8Gi"
    return returned


def test_a_template_read_back_with_the_api_servers_defaults_is_the_same() -> None:
    """Issue 33 item 6: the second pod of a shape found the template the first made and
    was refused, because the API server's copy carries defaults."""
    for limits in (
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192, "nvidia.com/gpucores": 30},
        {"nvidia.com/gpu": 2},
    ):
        converted = claim_admission.convert(pod(limits), VENDORS)
        assert converted is not None
        [wanted] = converted.templates
        existing = _as_the_api_server_returns(wanted)
        assert claim_admission.same_template(existing, wanted)


def test_a_template_that_asks_something_else_is_not_the_same() -> None:
    converted = claim_admission.convert(
        pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8192}), VENDORS
    )
    assert converted is not None
    [wanted] = converted.templates
    for change in (
        lambda e: e["capacity"]["requests"].update(memory="9Gi"),
        lambda e: e.update(count=2),
        lambda e: e.update(allocationMode="All"),
        lambda e: e.update(selectors=[{"cel": {"expression": "true"}}]),
        lambda e: e.update(adminAccess=True),
    ):
        existing = _as_the_api_server_returns(wanted)
        change(existing["spec"]["spec"]["devices"]["requests"][0]["exactly"])
        assert not claim_admission.same_template(existing, wanted)
    existing = _as_the_api_server_returns(wanted)
    existing["spec"]["spec"]["devices"]["config"] = [{"opaque": {"driver": "x", "parameters": {}}}]
    assert not claim_admission.same_template(existing, wanted)


def test_templates_say_they_are_the_webhooks() -> None:
    converted = claim_admission.convert(pod({"nvidia.com/gpu": 1}), VENDORS)
    assert converted is not None
    [template] = converted.templates
    assert claim_admission.made_by_webhook(template)
    digest = template["metadata"]["annotations"][claim_admission.DIGEST_ANNOTATION]
    assert digest == claim_admission.spec_digest(template["spec"])
    forged = {**template, "metadata": {**template["metadata"], "name": "vgpu-0123456789abcdef"}}
    assert not claim_admission.made_by_webhook(forged)
    unlabelled = {**template, "metadata": {**template["metadata"], "labels": {}}}
    assert not claim_admission.made_by_webhook(unlabelled)
