"""What the DRA tests share: a control plane with DRA nodes, an agent on the DRA path for
a KWOK node, and its slice."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from integration import operator_env as env
from integration.test_agent import AgentThread, quick_settings, wait_for

from vgpu_operator.agent.sim_machine import resolve_machine_path
from vgpu_operator.devices import dra
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.binaries import Binaries
from vgpu_operator.testing.controlplane import ControlPlane

RESOURCE = "/apis/resource.k8s.io/v1"
SLICES = f"{RESOURCE}/resourceslices"
ROOT = Path(__file__).resolve().parents[2]
#: The claim controller turns templates into claims and releases those of finished pods;
#: the garbage collector takes a node's slices with its DeviceInventory.
CLAIM_CONTROLLERS: tuple[str, ...] = ("resourceclaim-controller", "garbage-collector-controller")
TOLERATE_KWOK = [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]


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
    settings = quick_settings(
        node,
        split=split,
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


@contextlib.contextmanager
def dra_plane(
    binaries: Binaries,
    work: Path,
    machines: Mapping[str, str],
    *,
    split: int,
    controllers: Sequence[str] = CLAIM_CONTROLLERS,
    before_scheduler: Callable[[ControlPlane], None] = lambda cp: None,
    agents_out: list[AgentThread] | None = None,
) -> Iterator[ControlPlane]:
    """A KWOK control plane with the CRD, the DRA device classes, kube-controller-manager
    (``controllers``) and kube-scheduler; per node of ``machines`` (node -> bundled machine)
    a KWOK node on the DRA path and its agent (files under ``work``). Yielded once every
    node's slice lists its cards; the agents are stopped after (and listed in
    ``agents_out`` meanwhile, in ``machines``' order, when one is given)."""
    with ControlPlane(kwok=True, binaries=binaries) as cp:
        env.install_crd(cp)
        for doc in yaml.safe_load_all((ROOT / "manifests" / "dra-deviceclasses.yaml").read_text()):
            cp.create(f"{RESOURCE}/deviceclasses", doc)
        cp.start_controller_manager(list(controllers))
        before_scheduler(cp)
        cp.start_scheduler()
        agents: list[AgentThread] = []
        try:
            for node, machine in machines.items():
                cp.create_fake_gpu_node(node, gpus=0, labels={dra.NODE_PATH_LABEL: dra.PATH_DRA})
                agents.append(
                    dra_agent(node, machine, cp.kubeconfig_path, work / node, split=split)
                )
            for node in machines:
                wait_for(f"{node}'s slice", lambda n=node: node_slice(cp, n), timeout=60)
            if agents_out is not None:
                agents_out.extend(agents)
            yield cp
        finally:
            for agent in agents:
                agent.stop()


def fresh_namespace(plane: ControlPlane, prefix: str = "dra") -> str:
    """A new namespace of its own for one test."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    plane.ensure_namespace(name)
    return name


def claim_pod(
    name: str,
    *,
    claim: str | None = None,
    template: str | None = None,
    scheduler: str | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    """A pod whose one container uses one claim ``gpu``: the ResourceClaim ``claim`` or one
    made from the template ``template``; for ``scheduler`` (default kube-scheduler), pinned
    to ``node`` if given. It tolerates KWOK's nodes."""
    entry: dict[str, Any] = {"name": "gpu"}
    if claim is not None:
        entry["resourceClaimName"] = claim
    else:
        entry["resourceClaimTemplateName"] = template
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}
        ],
        "resourceClaims": [entry],
        "tolerations": TOLERATE_KWOK,
    }
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def exactly(
    capacity: Mapping[str, str] | None,
    *,
    selector: str | None = None,
    count: int | None = None,
    device_class: str = dra.SHARED_CLASS,
    tolerate_unhealthy: bool = False,
) -> dict[str, Any]:
    """One request's ``exactly``: the class, the ``capacity`` asked of each device, a CEL
    ``selector``, a ``count``, and a toleration of the unhealthy-card taint."""
    out: dict[str, Any] = {"deviceClassName": device_class}
    if count is not None:
        out["count"] = count
    if capacity is not None:
        out["capacity"] = {"requests": dict(capacity)}
    if selector is not None:
        out["selectors"] = [{"cel": {"expression": selector}}]
    if tolerate_unhealthy:
        out["tolerations"] = [{"key": dra.UNHEALTHY_TAINT_KEY, "operator": "Exists"}]
    return out


def scheduling_news(plane: ControlPlane, namespace: str, name: str) -> tuple[bool, str | None]:
    """Whether the pod is bound, and its PodScheduled=False message if it has one."""
    obj = plane.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    if obj["spec"].get("nodeName"):
        return True, None
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition.get("status") == "False":
            return False, str(condition.get("message", ""))
    return False, None


def unschedulable_message(plane: ControlPlane, namespace: str, pod: str) -> str | None:
    """The PodScheduled=False message of a pod the scheduler found unschedulable, if any."""
    obj = plane.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message", ""))
    return None


def one_request(exactly: Mapping[str, Any]) -> dict[str, Any]:
    """A claim's ``spec``: one request ``gpu`` for exactly this (class, capacity, ...)."""
    return {"devices": {"requests": [{"name": "gpu", "exactly": dict(exactly)}]}}


def create_claim(
    plane: ControlPlane, namespace: str, name: str, exactly: Mapping[str, Any]
) -> dict[str, Any]:
    """A ResourceClaim of one request ``gpu`` (see ``one_request``), as created."""
    return plane.create(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": one_request(exactly),
        },
    )


def create_claim_template(
    plane: ControlPlane, namespace: str, name: str, exactly: Mapping[str, Any]
) -> None:
    """A ResourceClaimTemplate whose claims have one request ``gpu`` (see ``one_request``)."""
    plane.create(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": one_request(exactly)},
        },
    )


@contextlib.contextmanager
def dra_operator(
    plane: ControlPlane, namespace: str, scheduler: str, config: str = ""
) -> Iterator[OperatorThread]:
    """The operator, running as ``scheduler`` with its device config (``config``: more
    lines of its ``scheduler:`` section) in ``namespace``; no inventory timeout (the DRA
    tests' nodes report through their slices)."""
    plane.ensure_namespace(namespace)
    env.put_config_map(plane, namespace, env.config_text(scheduler, config))
    with OperatorThread(env.options(plane, namespace, inventory_timeout_s=None)) as running:
        yield running
