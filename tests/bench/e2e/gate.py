"""The allocation gate's cost (issue 13): binds per node per second with it off and on.

The thousand bench nodes have no device plugin, so the operator runs there with the gate
off. Here a few more KWOK nodes get what the gate waits for: the real agent with its
device plugin and the kubelet stand-in (``make demo``'s fleet), which answers each bound
pod's Allocate and so writes bind-phase success. The same whole-GPU burst, confined to
these nodes, is placed with the gate off and then on.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from e2e import fleet, runs, workloads
from e2e.api import ApiError
from vgpu_operator.demo.nodes import AgentFleet, DemoNode
from vgpu_operator.testing.controlplane import fake_gpu_node_manifest

GATE_LABEL = "vgpu-bench/gate"
_MACHINES = ("l4-8.yaml", "l40s-pcie-8.yaml")


async def _create_nodes(bench: runs.Bench, names: list[str]) -> None:
    for name in names:
        manifest = fake_gpu_node_manifest(
            name, gpus=8, cpu="64", memory="512Gi", pods="250", labels={GATE_LABEL: "true"}
        )
        with contextlib.suppress(ApiError):
            await bench.api.create("/api/v1/nodes", manifest)
        await bench.api.merge_patch(f"/api/v1/nodes/{name}/status", {"status": manifest["status"]})


async def _wait_for_inventories(bench: runs.Bench, names: list[str], agents: AgentFleet) -> None:
    """Until every agent has reported its eight cards; then they join the recount."""
    for _ in range(240):
        if agents.errors:
            raise RuntimeError(f"a node agent failed: {agents.errors[0]!r}")
        items = await bench.api.list_all(fleet.INVENTORIES)
        reported = {
            item["metadata"]["name"]: item["status"]
            for item in items
            if item["metadata"]["name"] in names
            and len((item.get("status") or {}).get("devices") or []) == 8
        }
        if len(reported) == len(names):
            for name, status in reported.items():
                bench.gpus_per_node[name] = 8
                for card in status["devices"]:
                    bench.cards[card["uuid"]] = (
                        name,
                        int(card["memoryMiB"]),
                        int(card.get("cores") or 100),
                        int(card.get("splitCount") or 10),
                    )
            return
        await asyncio.sleep(0.5)
    raise TimeoutError("the gate nodes' agents did not report their cards")


async def gate_runs(session: Any, bench: runs.Bench, count: int = 8) -> None:
    """``session`` is main.Session (restarts the operator with other flags)."""
    names = [f"gate-{i:02d}" for i in range(count)]
    await _create_nodes(bench, names)
    nodes = [
        DemoNode(name, str(fleet.HERE / "machines" / _MACHINES[i % 2]), cpu="64", memory="512Gi")
        for i, name in enumerate(names)
    ]
    agents = AgentFleet(
        session.creds["bench"].kubeconfig_path,
        nodes,
        heartbeat_interval_s=30.0,
        plugin_root=session.workdir / "plugins",
    )
    agents.start()
    try:
        await _wait_for_inventories(bench, names, agents)
        for mode in ("off", "books"):
            await session.stop_operator()
            session.gate_args = [f"--allocation-gate={mode}"]
            await session.start_operator()
            await session.warm_up()

            def make(namespace: str, index: int) -> dict[str, Any]:
                body = workloads.whole()(namespace, index)
                body["spec"]["nodeSelector"] = {GATE_LABEL: "true"}
                return body

            workload = workloads.Workload(
                f"gate-{mode}", f"whole-GPU pods on {count} nodes with agents", count * 8, make
            )
            result = await runs.run(
                bench, workload.name, session.operator_scheduler(), workload, "gate", timeout_s=300
            )
            result.extra["gate"] = mode
            result.extra["nodes"] = count
            result.extra["binds_per_node_s"] = result.pods_per_s / count
    finally:
        session.gate_args = []
        await session.stop_operator()
        await asyncio.to_thread(agents.stop)
