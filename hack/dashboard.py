"""Write the Grafana dashboard: charts/vgpu-operator/dashboards/vgpu-operator.json.

    python hack/dashboard.py            write it
    python hack/dashboard.py --check    exit 1 when the committed file differs

Built with Grafana's own foundation SDK (its dashboard model, generated from Grafana's
schema), so the JSON is Grafana's. Variables: ``datasource`` (any Prometheus), ``node``
and ``namespace`` (multi-valued, "All" is ``.*``). Every query here is evaluated against
a real Prometheus scraping the demo cluster by tests/integration/test_dashboard.py; the
per-pod panels join DCGM exporter's per-card series through the agent's
``vgpu_agent_container_device_info`` (docs/operations.md explains the join).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard, stat, timeseries
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

OUTPUT = Path(__file__).resolve().parents[1] / "charts/vgpu-operator/dashboards/vgpu-operator.json"

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
NODE = 'node=~"$node"'
NAMESPACE = 'namespace=~"$namespace"'
RATE = "[$__rate_interval]"

#: The operator's and the agents' own process series, told apart by a series only they export.
OPERATOR_PROCESS = "and on(instance) vgpu_operator_leader"
AGENT_PROCESS = "and on(instance) vgpu_agent_heartbeat_age_seconds"


def _joined(dcgm: str) -> str:
    """A DCGM exporter per-card series joined to the agent's container info series: one
    value per container, the value of the card it holds a share of."""
    return (
        "max by (namespace, pod, container, UUID) ("
        f"vgpu_agent_container_device_info{{{NAMESPACE},{NODE}}} "
        f"* on(UUID) group_left() max by (UUID) ({dcgm}))"
    )


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: Sequence[Query]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"
    width: int = 12
    height: int = 8
    extra: dict[str, Any] = field(default_factory=dict)


def q(expr: str, legend: str = "") -> Query:
    return Query(expr, legend)


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "Cluster overview",
        (
            Panel(
                "GPUs",
                "Cards the scheduler books (every card of every GPU node).",
                [q(f"count(vgpu_operator_device_memory_capacity_bytes{{{NODE}}})")],
                kind="stat",
                width=4,
                height=4,
            ),
            Panel(
                "Card memory booked",
                "Memory booked by pods, of all the cards' registered memory.",
                [
                    q(
                        f"sum(vgpu_operator_device_memory_allocated_bytes{{{NODE}}}) / "
                        f"sum(vgpu_operator_device_memory_capacity_bytes{{{NODE}}})"
                    )
                ],
                unit="percentunit",
                kind="stat",
                width=4,
                height=4,
            ),
            Panel(
                "Compute booked",
                "Compute booked by pods, of all the cards' registered compute.",
                [
                    q(
                        f"sum(vgpu_operator_device_cores_allocated_ratio{{{NODE}}}) / "
                        f"sum(vgpu_operator_device_cores_capacity_ratio{{{NODE}}})"
                    )
                ],
                unit="percentunit",
                kind="stat",
                width=4,
                height=4,
            ),
            Panel(
                "Shares in use",
                "Containers holding a share of a card.",
                [q(f"sum(vgpu_operator_device_shares_allocated{{{NODE}}})")],
                kind="stat",
                width=4,
                height=4,
            ),
            Panel(
                "Pending pods",
                "Pods waiting for the scheduler, in any queue.",
                [q("sum(vgpu_operator_pending_pods)")],
                kind="stat",
                width=4,
                height=4,
            ),
            Panel(
                "Unhealthy cards",
                "Cards the node agents read as unhealthy.",
                [q(f"count(vgpu_agent_gpu_healthy{{{NODE}}} == 0) or vector(0)")],
                kind="stat",
                width=4,
                height=4,
            ),
        ),
    ),
    (
        "Cards and shares",
        (
            Panel(
                "Card memory booked, per card",
                "Booked memory of each card, of its registered memory.",
                [
                    q(
                        f"vgpu_operator_device_memory_allocated_bytes{{{NODE}}} / "
                        f"vgpu_operator_device_memory_capacity_bytes{{{NODE}}}",
                        "{{node}} {{device}}",
                    )
                ],
                unit="percentunit",
            ),
            Panel(
                "Shares per card",
                "Containers sharing each card (of deviceSplitCount).",
                [
                    q(
                        f"vgpu_operator_device_shares_allocated{{{NODE}}}",
                        "{{node}} {{device}}",
                    )
                ],
            ),
            Panel(
                "Compute booked, per card",
                "Compute booked on each card, in whole cards.",
                [
                    q(
                        f"vgpu_operator_device_cores_allocated_ratio{{{NODE}}}",
                        "{{node}} {{device}}",
                    )
                ],
            ),
            Panel(
                "Card memory in use (agent)",
                "Memory in use on each card as the node agent reads it (NVML).",
                [q(f"vgpu_agent_gpu_memory_used_bytes{{{NODE}}}", "{{node}} {{uuid}}")],
                unit="bytes",
            ),
        ),
    ),
    (
        "Scheduling",
        (
            Panel(
                "Scheduling attempts by result",
                "Attempts per second: scheduled, unschedulable, rejected, preempting...",
                [
                    q(
                        f"sum by (result) (rate(vgpu_operator_scheduling_attempts_total{RATE}))",
                        "{{result}}",
                    )
                ],
                unit="ops",
            ),
            Panel(
                "Pod creation to Binding",
                "What a user waits, queueing included: median and 99th percentile.",
                [
                    q(
                        "histogram_quantile(0.5, sum by (le) "
                        f"(rate(vgpu_operator_pod_create_to_bound_seconds_bucket{RATE})))",
                        "p50",
                    ),
                    q(
                        "histogram_quantile(0.99, sum by (le) "
                        f"(rate(vgpu_operator_pod_create_to_bound_seconds_bucket{RATE})))",
                        "p99",
                    ),
                ],
                unit="s",
            ),
            Panel(
                "Decision and Binding latency",
                "99th percentile of the engine's decision and of the Binding write.",
                [
                    q(
                        "histogram_quantile(0.99, sum by (le) "
                        f"(rate(vgpu_operator_decision_duration_seconds_bucket{RATE})))",
                        "decision p99",
                    ),
                    q(
                        "histogram_quantile(0.99, sum by (le) "
                        f"(rate(vgpu_operator_bind_duration_seconds_bucket{RATE})))",
                        "binding p99",
                    ),
                ],
                unit="s",
            ),
            Panel(
                "Webhook answers and API errors",
                "Admission answers by result, and failed API requests by operation.",
                [
                    q(
                        f"sum by (result) (rate(vgpu_operator_webhook_requests_total{RATE}))",
                        "webhook {{result}}",
                    ),
                    q(
                        f"sum by (operation) (rate(vgpu_operator_api_errors_total{RATE}))",
                        "API error {{operation}}",
                    ),
                ],
                unit="ops",
            ),
        ),
    ),
    (
        "Pending pods",
        (
            Panel(
                "Pending pods by queue",
                "active: due now; backoff: waiting out a backoff; unschedulable: did not "
                "fit, waiting for a change in the cluster.",
                [q("sum by (queue) (vgpu_operator_pending_pods)", "{{queue}}")],
            ),
            Panel(
                "Unschedulable pods by reason",
                "The reason codes of the pods' PodScheduled condition (a pod counts under "
                "each reason its message names).",
                [q("sum by (reason) (vgpu_operator_unschedulable_pods) > 0", "{{reason}}")],
            ),
        ),
    ),
    (
        "Quotas",
        (
            Panel(
                "Quota used",
                "Device resources booked per namespace, in the quota's units.",
                [
                    q(
                        f"vgpu_operator_quota_used{{{NAMESPACE}}}",
                        "{{namespace}} {{resource}}",
                    )
                ],
            ),
            Panel(
                "Quota used, of the limit",
                "Where a ResourceQuota sets a limit: what is booked, of it.",
                [
                    q(
                        f"vgpu_operator_quota_used{{{NAMESPACE}}} / "
                        f"vgpu_operator_quota_limit{{{NAMESPACE}}}",
                        "{{namespace}} {{resource}}",
                    )
                ],
                unit="percentunit",
            ),
        ),
    ),
    (
        "Preemption",
        (
            Panel(
                "Preemptions by result",
                "Preemptions started per second: evicted (every victim), refused (a "
                "disruption budget), error.",
                [
                    q(
                        f"sum by (result) (rate(vgpu_operator_preemption_attempts_total{RATE}))",
                        "{{result}}",
                    )
                ],
                unit="ops",
            ),
            Panel(
                "Victims per preemption",
                "Average pods evicted by one preemption since the operator started.",
                [
                    q(
                        "sum(vgpu_operator_preemption_victims_sum) / "
                        "sum(vgpu_operator_preemption_victims_count)"
                    )
                ],
                kind="stat",
            ),
        ),
    ),
    (
        "Stranded memory",
        (
            Panel(
                "Stranded memory per node",
                "Free card memory that no pending request could use (0 while no GPU pod "
                "waits); defined in docs/operations.md.",
                [q(f"vgpu_operator_stranded_memory_bytes{{{NODE}}}", "{{node}}")],
                unit="bytes",
            ),
            Panel(
                "Stranded, of free memory",
                "Stranded memory of all free card memory.",
                [
                    q(
                        f"sum(vgpu_operator_stranded_memory_bytes{{{NODE}}}) / "
                        f"sum(vgpu_operator_device_memory_capacity_bytes{{{NODE}}} - "
                        f"vgpu_operator_device_memory_allocated_bytes{{{NODE}}})"
                    )
                ],
                unit="percentunit",
            ),
        ),
    ),
    (
        "Per-pod GPU use (DCGM exporter, joined through the agent)",
        (
            Panel(
                "GPU utilization of each pod's cards",
                "DCGM_FI_DEV_GPU_UTIL of the card each container holds a share of: a "
                "card's figure, shown for every pod sharing it.",
                [
                    q(
                        _joined("DCGM_FI_DEV_GPU_UTIL") + " / 100",
                        "{{namespace}}/{{pod}} {{container}} {{UUID}}",
                    )
                ],
                unit="percentunit",
            ),
            Panel(
                "Frame buffer in use on each pod's cards",
                "DCGM_FI_DEV_FB_USED (MiB) of the card each container holds a share of.",
                [
                    q(
                        _joined("DCGM_FI_DEV_FB_USED") + " * 1048576",
                        "{{namespace}}/{{pod}} {{container}} {{UUID}}",
                    )
                ],
                unit="bytes",
            ),
            Panel(
                "Pods sharing each card",
                "Containers holding a share of each card, from the agents.",
                [
                    q(
                        f"count by (UUID) (vgpu_agent_container_device_info{{{NODE}}})",
                        "{{UUID}}",
                    )
                ],
            ),
        ),
    ),
    (
        "Processes",
        (
            Panel(
                "CPU",
                "CPU seconds per second of the operator and of the agents.",
                [
                    q(
                        f"rate(process_cpu_seconds_total{RATE}) {OPERATOR_PROCESS}",
                        "operator {{instance}}",
                    ),
                    q(
                        f"rate(process_cpu_seconds_total{RATE}) {AGENT_PROCESS}",
                        "agent {{instance}}",
                    ),
                ],
            ),
            Panel(
                "Resident memory",
                "Resident memory of the operator and of the agents.",
                [
                    q(f"process_resident_memory_bytes {OPERATOR_PROCESS}", "operator {{instance}}"),
                    q(f"process_resident_memory_bytes {AGENT_PROCESS}", "agent {{instance}}"),
                ],
                unit="bytes",
            ),
        ),
    ),
)


def _variables() -> list[Any]:
    def query_variable(name: str, label: str, query: str) -> Any:
        return (
            dashboard.QueryVariable(name)
            .label(label)
            .datasource(DATASOURCE)
            .query(query)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .include_all(True)
            .multi(True)
            .all_value(".*")
        )

    return [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        query_variable("node", "Node", "label_values(vgpu_operator_device_shares_capacity, node)"),
        query_variable(
            "namespace",
            "Namespace",
            "label_values(vgpu_agent_container_device_info, namespace)",
        ),
    ]


def _panel(panel: Panel, panel_id: int) -> Any:
    builder: Any = stat.Panel() if panel.kind == "stat" else timeseries.Panel()
    builder = (
        builder.id(panel_id)
        .title(panel.title)
        .description(panel.description)
        .datasource(DATASOURCE)
        .unit(panel.unit)
        .span(panel.width)
        .height(panel.height)
    )
    for ref, query in zip("ABCDEFGH", panel.queries, strict=False):
        target = prom.Dataquery().ref_id(ref).expr(query.expr)
        if query.legend:
            target = target.legend_format(query.legend)
        if panel.kind == "stat":
            target = target.instant()
        builder = builder.with_target(target)
    return builder


def build() -> dict[str, Any]:
    board = (
        dashboard.Dashboard("vgpu-operator")
        .uid("vgpu-operator")
        .description(
            "GPU sharing: cards and shares, scheduling, pending pods by queue and reason, "
            "quotas, preemption, stranded memory, per-pod GPU use (DCGM exporter joined "
            "through the node agents)."
        )
        .tags(["gpu", "vgpu-operator", "hami"])
        .refresh("30s")
        .time("now-1h", "now")
        .variables(_variables())
    )
    panel_id = 1
    for title, panels in ROWS:
        board = board.with_row(dashboard.Row(title).id(panel_id))
        panel_id += 1
        for panel in panels:
            board = board.with_panel(_panel(panel, panel_id))
            panel_id += 1
    encoded: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return _without_nulls(encoded)


def _without_nulls(value: Any) -> Any:
    """The SDK writes unset fields as null (``"options": null``); Grafana takes an absent
    field as its default, so absent they are."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if argv[1:] == ["--check"]:
        if not OUTPUT.is_file() or OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run `make dashboard`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
