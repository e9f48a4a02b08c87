"""The node agent on simulated machines against the real API server (kube-apiserver + etcd,
KWOK nodes): the inventory appears and is owned by its Node, carries the links, changes
when a card fails, heartbeats through its node's Lease (the inventory left as it is), and
comes back after the API server restarts."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from vgpu_operator import names, node_leases, resources
from vgpu_operator.agent.inventory import RegistrationOptions
from vgpu_operator.agent.main import run_agent
from vgpu_operator.agent.metrics import AgentMetrics, Operation
from vgpu_operator.agent.settings import AgentSettings
from vgpu_operator.agent.sim_machine import resolve_machine_path
from vgpu_operator.agent.simulated import SimulatedBackend
from vgpu_operator.devices import codec, nvidia
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane

T = TypeVar("T")

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
INVENTORIES = f"/apis/{names.CRD_GROUP}/{names.CRD_VERSION}/{names.DEVICE_INVENTORY_PLURAL}"
CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / resources.CRD_FILE_NAME


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except AdminRequestError as exc:  # e.g. 404 before the first write, 503 while restarting
            last_error, value = exc, None
        except OSError as exc:
            last_error, value = exc, None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last error: {last_error})")


@pytest.fixture(scope="module")
def crd(control_plane: ControlPlane) -> dict[str, Any]:
    """The committed CRD file, installed (or updated) and Established."""
    manifest = yaml.safe_load(CRD_FILE.read_text())
    name = manifest["metadata"]["name"]
    try:
        control_plane.create(CRD_PATH, manifest)
    except AdminRequestError as exc:
        if exc.status != 409:
            raise
        current = control_plane.get(f"{CRD_PATH}/{name}")
        manifest["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        control_plane.request("PUT", f"{CRD_PATH}/{name}", manifest)

    def established() -> dict[str, Any] | None:
        obj = control_plane.get(f"{CRD_PATH}/{name}")
        conditions = (obj.get("status") or {}).get("conditions") or []
        ok = any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
        return obj if ok else None

    return wait_for("the DeviceInventory CRD to be established", established)


def quick_settings(node: str, *, split: int = 10, **overrides: Any) -> AgentSettings:
    """An agent's settings for a test: heartbeat, polls and back-off in fractions of a second
    (the DaemonSet's are tens of seconds), ``split`` shares a card, then ``overrides``."""
    values: dict[str, Any] = {
        "node_name": node,
        "heartbeat_interval_s": 1.0,
        "poll_interval_s": 0.2,
        "backoff_initial_s": 0.2,
        "backoff_max_s": 1.0,
        "health_wait_s": 0.2,
        "registration": RegistrationOptions(split_count=split),
    }
    values.update(overrides)
    return AgentSettings(**values)


class AgentThread:
    """The agent's asyncio loop in a thread, as the DaemonSet process would run it."""

    def __init__(self, settings: AgentSettings, machine: Path, kubeconfig: Path) -> None:
        self.settings = settings
        self.machine = machine  # a test rewrites it to change the simulated cards
        self.metrics = AgentMetrics()
        self._backend = SimulatedBackend(machine, settings.node_name)
        self._kubeconfig = kubeconfig
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="agent", daemon=True)

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            await run_agent(
                self.settings,
                self._backend,
                kubeconfig=str(self._kubeconfig),
                stop=self._stop,
                metrics=self.metrics,
            )

        try:
            asyncio.run(main())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(10)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)
        assert not self._thread.is_alive(), "the agent did not stop"
        if self._error is not None:
            raise self._error

    def errors(self) -> float:
        """API and reading errors so far, all operations together."""
        return sum(
            self.metrics.registry.get_sample_value(
                "vgpu_agent_report_errors_total", {"operation": operation.value}
            )
            or 0.0
            for operation in Operation
        )


class AgentNode:
    """A fresh KWOK node (the owner of the inventory) and the agents a test starts on it,
    each on a writable copy of a bundled machine."""

    def __init__(self, cp: ControlPlane, obj: dict[str, Any], kubeconfig: Path, work: Path) -> None:
        self.cp = cp
        self.name: str = obj["metadata"]["name"]
        self.uid: str = obj["metadata"]["uid"]
        self.kubeconfig = kubeconfig
        self._work = work
        self.agents: list[AgentThread] = []

    def start(self, machine: str, **settings: Any) -> AgentThread:
        copy = self._work / f"{machine}.yaml"
        shutil.copy(resolve_machine_path(machine), copy)
        agent = AgentThread(quick_settings(self.name, **settings), copy, self.kubeconfig)
        agent.start()
        self.agents.append(agent)
        return agent

    def first_report(self) -> dict[str, Any]:
        """The inventory, once its agent has reported."""
        return wait_for("the inventory", lambda: reported(self.cp, self.name))


@pytest.fixture
def node(
    control_plane: ControlPlane, crd: dict[str, Any], kubeconfig_env: Path, tmp_path: Path
) -> Iterator[AgentNode]:
    """A fresh node; after the test its agents stop, and it goes with its inventory and Lease."""
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    fresh = AgentNode(
        control_plane, control_plane.create_fake_gpu_node(name, gpus=8), kubeconfig_env, tmp_path
    )
    yield fresh
    try:
        for agent in fresh.agents:
            agent.stop()
    finally:
        control_plane.delete(f"{INVENTORIES}/{name}")
        control_plane.delete(node_leases.lease_path(name))
        control_plane.delete(f"/api/v1/nodes/{name}")


def get_inventory(control_plane: ControlPlane, name: str) -> dict[str, Any]:
    return control_plane.get(f"{INVENTORIES}/{name}")


def reported(control_plane: ControlPlane, name: str) -> dict[str, Any] | None:
    obj = get_inventory(control_plane, name)
    return obj if obj.get("status") else None


def renewed_at(control_plane: ControlPlane, name: str) -> float | None:
    """When the node's Lease was last renewed, or None while there is none."""
    try:
        return node_leases.read_renewal(control_plane.get(node_leases.lease_path(name)))
    except AdminRequestError as exc:
        if exc.status == 404:
            return None
        raise


def rewrite(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    body = yaml.safe_load(path.read_text())
    change(body)
    path.write_text(yaml.safe_dump(body, sort_keys=False))


def test_inventory_appears_owned_by_its_node_with_every_link(
    control_plane: ControlPlane, node: AgentNode
) -> None:
    name = node.name
    node.start("h100-sxm-8")
    obj = node.first_report()

    (owner,) = obj["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": name,
        "uid": node.uid,
    }
    status = obj["status"]
    assert status["nodeName"] == name
    assert status["summary"] == {
        "gpuCount": 8,
        "healthyCount": 8,
        "model": "NVIDIA H100 80GB HBM3",
        "totalMemoryMiB": 8 * 81559,
    }
    assert status["driverVersion"] == "550.90.07"
    for device in status["devices"]:
        assert len(device["links"]) == 7
        assert {link["nvlinks"] for link in device["links"]} == {18}
    first = status["devices"][0]
    levels = {link["peerIndex"]: link["p2pLevel"] for link in first["links"]}
    assert levels == {
        1: "SameCPU",
        2: "SameCPU",
        3: "SameCPU",
        4: "CrossCPU",
        5: "CrossCPU",
        6: "CrossCPU",
        7: "CrossCPU",
    }
    # What the operator makes of it.
    devices, scores = resources.devices_from_inventory(obj)
    assert [d.type for d in devices] == ["NVIDIA H100 80GB HBM3"] * 8
    assert scores[devices[0].id][devices[1].id] == 1820


def test_kubectl_columns_show_the_summary(control_plane: ControlPlane, node: AgentNode) -> None:
    name = node.name
    node.start("l40s-pcie-4")
    node.first_report()
    table = _get_table(control_plane, f"{INVENTORIES}/{name}")
    columns = [c["name"] for c in table["columnDefinitions"]]
    (row,) = table["rows"]
    cells = dict(zip(columns, row["cells"], strict=True))
    assert cells["Node"] == name
    assert (cells["GPUs"], cells["Healthy"]) == (4, 4)
    assert cells["Model"] == "NVIDIA L40S"
    assert cells["Memory MiB"] == 4 * 46068
    assert cells["Last Report"].endswith("s")  # rendered as an age


def test_a_failing_gpu_flips_its_health(control_plane: ControlPlane, node: AgentNode) -> None:
    name = node.name
    agent = node.start("h100-sxm-8")
    node.first_report()

    rewrite(agent.machine, lambda body: body["gpus"][3].update(xid=79))

    def failed() -> dict[str, Any] | None:
        status = get_inventory(control_plane, name)["status"]
        return status if status["summary"]["healthyCount"] == 7 else None

    status = wait_for("card 3 to turn unhealthy", failed)
    sick = [d for d in status["devices"] if d["health"] == "Unhealthy"]
    assert [(d["index"], d["healthReason"]) for d in sick] == [(3, "critical XID 79")]
    (condition,) = status["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "Healthy",
        "False",
        "DevicesUnhealthy",
    )
    devices, _ = resources.devices_from_inventory(get_inventory(control_plane, name))
    assert [d.health for d in devices] == [True, True, True, False, True, True, True, True]


def test_the_lease_is_renewed_while_the_inventory_is_left_as_it_is(
    control_plane: ControlPlane, node: AgentNode
) -> None:
    name = node.name
    node.start("t4-legacy", lease_duration_s=45)
    first = node.first_report()
    lease = wait_for("the node's Lease", lambda: renewed_at(control_plane, name))
    obj = control_plane.get(node_leases.lease_path(name))
    assert obj["spec"]["holderIdentity"] == name
    assert obj["spec"]["leaseDurationSeconds"] == 45
    # Owned by its Node, so that it goes with it, as the inventory does.
    (owner,) = obj["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", name, node.uid)

    def later_than(previous: float) -> float | None:
        current = renewed_at(control_plane, name)
        return current if current is not None and current > previous else None

    second = wait_for("a later renewal", lambda: later_than(lease), timeout=15)
    wait_for("another renewal", lambda: later_than(second), timeout=15)
    # Nothing changed on the machine: the inventory was not written again.
    now = get_inventory(control_plane, name)
    assert now["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert resources.heartbeat_of(now) == resources.heartbeat_of(first)


def test_a_deleted_lease_is_created_again(control_plane: ControlPlane, node: AgentNode) -> None:
    name = node.name
    node.start("t4-legacy")
    wait_for("the node's Lease", lambda: renewed_at(control_plane, name))
    first = control_plane.get(node_leases.lease_path(name))["metadata"]["uid"]
    control_plane.delete(node_leases.lease_path(name))

    def recreated() -> str | None:
        try:
            uid = str(control_plane.get(node_leases.lease_path(name))["metadata"]["uid"])
        except AdminRequestError:
            return None
        return uid if uid != first else None

    wait_for("the Lease to come back", recreated, timeout=15)


def test_agent_writes_again_after_an_api_server_restart(
    control_plane: ControlPlane, node: AgentNode
) -> None:
    name = node.name
    agent = node.start("h100-pcie-failing")
    node.first_report()

    control_plane.stop_apiserver()
    try:
        # The card fails while the API server is away; the agent must keep trying.
        rewrite(agent.machine, lambda body: body["gpus"][0].update(xid=[48]))
        wait_for("the agent to notice the outage", lambda: agent.errors() > 0, 20)
    finally:
        control_plane.start_apiserver()

    def recovered() -> dict[str, Any] | None:
        status = get_inventory(control_plane, name)["status"]
        return status if status["summary"]["healthyCount"] == 2 else None

    status = wait_for("the latest state after the restart", recovered, timeout=60)
    assert [d["health"] for d in status["devices"]] == [
        "Unhealthy",
        "Healthy",
        "Unhealthy",
        "Healthy",
    ]
    # And it carries on heartbeating: its Lease is renewed again.
    beat = wait_for("the node's Lease", lambda: renewed_at(control_plane, name))
    wait_for(
        "a renewal after the restart",
        lambda: (renewed_at(control_plane, name) or 0.0) > beat,
        timeout=15,
    )


def test_a_deleted_inventory_is_recreated(control_plane: ControlPlane, node: AgentNode) -> None:
    name = node.name
    node.start("a100-mig")
    first = node.first_report()
    control_plane.delete(f"{INVENTORIES}/{name}")

    def recreated() -> dict[str, Any] | None:
        obj = reported(control_plane, name)
        return obj if obj and obj["metadata"]["uid"] != first["metadata"]["uid"] else None

    second = wait_for("the inventory to come back", recreated, timeout=20)
    assert second["status"]["devices"][0]["mode"] == "mig"
    assert len(second["status"]["devices"][0]["migInstances"]) == 3


def test_hami_annotations_let_hami_read_the_node(
    control_plane: ControlPlane, node: AgentNode
) -> None:
    name = node.name
    node.start("islands-16", write_hami_annotations=True)

    def annotated() -> dict[str, str] | None:
        annotations = control_plane.get(f"/api/v1/nodes/{name}")["metadata"].get("annotations", {})
        return annotations if nvidia.SCORE_ANNOTATION in annotations else None

    annotations = wait_for("HAMi's annotations", annotated)
    devices = codec.decode_node_devices(annotations[nvidia.REGISTER_ANNOTATION])
    assert len(devices) == 16
    assert {d.type for d in devices} == {"NVIDIA H100 80GB HBM3"}
    scores = codec.decode_pair_scores(annotations[nvidia.SCORE_ANNOTATION])
    assert scores[devices[0].id][devices[1].id] == 40 + 1800
    assert scores[devices[0].id][devices[8].id] == 10
    assert annotations[names.NODE_HANDSHAKE].startswith("Reported_")


def _get_table(control_plane: ControlPlane, path: str) -> dict[str, Any]:
    """GET as kubectl does, asking for the server-side table (printer columns)."""
    context = ssl.create_default_context(cafile=str(control_plane.ca_path))
    admin = control_plane.admin
    context.load_cert_chain(str(admin.cert_path), str(admin.key_path))
    request = urllib.request.Request(control_plane.server + path)
    request.add_header("Accept", "application/json;as=Table;g=meta.k8s.io;v=v1")
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        table: dict[str, Any] = json.loads(response.read())
    return table


def test_daemonset_manifest_is_accepted_by_the_api_server(control_plane: ControlPlane) -> None:
    manifest = Path(__file__).resolve().parents[2] / "manifests" / "agent-daemonset.yaml"
    control_plane.ensure_namespace("vgpu-operator")
    paths = {
        "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
        "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
        "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
        "DaemonSet": "/apis/apps/v1/namespaces/{ns}/daemonsets",
    }
    made = []
    for doc in yaml.safe_load_all(manifest.read_text()):
        path = paths[doc["kind"]].format(ns=doc["metadata"].get("namespace"))
        created = control_plane.create(f"{path}?dryRun=All", doc)
        made.append((created["kind"], created["metadata"].get("namespace")))
    assert made == [
        ("ServiceAccount", "vgpu-operator"),
        ("ClusterRole", None),
        ("ClusterRoleBinding", None),
        ("Role", "vgpu-operator"),
        ("RoleBinding", "vgpu-operator"),
        ("Role", node_leases.NAMESPACE),
        ("RoleBinding", node_leases.NAMESPACE),
        ("DaemonSet", "vgpu-operator"),
    ]


def test_agent_command_runs_until_sigterm_logging_json(
    control_plane: ControlPlane, node: AgentNode, kubeconfig_env: Path
) -> None:
    name = node.name
    command = [
        sys.executable,
        "-c",
        "from vgpu_operator.agent.cli import agent_command; agent_command()",
        f"--node-name={name}",
        "--backend=sim:l40s-pcie-4",
        f"--kubeconfig={kubeconfig_env}",
        "--metrics-port=0",
        "--poll-interval=0.2",
        "--log-format=json",
    ]
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    ) as process:
        try:
            status = wait_for("the inventory", lambda: reported(control_plane, name))["status"]
        finally:
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
    assert status["summary"]["gpuCount"] == 4
    events = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert "inventory_reported" in {e["event"] for e in events}
    assert all("timestamp" in e and "level" in e for e in events)


def test_a_tampered_inventory_is_put_back_by_its_agent(
    control_plane: ControlPlane, node: AgentNode
) -> None:
    """Someone (here the admin) sets a card's memory to 900000 MiB on the server; the agent
    compares the server's copy with its own reading and writes the truth back."""
    name = node.name
    node.start("t4-legacy", reassert_interval_s=3600.0)
    first = node.first_report()
    real = first["status"]["devices"][0]["memoryMiB"]
    devices = [dict(d) for d in first["status"]["devices"]]
    devices[0]["memoryMiB"] = 900000
    control_plane.patch(f"{INVENTORIES}/{name}/status", {"status": {"devices": devices}})

    def restored() -> dict[str, Any] | None:
        obj = get_inventory(control_plane, name)
        return obj if obj["status"]["devices"][0]["memoryMiB"] == real else None

    wait_for("the agent to put the real memory back", restored, timeout=15)


def test_an_inventory_naming_another_node_is_refused_by_the_api_server(
    control_plane: ControlPlane, node: AgentNode
) -> None:
    """The CRD's schema: an inventory describes only the node it is named after, and lists
    each card once."""
    name = node.name
    evil = {
        "apiVersion": resources.API_VERSION,
        "kind": names.DEVICE_INVENTORY_KIND,
        "metadata": {"name": f"{name}-evil"},
    }
    control_plane.create(INVENTORIES, evil)
    status = {
        "nodeName": name,
        "heartbeat": "2026-01-01T00:00:00Z",
        "devices": [],
        "summary": {"gpuCount": 0, "healthyCount": 0, "totalMemoryMiB": 0},
    }
    with pytest.raises(AdminRequestError) as refused:
        control_plane.patch(
            f"{INVENTORIES}/{name}-evil/status",
            {"status": status},
        )
    assert refused.value.status == 422
    assert "nodeName" in str(refused.value)


# --- the device config, followed without restart ------------------------------------------


def _device_config(namespace: str, name: str, text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"device-config.yaml": text},
    }


def _advertised(socket: Path, responses: int, timeout: float = 30.0) -> list[list[str]]:
    """The first ``responses`` device lists the plugin's ListAndWatch sends to kubelet."""
    import grpc  # only this test speaks gRPC

    from vgpu_operator.agent.deviceplugin import api_pb2, api_pb2_grpc

    async def watch() -> list[list[str]]:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            stream = stub.ListAndWatch(api_pb2.Empty())
            seen: list[list[str]] = []
            while len(seen) < responses:
                answer = await asyncio.wait_for(stream.read(), timeout)
                seen.append(sorted(d.ID for d in answer.devices))
            stream.cancel()
            return seen

    return asyncio.run(watch())


def test_a_device_config_change_reaches_inventory_and_kubelet_without_restart(
    control_plane: ControlPlane, node: AgentNode, namespace: str, tmp_path: Path
) -> None:
    """The node's nodeconfig entry (split, filterdevices) over the flags; a change to the
    ConfigMap is reported and re-advertised by the running agent, and both say the same."""
    import tempfile

    name = node.name
    configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
    entry = f"nodeconfig: [{{name: {name}, devicesplitcount: 4, filterdevices: {{index: [0]}}}}]"
    control_plane.create(configmaps, _device_config(namespace, "dc", entry))
    # A unix socket path must stay under 108 bytes: pytest's tmp_path can be longer.
    plugin_dir = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    try:
        node.start(
            "l40s-pcie-4",
            config_map="dc",
            config_namespace=namespace,
            device_plugin_dir=str(plugin_dir),
            hami_core_dir=str(tmp_path / "vgpu"),
        )

        def devices(split: int, count: int) -> list[dict[str, Any]] | None:
            status = (get_inventory(control_plane, name).get("status")) or {}
            found = status.get("devices") or []
            ok = len(found) == count and all(d["splitCount"] == split for d in found)
            return found if ok else None

        first = wait_for("the nodeconfig split and filter", lambda: devices(4, 3))
        assert 0 not in [d["index"] for d in first]
        socket = plugin_dir / "vgpu-operator-nvidia.sock"
        wait_for("the plugin's socket", socket.exists)
        # The plugin takes the cards from the status the agent wrote, just after the API
        # server answered the write: a moment after the test can see the inventory.
        wanted = sorted(f"{d['uuid']}-{i}" for d in first for i in range(4))
        wait_for("kubelet to be offered the same", lambda: _advertised(socket, 1) == [wanted])

        changed = _device_config(
            namespace, "dc", f"nodeconfig: [{{name: {name}, devicesplitcount: 6}}]"
        )
        control_plane.request("PUT", f"{configmaps}/dc", changed)
        after = wait_for("the changed split, every card back", lambda: devices(6, 4))
        wanted = sorted(f"{d['uuid']}-{i}" for d in after for i in range(6))
        wait_for("kubelet to be offered the change", lambda: _advertised(socket, 1) == [wanted])
    finally:
        shutil.rmtree(plugin_dir, ignore_errors=True)
