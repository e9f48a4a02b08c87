"""The engine allocates claims of the MIG DeviceClass: instances by the MIG rules, the
counters of every hold (other allocators' and its own decisions in flight) taken first so
two decisions never overlap, the allocation written as upstream's (no consumed capacity),
and a clear reason when nothing fits."""

from __future__ import annotations

from typing import Any

from builders import claim_status, resource_quota

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import dra, dra_mig
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.dialects.claims import claim_mig, claim_routing

NODE = "mig-a"
CARD = dra_mig.MigCardShape(
    uuid="GPU-00000000-aaaa-bbbb-cccc-000000000000",
    index=0,
    product="NVIDIA A100-SXM4-40GB",
    hami_type="NVIDIA-A100",
    memory_mib=40960,
)


def state() -> ClusterState:
    engine = ClusterState(DeviceConfig())
    engine.set_node({"metadata": {"name": NODE, "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA}}})
    for device_class in dra.device_classes():
        engine.set_device_class(device_class)
    for item in dra_mig.pool_slices(NODE, [], [CARD], 1, None):
        engine.set_slice(dict(item))
    return engine


def claim(name: str, profile: str | None = None, memory: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": dra.MIG_CLASS}
    if profile is not None:
        expression = f'device.attributes["{dra.DRIVER}"].profile == "{profile}"'
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": exactly}]}},
    }


def pod(name: str, claim_name: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "containers": [{"name": "c", "resources": {"claims": [{"name": "mig"}]}}],
            "resourceClaims": [{"name": "mig", "resourceClaimName": claim_name}],
        },
    }


def placed(engine: ClusterState, name: str, **ask: str) -> tuple[str, dict[str, Any]] | None:
    engine.set_claim(claim(name, **ask))
    decision = engine.schedule(pod(f"p-{name}", name), now=0)
    if not decision.scheduled:
        return None
    [write] = decision.claim_writes
    assert write.allocation is not None
    [result] = write.allocation["devices"]["results"]
    return str(result["device"]), dict(result)


def instance(profile: str, start: int) -> str:
    return dra_mig.instance_name(CARD.uuid, profile, start)


def test_a_mig_claim_gets_the_instance_the_mig_rules_choose_and_an_upstream_result() -> None:
    engine = state()
    got = placed(engine, "a", profile="1g.5gb")
    assert got is not None
    device, result = got
    assert device == instance("1g.5gb", 6)  # v2.10: 1g from the highest start
    assert result == {"request": "mig", "driver": dra.DRIVER, "pool": NODE, "device": device}


def test_decisions_in_flight_hold_their_counters_so_instances_never_overlap() -> None:
    engine = state()
    first = placed(engine, "a", profile="4g.20gb")
    assert first is not None
    assert first[0] == instance("4g.20gb", 0)
    # The first decision's claim is not written back yet: its hold still counts.
    second = placed(engine, "b", profile="3g.20gb")
    assert second is not None
    assert second[0] == instance("3g.20gb", 4)
    assert placed(engine, "c", profile="1g.5gb") is None  # every compute slice is taken
    engine.rollback("ns/p-a")  # the 4g goes: its slices come back
    again = placed(engine, "d", profile="4g.20gb")
    assert again is not None
    assert again[0] == instance("4g.20gb", 0)


def test_a_request_by_memory_takes_the_smallest_profile_that_holds_it() -> None:
    engine = state()
    got = placed(engine, "a", memory="9Gi")
    assert got is not None
    assert got[0] == instance("2g.10gb", 4)  # 1g.5gb is too small; 2g is the smallest


def test_refusals_say_why() -> None:
    engine = state()
    engine.set_claim(claim("none", profile="9g.99gb"))
    decision = engine.schedule(pod("p-none", "none"), now=0)
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert "DeviceNotSelected" in decision.diagnosis.message()
    assert placed(engine, "big", profile="7g.40gb") is not None
    engine.set_claim(claim("full", profile="1g.5gb"))
    decision = engine.schedule(pod("p-full", "full"), now=0)
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert "CardMigTopologyInfeasible" in decision.diagnosis.message()


def test_a_claim_mixing_mig_and_shares_is_refused_with_a_sentence() -> None:
    engine = state()
    mixed = claim("mixed", profile="1g.5gb")
    mixed["spec"]["devices"]["requests"].append(
        {"name": "share", "exactly": {"deviceClassName": dra.SHARED_CLASS}}
    )
    engine.set_claim(mixed)
    decision = engine.schedule(pod("p", "mixed"), now=0)
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert "claims of their own" in decision.diagnosis.message()


def test_pods_with_mig_claims_are_routed_to_this_scheduler() -> None:
    bare = pod("p", "a")
    del bare["spec"]["schedulerName"]
    ref = claim_routing.ClaimRef(claim_routing.CLAIM, "a")
    routing = claim_routing.route(bare, [(ref, claim("a", profile="1g.5gb"))], "vgpu-scheduler")
    assert routing.action is claim_routing.Action.ROUTE


def dual_state() -> ClusterState:
    """The card offered both ways: its share device consumes every counter of the card."""
    engine = ClusterState(DeviceConfig())
    engine.set_node({"metadata": {"name": NODE, "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA}}})
    for device_class in dra.device_classes():
        engine.set_device_class(device_class)
    slices = [dict(s) for s in dra_mig.pool_slices(NODE, [], [CARD], 1, None)]
    share = {
        "name": CARD.name,
        "allowMultipleAllocations": True,
        "attributes": {"mode": {"string": "hami-core"}},
        "capacity": {dra.MEMORY: {"value": "40960Mi"}},
        "consumesCounters": dra_mig.shared_device_counters(CARD.uuid),
    }
    slices[0]["spec"] = {**slices[0]["spec"], "devices": [share]}
    for item in slices:
        engine.set_slice(item)
    return engine


def test_a_card_offered_as_shares_and_as_mig_is_never_both_at_once() -> None:
    engine = dual_state()
    upstream = claim("upstream-share")
    upstream["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = dra.SHARED_CLASS
    upstream["status"] = claim_status(NODE, CARD.name, request="mig", consumed={"memory": "1Gi"})
    engine.set_claim(upstream)  # kube-scheduler gave a share of the card
    assert placed(engine, "a", profile="1g.5gb") is None
    engine.remove_claim("ns/upstream-share")
    got = placed(engine, "b", profile="1g.5gb")
    assert got is not None  # the share went: instances may be made
    # ... and while an instance holds, the engine offers no share of the card.
    engine.set_claim(
        {
            "metadata": {"namespace": "ns", "name": "s", "uid": "uid-s", "resourceVersion": "1"},
            "spec": {
                "devices": {
                    "requests": [{"name": "mig", "exactly": {"deviceClassName": dra.SHARED_CLASS}}]
                }
            },
        }
    )
    assert not engine.schedule(pod("p-s", "s"), now=0).scheduled


def test_a_request_for_several_instances_gets_them_all_on_free_slices_or_none() -> None:
    engine = state()
    many = claim("many", profile="2g.10gb")
    many["spec"]["devices"]["requests"][0]["exactly"]["count"] = 3
    engine.set_claim(many)
    decision = engine.schedule(pod("p-many", "many"), now=0)
    assert decision.scheduled
    [write] = decision.claim_writes
    assert write.allocation is not None
    devices = [r["device"] for r in write.allocation["devices"]["results"]]
    assert sorted(devices) == sorted(instance("2g.10gb", s) for s in (0, 2, 4))
    more = claim("more", profile="1g.5gb")
    more["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    engine.set_claim(more)
    # One compute slice is left: one 1g fits, two do not, and the claim gets none.
    assert not engine.schedule(pod("p-more", "more"), now=0).scheduled
    assert placed(engine, "one", profile="1g.5gb") is not None


def test_a_device_held_twice_takes_its_card_whole() -> None:
    node = claim_mig.read_mig_node(
        NODE, [dict(s) for s in dra_mig.pool_slices(NODE, [], [CARD], 1, None)]
    )
    assert node is not None
    one = instance("1g.5gb", 0)
    counted = claim_mig.ledger(node, [one, one])
    assert all(v == 0 for counters in counted.left.values() for v in counters.values())
    assert claim_mig.ledger(node, [one]).fits(node.pool.by_name[instance("1g.5gb", 1)].consumes)


def test_instances_count_their_memory_in_the_namespace_quota() -> None:
    engine = state()
    engine.set_quota(resource_quota("ns", gpumem=12000))
    first = placed(engine, "a", profile="2g.10gb")  # 9.75 GiB of 12000 MiB
    assert first is not None
    engine.set_claim(claim("b", profile="1g.5gb"))
    decision = engine.schedule(pod("p-b", "b"), now=0)
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert "ResourceQuotaNotFit" in decision.diagnosis.message()
    engine.rollback("ns/p-a")  # the 2g's hold goes, and its memory from the quota
    assert engine.schedule(pod("p-b", "b"), now=0).scheduled


def test_a_claim_the_quota_refuses_is_told_the_quota_even_when_the_cards_are_full() -> None:
    """Issue 44: with no room left and the quota refusing even the smallest instance, the
    pod was told CardMigTopologyInfeasible first (room freed would not have helped)."""
    engine = state()
    engine.set_quota(resource_quota("ns", gpumem=42000))
    assert placed(engine, "big", profile="7g.40gb") is not None  # the whole card
    engine.set_claim(claim("small", profile="1g.5gb"))
    decision = engine.schedule(pod("p-small", "small"), now=0)
    assert not decision.scheduled
    assert decision.diagnosis is not None
    message = decision.diagnosis.message()
    assert "ResourceQuotaNotFit" in message, message
    assert "CardMigTopologyInfeasible" not in message, message
