"""Karpenter on the live harness: GPU instance types described as the simulated machines
describe their cards, and an agent started for each node Karpenter makes.

``GPU_TYPES`` are three servers, each one of the agent's bundled machines (or a part of
one): its cards (``cards`` in the instance-types entry) are the DeviceInventory devices the
agent reports when it reads that machine, and its ``nvidia.com/gpu`` capacity is its card
count. One JSON file serves both Karpenter's KWOK provider (``--instance-types-file-path``,
which ignores the ``cards`` key) and the operator's catalogue (``--autoscale-instance-types``).

``NodeAgents`` watches the Nodes; for each node labelled with one of the instance types
(Karpenter's ``node.kubernetes.io/instance-type``) it starts the agent on a copy of that
type's machine, as the DaemonSet would start on a new node, so its DeviceInventory and its
Lease appear as on a real node (and, on a node its NodePool labels for the DRA path, its
ResourceSlice: the agent is also its DRA driver); it stops an agent whose node is gone.
"""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from integration.test_agent import AgentThread, quick_settings

from vgpu_operator.agent import inventory as agent_inventory
from vgpu_operator.agent.sim_machine import resolve_machine_path
from vgpu_operator.agent.simulated import SimulatedBackend
from vgpu_operator.devices import dra
from vgpu_operator.testing import karpenter
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane

ZONE = "test-zone-a"


@dataclass(frozen=True, slots=True)
class GpuType:
    """An instance type: a name, the machine its cards are, a price, CPU and memory."""

    name: str
    machine: str
    price: float
    cpu: str = "64"
    memory: str = "512Gi"
    #: Keep only these cards of the machine (None: all).
    cards: tuple[int, ...] | None = None


GPU_TYPES = (
    GpuType("gpu-8xh100", "h100-sxm-8", 98.32, cpu="192", memory="2048Gi"),
    GpuType("gpu-4xl40s", "l40s-pcie-4", 12.0, cpu="48", memory="384Gi"),
    GpuType("gpu-1xa100-mig", "a100-mig", 4.1, cpu="16", memory="128Gi", cards=(0,)),
)


def machine_file(gpu_type: GpuType, directory: Path) -> Path:
    """The type's machine, written to ``directory`` (only its ``cards`` kept, and without
    UUIDs: each node's agent derives its own from the node's name)."""
    raw = yaml.safe_load(resolve_machine_path(gpu_type.machine).read_text())
    gpus = raw.get("gpus") or []
    if gpu_type.cards is not None:
        gpus = [gpus[i] for i in gpu_type.cards]
        kept = set(gpu_type.cards)
        renumber = {old: new for new, old in enumerate(gpu_type.cards)}
        for section in ("pcie",):
            raw[section] = [
                {**r, "gpus": [renumber[g] for g in r["gpus"]]}
                for r in raw.get(section) or ()
                if len(kept & set(r["gpus"])) == len(r["gpus"]) and len(r["gpus"]) >= 2
            ]
        raw["nvlink"] = {}
    for gpu in gpus:
        gpu.pop("uuid", None)
        for instance in gpu.get("migInstances") or ():
            instance.pop("uuid", None)
    raw["gpus"] = gpus
    raw["name"] = gpu_type.name
    path = directory / f"{gpu_type.name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def card_facts(machine: Path, node_name: str) -> list[dict[str, Any]]:
    """The DeviceInventory devices the agent reports reading ``machine`` on ``node_name``."""
    backend = SimulatedBackend(machine, node_name)
    backend.open()
    try:
        reading = backend.read()
    finally:
        backend.close()
    options = agent_inventory.RegistrationOptions()
    devices = [
        agent_inventory.build_device(gpu, reading.gpus, reading, options) for gpu in reading.gpus
    ]
    return [d.model_dump(mode="json", by_alias=True, exclude_none=True) for d in devices]


def instance_type_entry(
    gpu_type: GpuType, machine: Path, *, with_cards: bool = True
) -> dict[str, Any]:
    """The type's entry in the KWOK provider's format, with the agent's ``cards``."""
    cards = card_facts(machine, gpu_type.name)
    entry: dict[str, Any] = {
        "name": gpu_type.name,
        "architecture": "amd64",
        "operatingSystems": ["linux"],
        "resources": {
            "cpu": gpu_type.cpu,
            "memory": gpu_type.memory,
            "pods": "110",
            "nvidia.com/gpu": str(len(cards)),
        },
        "offerings": [
            {
                "Price": gpu_type.price,
                "Available": True,
                "Requirements": [
                    {
                        "key": karpenter.CAPACITY_TYPE_LABEL,
                        "operator": "In",
                        "values": ["on-demand"],
                    },
                    {"key": karpenter.ZONE_LABEL, "operator": "In", "values": [ZONE]},
                ],
            }
        ],
    }
    if with_cards:
        entry["cards"] = cards
    return entry


def write_instance_types(
    directory: Path, types: Sequence[GpuType] = GPU_TYPES, without_cards: Sequence[str] = ()
) -> tuple[Path, dict[str, Path]]:
    """The instance-types file for ``types`` and each type's machine file."""
    machines = {t.name: machine_file(t, directory) for t in types}
    entries = [
        instance_type_entry(t, machines[t.name], with_cards=t.name not in without_cards)
        for t in types
    ]
    path = directory / "instance-types.json"
    path.write_text(json.dumps(entries, indent=1))
    return path, machines


class NodeAgents:
    """An agent for every node of a known instance type (see the module docstring)."""

    def __init__(self, cp: ControlPlane, machines: Mapping[str, Path], kubeconfig: Path) -> None:
        self._cp = cp
        self._machines = dict(machines)
        self._kubeconfig = kubeconfig
        self._agents: dict[str, AgentThread] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-agents", daemon=True)
        self.errors: list[str] = []

    def __enter__(self) -> NodeAgents:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for agent in list(self._agents.values()):
            agent.stop()
        self._agents.clear()

    @property
    def nodes(self) -> list[str]:
        return sorted(self._agents)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self._look()
            except (AdminRequestError, OSError) as exc:
                self.errors.append(str(exc))

    def _look(self) -> None:
        listed = self._cp.get(f"/api/v1/nodes?labelSelector={karpenter.INSTANCE_TYPE_LABEL}")
        present: set[str] = set()
        for node in listed.get("items") or ():
            name = node["metadata"]["name"]
            kind = (node["metadata"].get("labels") or {}).get(karpenter.INSTANCE_TYPE_LABEL)
            if kind not in self._machines or node["metadata"].get("deletionTimestamp"):
                continue
            present.add(name)
            if name not in self._agents:
                on_dra = node["metadata"]["labels"].get(dra.NODE_PATH_LABEL) == dra.PATH_DRA
                settings = _dra_settings(name) if on_dra else quick_settings(name)
                agent = AgentThread(settings, self._machines[kind], self._kubeconfig)
                agent.start()
                self._agents[name] = agent
        for name in set(self._agents) - present:
            self._agents.pop(name).stop()


def _dra_settings(node: str) -> Any:
    """The agent's settings as the node's DRA driver too (its own directories; sockets
    under a short path: unix socket paths are limited to 108 bytes)."""
    work = Path(tempfile.mkdtemp(prefix="kdra-"))
    return quick_settings(
        node,
        hami_core_dir=str(work / "vgpu"),
        dra_plugins_dir=str(work / "plugins"),
        dra_registry_dir=str(work / "registry"),
        cdi_dir=str(work / "cdi"),
    )


def nodes_of_pools(cp: ControlPlane) -> Iterator[dict[str, Any]]:
    """The Nodes Karpenter made (those with a NodePool's label)."""
    listed = cp.get(f"/api/v1/nodes?labelSelector={karpenter.NODE_POOL_LABEL}")
    yield from listed.get("items") or ()
