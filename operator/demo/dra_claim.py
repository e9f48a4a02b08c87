"""The demo's DRA part: on one node on the DRA path, the engine's choice beside
kube-scheduler's first fit for the same claims, and what a container receives.

A KWOK node labelled for DRA whose agent publishes four A100 80GB PCIe cards (NVLink
bridges on the pairs 0-1 and 2-3) as a ResourceSlice; kube-controller-manager's resource
claim controller makes each pod's claim from its template. kube-scheduler first allocates
60 GiB of card #1 (a claim pinned there by its selector), so the cards differ. Then the
same two claims are allocated twice, once by kube-scheduler (a pod that names no
scheduler: first fit, slice order) and once by the engine (a pod that names the
operator's scheduler; binpack): a share of 10 GiB and 25 %, and two cards of 30 GiB.
kube-scheduler takes card #0 for the share and #0 + #2 for the pair (the first that fit,
across the sockets); the engine takes card #1 (the tightest fit, leaving whole cards
whole) and #2 + #3 (a bridged pair). Then, as kubelet would on admission, the agent's DRA
plugin prepares the engine's share, and the CDI spec it wrote shows HAMi-core's settings.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from vgpu_operator import names
from vgpu_operator.agent.dra.kubelet_standin import prepare_claim
from vgpu_operator.demo.nodes import AgentFleet, DemoNode, create_nodes
from vgpu_operator.demo.settings import DemoError, Say, wait_for
from vgpu_operator.devices import dra
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.testing.controlplane import ControlPlane

DRA_NODE: Final = DemoNode("gpu-dra-a100", "a100-pcie-bridged", cpu="64", memory="512Gi", dra=True)
NAMESPACE: Final = "vgpu-demo-dra"
#: The engine's share: the claim the DRA plugin prepares.
POD: Final = "engine-share"
RESOURCE: Final = "/apis/resource.k8s.io/v1"
#: What the share asks of one card.
ASKED: Final = {"memory": "10Gi", "cores": "25"}
#: What each card of the two-card claim asks.
PAIR_ASKED: Final = {"memory": "30Gi"}
#: What kube-scheduler takes first, on card #1, so that the cards differ.
RESIDENT: Final = {"memory": "60Gi"}
#: The bridged pairs of the machine (card indices).
NVLINK_PAIRS: Final = frozenset({frozenset({0, 1}), frozenset({2, 3})})


@dataclass(frozen=True, slots=True)
class DraChoice:
    """One claim as one allocator allocated it."""

    what: str
    allocator: str
    pod: str
    #: The cards' indices, in result order.
    cards: tuple[int, ...]
    #: Per card, the MiB left free on it once every claim shown so far is counted.
    free_mib: tuple[int, ...]

    @property
    def linked(self) -> bool | None:
        """For several cards: whether they are one NVLink-bridged pair."""
        if len(self.cards) < 2:
            return None
        return frozenset(self.cards) in NVLINK_PAIRS


@dataclass(frozen=True, slots=True)
class DraClaimShown:
    """The claim as kube-scheduler allocated it, and what its container receives."""

    pod: str
    node: str
    claim: str
    device: str
    memory_mib: int
    cores: int
    share_id: str
    cdi_ids: tuple[str, ...]
    #: The container's environment from the claim's CDI spec (HAMi-core's settings).
    env: Mapping[str, str]
    #: Container path -> host path of the spec's mounts.
    mounts: Mapping[str, str]
    #: The claims of the comparison, each as kube-scheduler and as the engine chose.
    choices: tuple[DraChoice, ...] = ()


def run_dra_claim(
    cp: ControlPlane, say: Say, timeout_s: float, scheduler: str = names.SCHEDULER_NAME
) -> DraClaimShown:
    """Start kube-scheduler and the claim controller, the DRA node and its agent; allocate
    the claims of the comparison (``scheduler``: the operator's) and follow the engine's
    share from template to prepared CDI spec."""
    say("DRA: kube-scheduler, the resource claim controller and a node on the DRA path...")
    cp.start_controller_manager(["resourceclaim-controller"])
    cp.start_scheduler()
    for device_class in dra.device_classes():
        cp.create(f"{RESOURCE}/deviceclasses", device_class)
    create_nodes(cp, [DRA_NODE])
    home = cp.workdir / "dra"
    fleet = AgentFleet(cp.kubeconfig_path, [DRA_NODE], plugin_root=home)
    fleet.start()
    try:
        wait_for(f"{DRA_NODE.name}'s ResourceSlice", lambda: _slice(cp), timeout_s)
        cp.ensure_namespace(NAMESPACE)
        index = f'device.attributes["{dra.DRIVER}"].index == 1'
        _template(cp, "resident", RESIDENT, selector=index)
        _template(cp, "share", ASKED)
        _template(cp, "pair", PAIR_ASKED, count=2)
        say("DRA: the same claims allocated by kube-scheduler (first fit) and by the engine...")
        _allocate(cp, "resident", "resident", None, timeout_s)
        steps = (
            ("a 10 GiB, 25 % share", "first-fit-share", "share", None),
            ("a 10 GiB, 25 % share", POD, "share", scheduler),
            ("2 cards x 30 GiB", "first-fit-pair", "pair", None),
            ("2 cards x 30 GiB", "engine-pair", "pair", scheduler),
        )
        choices = []
        claim: dict[str, Any] = {}
        for what, pod, template, by in steps:
            allocated = _allocate(cp, pod, template, by, timeout_s)
            if pod == POD:
                claim = allocated
            choices.append(_choice(cp, what, "engine" if by else "kube-scheduler", pod, allocated))
        plugin_home = home / DRA_NODE.name
        meta = claim["metadata"]
        prepared = asyncio.run(
            prepare_claim(
                plugin_home / "plugins" / dra.DRIVER / "dra.sock",
                plugin_home / "cdi",
                meta["namespace"],
                meta["name"],
                meta["uid"],
            )
        )
    finally:
        fleet.stop()
    if prepared.error or prepared.spec is None:
        raise DemoError(f"the DRA plugin did not prepare the claim: {prepared.error}")
    shown = _shown(cp, claim, prepared.cdi_ids, prepared.spec)
    return replace(shown, choices=tuple(choices))


def _template(
    cp: ControlPlane,
    name: str,
    asked: Mapping[str, str],
    *,
    count: int = 1,
    selector: str | None = None,
) -> None:
    exactly: dict[str, Any] = {
        "deviceClassName": dra.SHARED_CLASS,
        "count": count,
        "capacity": {"requests": dict(asked)},
    }
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }
    cp.create(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaimtemplates", body)


def _allocate(
    cp: ControlPlane, pod: str, template: str, scheduler: str | None, timeout_s: float
) -> dict[str, Any]:
    """Create the pod (for ``scheduler``, or kube-scheduler) and wait for its claim's
    allocation. The engine's pod asks binpack: the tightest fit."""
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        "nodeSelector": {"kubernetes.io/hostname": DRA_NODE.name},
    }
    metadata: dict[str, Any] = {"name": pod}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
        metadata["annotations"] = {"hami.io/gpu-scheduler-policy": "binpack"}
    cp.create(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec},
    )
    who = "the engine" if scheduler else "kube-scheduler"
    return wait_for(f"{who} to allocate {pod}'s claim", lambda: _allocated(cp, pod), timeout_s)


def _choice(
    cp: ControlPlane, what: str, allocator: str, pod: str, claim: Mapping[str, Any]
) -> DraChoice:
    found = _slice(cp)
    assert found is not None
    devices = found["spec"]["devices"]
    index = {d["name"]: int(d["attributes"][dra.ATTR_INDEX]["int"]) for d in devices}
    total = {
        d["name"]: int(parse_quantity(d["capacity"][dra.MEMORY]["value"]) // dra.MIB)
        for d in devices
    }
    used = dra.recount(cp.get(f"{RESOURCE}/resourceclaims")["items"])
    results = claim["status"]["allocation"]["devices"]["results"]
    names_ = [r["device"] for r in results]
    free = []
    for name in names_:
        held = used.get((DRA_NODE.name, name))
        free.append(total[name] - (0 if held is None else int(held.memory_bytes // dra.MIB)))
    return DraChoice(
        what, allocator, f"{NAMESPACE}/{pod}", tuple(index[n] for n in names_), tuple(free)
    )


def _slice(cp: ControlPlane) -> dict[str, Any] | None:
    query = f"fieldSelector=spec.nodeName%3D{DRA_NODE.name}"
    found = cp.request("GET", f"{RESOURCE}/resourceslices?{query}")["items"]
    return found[0] if found else None


def _allocated(cp: ControlPlane, name: str) -> dict[str, Any] | None:
    pod = cp.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    statuses = pod.get("status", {}).get("resourceClaimStatuses") or []
    if not pod["spec"].get("nodeName") or not statuses:
        return None
    name = statuses[0].get("resourceClaimName")
    return cp.get(f"{RESOURCE}/namespaces/{NAMESPACE}/resourceclaims/{name}") if name else None


def _shown(
    cp: ControlPlane, claim: Mapping[str, Any], cdi_ids: tuple[str, ...], spec: Mapping[str, Any]
) -> DraClaimShown:
    result = claim["status"]["allocation"]["devices"]["results"][0]
    consumed = result.get("consumedCapacity") or {}
    pod = cp.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}")
    env_lines = [*spec["containerEdits"]["env"]]
    for device in spec["devices"]:
        env_lines += device["containerEdits"].get("env") or []
    return DraClaimShown(
        pod=f"{NAMESPACE}/{POD}",
        node=pod["spec"]["nodeName"],
        claim=claim["metadata"]["name"],
        device=result["device"],
        memory_mib=int(parse_quantity(consumed.get("memory", 0)) // dra.MIB),
        cores=int(parse_quantity(consumed.get("cores", 0))),
        share_id=str(result.get("shareID", "")),
        cdi_ids=cdi_ids,
        env=dict(line.split("=", 1) for line in env_lines),
        mounts={m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]},
    )


def render_dra_claim(shown: DraClaimShown) -> list[str]:
    """The lines the demo prints for the comparison and the prepared claim."""
    lines = []
    if shown.choices:
        lines += [
            f"DRA: the engine's choice beside kube-scheduler's first fit, on {DRA_NODE.name}",
            "(4x A100 80GB PCIe, NVLink bridges on cards 0-1 and 2-3; kube-scheduler first",
            "took 60 GiB of card #1):",
            f"  {'CLAIM':<22} {'ALLOCATED BY':<15} {'CARDS':<8} {'FREE AFTER MiB':<15} NVLINK",
        ]
        for choice in shown.choices:
            cards = " ".join(f"#{i}" for i in choice.cards)
            free = " ".join(str(f) for f in choice.free_mib)
            link = {None: "-", True: "bridged pair", False: "no (PCIe, across sockets)"}
            lines.append(
                f"  {choice.what:<22} {choice.allocator:<15} {cards:<8} {free:<15} "
                f"{link[choice.linked]}"
            )
        lines.append("")
    lines += [
        "DRA: the engine's share, prepared by the node's DRA plugin:",
        f"  pod {shown.pod} on {shown.node}, claim {shown.claim}",
        f"  device {shown.device}: {shown.memory_mib} MiB, {shown.cores} % of its cores "
        f"(share {shown.share_id})",
        f"  prepared as CDI device {', '.join(shown.cdi_ids)};",
        "  what its container receives:",
    ]
    lines += [f"    {key}={value}" for key, value in sorted(shown.env.items())]
    lines += [f"    mount {path} <- {host}" for path, host in sorted(shown.mounts.items())]
    return lines
