"""Helpers for the operator's integration tests (imported as ``integration.operator_env``).

Each test gets its own namespace, its own scheduler name (set through its own
device-config ConfigMap) and its own node label, so operators started by one test never
touch another test's pods or nodes on the shared control plane.
"""

from __future__ import annotations

import base64
import datetime
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from vgpu_operator import names, node_leases
from vgpu_operator.control.options import OperatorOptions
from vgpu_operator.scheduling.books.allocation_gate import GateMode
from vgpu_operator.testing import pod_allocation
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane
from vgpu_operator.timestamps import format_rfc3339

T = TypeVar("T")
Json = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / f"{names.DEVICE_INVENTORY_PLURAL}.{names.CRD_GROUP}.yaml"
INVENTORIES = f"/apis/{names.CRD_GROUP}/{names.CRD_VERSION}/{names.DEVICE_INVENTORY_PLURAL}"
CONFIG_MAP = "vgpu-device-config"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
GPU_MODEL = "NVIDIA A100-SXM4-80GB"
TEST_LABEL = "vgpu-test/group"


def wait_until(what: str, check: Callable[[], T | None], timeout_s: float = 60.0) -> T:
    """Poll ``check`` until it returns something other than None/False."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last is not None and last is not False:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def rfc3339(moment: datetime.datetime | None = None) -> str:
    moment = moment or datetime.datetime.now(datetime.UTC)
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(moment: datetime.datetime | None = None) -> str:
    """A MicroTime (a Lease's renewTime) as the API server writes it."""
    return format_rfc3339(moment or datetime.datetime.now(datetime.UTC), micro=True)


def create_unless_present(cp: ControlPlane, path: str, body: Mapping[str, Any]) -> Json | None:
    """Create the object; None when one of its name exists already (409), left as it is."""
    try:
        return cp.create(path, body)
    except AdminRequestError as exc:
        if exc.status != 409:
            raise
    return None


def refusal(call: Callable[[], object]) -> AdminRequestError | None:
    """The API server's refusal of a write, or None when it took it."""
    try:
        call()
    except AdminRequestError as exc:
        return exc
    return None


def install_crd(cp: ControlPlane) -> None:
    """Create the DeviceInventory CRD (once per control plane) and wait until it serves."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    create_unless_present(cp, path, crd)

    def established() -> bool:
        obj = cp.get(f"{path}/{crd['metadata']['name']}")
        conditions = (obj.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_until("the DeviceInventory CRD", established, 30)
    wait_until("DeviceInventories to be served", lambda: _served(cp), 30)


def _served(cp: ControlPlane) -> bool:
    try:
        cp.get(INVENTORIES)
    except AdminRequestError:
        return False
    return True


@dataclass(frozen=True)
class Card:
    uuid: str
    memory_mib: int = 81920
    split_count: int = 10
    cores: int = 100
    type: str = f"NVIDIA-{GPU_MODEL}"
    healthy: bool = True


def cards(prefix: str, count: int, **kwargs: Any) -> list[Card]:
    return [Card(f"GPU-{prefix}-{i}", **kwargs) for i in range(count)]


def inventory_status(node: str, node_cards: Sequence[Card], heartbeat: str | None = None) -> Json:
    """A DeviceInventory status in wire form, as the agent writes it."""
    return {
        "nodeName": node,
        "backend": "test",
        "heartbeat": heartbeat or rfc3339(),
        "devices": [
            {
                "uuid": c.uuid,
                "index": i,
                "vendor": "NVIDIA",
                "model": GPU_MODEL,
                "type": c.type,
                "memoryMiB": c.memory_mib,
                "cores": c.cores,
                "splitCount": c.split_count,
                "health": "Healthy" if c.healthy else "Unhealthy",
                "mode": "hami-core",
                "links": [],
            }
            for i, c in enumerate(node_cards)
        ],
        "summary": {
            "gpuCount": len(node_cards),
            "healthyCount": sum(c.healthy for c in node_cards),
            "model": GPU_MODEL,
            "totalMemoryMiB": sum(c.memory_mib for c in node_cards),
        },
    }


def write_inventory(
    cp: ControlPlane,
    node: str,
    node_cards: Sequence[Card],
    heartbeat: str | None = None,
    *,
    cordoned: Sequence[str] = (),
) -> Json:
    """Create (if needed) the node's DeviceInventory and write its status."""
    create_unless_present(
        cp,
        INVENTORIES,
        {
            "apiVersion": f"{names.CRD_GROUP}/{names.CRD_VERSION}",
            "kind": names.DEVICE_INVENTORY_KIND,
            "metadata": {"name": node},
            "spec": {"cordonedDevices": list(cordoned)},
        },
    )
    return cp.patch(
        f"{INVENTORIES}/{node}/status",
        {"status": inventory_status(node, node_cards, heartbeat)},
    )


def renew_lease(cp: ControlPlane, node: str, renewed: datetime.datetime | None = None) -> Json:
    """Renew (creating it first if needed) the node's Lease, as its agent does."""
    moment = renewed or datetime.datetime.now(datetime.UTC)
    spec = node_leases.renewal_spec(node, moment, 120)
    try:
        return cp.patch(node_leases.lease_path(node), {"spec": spec})
    except AdminRequestError as exc:
        if exc.status != 404:
            raise
    uid = str(cp.get(f"/api/v1/nodes/{node}")["metadata"]["uid"])
    return cp.create(node_leases.COLLECTION, node_leases.lease_manifest(node, moment, 120, uid))


class LeaseRenewer:
    """A node's agent, as far as its heartbeat goes: renews the node's Lease every
    ``every_s`` in a thread, from entering the block until leaving it."""

    def __init__(self, cp: ControlPlane, node: str, every_s: float = 1.0) -> None:
        self._cp = cp
        self._node = node
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{node}", daemon=True)
        #: Wall-clock time of the last renewal the API server accepted.
        self.last_renewed = 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            renew_lease(self._cp, self._node)
            self.last_renewed = time.time()
            self._stop.wait(self._every_s)

    def __enter__(self) -> LeaseRenewer:
        self._thread.start()
        wait_until("the first renewal", lambda: self.last_renewed > 0, 10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def gpu_node(
    cp: ControlPlane,
    name: str,
    node_cards: Sequence[Card],
    *,
    group: str,
    inventory: bool = True,
    pods: str = "1000",
    annotations: Mapping[str, str] | None = None,
    cordoned: Sequence[str] = (),
) -> Json:
    """A kwok node labelled for one test, with a DeviceInventory (or HAMi annotations)."""
    node = cp.create_fake_gpu_node(
        name,
        gpus=len(node_cards),
        pods=pods,
        labels={TEST_LABEL: group},
        annotations=dict(annotations or {}),
    )
    if inventory:
        write_inventory(cp, name, node_cards, cordoned=cordoned)
    return node


def hami_register_annotation(node_cards: Sequence[Card]) -> str:
    """``hami.io/node-nvidia-register`` as HAMi's device plugin writes it (JSON form)."""
    return json.dumps(
        [
            {
                "id": c.uuid,
                "index": i,
                "count": c.split_count,
                "devmem": c.memory_mib,
                "devcore": c.cores,
                "type": c.type,
                "numa": 0,
                "mode": "hami-core",
                "health": c.healthy,
            }
            for i, c in enumerate(node_cards)
        ]
    )


def config_text(scheduler_name: str, extra: str = "") -> str:
    return f"scheduler:\n  schedulerName: {scheduler_name}\n{extra}"


def put_config_map(cp: ControlPlane, namespace: str, text: str) -> Json:
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP, "namespace": namespace},
        "data": {"device-config.yaml": text},
    }
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    created = create_unless_present(cp, path, body)
    if created is not None:
        return created
    return cp.patch(f"{path}/{CONFIG_MAP}", {"data": body["data"]})


def new_scheduler(cp: ControlPlane, namespace: str, prefix: str = "sched") -> str:
    """A fresh scheduler name, set in the namespace's device config, with the CRD installed:
    the operator started for this namespace decides only the pods that name it."""
    install_crd(cp)
    name = unique(prefix)
    put_config_map(cp, namespace, config_text(name))
    return name


def pod_webhook_configuration(
    name: str, namespace: str, url: str, *, ca: bytes | None, timeout_s: int
) -> Json:
    """A MutatingWebhookConfiguration sending the namespace's pod creations to ``url``,
    failing closed; without ``ca`` the caBundle is left for the operator to fill in."""
    client_config: Json = {"url": url}
    if ca is not None:
        client_config["caBundle"] = base64.b64encode(ca).decode()
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "pods.vgpu-operator.io",
                "clientConfig": client_config,
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "sideEffects": "NoneOnDryRun",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "timeoutSeconds": timeout_s,
            }
        ],
    }


def plain_pod(namespace: str, name: str, limits: Mapping[str, str]) -> Json:
    """A pod as a user writes it: no scheduler named, one container with these limits."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/x",
                    "resources": {"limits": dict(limits)},
                }
            ]
        },
    }


def register_pod_webhook(cp: ControlPlane, name: str, namespace: str, url: str, ca: bytes) -> None:
    """Send the namespace's pod creations to the operator's webhook at ``url`` (served with
    a certificate of ``ca``): a configuration of ``pod_webhook_configuration`` that waits
    10 s for an answer."""
    cp.create(WEBHOOKS, pod_webhook_configuration(name, namespace, url, ca=ca, timeout_s=10))


def gpu_pod(
    namespace: str,
    name: str,
    *,
    scheduler: str,
    group: str,
    gpus: int = 1,
    gpumem: int | None = None,
    gpucores: int | None = None,
    labels: Mapping[str, str] | None = None,
    owner_job: bool = False,
) -> Json:
    limits: dict[str, str] = {"nvidia.com/gpu": str(gpus)}
    if gpumem is not None:
        limits["nvidia.com/gpumem"] = str(gpumem)
    if gpucores is not None:
        limits["nvidia.com/gpucores"] = str(gpucores)
    meta: Json = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {TEST_LABEL: group},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/cuda:latest",
                    "resources": {"limits": limits},
                }
            ],
        },
    }


def create_pod(cp: ControlPlane, pod: Json) -> Json:
    return cp.create(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods", pod)


def get_pod(cp: ControlPlane, namespace: str, name: str) -> Json:
    return cp.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def list_pods(cp: ControlPlane, namespace: str) -> list[Json]:
    items: list[Json] = cp.get(f"/api/v1/namespaces/{namespace}/pods").get("items", [])
    return items


def wait_bound(cp: ControlPlane, namespace: str, name: str, timeout_s: float = 60.0) -> Json:
    def check() -> Json | None:
        pod = get_pod(cp, namespace, name)
        return pod if (pod.get("spec") or {}).get("nodeName") else None

    return wait_until(f"{namespace}/{name} to be bound", check, timeout_s)


def condition(pod: Mapping[str, Any], kind: str = "PodScheduled") -> Mapping[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def events_for(cp: ControlPlane, namespace: str, name: str) -> list[Json]:
    items = cp.get(f"/api/v1/namespaces/{namespace}/events").get("items", [])
    return [e for e in items if (e.get("involvedObject") or {}).get("name") == name]


#: (card uuid, memory MiB, cores) per container device, from the pod's annotations.
allocation = pod_allocation.nvidia_devices


def usage_by_card(pods: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int, int]]:
    """card uuid -> (shares, memory MiB, cores) summed over bound, live pods."""
    totals: dict[str, tuple[int, int, int]] = {}
    for pod in pods:
        if not (pod.get("spec") or {}).get("nodeName"):
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for card, memory_mib, cores in allocation(pod):
            shares, mem, core = totals.get(card, (0, 0, 0))
            totals[card] = (shares + 1, mem + memory_mib, core + cores)
    return totals


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def options(
    cp: ControlPlane, namespace: str, *, standalone: bool = True, **overrides: Any
) -> OperatorOptions:
    """Options for an operator of one test (its own ConfigMap namespace, a free metrics port)."""
    values: dict[str, Any] = {
        "kubeconfig": cp.kubeconfig_path,
        "namespace": namespace,
        "config_map": CONFIG_MAP,
        "standalone": standalone,
        "metrics_port": 0,
        "metrics_addr": "127.0.0.1",
        "log_format": "console",
        "initial_backoff_s": 0.2,
        "max_backoff_s": 2.0,
        # KWOK nodes have no kubelet to answer; the gate's own tests run a stand-in.
        "allocation_gate": GateMode.OFF,
    }
    values.update(overrides)
    return OperatorOptions(**values)


def cleanup_group(cp: ControlPlane, namespace: str) -> None:
    """Delete a test's pods, nodes and inventories (namespaces never finish deleting)."""
    for pod in list_pods(cp, namespace):
        cp.delete(f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}")
    nodes = cp.get(f"/api/v1/nodes?labelSelector={TEST_LABEL}%3D{namespace}").get("items", [])
    for node in nodes:
        name = node["metadata"]["name"]
        cp.delete(f"{INVENTORIES}/{name}")
        cp.delete(node_leases.lease_path(name))
        cp.delete(f"/api/v1/nodes/{name}")


def no_pods_of_class(cp: ControlPlane, namespace: str, name: str, priority_class: str) -> None:
    """The ResourceQuota docs/operations.md recommends for a critical class: no pod of
    ``priority_class`` in ``namespace``, with the status its quota controller would write
    (no controller manager runs here)."""
    path = f"/api/v1/namespaces/{namespace}/resourcequotas"
    hard = {"pods": "0"}
    expression = {"scopeName": "PriorityClass", "operator": "In", "values": [priority_class]}
    cp.create(
        path,
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": name},
            "spec": {"hard": hard, "scopeSelector": {"matchExpressions": [expression]}},
        },
    )
    cp.request(
        "PATCH",
        f"{path}/{name}/status",
        {"status": {"hard": hard, "used": {"pods": "0"}}},
        content_type="application/merge-patch+json",
    )


def disruption_budget(
    cp: ControlPlane, namespace: str, name: str, labels: dict[str, str], allowed: int
) -> None:
    """A PodDisruptionBudget with the status the disruption controller would write."""
    path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
    cp.create(
        path,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": labels}, "maxUnavailable": 0},
        },
    )
    status = {
        "observedGeneration": 1,
        "disruptionsAllowed": allowed,
        "currentHealthy": 1,
        "desiredHealthy": 1,
        "expectedPods": 1,
    }
    cp.request(
        "PATCH",
        f"{path}/{name}/status",
        {"status": status},
        content_type="application/merge-patch+json",
    )
