"""The agent loop with a scripted backend and a recording writer, on a fake clock.

The real API server is exercised in tests/integration/test_agent.py; here the point is
the loop's decisions: when to write the status, when to renew the node's Lease (the
heartbeat), when to put back what someone changed, how to recover.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import pytest
from agent_fakes import FakeClock

from vgpu_operator import names
from vgpu_operator.agent.inventory_loop import Agent
from vgpu_operator.agent.metrics import AgentMetrics, Operation
from vgpu_operator.agent.readings import MIB, GpuReading, LinkReading, MachineReading
from vgpu_operator.agent.settings import AgentSettings
from vgpu_operator.devices import nvidia
from vgpu_operator.devices.links import P2PLevel
from vgpu_operator.kube.inventory import CrdMissingError, NodeNotFoundError
from vgpu_operator.kube.node_lease import LeaseNamespaceMissingError


def reading(*healthy: bool) -> MachineReading:
    gpus = tuple(
        GpuReading(
            index=i,
            uuid=f"GPU-{i}",
            name="NVIDIA L4",
            memory_total_bytes=23034 * MIB,
            numa_node=0,
            healthy=ok,
            health_reason=None if ok else "critical XID 79",
        )
        for i, ok in enumerate(healthy)
    )
    topology = {
        (a.uuid, b.uuid): LinkReading(P2PLevel.HOST_BRIDGE, 0)
        for a in gpus
        for b in gpus
        if a.uuid != b.uuid
    }
    return MachineReading(gpus=gpus, topology=topology, driver_version="550", cuda_version="12.4")


class ScriptedBackend:
    description = "sim:scripted"

    def __init__(self, *readings: MachineReading) -> None:
        self.readings = list(readings)
        self.opened = 0
        self.closed = 0
        self.open_failures = 0
        self.read_failures = 0
        self.health_changes = 0

    def open(self) -> None:
        if self.open_failures:
            self.open_failures -= 1
            raise RuntimeError("NVML Shared Library Not Found")
        self.opened += 1

    def read(self) -> MachineReading:
        if self.read_failures:
            self.read_failures -= 1
            raise RuntimeError("driver busy")
        if len(self.readings) > 1:
            return self.readings.pop(0)
        return self.readings[0]

    def watch_health(self, timeout_s: float) -> bool:
        if self.health_changes:
            self.health_changes -= 1
            return True
        return False

    def close(self) -> None:
        self.closed += 1


class RecordingWriter:
    """Records the calls; ``fail`` lists exceptions to raise on the next calls. ``server``
    is the inventory as the API server holds it: the last status written, unless a test
    changes it (None: deleted)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail: list[Exception] = []
        self.server: dict[str, Any] | None = None

    def _maybe_fail(self) -> None:
        if self.fail:
            raise self.fail.pop(0)

    async def ensure(self, node_name: str) -> None:
        self._maybe_fail()
        self.calls.append(("ensure", node_name))

    async def write_status(self, node_name: str, status: Mapping[str, Any]) -> None:
        self._maybe_fail()
        wire = json.loads(json.dumps(status))
        self.calls.append(("status", wire))
        self.server = {"metadata": {"name": node_name}, "spec": {}, "status": copy.deepcopy(wire)}

    async def read_inventory(self, node_name: str) -> Mapping[str, Any] | None:
        self._maybe_fail()
        self.calls.append(("read", node_name))
        return copy.deepcopy(self.server)

    async def renew_lease(self, node_name: str, renewed: datetime, duration_s: int) -> None:
        self._maybe_fail()
        self.calls.append(("lease", (node_name, renewed, duration_s)))

    async def write_node_annotations(
        self, node_name: str, annotations: Mapping[str, str | None]
    ) -> None:
        self._maybe_fail()
        self.calls.append(("annotations", dict(annotations)))

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls]


def make_agent(
    backend: ScriptedBackend,
    writer: RecordingWriter,
    clock: FakeClock,
    **settings: Any,
) -> Agent:
    values: dict[str, Any] = {
        "node_name": "node-a",
        "heartbeat_interval_s": 30.0,
        "poll_interval_s": 10.0,
        "backoff_initial_s": 1.0,
        "backoff_max_s": 8.0,
    }
    values.update(settings)
    return Agent(AgentSettings(**values), backend, writer, metrics=AgentMetrics(), clock=clock)


def step(agent: Agent) -> float:
    return asyncio.run(agent.step())


def test_first_poll_writes_the_status_and_renews_the_lease(clock: FakeClock) -> None:
    writer = RecordingWriter()
    agent = make_agent(ScriptedBackend(reading(True, True)), writer, clock, lease_duration_s=90)
    step(agent)
    assert writer.kinds() == ["ensure", "status", "lease"]
    status = writer.calls[1][1]
    assert status["nodeName"] == "node-a"
    assert status["backend"] == "sim:scripted"
    assert status["summary"]["gpuCount"] == 2
    # The report still carries its time, for operators that read no Lease.
    assert status["heartbeat"] == "2025-07-30T10:15:00Z"
    assert writer.calls[2][1] == ("node-a", clock.now, 90)


def test_unchanged_readings_renew_only_the_lease_at_the_interval(clock: FakeClock) -> None:
    """The heartbeat is the Lease: the inventory is read back (to compare) but never
    rewritten while what it reports stays the same."""
    writer = RecordingWriter()
    agent = make_agent(ScriptedBackend(reading(True)), writer, clock)
    assert step(agent) == 10.0
    clock.advance(10)
    assert step(agent) == 10.0
    clock.advance(10)
    assert step(agent) == 10.0  # the heartbeat is due in exactly 10 s
    assert writer.kinds() == ["ensure", "status", "lease"]
    for _ in range(3):
        clock.advance(10)
        step(agent)
        assert writer.kinds()[-2:] == ["lease", "read"]
        assert writer.calls[-2][1] == ("node-a", clock.now, 120)
        clock.advance(20)
        step(agent)
    assert writer.kinds().count("lease") == 4
    assert writer.kinds().count("status") == 1


def test_a_status_write_does_not_move_the_lease_schedule(clock: FakeClock) -> None:
    """Renewals keep their interval whatever else is written, so the Lease always shows
    when the agent was last alive."""
    writer = RecordingWriter()
    agent = make_agent(ScriptedBackend(reading(True, True), reading(True, False)), writer, clock)
    step(agent)
    clock.advance(25)
    assert step(agent) == pytest.approx(5.0)  # a card failed: written at once
    assert writer.kinds() == ["ensure", "status", "lease", "status"]
    clock.advance(5)
    step(agent)
    assert writer.kinds()[-2:] == ["lease", "read"]


def test_next_poll_comes_early_when_the_heartbeat_is_due_sooner(clock: FakeClock) -> None:
    agent = make_agent(
        ScriptedBackend(reading(True)), RecordingWriter(), clock, heartbeat_interval_s=4.0
    )
    assert step(agent) == 4.0
    clock.advance(3)
    assert step(agent) == pytest.approx(1.0)


def test_a_change_writes_the_whole_status_at_once(clock: FakeClock) -> None:
    writer = RecordingWriter()
    agent = make_agent(ScriptedBackend(reading(True, True), reading(True, False)), writer, clock)
    step(agent)
    clock.advance(1)
    step(agent)
    assert writer.kinds() == ["ensure", "status", "lease", "status"]
    status = writer.calls[-1][1]
    assert [d["health"] for d in status["devices"]] == ["Healthy", "Unhealthy"]
    assert status["summary"]["healthyCount"] == 1
    assert status["conditions"][0]["reason"] == "DevicesUnhealthy"


def errors(agent: Agent, operation: str) -> float | None:
    return agent.metrics.registry.get_sample_value(
        "vgpu_agent_report_errors_total", {"operation": operation}
    )


def test_a_failed_status_write_backs_off_then_rewrites_everything(clock: FakeClock) -> None:
    writer = RecordingWriter()
    agent = make_agent(ScriptedBackend(reading(True, True), reading(True, False)), writer, clock)
    step(agent)
    clock.advance(1)
    writer.fail = [ConnectionRefusedError("apiserver down"), OSError("still down")]
    delays = [asyncio.run(agent._step_or_back_off()) for _ in range(2)]
    assert 0.5 <= delays[0] <= 1.0
    assert 1.0 <= delays[1] <= 2.0
    assert errors(agent, "status") == 1.0
    assert errors(agent, "create") == 1.0
    # Back online: the object is checked and the latest state written in full.
    asyncio.run(agent._step_or_back_off())
    assert writer.kinds()[-2:] == ["ensure", "status"]
    assert writer.calls[-1][1]["summary"]["healthyCount"] == 1


def test_a_failed_lease_renewal_is_retried_without_rewriting_the_inventory(
    clock: FakeClock,
) -> None:
    writer = RecordingWriter()
    agent = make_agent(ScriptedBackend(reading(True)), writer, clock)
    step(agent)
    clock.advance(30)
    writer.fail = [ConnectionRefusedError("apiserver down"), LeaseNamespaceMissingError()]
    delays = [asyncio.run(agent._step_or_back_off()) for _ in range(2)]
    assert 0.5 <= delays[0] <= 1.0
    assert 1.0 <= delays[1] <= 2.0
    assert errors(agent, "heartbeat") == 2.0
    assert asyncio.run(agent._step_or_back_off()) == 10.0
    # The renewal goes through; the inventory was never in doubt: read back, not rewritten.
    assert writer.kinds() == ["ensure", "status", "lease", "lease", "read"]
    assert writer.calls[-2][1][1] == clock.now


def test_an_inventory_changed_by_someone_else_is_put_back(clock: FakeClock) -> None:
    writer = RecordingWriter()
    agent = make_agent(ScriptedBackend(reading(True)), writer, clock, reassert_interval_s=3600)
    step(agent)
    assert writer.server is not None
    real = writer.server["status"]["devices"][0]["memoryMiB"]
    writer.server["status"]["devices"][0]["memoryMiB"] = 900000
    clock.advance(30)
    step(agent)
    assert writer.kinds()[-3:] == ["lease", "read", "status"]
    assert writer.calls[-1][1]["devices"][0]["memoryMiB"] == real


def test_a_deleted_inventory_is_created_again_at_the_next_heartbeat(clock: FakeClock) -> None:
    writer = RecordingWriter()
    agent = make_agent(ScriptedBackend(reading(True)), writer, clock)
    step(agent)
    writer.server = None
    clock.advance(30)
    step(agent)
    assert writer.kinds()[-4:] == ["lease", "read", "ensure", "status"]


def test_the_whole_report_is_reasserted_at_its_interval(clock: FakeClock) -> None:
    writer = RecordingWriter()
    agent = make_agent(ScriptedBackend(reading(True)), writer, clock, reassert_interval_s=60)
    step(agent)
    clock.advance(30)
    step(agent)
    assert writer.kinds().count("status") == 1
    clock.advance(30)
    step(agent)
    assert writer.kinds()[-3:] == ["lease", "read", "status"]


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(CrdMissingError(), id="crd-missing"),
        pytest.param(NodeNotFoundError("node-a"), id="node-missing"),
        pytest.param(LeaseNamespaceMissingError(), id="lease-namespace-missing"),
        pytest.param(RuntimeError("anything else"), id="unexpected"),
    ],
)
def test_no_error_escapes_the_loop(clock: FakeClock, error: Exception) -> None:
    writer = RecordingWriter()
    writer.fail = [error] * 3
    agent = make_agent(ScriptedBackend(reading(True)), writer, clock)
    delays = [asyncio.run(agent._step_or_back_off()) for _ in range(4)]
    assert all(d > 0 for d in delays)
    assert writer.kinds() == ["ensure", "status", "lease"]


def test_read_failure_is_counted_and_keeps_what_the_server_has(clock: FakeClock) -> None:
    backend = ScriptedBackend(reading(True))
    writer = RecordingWriter()
    agent = make_agent(backend, writer, clock)
    step(agent)
    backend.read_failures = 1
    assert asyncio.run(agent._step_or_back_off()) > 0
    assert (
        agent.metrics.registry.get_sample_value(
            "vgpu_agent_report_errors_total", {"operation": "read"}
        )
        == 1.0
    )
    clock.advance(1)
    step(agent)
    assert writer.kinds() == ["ensure", "status", "lease"]  # nothing changed or due


def test_hami_annotations_are_written_when_changed_and_handshake_always(clock: FakeClock) -> None:
    writer = RecordingWriter()
    agent = make_agent(
        ScriptedBackend(reading(True, True), reading(True, True), reading(True, False)),
        writer,
        clock,
        write_hami_annotations=True,
    )
    step(agent)
    assert writer.kinds() == ["ensure", "status", "annotations", "lease"]
    first = writer.calls[-2][1]
    register = json.loads(first[nvidia.REGISTER_ANNOTATION])
    assert [d["id"] for d in register] == ["GPU-0", "GPU-1"]
    assert register[0]["type"] == "NVIDIA L4"
    assert register[0]["health"] is True
    scores = json.loads(first[nvidia.SCORE_ANNOTATION])
    assert scores[0] == {"uuid": "GPU-0", "score": {"GPU-1": 30}}
    assert first[names.NODE_HANDSHAKE].startswith("Reported_")

    clock.advance(30)
    step(agent)  # heartbeat: only the handshake
    assert writer.kinds()[-3:] == ["lease", "annotations", "read"]
    assert set(writer.calls[-2][1]) == {names.NODE_HANDSHAKE}

    clock.advance(1)
    step(agent)  # a card failed: the register annotation changes, the scores do not
    assert set(writer.calls[-1][1]) == {names.NODE_HANDSHAKE, nvidia.REGISTER_ANNOTATION}
    register = json.loads(writer.calls[-1][1][nvidia.REGISTER_ANNOTATION])
    assert "health" not in register[1]  # HAMi leaves false out


def test_gpu_count_dropping_to_zero_reports_disappearance(clock: FakeClock) -> None:
    gone = MachineReading(
        gpus=tuple(
            GpuReading(
                index=0,
                uuid="GPU-0",
                name="NVIDIA L4",
                memory_total_bytes=MIB,
                healthy=False,
                present=False,
            )
            for _ in range(1)
        )
    )
    writer = RecordingWriter()
    agent = make_agent(ScriptedBackend(reading(True), gone), writer, clock)
    step(agent)
    step(agent)
    condition = writer.calls[-1][1]["conditions"][0]
    assert (condition["status"], condition["reason"]) == ("False", "GPUsDisappeared")


def test_run_stops_cleanly_and_closes_the_backend(clock: FakeClock) -> None:
    backend = ScriptedBackend(reading(True))
    backend.open_failures = 1
    backend.health_changes = 1
    writer = RecordingWriter()
    agent = make_agent(
        backend,
        writer,
        clock,
        poll_interval_s=0.01,
        backoff_initial_s=0.01,
        backoff_max_s=0.02,
        health_wait_s=0.01,
    )

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        while "status" not in writer.kinds():
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, timeout=5)

    asyncio.run(scenario())
    assert backend.opened == 1
    assert backend.closed == 1
    assert (
        agent.metrics.registry.get_sample_value(
            "vgpu_agent_report_errors_total", {"operation": Operation.READ.value}
        )
        == 1.0
    )
    assert agent.last_written is not None
