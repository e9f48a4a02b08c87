"""The autoscaler's parts that read and write the API's shapes: the instance-type catalogue,
NodePools, the NodeClaims it makes, and which pods it leaves to Karpenter."""

from __future__ import annotations

import asyncio
from fractions import Fraction
from typing import Any

import pytest

from vgpu_operator.control import autoscale_catalogue, autoscale_claims, autoscale_units
from vgpu_operator.scheduling.autoscale import catalogue


def _card(uuid: str, index: int) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "index": index,
        "model": "NVIDIA L40S",
        "type": "NVIDIA-L40S",
        "memoryMiB": 46068,
        "cores": 100,
        "splitCount": 10,
        "health": "Healthy",
    }


def _entry(kind: str = "gpu-4xl40s", **changes: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": kind,
        "offerings": [
            {
                "Price": 12.0,
                "Available": True,
                "Requirements": [
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]},
                ],
            }
        ],
        "resources": {"cpu": "48", "memory": "384Gi", "nvidia.com/gpu": "2"},
        "cards": [_card("GPU-a", 0), _card("GPU-b", 1)],
    }
    entry.update(changes)
    return entry


def test_an_entry_is_read_with_its_cards_and_offering() -> None:
    read = autoscale_catalogue.parse_catalogue([_entry()])
    assert read.problems == ()
    (kind,) = read.types
    assert [d.memory_mib for d in kind.devices] == [46068, 46068]
    assert kind.offerings == (catalogue.Offering(12.0, "z1", "spot"),)
    assert kind.capacity["nvidia.com/gpu"] == Fraction(2)


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"cards": []}, "no card facts"),
        ({"cards": None}, "no card facts"),
        ({"offerings": [{"Price": -1}]}, "is not a finite number >= 0"),
        ({"offerings": [{"Price": "cheap"}]}, "no Price"),
        ({"resources": {"cpu": "lots", "memory": "1Gi"}}, "resources.cpu"),
        ({"cards": [_card("GPU-a", 0), _card("GPU-a", 1)]}, "distinct UUIDs"),
        ({"cards": [{**_card("GPU-a", 0), "memoryMiB": -5}]}, "cards.0.memoryMiB"),
        ({"name": ""}, "name must be a string"),
    ],
)
def test_a_bad_entry_is_left_out_with_what_to_change(changes: dict[str, Any], said: str) -> None:
    read = autoscale_catalogue.parse_catalogue([_entry("bad", **changes), _entry("good")])
    assert [t.name for t in read.types] == ["good"]
    (problem,) = read.problems
    assert said in problem


def test_a_file_that_is_not_a_list_is_refused() -> None:
    with pytest.raises(autoscale_catalogue.ConfigError):
        autoscale_catalogue.parse_catalogue({"name": "x"})


def _pool_object(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "gpu",
            "uid": "uid-1",
            "annotations": {
                "karpenter.sh/nodepool-hash": "123",
                "karpenter.sh/nodepool-hash-version": "v3",
            },
        },
        "spec": {
            "template": {
                "metadata": {"labels": {"team": "ml"}},
                "spec": {
                    "nodeClassRef": {
                        "group": "karpenter.kwok.sh",
                        "kind": "KWOKNodeClass",
                        "name": "default",
                    },
                    "requirements": [
                        {
                            "key": "node.kubernetes.io/instance-type",
                            "operator": "In",
                            "values": ["gpu-4xl40s", "gpu-8xh100"],
                        },
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
                    ],
                    "taints": [{"key": "gpu", "effect": "NoSchedule"}],
                    "expireAfter": "720h",
                },
            },
            "limits": {"nvidia.com/gpu": "16"},
            **spec,
        },
        "status": {"resources": {"nvidia.com/gpu": "8"}},
    }


def test_a_node_pool_gives_the_options_its_requirements_allow() -> None:
    pool = catalogue.read_node_pool(_pool_object())
    types = autoscale_catalogue.parse_catalogue([_entry(), _entry("gpu-other")]).types
    options = catalogue.options([pool], types)
    assert [o.instance_type.name for o in options] == ["gpu-4xl40s"]
    assert pool.limits == {"nvidia.com/gpu": Fraction(16)}
    assert pool.room({"nvidia.com/gpu": Fraction(8)}) is None
    assert "limit on nvidia.com/gpu (16)" in (pool.room({"nvidia.com/gpu": Fraction(9)}) or "")


def test_a_static_node_pool_is_not_autoscaled() -> None:
    with pytest.raises(catalogue.NodePoolError, match="static"):
        catalogue.read_node_pool(_pool_object(replicas=2))


def test_a_claim_is_the_pools_template_narrowed_to_the_chosen_offering() -> None:
    obj = _pool_object()
    pool = catalogue.read_node_pool(obj)
    (option,) = catalogue.options([pool], autoscale_catalogue.parse_catalogue([_entry()]).types)
    name = autoscale_claims.claim_name("gpu")
    claim = autoscale_claims.claim_manifest(option, obj, name)
    meta, spec = claim["metadata"], claim["spec"]
    assert meta["name"] == name
    assert name.startswith("gpu-")
    assert meta["labels"] == {
        "team": "ml",
        "karpenter.sh/nodepool": "gpu",
        autoscale_claims.OWNED_LABEL: "true",
        autoscale_claims.CLAIM_LABEL: name,
        "karpenter.kwok.sh/kwoknodeclass": "default",
    }
    assert meta["annotations"]["karpenter.sh/nodepool-hash"] == "123"
    assert meta["ownerReferences"][0]["uid"] == "uid-1"
    assert spec["taints"] == [{"key": "gpu", "effect": "NoSchedule"}]
    assert spec["expireAfter"] == "720h"
    one_each = {r["key"]: r["values"] for r in spec["requirements"]}
    assert one_each["node.kubernetes.io/instance-type"] == ["gpu-4xl40s"]
    assert one_each["karpenter.sh/capacity-type"] == ["spot"]
    assert one_each["topology.kubernetes.io/zone"] == ["z1"]
    read = autoscale_claims.read_claim(claim)
    assert read is not None
    assert read.ours
    assert read.option_key == option.key


def _pod(limits: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "n", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


@pytest.mark.parametrize(
    ("pod", "karpenters"),
    [
        (_pod({"nvidia.com/gpu": "2", "cpu": "1"}), True),
        (_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}), False),
        (_pod({"nvidia.com/gpu": "1"}, {"nvidia.com/use-gputype": "H100"}), False),
        (_pod({"example.com/fpga": "1"}), False),
        ({**_pod({}), "spec": {"containers": [], "resourceClaims": [{"name": "g"}]}}, False),
    ],
)
def test_pods_karpenters_simulation_serves(pod: dict[str, Any], karpenters: bool) -> None:
    listed = {"cpu", "memory", "pods", "nvidia.com/gpu"}
    assert autoscale_units.karpenter_serves(pod, listed) is karpenters


def _claims_pod(name: str, entry: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "n", "uid": f"uid-{name}"},
        "spec": {
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", **entry}],
        },
    }


def _gather(pods: list[dict[str, Any]], templates: dict[str, Any]) -> Any:
    return autoscale_units.gather(
        pods,  # type: ignore[arg-type]
        planned=set(),
        parked=lambda key: True,
        in_books=lambda key: False,
        listed={"cpu", "nvidia.com/gpu"},
        gangs=None,
        pins={},
        limit=10,
        templates=templates,
    )


def test_pods_with_claims_are_planned_their_template_claims_as_the_controller_makes_them() -> None:
    """A pod with a claim is a unit as it is; one whose claim is still to be made from a
    template carries that claim; one whose template is not there is left out, told which."""
    template = {"spec": {"spec": {"devices": {"requests": [{"name": "gpu"}]}}}}
    pods = [
        _claims_pod("made", {"resourceClaimName": "c1"}),
        _claims_pod("later", {"resourceClaimTemplateName": "t"}),
        _claims_pod("lost", {"resourceClaimTemplateName": "gone"}),
    ]
    assert autoscale_units.template_keys(pods) == ["n/t", "n/gone"]  # type: ignore[arg-type]
    units, left = _gather(pods, {"n/t": template})
    by_key = {u.key: u for u in units}
    assert set(by_key) == {"n/made", "n/later"}
    assert by_key["n/made"].claims == ()
    (claim,) = by_key["n/later"].claims
    assert claim["metadata"]["name"] == "later#gpu"
    statuses = by_key["n/later"].pods[0]["status"]["resourceClaimStatuses"]
    assert statuses == [{"name": "gpu", "resourceClaimName": "later#gpu"}]
    assert left == {"n/lost": "ResourceClaimTemplate n/gone not found: it cannot be planned for"}


def test_templates_are_read_at_most_a_bound_a_round_and_an_unreadable_one_skipped() -> None:
    pods = [_claims_pod(f"p{i}", {"resourceClaimTemplateName": f"t{i}"}) for i in range(40)]
    asked: list[str] = []

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        asked.append(name)
        if name == "t1":
            raise RuntimeError("forbidden")
        return None if name == "t2" else {"metadata": {"name": name}}

    found = asyncio.run(autoscale_units.read_templates(read, pods))  # type: ignore[arg-type]
    assert len(asked) == autoscale_units.TEMPLATE_READS
    assert "n/t1" not in found
    assert set(found) == {f"n/t{i}" for i in range(autoscale_units.TEMPLATE_READS)} - {
        "n/t1",
        "n/t2",
    }
