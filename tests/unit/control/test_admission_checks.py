"""The runtime of Kueue's check (``control.admission_checks``) on a fake API: which
workload events are judged, what is written, when holds end, and the Retry that Kueue
v0.17 would leave parked is set back to Pending."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from builders import cluster, make_node, make_pod

from vgpu_operator.control import admission_checks
from vgpu_operator.control.options import PlaceableOptions
from vgpu_operator.control.placeable_check import CONTROLLER_NAME, PlaceableCheck
from vgpu_operator.kube import workloads
from vgpu_operator.kube.requests import ApiError

GIB = 1024
CHECK = "vgpu-placeable"


class Writes:
    """What the controller wrote (check states and Active marks); ``refuse`` makes the
    next state write fail with that HTTP status."""

    def __init__(self) -> None:
        self.states: list[tuple[str, str, str, str]] = []
        self.active: list[str] = []
        self.refuse: int | None = None

    async def set_check_state(
        self,
        api: object,
        wl: Mapping[str, Any],
        check: str,
        state: str,
        message: str,
        now: float,
        *,
        requeue_after_s: int | None = None,
    ) -> None:
        if self.refuse is not None:
            status, self.refuse = self.refuse, None
            raise ApiError("PATCH", "/status", status, "{}")
        meta = wl["metadata"]
        self.states.append((meta["name"], check, state, meta["resourceVersion"]))

    async def set_check_active(self, api: object, check: str, now: float) -> None:
        self.active.append(check)


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> Writes:
    fake = Writes()
    monkeypatch.setattr(workloads, "set_check_state", fake.set_check_state)
    monkeypatch.setattr(workloads, "set_check_active", fake.set_check_active)
    return fake


def workload(rv: int, gib: int, *, state: str = "Pending", **conditions: bool) -> dict[str, Any]:
    template = make_pod("t", "team").container(gpu=1, gpumem=gib * GIB).obj()
    return {
        "metadata": {"name": "w", "namespace": "team", "uid": "u", "resourceVersion": str(rv)},
        "spec": {"podSets": [{"name": "main", "count": 1, "template": template}]},
        "status": {
            "admissionChecks": [{"name": CHECK, "state": state}],
            "conditions": [
                {"type": kind, "status": "True" if on else "False"}
                for kind, on in conditions.items()
            ],
        },
    }


class Setup:
    def __init__(self) -> None:
        self.state = cluster(make_node("n0").gpu("GPU-0", memory_mib=24 * GIB))
        self.check = PlaceableCheck(self.state, hold_s=30.0)
        self.leader = True
        self.released = 0
        self.now = 1000.0
        self.controller = admission_checks.PlaceableController(
            api=object(),  # type: ignore[arg-type]
            check=self.check,
            options=PlaceableOptions(hold_s=30.0, retry_after_s=2),
            decides=lambda: self.leader,
            on_released=self._released,
            on_error=lambda _: None,
            wall_clock=lambda: self.now,
        )

    def _released(self) -> None:
        self.released += 1

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        asyncio.run(self.controller._workload_event(kind, obj))

    def ours(self) -> None:
        check = {"metadata": {"name": CHECK}, "spec": {"controllerName": CONTROLLER_NAME}}
        asyncio.run(self.controller._check_event("ADDED", check))


def test_our_checks_are_marked_active_and_others_ignored(writes: Writes) -> None:
    s = Setup()
    s.ours()
    other = {"metadata": {"name": "prov"}, "spec": {"controllerName": "kueue.x-k8s.io/x"}}
    asyncio.run(s.controller._check_event("ADDED", other))
    assert writes.active == [CHECK]
    assert s.controller.checks == {CHECK}


def test_a_workload_is_judged_once_quota_is_reserved_and_once_per_version(
    writes: Writes,
) -> None:
    s = Setup()
    s.ours()
    s.event("ADDED", workload(1, 20))  # no quota reserved yet: not Kueue's question yet
    assert writes.states == []
    s.event("MODIFIED", workload(2, 20, QuotaReserved=True))
    s.event("MODIFIED", workload(2, 20, QuotaReserved=True))  # the same version again
    assert writes.states == [("w", CHECK, "Ready", "2")]
    assert "team/w" in s.check.holding()


def test_the_hold_ends_when_kueue_admits(writes: Writes) -> None:
    s = Setup()
    s.ours()
    s.event("MODIFIED", workload(2, 20, QuotaReserved=True))
    s.event("MODIFIED", workload(3, 20, state="Ready", QuotaReserved=True, Admitted=True))
    assert s.check.holding() == {}
    assert s.released == 1
    # The room is free again for the pods themselves.
    pod = make_pod("w-0", "team").container(gpu=1, gpumem=20 * GIB).obj()
    assert s.state.schedule(pod, s.now).scheduled


def test_a_standby_does_not_judge_until_it_decides(writes: Writes) -> None:
    s = Setup()
    s.ours()
    s.leader = False
    s.event("MODIFIED", workload(2, 20, QuotaReserved=True))
    assert writes.states == []
    s.leader = True
    asyncio.run(s.controller._judge("team/w"))
    assert writes.states == [("w", CHECK, "Ready", "2")]


def test_a_stale_version_is_not_answered_and_holds_nothing(writes: Writes) -> None:
    s = Setup()
    s.ours()
    writes.refuse = 409
    s.event("MODIFIED", workload(2, 20, QuotaReserved=True))
    assert writes.states == []
    assert s.check.holding() == {}
    # Its next version is judged as it comes.
    s.event("MODIFIED", workload(3, 20, QuotaReserved=True))
    assert writes.states == [("w", CHECK, "Ready", "3")]


def test_a_retry_left_without_quota_is_set_back_to_pending(writes: Writes) -> None:
    s = Setup()
    s.ours()
    s.event("MODIFIED", workload(2, 30, QuotaReserved=True))  # 30 GiB: no card holds it
    assert writes.states == [("w", CHECK, "Retry", "2")]
    # Kueue took the quota back but left our Retry (already marked Evicted).
    s.event("MODIFIED", workload(3, 30, state="Retry", QuotaReserved=False, Evicted=True))
    asyncio.run(s.controller._reset_retries())
    assert writes.states[-1] == ("w", CHECK, "Pending", "3")
    # Once set back, it is not reset again.
    asyncio.run(s.controller._reset_retries())
    assert len(writes.states) == 2
