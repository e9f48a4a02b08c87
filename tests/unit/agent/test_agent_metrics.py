"""The agent's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import generate_latest

from vgpu_operator.agent.containers import ContainerCard
from vgpu_operator.agent.metrics import AgentMetrics, Operation
from vgpu_operator.agent.readings import MIB, GpuReading, MachineReading


def _reading(**fields: object) -> MachineReading:
    values: dict[str, object] = {
        "index": 0,
        "uuid": "GPU-a",
        "name": "NVIDIA L4",
        "memory_total_bytes": 1000 * MIB,
        "memory_used_bytes": 10 * MIB,
        "utilization_ratio": 0.5,
        "temperature_celsius": 55.0,
        "power_watts": 70.5,
    }
    values.update(fields)
    return MachineReading(gpus=(GpuReading(**values),))  # type: ignore[arg-type]


def _value(metrics: AgentMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_telemetry_is_exported_per_card() -> None:
    metrics = AgentMetrics()
    metrics.observe(_reading())
    card = {"uuid": "GPU-a", "index": "0"}
    assert _value(metrics, "vgpu_agent_gpu_memory_capacity_bytes", **card) == 1000 * MIB
    assert _value(metrics, "vgpu_agent_gpu_memory_used_bytes", **card) == 10 * MIB
    assert _value(metrics, "vgpu_agent_gpu_utilization_ratio", **card) == 0.5
    assert _value(metrics, "vgpu_agent_gpu_temperature_celsius", **card) == 55.0
    assert _value(metrics, "vgpu_agent_gpu_power_watts", **card) == 70.5
    assert _value(metrics, "vgpu_agent_gpu_healthy", **card) == 1.0


def test_values_nvml_stops_giving_and_vanished_cards_are_dropped() -> None:
    metrics = AgentMetrics()
    metrics.observe(_reading())
    metrics.observe(_reading(power_watts=None))
    card = {"uuid": "GPU-a", "index": "0"}
    assert _value(metrics, "vgpu_agent_gpu_power_watts", **card) is None
    assert _value(metrics, "vgpu_agent_gpu_temperature_celsius", **card) == 55.0
    metrics.observe(MachineReading(gpus=()))
    assert _value(metrics, "vgpu_agent_gpu_memory_capacity_bytes", **card) is None


def test_errors_are_counted_by_operation_from_zero() -> None:
    metrics = AgentMetrics()
    assert _value(metrics, "vgpu_agent_report_errors_total", operation="status") == 0.0
    metrics.report_failed(Operation.STATUS)
    metrics.report_failed(Operation.STATUS)
    assert _value(metrics, "vgpu_agent_report_errors_total", operation="status") == 2.0


def test_heartbeat_age_counts_from_start_then_from_each_heartbeat() -> None:
    now = [100.0]
    metrics = AgentMetrics(monotonic=lambda: now[0])
    now[0] = 130.0
    assert _value(metrics, "vgpu_agent_heartbeat_age_seconds") == 30.0
    metrics.heartbeat_written()
    now[0] = 135.0
    assert _value(metrics, "vgpu_agent_heartbeat_age_seconds") == 5.0


def test_exposition_uses_the_documented_names() -> None:
    metrics = AgentMetrics()
    metrics.observe(_reading())
    text = generate_latest(metrics.registry).decode()
    for name in (
        "vgpu_agent_gpu_memory_used_bytes",
        "vgpu_agent_gpu_memory_capacity_bytes",
        "vgpu_agent_gpu_utilization_ratio",
        "vgpu_agent_gpu_temperature_celsius",
        "vgpu_agent_gpu_power_watts",
        "vgpu_agent_report_errors_total",
        "vgpu_agent_heartbeat_age_seconds",
    ):
        assert f"\n{name}" in text, name


def test_container_info_names_only_this_nodes_cards_and_follows_changes() -> None:
    metrics = AgentMetrics()
    metrics.observe(_reading())
    rows = {
        ContainerCard("team", "p", "main", "GPU-a"),
        ContainerCard("team", "p", "main", "GPU-elsewhere"),  # not a card of this node
    }
    metrics.containers("node-1", rows)
    labels = {"namespace": "team", "pod": "p", "container": "main", "node": "node-1"}
    assert _value(metrics, "vgpu_agent_container_device_info", **labels, UUID="GPU-a") == 1
    assert (
        _value(metrics, "vgpu_agent_container_device_info", **labels, UUID="GPU-elsewhere") is None
    )
    metrics.containers("node-1", set())
    assert _value(metrics, "vgpu_agent_container_device_info", **labels, UUID="GPU-a") is None
