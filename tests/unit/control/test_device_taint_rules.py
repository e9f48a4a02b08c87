"""DeviceTaintRules in the engine: a rule's taint counts as if the selected devices carried
it in their slice, so a claim is kept off them unless it tolerates the taint; the pods a
rule's coming or going may help are woken, and a rule that selects nothing changes
nothing."""

from __future__ import annotations

import copy
from typing import Any

from vgpu_operator.config import DeviceConfig
from vgpu_operator.control import claims_feed, feed, queue
from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.dialects.claims import taint_rules
from vgpu_operator.scheduling.status import Reason

NODE = "dra-a"
CARD = dra.CardShape("GPU-dra-a-0", 0, "L40S", "NVIDIA-L40S", 40960, 100, 4, "hami-core")
DRAIN = {"key": "example.com/drain", "value": "maintenance", "effect": "NoSchedule"}


def rule(name: str, selector: dict[str, str] | None, version: str = "1") -> dict[str, Any]:
    spec: dict[str, Any] = {"taint": DRAIN}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {"metadata": {"name": name, "resourceVersion": version}, "spec": spec}


def test_a_rule_selects_by_driver_pool_and_device_and_without_a_selector_nothing() -> None:
    devices = {"driver": dra.DRIVER, "pool": NODE, "device": CARD.name}
    read = taint_rules.read_rule(rule("r", devices))
    assert read is not None
    assert read.selects(dra.DRIVER, NODE, CARD.name)
    assert not read.selects(dra.DRIVER, "dra-b", CARD.name)
    every = taint_rules.read_rule(rule("all", {}))
    assert every is not None
    assert every.selects("other.example.com", "p", "d")
    assert taint_rules.read_rule(rule("none", None)) is None
    bad = rule("bad", {})
    bad["spec"]["taint"] = {"key": "k", "effect": "Sometimes"}
    assert taint_rules.read_rule(bad) is None


def test_a_rules_taint_follows_the_devices_own() -> None:
    obj = dict(dra.slice_wire(NODE, [CARD], 1, None))
    obj["spec"]["devices"][0]["taints"] = [{"key": "own", "value": "", "effect": "NoSchedule"}]
    read = taint_rules.read_rule(rule("r", {"device": CARD.name}))
    assert read is not None
    tainted = taint_rules.tainted_slice(obj, [read])
    assert [t["key"] for t in tainted["spec"]["devices"][0]["taints"]] == ["own", DRAIN["key"]]
    assert [t["key"] for t in obj["spec"]["devices"][0]["taints"]] == ["own"]  # not changed
    other = taint_rules.read_rule(rule("r", {"pool": "dra-b"}))
    assert other is not None
    assert taint_rules.tainted_slice(obj, [other]) is obj


class Cluster:
    def __init__(self) -> None:
        self.now = 1000.0
        self.state = ClusterState(DeviceConfig())
        self.queue = queue.SchedulingQueue(clock=lambda: self.now, flush_after_s=10**9)
        self.feed = feed.StateFeed(self.state, self.queue, wall_clock=lambda: self.now)
        self.claims = claims_feed.ClaimFeed(self.state, self.queue)
        for device_class in dra.device_classes():
            meta = {**device_class["metadata"], "resourceVersion": "1"}
            self.claims.class_event("ADDED", {**device_class, "metadata": meta})
        node = {
            "metadata": {
                "name": NODE,
                "resourceVersion": "1",
                "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA},
            },
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}},
        }
        self.feed.node_event("ADDED", node)
        obj = copy.deepcopy(dict(dra.slice_wire(NODE, [CARD], 1, None)))
        obj["metadata"]["resourceVersion"] = "2"
        self.claims.slice_event("ADDED", obj)

    def add_pod(self, name: str) -> None:
        request = {
            "deviceClassName": dra.SHARED_CLASS,
            "capacity": {"requests": {"memory": "10Gi"}},
        }
        claim = {
            "metadata": {
                "namespace": "ns",
                "name": name,
                "uid": f"c-{name}",
                "resourceVersion": "1",
            },
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        }
        self.claims.claim_event("ADDED", claim)
        pod = {
            "metadata": {
                "namespace": "ns",
                "name": name,
                "uid": f"u-{name}",
                "resourceVersion": "1",
            },
            "spec": {
                "schedulerName": "vgpu-scheduler",
                "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            },
            "status": {"phase": "Pending"},
        }
        self.feed.pod_event("ADDED", pod)

    def work(self) -> dict[str, Any]:
        """Decide every due pod; what each decision said."""
        said: dict[str, Any] = {}
        while (key := self.queue.pop()) is not None:
            pod = self.feed.pending_pod(key)
            assert pod is not None
            decision = self.state.schedule(pod, self.now)
            self.feed.settle_releases()
            said[key] = decision
            if decision.scheduled:
                self.state.confirm(key)
                self.queue.remove(key)
            else:
                self.queue.park(key, hint=decision.verdict)
            self.now += 20  # past any backoff
        return said


def test_a_rule_keeps_claims_off_its_devices_until_it_goes() -> None:
    cluster = Cluster()
    cluster.claims.rules_listed([rule("drain", {"driver": dra.DRIVER, "pool": NODE})], "5")
    cluster.add_pod("p")
    decision = cluster.work()["ns/p"]
    assert not decision.scheduled
    assert decision.diagnosis.device_counts() == {Reason.DEVICE_UNTOLERATED_TAINT.value: 1}
    # A rule for another pool changes nothing and wakes nobody.
    cluster.claims.rule_event("ADDED", rule("elsewhere", {"pool": "dra-b"}, "6"))
    assert cluster.work() == {}
    # The drain rule goes: the pod is woken and placed.
    cluster.claims.rule_event("DELETED", rule("drain", {"pool": NODE}, "7"))
    assert cluster.work()["ns/p"].scheduled
    assert cluster.state.holding_pods() == {"ns/p": NODE}
