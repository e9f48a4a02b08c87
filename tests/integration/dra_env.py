"""What the DRA tests share: an agent on the DRA path for a KWOK node, and its slice."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from integration.test_agent import AgentThread

from vgpu_operator.agent.inventory import RegistrationOptions
from vgpu_operator.agent.main import AgentSettings
from vgpu_operator.agent.simulated import resolve_machine_path
from vgpu_operator.testing.controlplane import ControlPlane

RESOURCE = "/apis/resource.k8s.io/v1"
SLICES = f"{RESOURCE}/resourceslices"


def dra_agent(
    node: str,
    machine: str,
    kubeconfig: Path,
    work: Path,
    *,
    split: int,
    registry_dir: Path | None = None,
    sockets: Path | None = None,
) -> AgentThread:
    """The node's agent on a bundled simulated machine, as its DRA driver, started. Its
    HAMi-core and CDI directories are under ``work``; its sockets under ``sockets`` (a short
    path: unix socket paths are limited to 108 bytes, and pytest's tmp_path can be longer);
    ``registry_dir`` is kubelet's plugin registry (the harness's), by default its own."""
    sockets = sockets or Path(tempfile.mkdtemp(prefix="dra-"))
    settings = AgentSettings(
        node_name=node,
        heartbeat_interval_s=1.0,
        poll_interval_s=0.2,
        backoff_initial_s=0.2,
        backoff_max_s=1.0,
        health_wait_s=0.2,
        registration=RegistrationOptions(split_count=split),
        hami_core_dir=str(work / "vgpu"),
        dra_plugins_dir=str(sockets / "plugins"),
        dra_registry_dir=str(registry_dir or sockets / "registry"),
        cdi_dir=str(work / "cdi"),
    )
    agent = AgentThread(settings, resolve_machine_path(machine), kubeconfig)
    agent.start()
    return agent


def node_slice(plane: ControlPlane, node: str) -> dict[str, Any] | None:
    """The node's slice, once it lists the node's cards."""
    found = plane.request("GET", f"{SLICES}?fieldSelector=spec.nodeName%3D{node}")["items"]
    return found[0] if found and found[0]["spec"].get("devices") else None
