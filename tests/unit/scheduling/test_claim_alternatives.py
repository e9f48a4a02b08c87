"""Prioritized alternatives (``firstAvailable``) and ``distinctAttribute`` constraints on
the DRA path, as upstream's allocator reads them (issue 39)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.dialects.claims import claim_variants, claims

NODE = "dra-a"
CEL_INDEX = f'device.attributes["{dra.DRIVER}"].index'


def state(numa: Sequence[int] = (0, 0, 1, 1), memory_mib: int = 10240) -> ClusterState:
    engine = ClusterState(DeviceConfig())
    engine.set_node({"metadata": {"name": NODE, "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA}}})
    for device_class in dra.device_classes():
        engine.set_device_class(device_class)
    cards = [
        dra.CardShape(
            f"GPU-{i}", i, "L40S", "NVIDIA-L40S", memory_mib, 100, 4, "hami-core", numa_node=n
        )
        for i, n in enumerate(numa)
    ]
    engine.set_slice(dra.slice_wire(NODE, cards, 1, None))
    return engine


def exactly(memory: str = "1Gi", count: int = 1, cel: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "deviceClassName": dra.SHARED_CLASS,
        "count": count,
        "capacity": {"requests": {"memory": memory}},
    }
    if cel is not None:
        out["selectors"] = [{"cel": {"expression": cel}}]
    return out


def claim(
    requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    return {
        "metadata": {"namespace": "ns", "name": "c", "uid": "uid-c", "resourceVersion": "1"},
        "spec": {"devices": devices},
    }


def pod() -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": "uid-p"},
        "spec": {
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}],
        },
    }


def results(engine: ClusterState, obj: dict[str, Any]) -> list[dict[str, Any]]:
    engine.set_claim(obj)
    decision = engine.schedule(pod(), now=0)
    assert decision.scheduled, decision.diagnosis and decision.diagnosis.message()
    [write] = decision.claim_writes
    assert write.allocation is not None
    return list(write.allocation["devices"]["results"])


def refusal(engine: ClusterState, obj: dict[str, Any]) -> str:
    engine.set_claim(obj)
    decision = engine.schedule(pod(), now=0)
    assert not decision.scheduled
    assert decision.diagnosis is not None
    return decision.diagnosis.message()


def alternatives(*subs: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"name": "gpu", "firstAvailable": [{"name": n, **e} for n, e in subs]}


def test_the_first_alternative_that_fits_is_chosen_and_named_as_upstream_names_it() -> None:
    engine = state()
    big = ("big", exactly("20Gi"))  # more than any card has
    small = ("small", exactly("2Gi"))
    got = results(engine, claim([alternatives(big, small)]))
    assert [r["request"] for r in got] == ["gpu/small"]
    assert got[0]["consumedCapacity"]["memory"] == "2Gi"


def test_an_earlier_alternative_wins_when_it_fits() -> None:
    engine = state()
    two = ("two", exactly("2Gi", count=2))
    one = ("one", exactly("2Gi"))
    got = results(engine, claim([alternatives(two, one)]))
    assert [r["request"] for r in got] == ["gpu/two", "gpu/two"]


def test_a_later_request_sends_an_earlier_one_to_its_next_alternative() -> None:
    # Upstream backtracks: "gpu/any" fits alone, but then "other" (card 0 only, whole)
    # cannot; the combination "gpu/three", "other" can.
    engine = state(memory_mib=10240)
    first = ("any", exactly("10Gi", cel=f"{CEL_INDEX} == 0"))
    second = ("three", exactly("10Gi", cel=f"{CEL_INDEX} == 3"))
    other = {"name": "other", "exactly": exactly("1Gi", cel=f"{CEL_INDEX} == 0")}
    got = results(engine, claim([alternatives(first, second), other]))
    placed = [(r["request"], r["device"]) for r in got]
    assert placed == [("gpu/three", "gpu-3"), ("other", "gpu-0")]


def test_a_constraint_on_a_subrequest_covers_it_only_when_chosen() -> None:
    obj = claims.Claim("ns", "c", "u", "1", ())
    req = claims.Request("gpu/a", dra.SHARED_CLASS, 1, (), {}, ())
    alt = claims.Request("gpu/b", dra.SHARED_CLASS, 1, (), {}, ())
    other = claims.Request("x", dra.SHARED_CLASS, 1, (), {}, ())
    obj = claims.Claim(
        "ns", "c", "u", "1", (req, other),
        match_attributes=((("gpu/b", "x"), "numa"), (("gpu", "x"), "island"), ((), "all")),
        choices=((req, alt), (other,)),
    )  # fmt: skip
    first, second = claim_variants.variants(obj)
    assert [r.name for r in first.requests] == ["gpu/a", "x"]
    assert first.match_attributes == ((("x",), "numa"), (("gpu/a", "x"), "island"), ((), "all"))
    assert [r.name for r in second.requests] == ["gpu/b", "x"]
    assert second.match_attributes[0] == (("gpu/b", "x"), "numa")


def test_distinct_attribute_spreads_a_request_over_numa_nodes() -> None:
    engine = state(numa=(0, 0, 1, 1))
    constraint = {"requests": ["gpu"], "distinctAttribute": dra.ATTR_NUMA_NODE}
    got = results(engine, claim([{"name": "gpu", "exactly": exactly(count=2)}], [constraint]))
    numa = {"gpu-0": 0, "gpu-1": 0, "gpu-2": 1, "gpu-3": 1}
    assert sorted(numa[r["device"]] for r in got) == [0, 1]


def test_distinct_attribute_across_requests() -> None:
    engine = state(numa=(0, 0, 1, 1))
    constraint = {"distinctAttribute": dra.ATTR_NUMA_NODE}
    requests = [{"name": "a", "exactly": exactly()}, {"name": "b", "exactly": exactly()}]
    got = results(engine, claim(requests, [constraint]))
    numa = {"gpu-0": 0, "gpu-1": 0, "gpu-2": 1, "gpu-3": 1}
    assert {numa[r["device"]] for r in got} == {0, 1}


def test_distinct_attribute_with_too_few_values_does_not_fit() -> None:
    engine = state(numa=(0, 0, 1, 1))
    constraint = {"requests": ["gpu"], "distinctAttribute": dra.ATTR_NUMA_NODE}
    message = refusal(engine, claim([{"name": "gpu", "exactly": exactly(count=3)}], [constraint]))
    assert "NodeInsufficientDevice" in message


def test_a_device_without_the_distinct_attribute_does_not_serve() -> None:
    engine = ClusterState(DeviceConfig())
    engine.set_node({"metadata": {"name": NODE, "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA}}})
    for device_class in dra.device_classes():
        engine.set_device_class(device_class)
    cards = [dra.CardShape(f"GPU-{i}", i, "L40S", "NVIDIA-L40S", 10240, 100, 4, "hami-core")
             for i in range(2)]  # fmt: skip
    engine.set_slice(dra.slice_wire(NODE, cards, 1, None))
    constraint = {"distinctAttribute": dra.ATTR_NUMA_NODE}
    refusal(engine, claim([{"name": "gpu", "exactly": exactly()}], [constraint]))


@pytest.mark.parametrize(
    ("requests", "constraints", "says"),
    [
        ([{"name": "gpu"}], None, "neither exactly nor firstAvailable"),
        (
            [{"name": "gpu", "exactly": exactly(), "firstAvailable": [{"name": "a"}]}],
            None,
            "both exactly and firstAvailable",
        ),
        ([alternatives(("a", exactly()), ("a", exactly()))], None, "one alternative twice"),
        (
            [alternatives(("a", {**exactly(), "deviceClassName": "other.example.com"}))],
            None,
            "the alternative 'gpu/a' uses DeviceClass 'other.example.com'",
        ),
        (
            [alternatives(("a", {**exactly(), "allocationMode": "All"}))],
            None,
            "allocationMode All",
        ),
        (
            [{"name": "gpu", "exactly": exactly()}],
            [{"requests": ["gpu/x"], "distinctAttribute": "index"}],
            "'gpu/x', which is not a request",
        ),
        (
            [{"name": "gpu", "exactly": exactly()}],
            [{"matchAttribute": "index", "distinctAttribute": "uuid"}],
            "exactly one of matchAttribute and distinctAttribute",
        ),
        (
            [
                alternatives(*((f"s{j}", exactly()) for j in range(4))) | {"name": f"r{k}"}
                for k in range(5)
            ],
            None,
            "1024 combinations",
        ),
    ],
)
def test_unsupported_or_bad_fields_get_a_sentence(
    requests: list[dict[str, Any]], constraints: list[dict[str, Any]] | None, says: str
) -> None:
    assert says in refusal(state(), claim(requests, constraints))


@pytest.mark.parametrize("kind", ["distinct", "capacity"])
def test_a_later_request_sends_an_earlier_one_to_another_card(kind: str) -> None:
    # The first request may take several cards; the one it would take first is the only
    # one the second may use. Upstream's allocator goes back and so does the engine.
    engine = state(memory_mib=10240)
    if kind == "distinct":
        first = exactly(cel=f"{CEL_INDEX} >= 2")
        second = exactly(cel=f"{CEL_INDEX} == 3")
        constraints = [{"distinctAttribute": f"{dra.DRIVER}/{dra.ATTR_INDEX}"}]
    else:
        first = exactly("6Gi", cel=f"{CEL_INDEX} >= 2")
        second = exactly("6Gi", cel=f"{CEL_INDEX} == 3")
        constraints = []
    requests = [{"name": "a", "exactly": first}, {"name": "b", "exactly": second}]
    got = results(engine, claim(requests, constraints))
    assert [(r["request"], r["device"]) for r in got] == [("a", "gpu-2"), ("b", "gpu-3")]


def test_under_match_attribute_an_earlier_request_moves_rather_than_a_later_one_falls_back() -> (
    None
):
    # The differential test's seed 7, case 92: upstream's depth-first allocator puts "a"
    # on card 0 (NUMA 0) first, so "b" falls back to its second alternative; the first
    # combination that fits, in order, keeps "b" on its first (and "a" on NUMA 1).
    engine = state(numa=(0, 0, 1, 1))
    a = alternatives(("s0", exactly("4Gi")), ("s1", exactly("4Gi", cel=f"{CEL_INDEX} >= 2")))
    b = alternatives(
        ("s0", exactly(cel=f"{CEL_INDEX} >= 2")), ("s1", exactly(cel=f"{CEL_INDEX} == 0"))
    )
    requests = [a | {"name": "a"}, b | {"name": "b"}]
    got = results(engine, claim(requests, [{"matchAttribute": dra.ATTR_NUMA_NODE}]))
    assert [r["request"] for r in got] == ["a/s0", "b/s0"]
    assert {r["device"] for r in got} <= {"gpu-2", "gpu-3"}


def test_a_class_config_names_the_alternative_chosen() -> None:
    engine = state()
    opaque = {"driver": dra.DRIVER, "parameters": {"example": 1}}
    for device_class in dra.device_classes():
        if device_class["metadata"]["name"] == dra.SHARED_CLASS:
            device_class = {
                **device_class,
                "spec": {**device_class["spec"], "config": [{"opaque": opaque}]},
            }
        engine.set_device_class(device_class)
    engine.set_claim(claim([alternatives(("big", exactly("20Gi")), ("small", exactly("2Gi")))]))
    decision = engine.schedule(pod(), now=0)
    [write] = decision.claim_writes
    assert write.allocation is not None
    config = write.allocation["devices"]["config"]
    assert config == [{"source": "FromClass", "requests": ["gpu/small"], "opaque": opaque}]
