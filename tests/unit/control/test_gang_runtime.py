"""The runtime's side of gangs (``control.gang_runtime``): the PodGroup store, gathering a
group's members, counting those placed, and the PodGroup's condition."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from builders import cluster, make_node, make_pod

from vgpu_operator import names
from vgpu_operator.control.gang_runtime import (
    GangRuntime,
    PodGroupStore,
    error_condition,
    group_condition,
)
from vgpu_operator.devices import nvidia
from vgpu_operator.scheduling.gangs import gangs

NOW = datetime.datetime(2026, 11, 28, tzinfo=datetime.UTC)


def pod_group(name: str, min_count: int, scheduled: str | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}},
    }
    if scheduled is not None:
        condition = {"type": gangs.INITIALLY_SCHEDULED, "status": scheduled}
        obj["status"] = {"conditions": [condition]}
    return obj


def member(name: str, group: str = "train", scheduler: str = names.SCHEDULER_NAME) -> Any:
    pod = make_pod(name, "ml").container(gpu=1).spec("schedulerName", scheduler).obj()
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def test_the_store_keeps_groups_and_says_which_changed() -> None:
    changed: list[str] = []
    store = PodGroupStore(changed.append)
    asyncio.run(store.listed([pod_group("a", 2), pod_group("b", 1)], "1"))
    assert sorted(changed) == ["ml/a", "ml/b"]
    changed.clear()
    asyncio.run(store.listed([pod_group("a", 2), pod_group("b", 3)], "2"))
    assert changed == ["ml/b"]
    asyncio.run(store.event("DELETED", pod_group("a", 2)))
    assert store.get("ml/a") is None
    assert changed == ["ml/b", "ml/a"]
    asyncio.run(store.event("MODIFIED", pod_group("b", 3, scheduled="True")))
    assert store.initially_scheduled("ml/b")
    assert not store.initially_scheduled("ml/a")


def runtime(pods: list[Any], groups: list[dict[str, Any]], cards: int) -> GangRuntime:
    node = make_node("n")
    for i in range(cards):
        node.gpu(f"GPU-{i}")
    store = PodGroupStore()
    asyncio.run(store.listed(groups, "1"))
    return GangRuntime(
        cluster(node),
        lambda group: [p for p in pods if gangs.group_of(p) == group],
        lambda: names.SCHEDULER_NAME,
        store,
    )


def test_members_of_the_group_and_this_scheduler_only() -> None:
    pods = [member("w0"), member("w1"), member("other", "eval"), make_pod("plain", "ml").obj()]
    rt = runtime(pods, [pod_group("train", 2)], cards=4)
    assert [p["metadata"]["name"] for p in rt.members("ml/train")] == ["w0", "w1"]


def test_placed_members_count_and_a_rolled_back_one_is_pending_again() -> None:
    pods = [member("w0"), member("w1")]
    rt = runtime(pods, [pod_group("train", 2)], cards=4)
    out = rt.decide("ml/train", 0.0)
    assert len(out.placed) == 2
    assert rt.members("ml/train") == []  # both being bound
    rt.engine.rollback("ml/w1")  # its Binding failed
    assert [p["metadata"]["name"] for p in rt.members("ml/train")] == ["w1"]
    again = rt.decide("ml/train", 0.0)  # w0 counts toward minCount: w1 alone is placed
    assert [d.pod for d in again.placed] == ["ml/w1"]


def test_after_a_restart_the_members_the_api_says_are_bound_count_toward_min_count() -> None:
    """A fresh runtime (the operator restarted) has placed no member itself: the members
    bound before the restart, which the books hold, count toward minCount as they did, so
    the two pending members of a group of four complete it instead of waiting for four."""
    bound = [member(f"w{i}") for i in range(2)]
    for i, pod in enumerate(bound):
        pod["spec"]["nodeName"] = "n"
        pod["metadata"]["annotations"] = {
            names.ASSIGNED_NODE: "n",
            nvidia.ALLOCATED_ANNOTATION: f"GPU-{i},NVIDIA,1000,0:;",
        }
    pending = [member("w2"), member("w3")]
    rt = runtime(pending, [pod_group("train", 4)], cards=4)
    for pod in bound:
        rt.engine.set_pod(pod)
    waiting = rt.decide("ml/train", 0.0)  # nothing says w0 and w1 are bound: wait for 4
    assert waiting.placed == ()
    assert "minCount 4, 2 exist" in (waiting.reason or "")
    rt = GangRuntime(
        rt.engine,
        lambda group: pending,
        lambda: names.SCHEDULER_NAME,
        rt.groups,
        lambda group: {"ml/w0": "n", "ml/w1": "n", "ml/gone": "n"},  # gone: not in the books
    )
    out = rt.decide("ml/train", 0.0)
    assert sorted(d.pod for d in out.placed) == ["ml/w2", "ml/w3"]
    assert out.needed == 2


def test_mixed_schedulers_and_a_bad_pod_group_are_refused() -> None:
    pods = [member("w0"), member("w1", scheduler="default-scheduler")]
    rt = runtime(pods, [pod_group("train", 2)], cards=4)
    assert "different schedulers" in (rt.decide("ml/train", 0.0).reason or "")
    bad = {"metadata": {"name": "train", "namespace": "ml"}, "spec": {"schedulingPolicy": {}}}
    rt = runtime([member("w0")], [bad], cards=4)
    out = rt.decide("ml/train", 0.0)
    assert out.placed == ()
    assert "exactly one of basic, gang" in (out.reason or "")


def test_an_initially_scheduled_group_places_later_members_one_by_one() -> None:
    rt = runtime([member("w5")], [pod_group("train", 4, scheduled="True")], cards=4)
    out = rt.decide("ml/train", 0.0)
    assert [d.pod for d in out.placed] == ["ml/w5"]
    assert group_condition(out, NOW) is None  # nothing new to say on the PodGroup


def test_the_condition_is_written_once_per_change() -> None:
    rt = runtime([member("w0"), member("w1")], [pod_group("train", 2)], cards=1)
    out = rt.decide("ml/train", 0.0)
    condition = rt.condition_to_write(out, NOW)
    assert condition is not None
    assert condition["status"] == "False"
    assert condition["reason"] == gangs.REASON_UNSCHEDULABLE
    assert rt.condition_to_write(rt.decide("ml/train", 0.0), NOW) is None


def test_a_failed_decision_is_a_scheduler_error_on_the_pod_group() -> None:
    condition = error_condition("scheduling failed: boom", NOW)
    assert (condition["status"], condition["reason"]) == ("False", gangs.REASON_SCHEDULER_ERROR)
    assert condition["message"] == "scheduling failed: boom"


def test_a_members_queue_priority_is_never_above_its_pod_groups() -> None:
    store = PodGroupStore()
    high = pod_group("lifted", 2)
    high["spec"].update(priorityClassName="high", priority=100000)
    low = pod_group("slowed", 2)
    low["spec"].update(priorityClassName="low", priority=5)
    unnamed = pod_group("plain", 2)
    unnamed["spec"]["priority"] = 0  # the API server's default: no class named
    asyncio.run(store.listed([high, low, unnamed], "1"))

    def at(name: str, group: str, priority: int) -> Any:
        pod = member(name, group)
        pod["spec"]["priority"] = priority
        return pod

    assert store.queue_priority(at("a", "lifted", 0)) == 0
    assert store.queue_priority(at("b", "slowed", 1000)) == 5
    assert store.queue_priority(at("c", "plain", 1000)) == 1000
    assert store.queue_priority(at("d", "missing", 10)) == 10
    asyncio.run(store.event("DELETED", low))
    assert store.queue_priority(at("b", "slowed", 1000)) == 1000
