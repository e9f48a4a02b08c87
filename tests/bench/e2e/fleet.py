"""The bench's GPU nodes: KWOK Nodes and the DeviceInventories their agents would write.

Four eight-card machines in turn (NVSwitch H100, NVLink-paired A100, PCIe L40S over two
sockets, L4 on one socket). Each inventory is built by the agent's own code (NVML reader
over the simulated machine, ``inventory.build_status``) with card UUIDs derived from the
node name. No agent process runs per node (a thousand would not fit on the machine); a
heartbeat task renews each node's Lease every 30 s, as the agent does (the inventories
are written once: their reports do not change), so the API server and the operator see
the same stream of heartbeats as in a real cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from e2e.api import Api, ApiError, Json, gather_limited
from vgpu_operator import names, node_leases, resources
from vgpu_operator.agent import health, inventory
from vgpu_operator.agent.nvml import NvmlReader
from vgpu_operator.agent.sim_machine import SimMachine, load_machine
from vgpu_operator.agent.sim_machine import resolve_machine_path as bundled_path
from vgpu_operator.agent.simulated import SimulatedNvml
from vgpu_operator.testing.controlplane import fake_gpu_node_manifest

HERE = Path(__file__).resolve().parent
#: (machine, where its file is): the bundled H100 board and the bench's own three.
MACHINES: Final = (
    ("h100-sxm-8", bundled_path("h100-sxm-8")),
    ("a100-pcie-8", HERE / "machines" / "a100-pcie-8.yaml"),
    ("l40s-pcie-8", HERE / "machines" / "l40s-pcie-8.yaml"),
    ("l4-8", HERE / "machines" / "l4-8.yaml"),
)
INVENTORIES: Final = f"/apis/{names.CRD_GROUP}/{names.CRD_VERSION}/{names.DEVICE_INVENTORY_PLURAL}"
HEARTBEAT_INTERVAL_S: Final = 30.0
#: What each Lease says it lasts: the operator's default --inventory-timeout, as the agent.
LEASE_DURATION_S: Final = 120
NODE_LABEL: Final = "vgpu-bench/node"


@dataclass(frozen=True, slots=True)
class BenchNode:
    name: str
    machine: str
    status: Json  # the DeviceInventory status, in wire form

    @property
    def cards(self) -> list[Json]:
        return list(self.status["devices"])


def node_name(index: int) -> str:
    return f"gpu-{index:05d}"


def build_status(node: str, machine: SimMachine, when: datetime.datetime) -> Json:
    """What the node's agent would write: the real reader and builder over the machine."""
    sim = SimulatedNvml(machine, node, pinned_uuids=False)
    reader = NvmlReader(
        sim.module(), numa_from_bus_id=sim.sysfs_numa_node, description=f"sim:{machine.name}"
    )
    reader.open()
    try:
        reading = reader.read()
    finally:
        reader.close()
    status = inventory.build_status(
        reading,
        node_name=node,
        backend=f"sim:{machine.name}",
        options=inventory.RegistrationOptions(),
        count=health.check_gpu_count(0, len(reading.gpus)),
        heartbeat=when,
    )
    return resources.status_to_wire(status)


def plan(count: int) -> list[BenchNode]:
    machines = {name: load_machine(path) for name, path in MACHINES}
    when = datetime.datetime.now(datetime.UTC)
    nodes = []
    for index in range(count):
        machine = MACHINES[index % len(MACHINES)][0]
        name = node_name(index)
        nodes.append(BenchNode(name, machine, build_status(name, machines[machine], when)))
    return nodes


def _node_manifest(node: BenchNode) -> Json:
    return fake_gpu_node_manifest(
        node.name,
        gpus=len(node.cards),
        cpu="128",
        memory="1Ti",
        pods="250",
        labels={NODE_LABEL: "true", "vgpu-operator.io/simulated-machine": node.machine},
    )


async def _create_node(api: Api, node: BenchNode) -> None:
    manifest = _node_manifest(node)
    with contextlib.suppress(ApiError):
        await api.create("/api/v1/nodes", manifest)
    # A create drops the status; KWOK keeps the capacity once it is there.
    created = await api.merge_patch(
        f"/api/v1/nodes/{node.name}/status", {"status": manifest["status"]}
    )
    lease = node_leases.lease_manifest(
        node.name, _now(), LEASE_DURATION_S, str(created["metadata"]["uid"])
    )
    with contextlib.suppress(ApiError):
        await api.create(node_leases.COLLECTION, lease)
    body = {
        "apiVersion": f"{names.CRD_GROUP}/{names.CRD_VERSION}",
        "kind": names.DEVICE_INVENTORY_KIND,
        "metadata": {"name": node.name},
        "spec": {"cordonedDevices": []},
    }
    with contextlib.suppress(ApiError):
        await api.create(INVENTORIES, body)
    await api.merge_patch(f"{INVENTORIES}/{node.name}/status", {"status": node.status})


async def create(api: Api, nodes: list[BenchNode], timeout_s: float = 600.0) -> float:
    """Create every node, its inventory and its Lease, wait until KWOK made them Ready;
    seconds taken."""
    start = asyncio.get_running_loop().time()
    await api.ensure_namespace(node_leases.NAMESPACE)
    await gather_limited(16, [_create_node(api, node) for node in nodes])
    wanted = {node.name for node in nodes}
    while True:
        items = await api.list_all(f"/api/v1/nodes?labelSelector={NODE_LABEL}%3Dtrue")
        ready = {item["metadata"]["name"] for item in items if _ready(item)}
        if wanted <= ready:
            return asyncio.get_running_loop().time() - start
        if asyncio.get_running_loop().time() - start > timeout_s:
            raise TimeoutError(f"{len(wanted - ready)} nodes not Ready after {timeout_s}s")
        await asyncio.sleep(2)


def _ready(node: Json) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


async def heartbeats(
    api: Api, nodes: list[BenchNode], stop: asyncio.Event, interval_s: float = HEARTBEAT_INTERVAL_S
) -> None:
    """Renew every node's Lease every 30 s, spread evenly, like the agents do (the same
    merge patch of the spec). Each write runs on its own (at most 32 at once), so a slow
    API server delays beats rather than stretching the cycle past the operator's
    inventory timeout."""
    gap = interval_s / max(1, len(nodes))
    gate = asyncio.Semaphore(32)
    pending: set[asyncio.Task[None]] = set()

    async def beat(node: BenchNode) -> None:
        async with gate:
            spec = node_leases.renewal_spec(node.name, _now(), LEASE_DURATION_S)
            with contextlib.suppress(ApiError, OSError, asyncio.TimeoutError):
                await api.merge_patch(node_leases.lease_path(node.name), {"spec": spec})

    loop = asyncio.get_running_loop()
    next_at = loop.time()
    try:
        while not stop.is_set():
            for node in nodes:
                if stop.is_set():
                    return
                task = loop.create_task(beat(node))
                pending.add(task)
                task.add_done_callback(pending.discard)
                next_at += gap
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, next_at - loop.time()))
    finally:
        for task in pending:
            task.cancel()


def card_limits(nodes: list[BenchNode]) -> dict[str, tuple[str, int, int, int]]:
    """uuid -> (node, memory MiB, cores, split count): what each card may hold."""
    limits: dict[str, tuple[str, int, int, int]] = {}
    for node in nodes:
        for card in node.cards:
            limits[card["uuid"]] = (
                node.name,
                int(card["memoryMiB"]),
                int(card.get("cores") or 100),
                int(card.get("splitCount") or 10),
            )
    return limits


def models(nodes: list[BenchNode]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in nodes:
        for card in node.cards:
            counts[str(card["model"])] = counts.get(str(card["model"]), 0) + 1
    return counts


def first_card(nodes: list[BenchNode], machine: str) -> Any:
    return next(node.cards[0]["uuid"] for node in nodes if node.machine == machine)
