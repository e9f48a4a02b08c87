"""The books against a tenant's claims (issue 33): a claim with HAMi-core off holds its
cards whole, an adminAccess result holds nothing, and a claim that goes from under a
running pod keeps its hold (in the books and the quota) until the pod ends."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from unit.scheduling.test_claim_books import NODE, claim, pod, state

from vgpu_operator.agent.dra import prepare
from vgpu_operator.devices import dra
from vgpu_operator.scheduling.books import claim_ledger
from vgpu_operator.scheduling.cycle.cluster import ClusterState

CARD_MIB = 10240  # the card test_claim_books.state() publishes
CARD_SLOTS = 4


def usage(engine: ClusterState) -> tuple[int, int, int]:
    [row] = engine.device_usage()
    return row.used_slots, row.used_memory_mib, row.used_cores


def quota_memory(engine: ClusterState) -> int:
    """What the namespace ``ns`` has used of its GPU memory quota (MiB)."""
    used = engine.quota_usage().get("ns", {})
    return sum(amount for name, (amount, _) in used.items() if name.endswith("gpumem"))


def reserved(obj: dict[str, Any], *pods: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["status"]["reservedFor"] = [
        {"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods
    ]
    return out


def running(name: str, claim_name: str, phase: str = "Running") -> dict[str, Any]:
    out = pod(name, claim_name)
    out["spec"]["nodeName"] = NODE
    out["status"] = {"phase": phase}
    return out


def with_config(obj: dict[str, Any], parameters: Any, source: str = "FromClaim") -> dict[str, Any]:
    out = copy.deepcopy(obj)
    devices = out["status"]["allocation"]["devices"]
    devices.setdefault("config", []).append(
        {"source": source, "opaque": {"driver": dra.DRIVER, "parameters": parameters}}
    )
    return out


# --- HAMi-core off -------------------------------------------------------------------------


def test_a_claim_with_hami_core_off_holds_its_card_whole_in_the_books_and_the_quota() -> None:
    engine = state()
    engine.set_claim(with_config(claim("raw", "1Gi", allocated=True), {"hamiCore": False}))
    assert usage(engine) == (CARD_SLOTS, CARD_MIB, 100)
    assert quota_memory(engine) == CARD_MIB
    # Nothing else fits beside it, and a recount finds a second claim there over-committed.
    engine.set_claim(claim("next", "1Gi"))
    assert not engine.schedule(pod("p", "next"), now=0).scheduled
    engine.set_claim(claim("beside", "1Gi", allocated=True))
    assert engine.over_committed(NODE, ["gpu-a"]) == ["gpu-a"]


def _asking_whole(name: str, memory: str) -> dict[str, Any]:
    """A pending claim whose own config turns HAMi-core off."""
    out = claim(name, memory)
    out["spec"]["devices"]["config"] = [
        {"opaque": {"driver": dra.DRIVER, "parameters": {"hamiCore": False}}}
    ]
    return out


def test_the_engine_places_a_claim_with_hami_core_off_only_on_a_card_it_takes_whole() -> None:
    # The books count such a claim whole once allocated; the decision must size it so too,
    # or it lands on a card already shared and the card is over-committed.
    engine = state()
    engine.set_claim(claim("share", "1Gi", allocated=True))
    engine.set_claim(_asking_whole("raw", "1Gi"))
    refused = engine.schedule(pod("p", "raw"), now=0)
    assert not refused.scheduled
    engine.remove_claim("ns/share")
    decision = engine.schedule(pod("p", "raw"), now=0)
    assert decision.scheduled
    [write] = decision.claim_writes
    assert write.allocation is not None
    [result] = write.allocation["devices"]["results"]
    consumed = result["consumedCapacity"]
    assert consumed["memory"] in ("10Gi", "10240Mi", str(CARD_MIB * 1024 * 1024))
    assert usage(engine) == (CARD_SLOTS, CARD_MIB, 100)
    # And nothing is placed beside it while it holds the card.
    engine.set_claim(claim("next", "1Gi"))
    assert not engine.schedule(pod("q", "next"), now=0).scheduled


def test_hami_core_on_or_unsaid_books_the_share_it_names() -> None:
    for parameters in ({"hamiCore": True}, {"hamiCore": "false"}, {"other": 1}, ["x"]):
        engine = state()
        engine.set_claim(with_config(claim("c", "1Gi", allocated=True), parameters))
        assert usage(engine) == (1, 1024, 0), parameters


@pytest.mark.parametrize(
    ("configs", "off"),
    [
        ([], False),
        ([("FromClaim", {"hamiCore": False})], True),
        ([("FromClass", {"hamiCore": False})], True),
        ([("FromClass", {"hamiCore": False}), ("FromClaim", {"hamiCore": True})], False),
        ([("FromClaim", {"hamiCore": True}), ("FromClass", {"hamiCore": False})], False),
        ([("FromClaim", {"hamiCore": 0})], False),
        ([("FromClaim", {"hamiCore": None})], False),
        ([("FromClaim", "not a mapping")], False),
    ],
)
def test_the_books_read_hami_core_off_as_the_agent_does(
    configs: list[tuple[str, Any]], off: bool
) -> None:
    obj = claim("c", "1Gi", allocated=True)
    for source, parameters in configs:
        obj = with_config(obj, parameters, source)
    allocation = obj["status"]["allocation"]
    assert claim_ledger.hami_core_off(allocation) is off
    assert prepare._hami_core_on(obj) is not off


# --- adminAccess -----------------------------------------------------------------------------


def test_an_admin_access_result_books_nothing() -> None:
    engine = state()
    obj = claim("admin", "8Gi", allocated=True)
    obj["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    engine.set_claim(obj)
    assert usage(engine) == (0, 0, 0)
    assert quota_memory(engine) == 0
    assert engine.claim_holds() == {}
    assert engine.over_committed(NODE, ["gpu-a"]) == []


# --- a claim pulled from under a running pod ------------------------------------------------


def test_a_claim_deleted_under_its_running_pod_holds_until_the_pod_ends() -> None:
    engine = state()
    allocated = reserved(claim("mine", "8Gi", allocated=True), "p")
    engine.set_pod(running("p", "mine"))
    engine.set_claim(allocated)
    assert usage(engine)[1] == 8192
    engine.remove_claim("ns/mine")  # the tenant removed the finalizer and deleted it
    assert usage(engine)[1] == 8192
    assert quota_memory(engine) == 8192
    assert list(engine.kept_holds().values()) == [frozenset({"uid-p"})]
    # No second claim is placed past the card, nor counted as free by a recount.
    engine.set_claim(claim("second", "8Gi"))
    assert not engine.schedule(pod("q", "second"), now=0).scheduled
    engine.set_claim(claim("raced", "8Gi", allocated=True))
    assert engine.over_committed(NODE, ["gpu-a"]) == ["gpu-a"]
    engine.remove_claim("ns/raced")
    # The pod ends: the share is free.
    engine.set_pod(running("p", "mine", phase="Succeeded"))
    assert usage(engine) == (0, 0, 0)
    assert quota_memory(engine) == 0
    assert engine.kept_holds() == {}
    assert engine.schedule(pod("q", "second"), now=0).scheduled


def test_a_kept_hold_goes_with_the_last_pod_that_keeps_it() -> None:
    engine = state()
    engine.set_pod(running("p", "shared"))
    engine.set_pod(running("q", "shared"))
    engine.set_claim(reserved(claim("shared", "4Gi", allocated=True), "p", "q"))
    engine.remove_claim("ns/shared")
    engine.remove_pod("ns/p")
    assert usage(engine)[1] == 4096
    # A pod of the same name, a new one: the old one (which kept the hold) is gone.
    replacement = running("q", "shared")
    replacement["metadata"]["uid"] = "uid-q-2"
    engine.set_pod(replacement)
    assert usage(engine) == (0, 0, 0)


def test_an_allocation_stripped_under_a_running_pod_keeps_its_hold() -> None:
    engine = state()
    engine.set_pod(running("p", "mine"))
    allocated = reserved(claim("mine", "8Gi", allocated=True), "p")
    engine.set_claim(allocated)
    stripped = copy.deepcopy(allocated)
    del stripped["status"]["allocation"]
    engine.set_claim(stripped)
    assert usage(engine)[1] == 8192
    # A later allocation of the same claim is its own hold beside the kept one.
    engine.set_claim(reserved(claim("mine", "1Gi", allocated=True), "p"))
    assert usage(engine)[1] == 8192 + 1024
    engine.remove_pod("ns/p")
    assert usage(engine)[1] == 1024


def test_a_claim_unreserved_and_deallocated_frees_its_share() -> None:
    """The scheduler's unreserve (and the claim controller's release) takes the pod out of
    reservedFor with the allocation: nothing is kept for a pod it no longer names."""
    engine = state()
    engine.set_pod(running("p", "mine"))
    engine.set_claim(reserved(claim("mine", "8Gi", allocated=True), "p"))
    engine.set_claim(claim("mine", "8Gi"))
    assert usage(engine) == (0, 0, 0)
    assert engine.kept_holds() == {}


def test_a_claim_deleted_under_a_pod_never_bound_or_ended_is_freed() -> None:
    engine = state()
    waiting = pod("w", "mine")  # reserved by a scheduler, never bound
    engine.set_pod(waiting)
    engine.set_pod(running("done", "mine", phase="Failed"))
    engine.set_claim(reserved(claim("mine", "8Gi", allocated=True), "w", "done"))
    engine.remove_claim("ns/mine")
    assert usage(engine) == (0, 0, 0)
    assert quota_memory(engine) == 0
