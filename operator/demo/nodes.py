"""The demo's KWOK GPU nodes: their machines, the agents that report them, their cards."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from vgpu_operator import resources
from vgpu_operator.agent.backends import backend_from_spec
from vgpu_operator.agent.deviceplugin.kubelet_standin import ContainerSettings, KubeletStandIn
from vgpu_operator.agent.main import run_agent
from vgpu_operator.agent.settings import AgentSettings
from vgpu_operator.demo.settings import CRDS, INVENTORIES, DemoError, Json, wait_for
from vgpu_operator.devices import dra, nvidia
from vgpu_operator.kube.client import api_client
from vgpu_operator.kube.pods import pods_on_node
from vgpu_operator.testing.controlplane import (
    AdminRequestError,
    ControlPlane,
)
from vgpu_operator.wire import Pod


@dataclass(frozen=True, slots=True)
class DemoNode:
    """A KWOK node and the simulated machine its agent reads."""

    name: str
    machine: str  # a bundled machine: operator/agent/machines/<machine>.yaml
    cpu: str
    memory: str
    pods: str = "110"
    taints: tuple[Mapping[str, str], ...] = ()
    #: On the DRA path: its agent publishes a ResourceSlice and is its DRA driver.
    dra: bool = False


#: The demo's device config (examples/device-config.yaml), read by the operator and,
#: for their own node's settings and MIG geometries, by the agents.
DEMO_CONFIG_NAMESPACE: Final = "vgpu-operator"
DEMO_CONFIG_MAP: Final = "vgpu-device-config"

#: Keeps pods that do not ask for MIG off the MIG node (the MIG example tolerates it).
#: Under HAMi's rules a pod that names no ``nvidia.com/vgpu-mode`` may take a MIG
#: instance: the exclusive example would take the whole card as a 7g.40gb instance.
MIG_TAINT: Final = {"key": nvidia.MIG_TAINT_KEY, "value": "true", "effect": "NoSchedule"}

DEMO_NODES: Final = (
    DemoNode("gpu-h100-sxm", "h100-sxm-8", cpu="192", memory="2Ti"),
    DemoNode("gpu-l40s", "l40s-pcie-4", cpu="64", memory="512Gi"),
    DemoNode("gpu-a100-mig", "a100-mig", cpu="128", memory="1Ti", taints=(MIG_TAINT,)),
    DemoNode("gpu-h100-failing", "h100-pcie-failing", cpu="96", memory="1Ti"),
    DemoNode("gpu-islands-16", "islands-16", cpu="224", memory="4Ti"),
)


@dataclass(frozen=True, slots=True)
class CardFacts:
    """One card as its node's DeviceInventory reports it."""

    node: str
    index: int
    uuid: str
    model: str
    memory_mib: int
    numa_node: int | None
    healthy: bool
    mode: str
    nvlink_peers: frozenset[str]


@dataclass(frozen=True, slots=True)
class MachineSummary:
    gpus: int
    healthy: int


def _read_machine(node: DemoNode) -> MachineSummary:
    """What the node's agent will report once settled: the card count (the Node's
    ``nvidia.com/gpu`` capacity) and how many stay healthy after the machine's health
    events (a simulated XID shows up as an event, not in the first reading)."""
    backend = backend_from_spec(f"sim:{node.machine}", node.name)
    backend.open()
    try:
        for _ in range(20):
            if not backend.watch_health(0.05):
                break
        reading = backend.read()
    finally:
        backend.close()
    present = [gpu for gpu in reading.gpus if gpu.present]
    return MachineSummary(len(present), sum(1 for gpu in present if gpu.healthy))


def install_crd(cp: ControlPlane, timeout_s: float = 30.0) -> None:
    """Create the DeviceInventory CRD and wait until its API is served."""
    crd = resources.render_crd()
    try:
        cp.create(CRDS, crd)
    except AdminRequestError as exc:
        if exc.status != 409:
            raise

    def served() -> bool:
        try:
            cp.get(INVENTORIES)
        except AdminRequestError:
            return False
        return True

    wait_for("the DeviceInventory API", served, timeout_s)


def create_nodes(cp: ControlPlane, nodes: Sequence[DemoNode]) -> dict[str, MachineSummary]:
    """A KWOK node per machine, with ``nvidia.com/gpu`` capacity = its card count."""
    machines = {}
    for node in nodes:
        machine = _read_machine(node)
        machines[node.name] = machine
        cp.create_fake_gpu_node(
            node.name,
            gpus=machine.gpus,
            cpu=node.cpu,
            memory=node.memory,
            pods=node.pods,
            labels={
                nvidia.GPU_PRESENT_LABEL: "true",
                "vgpu-operator.io/simulated-machine": node.machine,
                **({dra.NODE_PATH_LABEL: dra.PATH_DRA} if node.dra else {}),
            },
            taints=node.taints,
            wait_ready=False,
        )
    for node in nodes:
        cp.wait_for_node_ready(node.name)
    return machines


class AgentFleet:
    """One node agent per node (simulated backend), as asyncio tasks in one thread.

    Each is the agent's own ``run_agent``: it creates the DeviceInventory, writes the
    status and keeps the heartbeat fresh until ``stop``. With ``plugin_root`` each agent
    is also its node's device plugin (in ``plugin_root/<node>``) and a kubelet stand-in
    drives it for the pods bound there, so allocations are handed out as on a real node.
    ``metrics_ports`` serves a node's agent metrics on a port (none by default).
    """

    def __init__(
        self,
        kubeconfig: Path,
        nodes: Sequence[DemoNode],
        heartbeat_interval_s: float = 20.0,
        plugin_root: Path | None = None,
        metrics_ports: Mapping[str, int] | None = None,
    ) -> None:
        self._kubeconfig = kubeconfig
        self._nodes = tuple(nodes)
        self._heartbeat_interval_s = heartbeat_interval_s
        self._plugin_root = plugin_root
        self._metrics_ports = dict(metrics_ports or {})
        self.standins: dict[str, KubeletStandIn] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._running = threading.Event()
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._main, name="demo-agents", daemon=True)

    def start(self, timeout_s: float = 10.0) -> None:
        self._thread.start()
        if not self._running.wait(timeout_s):
            raise DemoError("the node agents did not start")

    def stop(self, timeout_s: float = 15.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop has just finished
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise DemoError("the node agents did not stop in time")

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported by the caller through .errors
            self.errors.append(exc)
        finally:
            self._running.set()

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._running.set()
        runs = [
            run_agent(
                self._settings(node),
                backend_from_spec(f"sim:{node.machine}", node.name),
                kubeconfig=str(self._kubeconfig),
                metrics_port=self._metrics_ports.get(node.name, 0),
                stop=self._stop,
            )
            for node in self._nodes
        ]
        if self._plugin_root is not None:
            runs += [self._standin(node.name, self._stop) for node in self._nodes if not node.dra]
        results = await asyncio.gather(*runs, return_exceptions=True)
        self.errors.extend(r for r in results if isinstance(r, BaseException))

    def _settings(self, node: DemoNode) -> AgentSettings:
        settings = AgentSettings(
            node_name=node.name,
            heartbeat_interval_s=self._heartbeat_interval_s,
            poll_interval_s=self._heartbeat_interval_s,
        )
        if self._plugin_root is None:
            return settings
        home = self._plugin_root / node.name
        if node.dra:
            # kubelet's DRA directories and the CDI directory, under this node's home.
            return dataclasses.replace(
                settings,
                hami_core_dir=str(home / "vgpu"),
                dra_plugins_dir=str(home / "plugins"),
                dra_registry_dir=str(home / "registry"),
                cdi_dir=str(home / "cdi"),
            )
        return dataclasses.replace(
            settings,
            device_plugin_dir=str(home / "device-plugins"),
            hami_core_dir=str(home / "vgpu"),
            # The device config the operator reads (MIG geometries, node settings).
            config_namespace=DEMO_CONFIG_NAMESPACE,
            config_map=DEMO_CONFIG_MAP,
        )

    async def _standin(self, node: str, stop: asyncio.Event) -> None:
        assert self._plugin_root is not None
        async with api_client(str(self._kubeconfig)) as api:

            async def pods() -> list[Pod]:
                return await pods_on_node(api, node)

            standin = KubeletStandIn(node, self._plugin_root / node / "device-plugins", pods)
            self.standins[node] = standin
            await standin.run(stop)

    def container_settings(self) -> list[ContainerSettings]:
        """What every container received from its node's plugin so far."""
        return [s for standin in self.standins.values() for s in list(standin.settings)]


def wait_for_inventories(
    cp: ControlPlane, machines: Mapping[str, MachineSummary], fleet: AgentFleet, timeout_s: float
) -> list[Json]:
    """Wait until every node's DeviceInventory reports all of its cards, and as many
    healthy ones as the machine shows."""

    def reported() -> list[Json] | None:
        if fleet.errors:
            raise DemoError(f"a node agent failed: {fleet.errors[0]!r}")
        items: list[Json] = cp.get(INVENTORIES).get("items", [])
        by_node = {str(item["metadata"]["name"]): item for item in items}
        for node, machine in machines.items():
            status = (by_node.get(node) or {}).get("status") or {}
            summary = status.get("summary") or {}
            if len(status.get("devices") or []) != machine.gpus:
                return None
            if summary.get("healthyCount") != machine.healthy:
                return None
        return [by_node[node] for node in machines]

    return wait_for("every node's DeviceInventory", reported, timeout_s)


def cards_from_inventories(inventories: Sequence[Mapping[str, Any]]) -> dict[str, CardFacts]:
    """uuid -> the card's facts, from DeviceInventory objects."""
    cards = {}
    for item in inventories:
        status = item.get("status") or {}
        node = str(status.get("nodeName") or item["metadata"]["name"])
        for device in status.get("devices") or []:
            peers = frozenset(
                str(link["peer"])
                for link in device.get("links") or []
                if int(link.get("nvlinks") or 0) > 0
            )
            numa = device.get("numaNode")
            cards[str(device["uuid"])] = CardFacts(
                node=node,
                index=int(device["index"]),
                uuid=str(device["uuid"]),
                model=str(device.get("model") or device.get("type") or ""),
                memory_mib=int(device.get("memoryMiB") or 0),
                numa_node=int(numa) if numa is not None else None,
                healthy=device.get("health") == "Healthy",
                mode=str(device.get("mode") or ""),
                nvlink_peers=peers,
            )
    return cards
