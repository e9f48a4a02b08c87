"""`promtool check metrics` on the live endpoints: the operator's (with devices, a quota
and a bound pod, so every family has samples) and the agent's (its command, as the
DaemonSet runs it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

from integration import operator_env as env
from prometheus_client.parser import text_string_to_metric_families

from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.controlplane import ControlPlane
from vgpu_operator.testing.processes import free_port as _free_port


def _scrape(port: int) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text: str = response.read().decode()
    return text


def _promtool_check(promtool: Path, exposition: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_operator_endpoint_passes_promtool(
    control_plane: ControlPlane, namespace: str, promtool: Path
) -> None:
    cp = control_plane
    scheduler = env.new_scheduler(cp, namespace)
    node = f"{namespace}-m"
    env.gpu_node(cp, node, env.cards(node, 2), group=namespace)
    cp.create(
        f"/api/v1/namespaces/{namespace}/resourcequotas",
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "100000"}},
        },
    )
    try:
        with OperatorThread(env.options(cp, namespace)) as operator:
            env.create_pod(
                cp,
                env.gpu_pod(
                    namespace, "p", scheduler=scheduler, group=namespace, gpumem=1024, gpucores=10
                ),
            )
            env.wait_bound(cp, namespace, "p")
            server = operator.app.server
            assert server is not None
            assert server.port is not None
            exposition = _scrape(server.port)
    finally:
        env.cleanup_group(cp, namespace)
    assert "vgpu_operator_pod_create_to_bound_seconds_count" in exposition
    assert "vgpu_operator_device_shares_capacity{" in exposition
    assert "process_resident_memory_bytes" in exposition
    checked = _promtool_check(promtool, exposition)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The namespace limits gpumem only: what it uses without a limit has no limit series
    # (a 0 there would make every `used > limit` alert fire).
    used, limits = _quota_series(exposition, namespace)
    assert limits == {"nvidia.com/gpumem": 100000}
    assert used.keys() > limits.keys()


def _quota_series(exposition: str, namespace: str) -> tuple[dict[str, float], dict[str, float]]:
    found: dict[str, dict[str, float]] = {"used": {}, "limit": {}}
    for family in text_string_to_metric_families(exposition):
        kind = family.name.removeprefix("vgpu_operator_quota_")
        if kind not in found:
            continue
        for sample in family.samples:
            if sample.labels["namespace"] == namespace:
                found[kind][sample.labels["resource"]] = sample.value
    return found["used"], found["limit"]


def test_the_agent_endpoint_passes_promtool(
    control_plane: ControlPlane, kubeconfig_env: Path, promtool: Path
) -> None:
    cp = control_plane
    env.install_crd(cp)
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    cp.create_fake_gpu_node(node, gpus=4)
    port = _free_port()
    command = [
        sys.executable,
        "-c",
        "from vgpu_operator.agent.cli import agent_command; agent_command()",
        f"--node-name={node}",
        "--backend=sim:l40s-pcie-4",
        f"--kubeconfig={kubeconfig_env}",
        f"--metrics-port={port}",
        "--poll-interval=0.2",
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        text=True,
    )
    try:

        def scraped() -> str | None:
            try:
                text = _scrape(port)
            except OSError:
                return None
            return text if "vgpu_agent_gpu_memory_capacity_bytes{" in text else None

        exposition = env.wait_until("the agent's metrics", scraped, 60)
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=20)
        cp.delete(f"{env.INVENTORIES}/{node}")
        cp.delete(f"/api/v1/nodes/{node}")
    assert "process_resident_memory_bytes" in exposition
    checked = _promtool_check(promtool, exposition)
    assert checked.returncode == 0, checked.stdout + checked.stderr
