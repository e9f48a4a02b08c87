"""The Grafana dashboard, proven on live data: a real Prometheus scrapes the demo cluster
(the operator, every node's agent) and every panel's queries are evaluated against it.

The demo runs once for the module (``run_demo`` with the agents' metrics served); while it
runs, a Prometheus server of promtool's release scrapes the operator, the five agents and
a stand-in for NVIDIA's DCGM exporter (``FakeDcgmExporter``: DCGM's metric names and
labels, one series per card UUID of the demo's inventories; no real DCGM runs here). Each
query is evaluated with the variables at "All" (``.*``), where it must answer without an
error and with data (every panel shows something the demo has), and with each variable at
a real value, where it must answer without an error.
"""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from integration.prometheus_server import PrometheusServer, QueryError, Target, free_port

from vgpu_operator.demo import DemoResult, RunningDemo, run_demo
from vgpu_operator.demo.dra_claim import DRA_NODE
from vgpu_operator.demo.nodes import DEMO_NODES, cards_from_inventories
from vgpu_operator.demo.settings import INVENTORIES
from vgpu_operator.testing.controlplane import Binaries

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts" / "vgpu-operator" / "dashboards" / "vgpu-operator.json"
#: What Grafana puts in for $__rate_interval at a 1 s scrape interval and a short range.
RATE_INTERVAL = "10s"


def _board() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    ref: str
    expr: str

    @property
    def id(self) -> str:
        return f"{self.panel} [{self.ref}]"


def panel_queries() -> list[PanelQuery]:
    return [
        PanelQuery(panel["title"], target["refId"], target["expr"])
        for panel in _board()["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def variable_queries() -> dict[str, tuple[str, str]]:
    """name -> (metric, label) of each ``label_values(metric, label)`` variable."""
    out = {}
    for variable in _board()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", variable["query"])
        assert match, variable["query"]
        out[variable["name"]] = (match.group(1), match.group(2))
    return out


def substitute(expr: str, values: Mapping[str, str]) -> str:
    text = expr.replace("$__rate_interval", RATE_INTERVAL)
    for name, value in values.items():
        text = text.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in text, text
    return text


# --- a stand-in for DCGM exporter -----------------------------------------------------------


class FakeDcgmExporter:
    """Serves DCGM exporter's per-card gauges for the given cards, as dcgm-exporter labels
    them (gpu, UUID, device, modelName, Hostname). A stand-in: it proves the dashboard's
    join, not DCGM's readings."""

    def __init__(self, cards: Sequence[Mapping[str, Any]]) -> None:
        lines = []
        for name, help_text, value in (
            ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda i: 10 + 7 * i),
            ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda i: 1000 * i),
        ):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
            for card in cards:
                labels = (
                    f'gpu="{card["index"]}",UUID="{card["uuid"]}",device="nvidia{card["index"]}",'
                    f'modelName="{card["model"]}",Hostname="{card["node"]}"'
                )
                lines.append(f"{name}{{{labels}}} {value(card['index'])}")
        body = ("\n".join(lines) + "\n").encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        self.port = free_port()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeDcgmExporter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


# --- the demo, scraped ------------------------------------------------------------------------


@dataclass
class Evaluated:
    """What the queries answered while the demo ran."""

    demo: DemoResult | None = None
    #: (query id, variables) -> the result, or the error Prometheus gave
    answers: dict[tuple[str, str], list[dict[str, Any]] | QueryError] | None = None
    variables: dict[str, list[str]] | None = None
    checks: dict[str, list[dict[str, Any]]] | None = None
    #: endpoint -> (promtool's exit status, its output, the exposition)
    linted: dict[str, tuple[int, str, str]] | None = None


#: Expressions the assertions below read besides the panels'.
CHECKS = {
    "pending": "sum(vgpu_operator_pending_pods)",
    "reasons": "vgpu_operator_unschedulable_pods > 0",
    "preemptions": 'vgpu_operator_preemption_attempts_total{result="evicted"}',
    "victims": "vgpu_operator_preemption_victims_count",
    "stranded": "vgpu_operator_stranded_memory_bytes",
    "shared": (
        'vgpu_agent_container_device_info{pod=~"shared-a|shared-b"} '
        "* on(UUID) group_left(modelName) max by (UUID, modelName) (DCGM_FI_DEV_GPU_UTIL)"
    ),
}


def _wait_for_data(server: PrometheusServer, jobs: Mapping[str, int], timeout_s: float) -> None:
    """Every target up, two scrapes behind each rate window, and the container info in."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        up = server.targets_up()
        rates = server.query(f"rate(process_cpu_seconds_total[{RATE_INTERVAL}])")
        info = server.query("vgpu_agent_container_device_info")
        if up == dict(jobs) and len(rates) >= 2 and info:
            time.sleep(3)  # a few more samples in every window
            return
        time.sleep(0.5)
    raise AssertionError(
        f"no data after {timeout_s:.0f}s: up={server.targets_up()}\n{server.log_tail()}"
    )


def _lint(promtool: Path, port: int) -> tuple[int, str, str]:
    """`promtool check metrics` on an endpoint's exposition as the demo left it."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    done = subprocess.run(
        [str(promtool), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    return done.returncode, done.stdout + done.stderr, text


def _evaluate(
    running: RunningDemo, tools: tuple[Path, Path], workdir: Path, into: Evaluated
) -> None:
    prometheus, promtool = tools
    # Every family has samples now (a preemption, waiting pods, shared cards): lint them.
    agent_port = running.agent_metrics_ports["gpu-h100-failing"]  # the shared pods' node
    into.linted = {
        "operator": _lint(promtool, running.operator.metrics_port),
        "agent": _lint(promtool, agent_port),
    }
    inventories = running.cp.get(INVENTORIES)["items"]
    cards = [
        {"index": c.index, "uuid": c.uuid, "model": c.model, "node": c.node}
        for c in cards_from_inventories(inventories).values()
    ]
    with FakeDcgmExporter(cards) as dcgm:
        jobs = {
            "vgpu-operator": [Target(running.operator.metrics_port)],
            "vgpu-agent": [
                Target(port, {"node": node}) for node, port in running.agent_metrics_ports.items()
            ],
            "dcgm-exporter": [Target(dcgm.port)],
        }
        with PrometheusServer(prometheus, workdir, jobs) as server:
            _wait_for_data(server, {job: len(t) for job, t in jobs.items()}, timeout_s=90)
            variables = {
                name: server.label_values(label, metric)
                for name, (metric, label) in variable_queries().items()
            }
            settings = [dict.fromkeys(variables, ".*")]
            # One real value per variable, regex-escaped as Grafana does in a PromQL string.
            settings += [
                {**settings[0], name: values[0].replace(".", "\\\\.")}
                for name, values in variables.items()
                if values
            ]
            answers: dict[tuple[str, str], list[dict[str, Any]] | QueryError] = {}
            for query in panel_queries():
                for values in settings:
                    key = (query.id, json.dumps(values, sort_keys=True))
                    try:
                        answers[key] = server.query(substitute(query.expr, values))
                    except QueryError as exc:
                        answers[key] = exc
            into.answers = answers
            into.variables = variables
            into.checks = {name: server.query(expr) for name, expr in CHECKS.items()}


@pytest.fixture(scope="module")
def scraped(
    control_plane_binaries: Binaries,
    prometheus: Path,
    promtool: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Evaluated:
    evaluated = Evaluated()
    workdir = tmp_path_factory.mktemp("prometheus")
    ports = {node.name: free_port() for node in DEMO_NODES}
    lines: list[str] = []
    evaluated.demo = run_demo(
        binaries=control_plane_binaries,
        timeout_s=90,
        say=lines.append,
        agent_metrics_ports=ports,
        agent_heartbeat_s=2.0,
        while_running=lambda running: _evaluate(
            running, (prometheus, promtool), workdir, evaluated
        ),
    )
    print("\n".join(lines))  # shown by pytest when a test fails
    return evaluated


ALL = json.dumps(dict.fromkeys(("namespace", "node"), ".*"), sort_keys=True)


@pytest.mark.parametrize("query", panel_queries(), ids=lambda q: q.id)
def test_every_panel_query_answers_with_data(scraped: Evaluated, query: PanelQuery) -> None:
    assert scraped.answers is not None
    answer = scraped.answers[(query.id, ALL)]
    assert not isinstance(answer, QueryError), f"{query.expr}\n{answer}"
    assert answer, f"no data for {query.id}: {query.expr}"


def test_every_query_answers_with_each_variable_at_a_real_value(scraped: Evaluated) -> None:
    assert scraped.answers is not None
    errors = {k: v for k, v in scraped.answers.items() if isinstance(v, QueryError)}
    assert errors == {}


#: Every node whose cards the operator's books hold: the DRA node's cards (its slice's
#: devices, with the claim kube-scheduler allocated there) are counted too.
BOOKED_NODES = {node.name for node in (*DEMO_NODES, DRA_NODE)}


def test_the_variables_list_the_demos_nodes_and_namespaces(scraped: Evaluated) -> None:
    assert scraped.variables is not None
    assert set(scraped.variables["node"]) == BOOKED_NODES
    assert {"vgpu-demo", "team-quota"} <= set(scraped.variables["namespace"])


def test_pending_pods_reasons_and_preemption_are_the_demos(scraped: Evaluated) -> None:
    """The pods that wait (one over its quota, one too big for any card, and the four of
    the gang that waits whole), under the reasons their conditions name; the preemption
    evicted its one victim."""
    checks = scraped.checks
    assert checks is not None
    reasons = {s["metric"]["reason"]: float(s["value"][1]) for s in checks["reasons"]}
    assert float(checks["pending"][0]["value"][1]) == 6, reasons
    assert reasons.get("ResourceQuotaNotFit") == 1
    assert reasons.get("CardInsufficientMemory") == 1
    assert float(checks["preemptions"][0]["value"][1]) == 1
    assert float(checks["victims"][0]["value"][1]) == 1
    assert {s["metric"]["node"] for s in checks["stranded"]} == BOOKED_NODES


def test_dcgm_figures_join_to_every_pod_sharing_a_card(scraped: Evaluated) -> None:
    """The two shared pods hold one card: DCGM's one series for that card joins to both."""
    checks = scraped.checks
    assert checks is not None
    joined = {s["metric"]["pod"]: (s["metric"]["UUID"], s["value"][1]) for s in checks["shared"]}
    assert set(joined) == {"shared-a", "shared-b"}
    assert joined["shared-a"] == joined["shared-b"]


@pytest.mark.parametrize("endpoint", ["operator", "agent"])
def test_the_endpoints_pass_promtool_with_every_family_filled(
    scraped: Evaluated, endpoint: str
) -> None:
    assert scraped.linted is not None
    status, output, exposition = scraped.linted[endpoint]
    assert status == 0, output
    for family in {
        "operator": (
            "vgpu_operator_pending_pods{",
            "vgpu_operator_unschedulable_pods{",
            "vgpu_operator_preemption_attempts_total{",
            "vgpu_operator_preemption_victims_bucket{",
            "vgpu_operator_stranded_memory_bytes{",
        ),
        "agent": ("vgpu_agent_container_device_info{",),
    }[endpoint]:
        assert family in exposition, family
