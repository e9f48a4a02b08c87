"""The worker: decide -> bind -> confirm, rollback on failure, reports, gate and resync;
preemption: nominate, evict, report, and give up when an eviction is refused.

The engine, the binder and the reporter are fakes; the queue and the feed are real.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Mapping
from typing import Any

import pytest
from manual_clock import ManualClock

from vgpu_operator import names
from vgpu_operator.control import worker as worker_module
from vgpu_operator.control.feed import StateFeed
from vgpu_operator.control.queue import OWN_CHANGE_ONLY, Refused, SchedulingQueue, WaitsForVictims
from vgpu_operator.control.worker import SchedulingWorker
from vgpu_operator.devices import model, nvidia
from vgpu_operator.kube.binding import BindOutcome
from vgpu_operator.kube.eviction import EvictOutcome
from vgpu_operator.metrics import OperatorMetrics
from vgpu_operator.scheduling.books.allocation_gate import GateHolder
from vgpu_operator.scheduling.cycle.cluster import Decision, NominationWait
from vgpu_operator.scheduling.status import Diagnosis, NodeFailure, Reason

SCHED = "vgpu-scheduler"
ANNOTATIONS = {names.ASSIGNED_NODE: "n1", nvidia.ALLOCATED_ANNOTATION: "GPU-0,NVIDIA,1000,0:;"}
NO_MEMORY = Diagnosis({"n1": NodeFailure({Reason.CARD_INSUFFICIENT_MEMORY: 2})}, 1)


class Engine:
    """A fake engine: decisions are set per pod; every call is recorded in order."""

    def __init__(self) -> None:
        self.decisions: dict[str, Decision | Exception] = {}
        self.log: list[str] = []
        self.cancelled: list[str] = []
        self.shut: set[str] = set()
        self.gate_enabled = True
        #: How long the pod holding a shut node's gate has held it, and which pod it is.
        self.held_s = 12.0
        self.holder = "ns/holder"
        #: Each preemptor's nomination, and those whose hold has timed out.
        self.waits: dict[str, NominationWait] = {}
        self.expired: list[NominationWait] = []

    def schedule(self, pod: Mapping[str, Any], now: float) -> Decision:
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        self.log.append(f"schedule {key}")
        decision = self.decisions.get(key, Decision(key, True, "n1", annotations=ANNOTATIONS))
        if isinstance(decision, Exception):
            raise decision
        return decision

    def confirm(self, key: str, now: float | None = None) -> None:
        self.log.append(f"confirm {key}")

    def rollback(self, key: str) -> None:
        self.log.append(f"rollback {key}")

    def cancel_preemption(self, key: str) -> None:
        self.cancelled.append(key)
        self.waits.pop(key, None)

    def nomination_wait(self, key: str) -> NominationWait | None:
        return self.waits.get(key)

    def take_expired_nominations(self, now: float) -> list[NominationWait]:
        taken, self.expired = self.expired, []
        return taken

    # What the feed calls:
    def set_pod(self, pod: Mapping[str, Any]) -> None:
        self.log.append(f"set {pod['metadata']['name']} node={pod['spec'].get('nodeName')}")

    def allocation_error(self, key: str) -> str | None:
        return None

    def allocation_warning(self, key: str) -> str | None:
        return None

    def expired_gates(self, now: float) -> list[tuple[str, str]]:
        return []

    def bind_gate_open(self, node_name: str, key: str, now: float) -> bool:
        return node_name not in self.shut

    def bind_gate_enabled(self) -> bool:
        return self.gate_enabled

    def gate_holder(self, node_name: str, now: float) -> GateHolder | None:
        if node_name not in self.shut:
            return None
        return GateHolder(self.holder, self.held_s, 60.0 - self.held_s)

    def remove_pod(self, key: str) -> None:
        self.log.append(f"remove {key}")

    def set_config(self, config: Any) -> None: ...
    def set_node(self, node: Mapping[str, Any]) -> None: ...
    def node_warnings(self, name: str) -> tuple[str, ...]:
        return ()

    def remove_node(self, name: str) -> None: ...
    def set_inventory(self, *args: Any, **kwargs: Any) -> None: ...
    def remove_inventory(self, node_name: str) -> None: ...
    def set_heartbeat(self, node_name: str, heartbeat: float | None) -> None: ...
    def set_quota(self, quota: Mapping[str, Any]) -> None: ...
    def remove_quota(self, namespace: str, name: str) -> None: ...
    def set_budget(self, pdb: Mapping[str, Any]) -> None: ...
    def remove_budget(self, namespace: str, name: str) -> None: ...

    def take_freed(self) -> list[Any]:
        return []

    def fits_now(self, verdict: Any, node: str, now: float) -> bool:
        return True

    def quota_may_help(self, verdict: Any, namespace: str) -> bool:
        return True


class Binder:
    def __init__(self) -> None:
        self.outcome: BindOutcome | Exception = BindOutcome.BOUND
        self.bound: list[tuple[str, str, dict[str, str]]] = []
        self.fresh: Mapping[str, Any] | None = None
        self.gate: asyncio.Event | None = None
        self.active = 0
        self.most_active = 0

    async def bind(
        self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]
    ) -> BindOutcome:
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            if self.gate is not None:
                await self.gate.wait()
            if isinstance(self.outcome, Exception):
                raise self.outcome
            self.bound.append((pod["metadata"]["name"], node, dict(annotations)))
            return self.outcome
        finally:
            self.active -= 1

    async def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.fresh


class Reporter:
    """Records each report as ``(what, pod name, detail)``: one method per method of
    ``worker.Reporter``, all alike (``REPORTS``)."""

    def __init__(self) -> None:
        self.reports: list[tuple[str, str, Any]] = []

    async def _record(self, what: str, pod: Mapping[str, Any], detail: Any) -> None:
        self.reports.append((what, pod["metadata"]["name"], detail))


REPORTS = (
    "unschedulable",
    "rejected",
    "failed",
    "adjusted",
    "scheduled",
    "gated",
    "preemption_blocked",
    "waiting_for_victims",
    "nomination_timed_out",
)
for _what in REPORTS:
    setattr(Reporter, _what, functools.partialmethod(Reporter._record, _what))


class Rig:
    """A worker over fakes; a test that needs another binder, reporter, gate or
    preemptor hands it in."""

    def __init__(
        self,
        max_binds: int = 4,
        gate_report_after_s: float = 60.0,
        *,
        binder: Any = None,
        reporter: Any = None,
        gate: Any = None,
        preemptor: Any = None,
    ) -> None:
        self.clock = ManualClock()
        self.engine = Engine()
        self.queue = SchedulingQueue(clock=self.clock, notify=lambda: self.worker.poke())
        self.feed = StateFeed(self.engine, self.queue)
        self.binder = Binder() if binder is None else binder
        self.reporter = Reporter() if reporter is None else reporter
        self.metrics = OperatorMetrics()
        self.resyncs = 0
        self.worker = SchedulingWorker(
            self.engine,
            self.feed,
            self.queue,
            self.binder,
            self.reporter,
            self.metrics,
            resync=self._resync,
            gate=gate,
            preemptor=preemptor,
            max_binds_in_flight=max_binds,
            clock=self.clock,
            wall_clock=lambda: 1_000.0,
            gate_report_after_s=gate_report_after_s,
        )

    async def _resync(self) -> None:
        self.resyncs += 1
        self.engine.log.append("resync")

    def add(self, name: str, version: int = 1) -> None:
        self.feed.pod_event("ADDED", pod(name, version))

    def decide_next(self) -> str:
        key = self.queue.pop()
        assert key is not None
        self.worker.decide(key)
        return key

    def attempts(self, result: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "vgpu_operator_scheduling_attempts_total", {"result": result}
        )
        return value or 0.0

    def preemptions(self, result: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "vgpu_operator_preemption_attempts_total", {"result": result}
        )
        return value or 0.0

    def waiting_reasons(self) -> dict[str, int]:
        return dict(self.queue.census().unschedulable_reasons)


def pod(name: str, version: int, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": SCHED, "containers": [{"name": "c"}]}
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": "u-" + name,
            "resourceVersion": str(version),
        },
        "spec": spec,
        "status": {"phase": "Pending" if node is None else "Running"},
    }


async def settle(rig: Rig) -> None:
    await rig.worker.drain()


def test_fitting_pod_is_bound_with_annotations_then_confirmed() -> None:
    async def scenario() -> Rig:
        rig = Rig()
        rig.add("a")
        rig.decide_next()
        await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert rig.binder.bound == [("a", "n1", ANNOTATIONS)]
    assert rig.engine.log[-2:] == ["schedule ns/a", "confirm ns/a"]
    assert "ns/a" not in rig.queue
    assert ("scheduled", "a", "n1") in rig.reporter.reports
    assert rig.attempts("scheduled") == 1


def test_bindings_wait_in_order_for_the_nodes_allocation_gate() -> None:
    gpu = {"NVIDIA": ((model.ContainerDevice("GPU-0", "NVIDIA", 1024, 10),),)}

    async def scenario() -> tuple[Rig, list[list[str]]]:
        rig = Rig()
        rig.engine.shut.add("n1")
        seen: list[list[str]] = []
        for name in ("a", "b"):
            rig.engine.decisions[f"ns/{name}"] = Decision(
                f"ns/{name}", True, "n1", devices=gpu, annotations=ANNOTATIONS
            )
            rig.add(name)
            rig.decide_next()
        rig.engine.decisions["ns/plain"] = Decision("ns/plain", True, "n1", annotations={})
        rig.add("plain")
        rig.decide_next()  # no devices: it does not wait for the gate
        await asyncio.sleep(0.05)
        seen.append([b[0] for b in rig.binder.bound])
        rig.engine.shut.discard("n1")
        rig.worker.node_settled("n1")
        await asyncio.sleep(0.05)
        seen.append([b[0] for b in rig.binder.bound])
        await settle(rig)
        return rig, seen

    rig, seen = asyncio.run(scenario())
    assert seen[0] == ["plain"]
    # Once open, the earliest decided binds first (this fake gate stays open after).
    assert seen[1] == ["plain", "a", "b"]
    assert rig.attempts("gated") == 2
    assert rig.reporter.reports.count(("scheduled", "a", "n1")) == 1


def test_a_long_wait_at_the_gate_shows_on_the_pod_once() -> None:
    """A Binding kept waiting by another pod's silent device plugin is reported on its
    pod (condition and Event, with who holds the gate and until when), once."""
    gpu = {"NVIDIA": ((model.ContainerDevice("GPU-0", "NVIDIA", 1024, 10),),)}

    async def scenario() -> Rig:
        rig = Rig(gate_report_after_s=0.0)
        rig.engine.shut.add("n1")
        rig.engine.decisions["ns/a"] = Decision(
            "ns/a", True, "n1", devices=gpu, annotations=ANNOTATIONS
        )
        rig.add("a")
        rig.decide_next()
        await _until(lambda: any(r[0] == "gated" for r in rig.reporter.reports))
        rig.worker.node_settled("n1")  # woken, still shut: no second report
        await asyncio.sleep(0.02)
        rig.engine.shut.discard("n1")
        rig.worker.node_settled("n1")
        await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    gated = [r for r in rig.reporter.reports if r[0] == "gated"]
    assert len(gated) == 1
    assert "pod ns/holder was bound there 12 s ago" in gated[0][2]
    assert "in 48 s at the latest" in gated[0][2]
    assert [b[0] for b in rig.binder.bound] == ["a"]


def test_the_gate_report_follows_a_new_holder() -> None:
    """Told that ns/holder keeps the gate shut, the pod is told again when another pod
    holds it (the first timed out or answered and an earlier waiter was bound): first
    only once the new holder has held it long too, then not again for the same one."""
    gpu = {"NVIDIA": ((model.ContainerDevice("GPU-0", "NVIDIA", 1024, 10),),)}

    def gated(rig: Rig) -> list[str]:
        return [r[2] for r in rig.reporter.reports if r[0] == "gated"]

    async def scenario() -> tuple[Rig, list[int]]:
        rig = Rig(gate_report_after_s=0.0)
        rig.engine.shut.add("n1")
        rig.engine.decisions["ns/a"] = Decision(
            "ns/a", True, "n1", devices=gpu, annotations=ANNOTATIONS
        )
        rig.add("a")
        rig.decide_next()
        await _until(lambda: len(gated(rig)) == 1)
        counts = [len(gated(rig))]
        rig.engine.holder = "ns/next"  # ns/holder let go; ns/next was bound meanwhile
        rig.worker.node_settled("n1")
        await _until(lambda: len(gated(rig)) == 2)
        rig.worker.node_settled("n1")  # the same holder: nothing new to say
        await asyncio.sleep(0.02)
        counts.append(len(gated(rig)))
        rig.engine.shut.discard("n1")
        rig.worker.node_settled("n1")
        await settle(rig)
        return rig, counts

    rig, counts = asyncio.run(scenario())
    assert counts == [1, 2]
    first, second = gated(rig)
    assert "pod ns/holder was bound there" in first
    assert "pod ns/next was bound there" in second
    assert [b[0] for b in rig.binder.bound] == ["a"]


def test_a_gate_report_being_written_lands_before_the_binding() -> None:
    """The Binding sets PodScheduled True: a gate report still in flight when the gate
    opens must be written before it, or its False stays on the bound pod."""
    gpu = {"NVIDIA": ((model.ContainerDevice("GPU-0", "NVIDIA", 1024, 10),),)}
    order: list[str] = []

    class SlowReporter(Reporter):
        def __init__(self) -> None:
            super().__init__()
            self.release = asyncio.Event()

        async def gated(self, pod: Mapping[str, Any], message: str) -> None:
            order.append("report started")
            await self.release.wait()
            order.append("report written")

    async def scenario() -> Rig:
        reporter = SlowReporter()
        rig = Rig(gate_report_after_s=0.0, reporter=reporter)
        rig.engine.shut.add("n1")
        rig.engine.decisions["ns/a"] = Decision(
            "ns/a", True, "n1", devices=gpu, annotations=ANNOTATIONS
        )
        rig.add("a")
        rig.decide_next()
        await _until(lambda: order == ["report started"])
        rig.engine.shut.discard("n1")
        rig.worker.node_settled("n1")
        await asyncio.sleep(0.02)
        order.extend(f"bound {b[0]}" for b in rig.binder.bound)
        reporter.release.set()
        await settle(rig)
        order.extend(f"bound {b[0]}" for b in rig.binder.bound)
        return rig

    asyncio.run(scenario())
    assert order == ["report started", "report written", "bound a"]


@pytest.mark.parametrize(
    ("report_after_s", "held_s"),
    [pytest.param(60.0, 12.0, id="short-wait"), pytest.param(0.05, 0.0, id="young-holder")],
)
def test_a_wait_in_a_prompt_queue_is_not_reported(report_after_s: float, held_s: float) -> None:
    """Not reported: a short wait, nor a long one behind holders that answer promptly
    (a burst's queue), however often the worker looks."""
    gpu = {"NVIDIA": ((model.ContainerDevice("GPU-0", "NVIDIA", 1024, 10),),)}

    async def scenario() -> Rig:
        rig = Rig(gate_report_after_s=report_after_s)
        rig.engine.held_s = held_s
        rig.engine.shut.add("n1")
        rig.engine.decisions["ns/a"] = Decision(
            "ns/a", True, "n1", devices=gpu, annotations=ANNOTATIONS
        )
        rig.add("a")
        rig.decide_next()
        await asyncio.sleep(0.3)
        rig.engine.shut.discard("n1")
        rig.worker.node_settled("n1")
        await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert not any(r[0] == "gated" for r in rig.reporter.reports)
    assert [b[0] for b in rig.binder.bound] == ["a"]


@pytest.mark.parametrize(("gate_enabled", "together"), [(True, 1), (False, 3)])
def test_a_nodes_gpu_bindings_go_one_at_a_time_only_with_the_gate(
    gate_enabled: bool, together: int
) -> None:
    """With the gate on, one GPU Binding per node is written at a time (the plugin must
    tell the pods apart); with it off, nothing holds the node's Bindings back."""
    gpu = {"NVIDIA": ((model.ContainerDevice("GPU-0", "NVIDIA", 1024, 10),),)}

    async def scenario() -> Rig:
        rig = Rig()
        rig.engine.gate_enabled = gate_enabled
        rig.binder.gate = asyncio.Event()
        for name in ("a", "b", "c"):
            rig.engine.decisions[f"ns/{name}"] = Decision(
                f"ns/{name}", True, "n1", devices=gpu, annotations=ANNOTATIONS
            )
            rig.add(name)
            rig.decide_next()
        await asyncio.sleep(0.05)
        rig.binder.gate.set()
        await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert rig.binder.most_active == together
    assert sorted(b[0] for b in rig.binder.bound) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("outcome", "requeued", "result"),
    [
        pytest.param(RuntimeError("apiserver down"), True, "error", id="error-retries"),
        pytest.param(BindOutcome.GONE, False, None, id="gone-is-dropped"),
    ],
)
def test_failed_bind_rolls_back(outcome: Any, requeued: bool, result: str | None) -> None:
    async def scenario() -> Rig:
        rig = Rig()
        rig.binder.outcome = outcome
        rig.binder.fresh = pod("a", 1)  # read back after a lost answer: still unbound
        rig.add("a")
        rig.decide_next()
        await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert rig.engine.log[-1] == "rollback ns/a"
    assert "confirm ns/a" not in rig.engine.log
    assert ("ns/a" in rig.queue) is requeued
    if result:
        assert rig.attempts(result) == 1
    if requeued:
        assert rig.queue.pop() is None  # backing off
        rig.clock.now += 1.0
        assert rig.queue.pop() == "ns/a"


class FlakyReads(Binder):
    """The Binding's answer is lost; the first reads of the pod fail too."""

    def __init__(self, fresh: Mapping[str, Any], failures: int) -> None:
        super().__init__()
        self.outcome = RuntimeError("Server disconnected")
        self.fresh = fresh
        self.failures = failures

    async def read_pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("connection reset")
        return self.fresh


def test_a_lost_answer_keeps_the_booking_until_the_pod_says_it_was_bound() -> None:
    """The Binding went through but its answer was lost: the shares stay booked (never
    handed to another pod meanwhile) and the pod counts as bound."""

    async def scenario() -> Rig:
        rig = Rig(binder=FlakyReads(pod("a", 2, node="n1"), failures=1))
        rig.add("a")
        rig.decide_next()
        await asyncio.sleep(0.2)  # the first read fails: nothing is rolled back
        assert "rollback ns/a" not in rig.engine.log
        await asyncio.sleep(0.5)
        await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert "rollback ns/a" not in rig.engine.log
    assert rig.engine.log[-1] == "confirm ns/a"
    assert "ns/a" not in rig.queue


def test_a_lost_answer_for_a_pod_bound_elsewhere_rolls_back_and_rereads() -> None:
    async def scenario() -> Rig:
        rig = Rig(binder=FlakyReads(pod("a", 2, node="n2"), failures=0))
        rig.add("a")
        rig.decide_next()
        await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert "rollback ns/a" in rig.engine.log
    assert "confirm ns/a" not in rig.engine.log
    assert "set a node=n2" in rig.engine.log  # booked as the server has it


def test_conflict_rolls_back_and_takes_the_pod_as_the_server_has_it() -> None:
    async def scenario() -> Rig:
        rig = Rig()
        rig.binder.outcome = BindOutcome.CONFLICT
        rig.binder.fresh = pod("a", 9, node="n2")
        rig.add("a")
        rig.decide_next()
        await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert "rollback ns/a" in rig.engine.log
    assert rig.engine.log[-1] == "set a node=n2"
    assert "ns/a" not in rig.queue
    assert rig.attempts("bind_conflict") == 1


def test_pod_that_does_not_fit_is_parked_and_reported() -> None:
    async def scenario() -> Rig:
        rig = Rig()
        rig.engine.decisions["ns/a"] = Decision("ns/a", False, diagnosis=NO_MEMORY)
        rig.add("a")
        rig.decide_next()
        await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert rig.reporter.reports == [("unschedulable", "a", NO_MEMORY)]
    assert rig.queue.parked_count == 1
    assert rig.binder.bound == []
    assert rig.attempts("unschedulable") == 1
    # The metric's reason is the condition message's: CardInsufficientMemory.
    assert rig.waiting_reasons() == {"CardInsufficientMemory": 1}


NO_CORES = Diagnosis({"n1": NodeFailure({Reason.CARD_INSUFFICIENT_CORE: 2})}, 1)


def test_a_pod_is_told_why_it_waits_only_when_the_message_changes() -> None:
    """Retried with the same verdict, a pod costs no condition or Event write."""

    async def scenario() -> Rig:
        rig = Rig()
        rig.add("a")
        for diagnosis in (NO_MEMORY, NO_MEMORY, NO_CORES, NO_CORES, NO_MEMORY):
            rig.engine.decisions["ns/a"] = Decision("ns/a", False, diagnosis=diagnosis)
            rig.queue.wake_all()
            rig.clock.now += 60
            rig.decide_next()
            await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert [r[2] for r in rig.reporter.reports] == [NO_MEMORY, NO_CORES, NO_MEMORY]
    assert rig.attempts("unschedulable") == 5


def test_a_new_pod_under_an_old_name_is_told_why_it_waits() -> None:
    async def scenario() -> Rig:
        rig = Rig()
        rig.engine.decisions["ns/a"] = Decision("ns/a", False, diagnosis=NO_MEMORY)
        rig.add("a")
        rig.decide_next()
        await settle(rig)
        rig.feed.pod_event("DELETED", pod("a", 2))
        again = pod("a", 3)
        again["metadata"]["uid"] = "u-a-second"
        rig.feed.pod_event("ADDED", again)
        rig.decide_next()
        await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert [r[:2] for r in rig.reporter.reports] == [("unschedulable", "a")] * 2


def test_a_report_that_failed_is_written_again_on_the_next_attempt() -> None:
    class Failing(Reporter):
        calls = 0

        async def unschedulable(self, pod: Mapping[str, Any], diagnosis: Diagnosis) -> None:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("API server away")
            await super().unschedulable(pod, diagnosis)

    async def scenario() -> Rig:
        rig = Rig(reporter=Failing())
        rig.engine.decisions["ns/a"] = Decision("ns/a", False, diagnosis=NO_MEMORY)
        rig.add("a")
        for _ in range(2):
            rig.queue.wake_all()
            rig.clock.now += 60
            rig.decide_next()
            await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert rig.reporter.reports == [("unschedulable", "a", NO_MEMORY)]


def test_each_waiting_pod_waits_with_the_hint_of_its_decision() -> None:
    verdict = object()  # the engine's verdict is opaque to the worker

    async def scenario() -> Rig:
        rig = Rig()
        rig.engine.decisions["ns/fits-nowhere"] = Decision(
            "ns/fits-nowhere",
            False,
            diagnosis=NO_MEMORY,
            verdict=verdict,  # type: ignore[arg-type]
        )
        rig.engine.decisions["ns/unreadable"] = Decision(
            "ns/unreadable", False, diagnosis=Diagnosis({}, 1, error="gpumem: not a number")
        )
        rig.engine.decisions["ns/refused"] = Decision("ns/refused", False, rejected="over quota")
        rig.engine.decisions["ns/preempting"] = Decision(
            "ns/preempting", False, diagnosis=NO_MEMORY, nominated_node="n7"
        )
        rig.engine.waits["ns/preempting"] = NominationWait("ns/preempting", "n7", ("ns/v",))
        rig.engine.decisions["ns/claim-not-made"] = Decision(
            "ns/claim-not-made",
            False,
            diagnosis=Diagnosis({}, 1, error="claim ns/x does not exist yet"),
            waits_for_claims=True,
        )
        for name in ("fits-nowhere", "unreadable", "refused", "preempting", "claim-not-made"):
            rig.add(name)
            rig.decide_next()
        await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert rig.queue.hint_of("ns/fits-nowhere") is verdict
    assert rig.queue.hint_of("ns/unreadable") is OWN_CHANGE_ONLY
    assert rig.queue.hint_of("ns/refused") == Refused("ns")
    assert rig.queue.hint_of("ns/preempting") == WaitsForVictims("n7")
    # Waits for its claim's arrival (any event may bring it), not for its own change.
    assert rig.queue.hint_of("ns/claim-not-made") is None


def test_rejected_pod_is_parked_with_the_admission_message() -> None:
    async def scenario() -> Rig:
        rig = Rig()
        rig.engine.decisions["ns/a"] = Decision("ns/a", False, rejected="quota exceeded")
        rig.add("a")
        rig.decide_next()
        await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert rig.reporter.reports == [("rejected", "a", "quota exceeded")]
    assert rig.queue.parked_count == 1
    assert rig.attempts("rejected") == 1
    assert rig.waiting_reasons() == {"AdmissionRejected": 1}


def test_engine_error_does_not_stop_the_worker() -> None:
    async def scenario() -> Rig:
        rig = Rig()
        rig.engine.decisions["ns/a"] = ValueError("bad annotation")
        rig.add("a")
        rig.add("b", 2)
        rig.decide_next()
        rig.decide_next()
        await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert rig.reporter.reports[0][:2] == ("failed", "a")
    assert "bad annotation" in rig.reporter.reports[0][2]
    assert [b[0] for b in rig.binder.bound] == ["b"]
    assert rig.attempts("error") == 1
    assert rig.waiting_reasons() == {"SchedulingError": 1}


class ToggleGate:
    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.openings = 0

    def open(self) -> None:
        self.openings += 1
        self.event.set()

    def close(self) -> None:
        self.event.clear()

    def is_open(self) -> bool:
        return self.event.is_set()

    async def wait_open(self) -> int:
        await self.event.wait()
        return self.openings


async def _until(condition: Any, timeout_s: float = 2.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.001)


def test_worker_decides_only_while_open_and_resyncs_after_each_opening() -> None:
    async def scenario() -> Rig:
        gate = ToggleGate()
        rig = Rig(gate=gate)
        rig.add("a")
        task = asyncio.create_task(rig.worker.run())
        await asyncio.sleep(0.01)
        assert rig.engine.log.count("schedule ns/a") == 0  # closed: no decisions
        gate.open()
        await _until(lambda: len(rig.binder.bound) == 1)
        gate.close()
        rig.add("b", 2)
        await asyncio.sleep(0.01)
        assert len(rig.binder.bound) == 1
        gate.open()
        await _until(lambda: len(rig.binder.bound) == 2)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return rig

    rig = asyncio.run(scenario())
    assert rig.resyncs == 2
    first, second = (i for i, line in enumerate(rig.engine.log) if line == "resync")
    assert rig.engine.log.index("schedule ns/a") > first
    assert rig.engine.log.index("schedule ns/b") > second


def test_binds_in_flight_are_bounded() -> None:
    async def scenario() -> Rig:
        rig = Rig(max_binds=2)
        rig.binder.gate = asyncio.Event()
        for i in range(6):
            rig.add(f"p{i}", i + 1)
        task = asyncio.create_task(rig.worker.run())
        await _until(lambda: rig.binder.active == 2)
        await asyncio.sleep(0.01)
        assert rig.engine.log.count("resync") == 1
        assert sum(line.startswith("schedule") for line in rig.engine.log) == 2
        rig.binder.gate.set()
        await _until(lambda: len(rig.binder.bound) == 6)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return rig

    rig = asyncio.run(scenario())
    assert rig.binder.most_active == 2


# --- preemption -------------------------------------------------------------------------

PREEMPTING = Decision(
    "ns/a",
    False,
    diagnosis=NO_MEMORY,
    nominated_node="n1",
    victims=("ns/v1", "ns/v2"),
    victim_uids={"ns/v1": "u-v1"},
)


class Preemptor:
    def __init__(self) -> None:
        self.outcomes: dict[str, EvictOutcome | Exception] = {}
        self.log: list[str] = []

    async def evict(self, victim: str, uid: str) -> EvictOutcome:
        outcome = self.outcomes.get(victim, EvictOutcome.EVICTED)
        self.log.append(f"evict {victim}" + (f" uid={uid}" if uid else ""))
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def nominate(self, pod: Mapping[str, Any], node: str | None) -> None:
        self.log.append(f"nominate {pod['metadata']['name']} {node}")

    async def preempted(self, victim: str, preemptor: Mapping[str, Any], node: str) -> None:
        self.log.append(f"preempted {victim} by {preemptor['metadata']['name']} on {node}")

    async def preempting(self, pod: Mapping[str, Any], node: str, victims: int) -> None:
        self.log.append(f"preempting {victims} on {node}")


def rig_with_preemptor(decision: Decision) -> tuple[Rig, Preemptor]:
    preemptor = Preemptor()
    rig = Rig(preemptor=preemptor)
    rig.engine.decisions["ns/a"] = decision
    return rig, preemptor


def run(decision: Decision, **outcomes: EvictOutcome | Exception) -> tuple[Rig, Preemptor]:
    async def scenario() -> tuple[Rig, Preemptor]:
        rig, preemptor = rig_with_preemptor(decision)
        preemptor.outcomes = {f"ns/{k}": v for k, v in outcomes.items()}
        rig.add("a")
        rig.decide_next()
        await rig.worker.drain()
        return rig, preemptor

    return asyncio.run(scenario())


def test_preempting_pod_is_nominated_and_its_victims_evicted_not_bound() -> None:
    rig, preemptor = run(PREEMPTING)
    assert rig.binder.bound == []
    assert preemptor.log == [
        "nominate a n1",
        "preempting 2 on n1",
        "evict ns/v1 uid=u-v1",
        "preempted ns/v1 by a on n1",
        "evict ns/v2",
        "preempted ns/v2 by a on n1",
    ]
    assert rig.engine.cancelled == []
    assert rig.queue.parked_count == 1  # waits for the victims to go
    assert rig.reporter.reports == []
    assert rig.attempts("preempting") == 1
    assert rig.preemptions("evicted") == 1
    assert rig.preemptions("refused") == rig.preemptions("error") == 0
    get = rig.metrics.registry.get_sample_value
    assert get("vgpu_operator_preemption_victims_sum") == 2
    assert get("vgpu_operator_preemption_victims_bucket", {"le": "1.0"}) == 0
    assert get("vgpu_operator_preemption_victims_bucket", {"le": "2.0"}) == 1
    assert rig.waiting_reasons() == {"CardInsufficientMemory": 1}


def test_refused_eviction_stops_the_preemption_and_says_why() -> None:
    rig, preemptor = run(PREEMPTING, v1=EvictOutcome.REFUSED)
    assert "evict ns/v2" not in preemptor.log  # nothing more is evicted for nothing
    assert not any(line.startswith("preempted ns/v1") for line in preemptor.log)
    assert rig.engine.cancelled == ["ns/a"]
    assert preemptor.log[-1] == "nominate a None"
    (blocked,) = [r for r in rig.reporter.reports if r[0] == "preemption_blocked"]
    assert "the eviction of ns/v1 was refused" in blocked[2]
    assert "no pod was evicted" in blocked[2]
    assert rig.queue.parked_count == 0  # decided again after its backoff
    assert rig.queue.pop() is None
    rig.clock.now += 60
    assert rig.queue.pop() == "ns/a"
    assert rig.preemptions("refused") == 1
    assert rig.preemptions("evicted") == 0


def test_victim_already_gone_is_no_refusal() -> None:
    rig, preemptor = run(PREEMPTING, v2=EvictOutcome.GONE)
    assert rig.engine.cancelled == []
    assert "preempted ns/v2 by a on n1" not in preemptor.log


def test_api_error_gives_the_preemption_up() -> None:
    rig, _ = run(PREEMPTING, v1=RuntimeError("apiserver down"))
    assert rig.engine.cancelled == ["ns/a"]
    assert rig.preemptions("error") == 1
    assert rig.preemptions("refused") == 0


def test_a_preemption_a_budget_blocks_is_reported_as_a_warning() -> None:
    blocked = Decision(
        "ns/a",
        False,
        diagnosis=NO_MEMORY,
        preemption_blocked="Preemption would have to evict ns/db-0 (PodDisruptionBudget ns/db)",
    )
    rig, preemptor = run(blocked)
    assert preemptor.log == []
    ((kind, name, message),) = rig.reporter.reports
    assert (kind, name) == ("preemption_blocked", "a")
    assert message.startswith(NO_MEMORY.message())
    assert "PodDisruptionBudget ns/db" in message


def test_a_blocked_preemption_is_reported_once_per_message() -> None:
    """Retried while the budget still blocks it, the pod is not told again; once the
    block is gone, what it waits for changed and it is told that."""
    budget = "Preemption would have to evict ns/db-0 (PodDisruptionBudget ns/db)"
    blocked = Decision("ns/a", False, diagnosis=NO_MEMORY, preemption_blocked=budget)

    async def scenario() -> Rig:
        rig = Rig()
        rig.add("a")
        for decision in (blocked, blocked, Decision("ns/a", False, diagnosis=NO_MEMORY)):
            rig.engine.decisions["ns/a"] = decision
            rig.queue.wake_all()
            rig.clock.now += 60
            rig.decide_next()
            await settle(rig)
        return rig

    rig = asyncio.run(scenario())
    assert [r[0] for r in rig.reporter.reports] == ["preemption_blocked", "unschedulable"]
    assert rig.attempts("unschedulable") == 3


def test_waiting_for_victims_is_told_once_per_news() -> None:
    """A pod whose earlier preemption's victims are still there waits for them, is told
    which (its condition and an Event), and is not told again until one has left."""
    waiting = Decision("ns/a", False, diagnosis=NO_MEMORY, nominated_node="n1")

    async def scenario() -> tuple[Rig, Preemptor]:
        rig, preemptor = rig_with_preemptor(waiting)
        rig.add("a")
        for left in (("ns/v1", "ns/v2"), ("ns/v1", "ns/v2"), ("ns/v2",)):
            rig.engine.waits["ns/a"] = NominationWait("ns/a", "n1", left)
            rig.queue.wake_all()
            rig.clock.now += 60
            rig.decide_next()
            await settle(rig)
        return rig, preemptor

    rig, preemptor = asyncio.run(scenario())
    assert preemptor.log == []  # nothing evicted again
    told = [r for r in rig.reporter.reports if r[0] == "waiting_for_victims"]
    assert [m for _, _, m in told] == [
        "Waiting on node n1 for the pods preempted for it to leave (2 still there: ns/v1, ns/v2).",
        "Waiting on node n1 for the pods preempted for it to leave (1 still there: ns/v2).",
    ]
    assert rig.queue.parked_count == 1
    assert rig.engine.cancelled == []
    assert rig.metrics.registry.get_sample_value("vgpu_operator_preemption_victims_count") == 0


def test_a_nomination_with_no_victims_is_given_up_and_the_pod_told() -> None:
    """Issue 44: a preemption that named no victim (its trial found room the node's own
    check refuses) left the pod parked for a victim that would never leave, silently."""
    no_victims = Decision("ns/a", False, diagnosis=NO_MEMORY, nominated_node="n1")
    rig, preemptor = run(no_victims)
    assert preemptor.log == []
    assert rig.engine.cancelled == ["ns/a"]  # the hold is given up
    ((kind, name, message),) = rig.reporter.reports
    assert (kind, name) == ("preemption_blocked", "a")
    assert message.startswith(NO_MEMORY.message())
    assert "Preemption chose node n1 without any pod to evict" in message
    assert rig.queue.parked_count == 1  # waits for a change, with its diagnosis's hint
    assert rig.attempts("unschedulable") == 1
    assert rig.attempts("preempting") == 0


def test_a_nomination_past_its_timeout_is_told_unnominated_and_decided_again() -> None:
    async def scenario() -> tuple[Rig, Preemptor]:
        rig, preemptor = rig_with_preemptor(PREEMPTING)
        rig.add("a")
        rig.decide_next()
        await settle(rig)
        preemptor.log.clear()
        assert rig.queue.parked_count == 1
        # 300 s on, a victim is still there: the engine gave the hold up.
        rig.engine.expired = [NominationWait("ns/a", "n1", ("ns/v2",))]
        rig.worker.check_nominations()  # the operator's housekeeping
        await settle(rig)
        return rig, preemptor

    rig, preemptor = asyncio.run(scenario())
    told = [r for r in rig.reporter.reports if r[0] == "nomination_timed_out"]
    assert len(told) == 1
    assert "did not leave in time (1 still there: ns/v2)" in told[0][2]
    assert preemptor.log == ["nominate a None"]
    assert rig.queue.parked_count == 0
    rig.clock.now += 60  # past its backoff
    assert rig.queue.pop() == "ns/a"  # decided again


def test_an_eviction_that_fails_is_told_not_only_logged() -> None:
    rig, _ = run(PREEMPTING, v1=RuntimeError("apiserver down"))
    (blocked,) = [r for r in rig.reporter.reports if r[0] == "preemption_blocked"]
    assert blocked[2] == (
        "Preemption on node n1 stopped: the eviction of ns/v1 failed (apiserver down); no "
        "pod was evicted. The pod is decided again after its backoff."
    )


@pytest.mark.parametrize(("slice_s", "first_turn"), [(0.0, 1), (60.0, 10)])
def test_the_worker_decides_for_a_slice_of_time_per_turn_of_the_loop(
    monkeypatch: pytest.MonkeyPatch, slice_s: float, first_turn: int
) -> None:
    """Free bind slots are refilled for up to ``DECIDING_SLICE_S`` at once, not one per
    turn of the event loop (where Binding answers and watch events compete for turns)."""
    monkeypatch.setattr(worker_module, "DECIDING_SLICE_S", slice_s)

    async def scenario() -> tuple[int, int]:
        rig = Rig(max_binds=16)
        for index in range(10):
            rig.add(f"p{index}")
        task = asyncio.create_task(rig.worker.run())
        await asyncio.sleep(0)  # the worker's first turn
        decided = sum(1 for line in rig.engine.log if line.startswith("schedule "))
        for _ in range(50):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return decided, len(rig.binder.bound)

    decided, bound = asyncio.run(scenario())
    assert decided == first_turn
    assert bound == 10
