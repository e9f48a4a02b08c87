"""Issue 22: a hostile tenant, with no more than the built-in ``edit`` ClusterRole in their
own namespace, against the install of ``manifests/`` on a fresh API server.

Everything runs as it would in a cluster: the README's install commands, the operator on
its own ServiceAccount token (with its webhook, reached on loopback), and on each KWOK
node the agent on a token bound to its pod there, serving as the node's device plugin,
driven by the kubelet stand-in. The tenant speaks to the API server with a token of a
ServiceAccount of theirs bound to ``edit``.

Each attack of the issue is tried, and after each the operator's gauges must agree with a
recount of what the containers actually received from the device plugins (a container
without HAMi-core counts as holding its whole card).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import shlex
import ssl
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from integration import operator_env as env
from integration.test_install import (
    Cluster,
    agent_pod,
    readme_install_commands,
    service_account_token,
    token_kubeconfig,
)
from integration.test_operator_webhook import _free_port, make_pki
from prometheus_client.parser import text_string_to_metric_families

from vgpu_operator import names
from vgpu_operator.agent.deviceplugin.kubelet_standin import ContainerSettings, KubeletStandIn
from vgpu_operator.agent.inventory import RegistrationOptions
from vgpu_operator.agent.main import run_agent
from vgpu_operator.agent.settings import AgentSettings
from vgpu_operator.agent.sim_machine import resolve_machine_path
from vgpu_operator.agent.simulated import SimulatedBackend
from vgpu_operator.control.options import WebhookOptions
from vgpu_operator.devices import nvidia
from vgpu_operator.handlers.app import WEBHOOK_ID
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.kube.client import api_client
from vgpu_operator.kube.pods import pods_on_node
from vgpu_operator.scheduling.books.allocation_gate import GateMode
from vgpu_operator.testing.controlplane import AdminRequestError, Binaries, ControlPlane

Json = dict[str, Any]
NAMESPACE = "vgpu-operator"
SCHEDULER = "vgpu-scheduler"
CARD_MIB = 46068  # an L40S, as the simulated machine l40s-pcie-4 reports it
#: The operator's allocation gate opens this long after a Binding without the plugin's
#: answer (short, so that the gate's own tests do not wait a minute).
GATE_TIMEOUT_S = 15.0
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


# --- the tenant -----------------------------------------------------------------------------


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclass
class Tenant:
    """A ServiceAccount of the tenant's namespace with the built-in ``edit`` role there,
    speaking to the API server with its own token."""

    cp: ControlPlane
    namespace: str
    token: str

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Json:
        # Compact, as kubectl sends it: the API server keeps a claim's opaque parameters as
        # sent, and this module's clean-up removes finalizers with merge patches, which
        # the API server refuses for parameters it would re-encode differently ("spec:
        # field is immutable"; the operator copes: test_dra_admission's spaced claim).
        data = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        req = urllib.request.Request(self.cp.server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        context = ssl.create_default_context(cafile=str(self.cp.ca_path))
        try:
            with urllib.request.urlopen(req, context=context, timeout=30) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                text = exc.read().decode(errors="replace")
            try:
                message = str(json.loads(text).get("message", text))
            except ValueError:
                message = text
            raise Refused(exc.code, message) from None
        return json.loads(raw) if raw else {}

    def create_pod(self, pod: Json) -> Json:
        return self.request("POST", f"/api/v1/namespaces/{self.namespace}/pods", pod)

    def patch_pod(self, name: str, patch: Any, kind: str = "merge") -> Json:
        content_type = {
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
        }[kind]
        path = f"/api/v1/namespaces/{self.namespace}/pods/{name}"
        return self.request("PATCH", path, patch, content_type)

    def refused(self, action: Callable[[], object]) -> str:
        """The refusal's message (the action must be refused with 403 or 422)."""
        with pytest.raises(Refused) as refusal:
            action()
        assert refusal.value.status in (403, 422), refusal.value
        return refusal.value.message


def aggregate_cluster_role(cp: ControlPlane, name: str) -> Json:
    """Fill an aggregated ClusterRole's rules from the roles its selectors pick, as
    kube-controller-manager's ClusterRole aggregation does (no controller manager runs
    here, and the built-in ``edit`` role holds no rules of its own)."""
    path = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
    role = cp.get(f"{path}/{name}")
    rules: list[Json] = []
    for selector in (role.get("aggregationRule") or {}).get("clusterRoleSelectors") or []:
        labels = ",".join(f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items())
        for picked in cp.get(f"{path}?labelSelector={labels}").get("items", []):
            rules.extend(r for r in picked.get("rules") or [] if r not in rules)
    role["rules"] = rules
    return cp.request("PUT", f"{path}/{name}", role)


def make_tenant(cp: ControlPlane, namespace: str) -> Tenant:
    """A ServiceAccount ``tenant`` of ``namespace``, with the built-in ``edit`` role
    there and nothing else, and a token of its own."""
    cp.ensure_namespace(namespace)
    cp.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant"}},
    )
    cp.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-edit"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}],
        },
    )
    answer = cp.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/tenant/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    return Tenant(cp, namespace, str(answer["status"]["token"]))


def gpu_pod(
    name: str,
    *,
    node: str,
    gpus: int = 1,
    gpumem: int | None = None,
    gpucores: int | None = None,
    env_vars: Mapping[str, str] | None = None,
) -> Json:
    """A tenant's GPU pod as they would write it: no schedulerName (the webhook routes
    it), kept to ``node`` with a nodeSelector (which a tenant may set)."""
    limits: dict[str, str] = {"nvidia.com/gpu": str(gpus)}
    if gpumem is not None:
        limits["nvidia.com/gpumem"] = str(gpumem)
    if gpucores is not None:
        limits["nvidia.com/gpucores"] = str(gpucores)
    container: Json = {
        "name": "main",
        "image": "registry.invalid/cuda",
        "resources": {"limits": limits},
    }
    if env_vars:
        container["env"] = [{"name": k, "value": v} for k, v in env_vars.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [container],
        },
    }


# --- the nodes: agent, device plugin, kubelet stand-in --------------------------------------


@dataclass
class NodeRig:
    """One KWOK node's agent (on its pod-bound token, as the device plugin too) and its
    kubelet stand-in (on admin credentials, as kubelet). ``admitting`` cleared: the
    stand-in sees no pods yet (a kubelet that has not admitted them)."""

    name: str
    agent_kubeconfig: Path
    admin_kubeconfig: Path
    home: Path
    admitting: threading.Event = field(default_factory=threading.Event)
    standin: KubeletStandIn | None = None
    errors: list[BaseException] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        ready = threading.Event()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            ready.set()
            results = await asyncio.gather(
                run_agent(
                    self._settings(),
                    self._backend(),
                    kubeconfig=str(self.agent_kubeconfig),
                    stop=self._stop,
                ),
                self._kubelet(self._stop),
                return_exceptions=True,
            )
            self.errors.extend(r for r in results if isinstance(r, BaseException))

        def thread_main() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:
                self.errors.append(exc)
                ready.set()

        self._thread = threading.Thread(target=thread_main, name=f"node-{self.name}", daemon=True)
        self._thread.start()
        assert ready.wait(10), "the node's agent did not start"

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(20)

    def _backend(self) -> SimulatedBackend:
        # Both nodes read the same bundled machine, so their cards share UUIDs: every
        # count here is per node and card.
        return SimulatedBackend(resolve_machine_path("l40s-pcie-4"), self.name)

    def _settings(self) -> AgentSettings:
        return AgentSettings(
            node_name=self.name,
            heartbeat_interval_s=2.0,
            poll_interval_s=1.0,
            backoff_initial_s=0.2,
            backoff_max_s=1.0,
            health_wait_s=0.2,
            registration=RegistrationOptions(split_count=10),
            device_plugin_dir=str(self.home / "device-plugins"),
            hami_core_dir=str(self.home / "vgpu"),
            config_namespace=NAMESPACE,
            config_map="vgpu-device-config",
        )

    async def _kubelet(self, stop: asyncio.Event) -> None:
        async with api_client(str(self.admin_kubeconfig)) as api:

            async def pods() -> list[Json]:
                if not self.admitting.is_set():
                    return []
                return await pods_on_node(api, self.name)

            self.standin = KubeletStandIn(self.name, self.home / "device-plugins", pods, poll_s=0.2)
            await self.standin.run(stop)

    def received(self) -> list[ContainerSettings]:
        return list(self.standin.settings) if self.standin is not None else []


# --- the stack ------------------------------------------------------------------------------


@dataclass
class Stack:
    cluster: Cluster
    operator: OperatorThread
    main: NodeRig  # its kubelet admits pods at once
    slow: NodeRig  # its kubelet admits nothing until a test lets it
    tenant: Tenant

    @property
    def cp(self) -> ControlPlane:
        return self.cluster.cp

    def rigs(self) -> list[NodeRig]:
        return [self.main, self.slow]


def _point_webhook_at(cp: ControlPlane, port: int, ca: bytes) -> None:
    """manifests/webhook.yaml's configuration, as installed, reaching the operator on
    loopback (a KWOK cluster has no Service network)."""
    config = cp.get(f"{WEBHOOKS}/vgpu-operator")
    for hook in config["webhooks"]:
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}/{WEBHOOK_ID}",
            "caBundle": base64.b64encode(ca).decode(),
        }
    cp.request("PUT", f"{WEBHOOKS}/vgpu-operator", config)


def _gpu_node(cp: ControlPlane, name: str, home: Path) -> NodeRig:
    cp.create_fake_gpu_node(name, gpus=4)
    token = service_account_token(cp, "vgpu-agent", agent_pod(cp, name))
    rig = NodeRig(
        name,
        token_kubeconfig(cp, token, home / f"{name}-agent.kubeconfig"),
        cp.kubeconfig_path,
        home / name,
    )
    rig.start()
    return rig


@pytest.fixture(scope="module")
def stack(
    control_plane_binaries: Binaries, kubectl: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("tenant")
    with ControlPlane(kwok=True, binaries=control_plane_binaries) as cp:
        cluster = Cluster(cp, kubectl)
        for command in readme_install_commands():
            done = cluster.run(shlex.split(command)[1:])
            assert done.returncode == 0, f"`{command}` failed:\n{done.stdout}\n{done.stderr}"
        pki = make_pki(home)
        port = _free_port()
        _point_webhook_at(cp, port, pki.ca.read_bytes())
        operator_token = service_account_token(cp, "vgpu-operator")
        options = env.options(
            cp,
            NAMESPACE,
            kubeconfig=token_kubeconfig(cp, operator_token, home / "operator.kubeconfig"),
            config_map="vgpu-device-config",
            allocation_gate=GateMode.BOOKS,
            allocation_gate_timeout_s=GATE_TIMEOUT_S,
            webhook=WebhookOptions(
                port=port, addr="127.0.0.1", certfile=pki.cert, pkeyfile=pki.key, cafile=pki.ca
            ),
        )
        suffix = uuid.uuid4().hex[:6]
        main = _gpu_node(cp, f"gpu-main-{suffix}", home)
        slow = _gpu_node(cp, f"gpu-slow-{suffix}", home)
        main.admitting.set()
        operator = OperatorThread(options).start()
        try:
            edit = aggregate_cluster_role(cp, "edit")
            assert any("pods" in rule.get("resources", []) for rule in edit["rules"])
            tenant = make_tenant(cp, f"team-{suffix}")
            stack = Stack(cluster, operator, main, slow, tenant)
            for rig in stack.rigs():
                env.wait_until(
                    f"{rig.name}'s inventory", lambda rig=rig: _reported(cp, rig.name), 60
                )
            _wait_webhook_serving(stack)
            yield stack
        finally:
            operator.stop()
            main.stop()
            slow.stop()


def _gone(cp: ControlPlane, namespace: str, name: str) -> bool:
    try:
        env.get_pod(cp, namespace, name)
    except AdminRequestError as exc:
        return exc.status == 404
    return False


def _reported(cp: ControlPlane, node: str) -> bool:
    try:
        inventory = cp.get(f"{env.INVENTORIES}/{node}")
    except AdminRequestError:
        return False
    return len((inventory.get("status") or {}).get("devices") or []) == 4


def _wait_webhook_serving(stack: Stack) -> None:
    """Until the tenant's dry-run GPU pod comes back routed to our scheduler."""
    tenant = stack.tenant
    path = f"/api/v1/namespaces/{tenant.namespace}/pods?dryRun=All"

    seen: list[str] = []

    def routed() -> bool:
        try:
            pod = tenant.request("POST", path, gpu_pod("probe", node=stack.main.name))
        except Refused as exc:
            seen[:] = [str(exc)]  # the RoleBinding just made may not be in force yet
            return False
        seen[:] = [f"schedulerName {pod['spec'].get('schedulerName')}"]
        return bool(pod["spec"].get("schedulerName") == SCHEDULER)

    try:
        env.wait_until("the webhook to route GPU pods", routed, 60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {seen}") from None


@pytest.fixture
def tenant(stack: Stack) -> Iterator[Tenant]:
    """The tenant, their namespace emptied after each attack (and each node's devices
    free again)."""
    yield stack.tenant
    _delete_all_pods(stack.cp, stack.tenant.namespace)


def _delete_all_pods(cp: ControlPlane, namespace: str) -> None:
    for pod in env.list_pods(cp, namespace):
        cp.delete(
            f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}?gracePeriodSeconds=0"
        )
    env.wait_until(f"{namespace} to be empty", lambda: not env.list_pods(cp, namespace), 60)


# --- the gauges against what containers received --------------------------------------------


Usage = dict[tuple[str, str], tuple[int, int, int]]  # (node, card) -> shares, MiB, cores


def gauges(stack: Stack) -> Usage:
    """The operator's per-card gauges, scraped from its /metrics endpoint."""
    server = stack.operator.app.server
    assert server is not None
    assert server.port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    wanted = {
        "vgpu_operator_device_shares_allocated": 0,
        "vgpu_operator_device_memory_allocated_bytes": 1,
        "vgpu_operator_device_cores_allocated_ratio": 2,
    }
    usage: dict[tuple[str, str], list[int]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            position = wanted.get(sample.name)
            if position is None:
                continue
            key = (sample.labels["node"], sample.labels["device"])
            value = sample.value
            scaled = value / 2**20 if position == 1 else value * 100 if position == 2 else value
            usage.setdefault(key, [0, 0, 0])[position] = round(scaled)
    return {key: (v[0], v[1], v[2]) for key, v in usage.items() if any(v)}


def recount(stack: Stack) -> Usage:
    """What the live pods' containers received from their nodes' device plugins."""
    live = {
        p["metadata"]["uid"]
        for p in stack.cp.get("/api/v1/pods").get("items", [])
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    }
    usage: dict[tuple[str, str], list[int]] = {}
    for rig in stack.rigs():
        for received in rig.received():
            if received.error is not None or received.uid not in live:
                continue
            visible = received.envs.get("NVIDIA_VISIBLE_DEVICES", "").split(",")
            hami_core = any(path == "/etc/ld.so.preload" for path, _, _ in received.mounts)
            for index, card in enumerate(visible):
                if hami_core:
                    memory = int(received.envs[f"CUDA_DEVICE_MEMORY_LIMIT_{index}"].rstrip("m"))
                    cores = int(received.envs["CUDA_DEVICE_SM_LIMIT"])
                else:  # nothing limits it: the whole card is its
                    memory, cores = CARD_MIB, 100
                totals = usage.setdefault((rig.name, card), [0, 0, 0])
                totals[0] += 1
                totals[1] += memory
                totals[2] += cores
    return {key: (v[0], v[1], v[2]) for key, v in usage.items()}


def assert_gauges_agree_with_the_recount(stack: Stack) -> Usage:
    """Once every bound pod's kubelet has admitted it, the books say what the containers
    got: no share given without being booked, none booked without being given."""
    last: list[tuple[Usage, Usage]] = []

    def agree() -> Usage | None:
        books, given = gauges(stack), recount(stack)
        last[:] = [(books, given)]
        return books if books == given else None

    try:
        return env.wait_until("the gauges to agree with the recount", agree, 60)
    except AssertionError:
        books, given = last[0]
        raise AssertionError(f"gauges {books} != what containers received {given}") from None


def wait_received(stack: Stack, rig: NodeRig, pod: str) -> ContainerSettings:
    """What the pod now named ``pod`` received (names recur from test to test)."""
    key = f"{stack.tenant.namespace}/{pod}"

    def received() -> ContainerSettings | None:
        try:
            uid = env.get_pod(stack.cp, stack.tenant.namespace, pod)["metadata"]["uid"]
        except AdminRequestError:
            return None
        return next((r for r in rig.received() if r.pod == key and r.uid == uid), None)

    return env.wait_until(f"{key}'s Allocate", received, 60)


def events_of(cp: ControlPlane, namespace: str, name: str) -> list[Json]:
    """The Events of the pod now named ``name`` (not of earlier pods of that name)."""
    try:
        uid = env.get_pod(cp, namespace, name)["metadata"]["uid"]
    except AdminRequestError:
        return []
    return [e for e in env.events_for(cp, namespace, name) if e["involvedObject"].get("uid") == uid]


def allocation_patch(node: str, card: str, memory: int = CARD_MIB, cores: int = 100) -> Json:
    entry = f"{card},NVIDIA,{memory},{cores}:;"
    return {
        names.ASSIGNED_NODE: node,
        names.BIND_PHASE: "allocating",
        names.BIND_TIME: "4102444800",  # 2100-01-01
        nvidia.TO_ALLOCATE_ANNOTATION: entry,
        nvidia.ALLOCATED_ANNOTATION: entry,
    }


def cards_of(stack: Stack, node: str) -> list[str]:
    inventory = stack.cp.get(f"{env.INVENTORIES}/{node}")
    return [str(d["uuid"]) for d in inventory["status"]["devices"]]


@contextlib.contextmanager
def allowing(stack: Stack, namespace: str, *labels: str) -> Iterator[None]:
    """An administrator's namespace labels, for the length of a block."""
    path = f"/api/v1/namespaces/{namespace}"
    stack.cp.patch(path, {"metadata": {"labels": dict.fromkeys(labels, "true")}})
    try:
        yield
    finally:
        stack.cp.patch(path, {"metadata": {"labels": dict.fromkeys(labels)}})


# --- 1. a share without the scheduler --------------------------------------------------------


def test_1_a_tenant_cannot_take_a_share_without_the_scheduler(stack: Stack, tenant: Tenant) -> None:
    """Another schedulerName, a preset nodeName and hand-written allocation annotations:
    refused at admission, each on its own; where an administrator allows bypassing the
    scheduler, the pod is created but the device plugin serves it nothing and the books
    count nothing."""
    node = stack.main.name
    card = cards_of(stack, node)[0]
    shared = tenant.create_pod(gpu_pod("honest", node=node, gpumem=20000))
    assert shared["spec"]["schedulerName"] == SCHEDULER  # routed by the webhook
    wait_received(stack, stack.main, "honest")

    thief = gpu_pod("thief", node=node)
    thief["spec"]["schedulerName"] = "my-scheduler"
    thief["spec"]["nodeName"] = node
    thief["metadata"]["annotations"] = allocation_patch(node, card)
    message = tenant.refused(lambda: tenant.create_pod(thief))
    assert "GPU allocation record" in message or "placed by the" in message

    only_annotations = gpu_pod("forger", node=node)
    only_annotations["metadata"]["annotations"] = allocation_patch(node, card)
    message = tenant.refused(lambda: tenant.create_pod(only_annotations))
    assert "vgpu-allocation-record" in message
    assert "create the pod without them" in message

    preset = gpu_pod("preset", node=node)
    preset["spec"]["nodeName"] = node
    message = tenant.refused(lambda: tenant.create_pod(preset))
    assert "remove spec.nodeName" in message
    assert "vgpu-operator.io/allow-node-name=true" in message

    foreign = gpu_pod("foreign", node=node)
    foreign["spec"]["schedulerName"] = "my-scheduler"
    message = tenant.refused(lambda: tenant.create_pod(foreign))
    assert "not by my-scheduler" in message

    # An administrator allows both in the namespace: the pod lands, and gets nothing.
    with allowing(
        stack,
        tenant.namespace,
        "vgpu-operator.io/allow-node-name",
        "vgpu-operator.io/allow-other-schedulers",
    ):
        bypass = gpu_pod("bypass", node=node)
        bypass["spec"]["schedulerName"] = "my-scheduler"
        bypass["spec"]["nodeName"] = node
        tenant.create_pod(bypass)
        refused = wait_received(stack, stack.main, "bypass")
    assert refused.error is not None
    assert refused.envs == {}
    usage = assert_gauges_agree_with_the_recount(stack)
    assert sum(shares for shares, _, _ in usage.values()) == 1  # the honest pod alone


# --- 2. over-commit by editing one's own allocation ------------------------------------------


def test_2_a_tenant_cannot_edit_its_allocation_to_overcommit_or_beat_the_quota(
    stack: Stack, tenant: Tenant
) -> None:
    cp, node = stack.cp, stack.main.name
    quota_path = f"/api/v1/namespaces/{tenant.namespace}/resourcequotas"
    cp.create(
        quota_path,
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "50000"}},
        },
    )
    try:
        tenant.create_pod(gpu_pod("big", node=node, gpumem=40000))
        first = wait_received(stack, stack.main, "big")
        assert first.error is None
        card = first.envs["NVIDIA_VISIBLE_DEVICES"]
        small = f"{card},NVIDIA,1,0:;"
        for patch, kind in (
            ({"metadata": {"annotations": {nvidia.ALLOCATED_ANNOTATION: small}}}, "merge"),
            ({"metadata": {"annotations": {nvidia.ALLOCATED_ANNOTATION: None}}}, "merge"),
            (
                [
                    {
                        "op": "remove",
                        "path": "/metadata/annotations/hami.io~1vgpu-devices-allocated",
                    }
                ],
                "json",
            ),
        ):
            message = tenant.refused(lambda p=patch, k=kind: tenant.patch_pod("big", p, k))
            assert "hami.io/vgpu-devices-allocated" in message
        held = env.get_pod(cp, tenant.namespace, "big")["metadata"]["annotations"]
        assert held[nvidia.ALLOCATED_ANNOTATION].startswith(f"{card},NVIDIA,40000,")

        # A second 40000 MiB pod: the quota (50000) holds it back.
        tenant.create_pod(gpu_pod("second", node=node, gpumem=40000))

        def waits_for_quota() -> bool:
            pod = env.get_pod(cp, tenant.namespace, "second")
            cond = env.condition(pod) or {}
            return "ResourceQuotaNotFit" in str(cond.get("message", ""))

        env.wait_until("the second pod to wait for the quota", waits_for_quota, 60)
        assert not env.get_pod(cp, tenant.namespace, "second")["spec"].get("nodeName")
        usage = assert_gauges_agree_with_the_recount(stack)
        assert [memory for _, memory, _ in usage.values()] == [40000]
    finally:
        cp.delete(f"{quota_path}/gpu")


# --- 3. squat a node with a CPU-only pod ------------------------------------------------------


def test_3_a_cpu_only_pod_cannot_squat_a_node(stack: Stack, tenant: Tenant) -> None:
    node = stack.main.name
    squat = "".join(f"{card},NVIDIA,{CARD_MIB},100:" for card in cards_of(stack, node)) + ";"
    pod: Json = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "squatter",
            "annotations": {
                names.ASSIGNED_NODE: node,
                names.BIND_PHASE: "success",
                nvidia.ALLOCATED_ANNOTATION: squat,
            },
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "registry.invalid/busybox"}],
        },
    }
    message = tenant.refused(lambda: tenant.create_pod(pod))
    assert "vgpu-allocation-record" in message
    # The same pod without the forged record is an ordinary CPU pod (no GPU policy
    # applies to it), and adding the record afterwards is refused too.
    del pod["metadata"]["annotations"]
    tenant.create_pod(pod)
    patch = {"metadata": {"annotations": {nvidia.ALLOCATED_ANNOTATION: squat}}}
    tenant.refused(lambda: tenant.patch_pod("squatter", patch))
    # The node's GPU pods are placed as if it were not there.
    tenant.create_pod(gpu_pod("next", node=node, gpumem=40000))
    assert wait_received(stack, stack.main, "next").error is None
    usage = assert_gauges_agree_with_the_recount(stack)
    assert sorted(memory for _, memory, _ in usage.values()) == [40000]


# --- 4. hold a node's allocation gate shut -----------------------------------------------------


def test_4_a_tenant_cannot_hold_a_gate_and_a_gated_wait_is_shown(
    stack: Stack, tenant: Tenant
) -> None:
    """A future bind-time on the tenant's own running pod is refused; and the gate the
    operator keeps (here held by a pod whose kubelet has not admitted it) opens after
    its timeout on the operator's clock, while the pod waiting behind it shows why in
    its condition and an Event."""
    cp, main, slow = stack.cp, stack.main.name, stack.slow.name
    tenant.create_pod(gpu_pod("mine", node=main, gpumem=1000))
    wait_received(stack, stack.main, "mine")
    for forged in (
        {names.BIND_PHASE: "allocating", names.BIND_TIME: "4102444800"},
        {names.BIND_TIME: "4102444800"},
        {names.BIND_PHASE: "allocating"},
    ):
        message = tenant.refused(
            lambda a=forged: tenant.patch_pod("mine", {"metadata": {"annotations": a}})
        )
        assert "vgpu-allocation-record" in message

    stack.slow.admitting.clear()  # the slow node's kubelet admits nothing
    tenant.create_pod(gpu_pod("holder", node=slow, gpumem=1000))
    env.wait_bound(cp, tenant.namespace, "holder")
    tenant.create_pod(gpu_pod("waiter", node=slow, gpumem=1000))
    shown: list[Json] = []

    def gate_shown() -> bool:
        pod = env.get_pod(cp, tenant.namespace, "waiter")
        cond = env.condition(pod) or {}
        if cond.get("reason") == "WaitingForAllocationGate":
            shown.append(dict(cond))
        return bool(shown) or bool(pod["spec"].get("nodeName"))

    env.wait_until("the waiting pod's condition", gate_shown, 60)
    assert shown, "the waiter was bound without ever showing why it waited"
    assert shown[0]["status"] == "False"
    assert f"pod {tenant.namespace}/holder was bound there" in shown[0]["message"]
    events = events_of(cp, tenant.namespace, "waiter")
    assert any(e["reason"] == "WaitingForAllocationGate" for e in events)
    # The holder never answers: the gate opens after its timeout, and the waiter binds.
    bound = env.wait_bound(cp, tenant.namespace, "waiter", GATE_TIMEOUT_S + 30)
    assert bound["spec"]["nodeName"] == slow
    scheduled = env.condition(bound) or {}
    assert scheduled.get("status") == "True"
    # The holder is given up (deleted); the kubelet comes, and the waiter is served.
    cp.delete(f"/api/v1/namespaces/{tenant.namespace}/pods/holder?gracePeriodSeconds=0")
    env.wait_until("the holder to go", lambda: _gone(cp, tenant.namespace, "holder"), 30)
    stack.slow.admitting.set()
    assert wait_received(stack, stack.slow, "waiter").error is None
    assert_gauges_agree_with_the_recount(stack)


# --- 5. the gate after a long wait --------------------------------------------------------------


def test_5_a_pod_bound_after_a_long_wait_holds_the_gate_from_its_binding(
    stack: Stack, tenant: Tenant
) -> None:
    """Three pods for one node whose kubelet is late. The first holds the gate until its
    timeout; the second is bound then, after waiting longer than the timeout, and must
    hold the gate from its Binding: had its decision's time counted, the third would be
    bound at once, and the plugin could not tell the two apart when the kubelet comes."""
    cp, slow = stack.cp, stack.slow.name
    stack.slow.admitting.clear()
    tenant.create_pod(gpu_pod("first", node=slow, gpus=2, gpumem=1000))
    env.wait_bound(cp, tenant.namespace, "first")
    tenant.create_pod(gpu_pod("second", node=slow, gpumem=1000))
    env.wait_until(
        "the second pod to be decided",
        lambda: (
            "WaitingForAllocationGate"
            in {e["reason"] for e in events_of(cp, tenant.namespace, "second")}
        ),
        60,
    )
    tenant.create_pod(gpu_pod("third", node=slow, gpumem=1000))
    env.wait_bound(cp, tenant.namespace, "second", GATE_TIMEOUT_S + 30)
    assert not env.get_pod(cp, tenant.namespace, "third")["spec"].get("nodeName"), (
        "the third pod was bound together with the second"
    )
    # The third was told the first holds the gate; now the second does, and its condition
    # says so (it named the first, long gone, until it was bound).
    named: list[str] = []

    def third_names_the_second() -> bool:
        third = env.get_pod(cp, tenant.namespace, "third")
        named.append(str((env.condition(third) or {}).get("message") or ""))
        return f"pod {tenant.namespace}/second was bound there" in named[-1]

    env.wait_until("the third pod's condition to name the second", third_names_the_second, 14)
    assert not env.get_pod(cp, tenant.namespace, "third")["spec"].get("nodeName")
    stack.slow.admitting.set()  # the kubelet comes: first, second, then third
    for name in ("first", "second"):
        assert wait_received(stack, stack.slow, name).error is None
    env.wait_bound(cp, tenant.namespace, "third", GATE_TIMEOUT_S + 30)
    assert wait_received(stack, stack.slow, "third").error is None
    for name in ("first", "second", "third"):
        phase = env.get_pod(cp, tenant.namespace, name)["metadata"]["annotations"]
        assert phase[names.BIND_PHASE] == "success", name
    assert_gauges_agree_with_the_recount(stack)


# --- 6. turn HAMi-core off ---------------------------------------------------------------------


def test_6_turning_hami_core_off_is_an_administrators_choice(stack: Stack, tenant: Tenant) -> None:
    node = stack.main.name
    off = gpu_pod(
        "raw", node=node, gpumem=1024, gpucores=10, env_vars={"CUDA_DISABLE_CONTROL": "true"}
    )
    message = tenant.refused(lambda: tenant.create_pod(off))
    assert "vgpu-operator.io/allow-hami-core-off=true" in message
    overriding = gpu_pod(
        "override", node=node, gpumem=1024, env_vars={"CUDA_DEVICE_MEMORY_LIMIT_0": "46068m"}
    )
    message = tenant.refused(lambda: tenant.create_pod(overriding))
    assert "the device plugin sets HAMi-core's limits" in message
    # Allowed by an administrator: booked as the whole card, which is what it can use.
    with allowing(stack, tenant.namespace, "vgpu-operator.io/allow-hami-core-off"):
        tenant.create_pod(off)
    received = wait_received(stack, stack.main, "raw")
    assert received.error is None
    assert not any(path == "/etc/ld.so.preload" for path, _, _ in received.mounts)
    usage = assert_gauges_agree_with_the_recount(stack)
    assert list(usage.values()) == [(1, CARD_MIB, 100)]
    reasons = {e["reason"] for e in events_of(stack.cp, tenant.namespace, "raw")}
    assert "GpuRequestAdjusted" in reasons


# --- 7. fail another pod's Allocate with a decoy ----------------------------------------------


def test_7_a_decoy_cannot_fail_another_pods_allocate(stack: Stack, tenant: Tenant) -> None:
    cp, node = stack.cp, stack.main.name
    card = cards_of(stack, node)[1]
    decoy: Json = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "decoy", "annotations": allocation_patch(node, card, 1000, 10)},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "main", "image": "registry.invalid/busybox"}],
        },
    }
    message = tenant.refused(lambda: tenant.create_pod(decoy))
    assert "vgpu-allocation-record" in message

    # Were a decoy there all the same (an administrator's, or a cluster without the
    # policy), one that no trusted scheduler placed is no candidate: the pod is served.
    foreign = json.loads(json.dumps(decoy))
    foreign["spec"]["schedulerName"] = "my-scheduler"
    cp.create(f"/api/v1/namespaces/{tenant.namespace}/pods", foreign)
    tenant.create_pod(gpu_pod("victim", node=node, gpumem=1000))
    assert wait_received(stack, stack.main, "victim").error is None
    assert_gauges_agree_with_the_recount(stack)

    # One that looks placed by this scheduler makes the Allocate ambiguous: both pods
    # are marked failed and told so; nobody gets devices meant for another.
    lookalike = json.loads(json.dumps(decoy))
    lookalike["metadata"]["name"] = "lookalike"
    lookalike["spec"]["schedulerName"] = SCHEDULER
    cp.create(f"/api/v1/namespaces/{tenant.namespace}/pods", lookalike)
    tenant.create_pod(gpu_pod("victim-2", node=node, gpumem=1000))
    refused = wait_received(stack, stack.main, "victim-2")
    assert refused.error is not None
    assert "refusing to guess" in refused.error
    for name in ("victim-2", "lookalike"):

        def marked(name: str = name) -> bool:
            pod = env.get_pod(cp, tenant.namespace, name)
            return bool(pod["metadata"]["annotations"].get(names.BIND_PHASE) == "failed")

        env.wait_until(f"{name} to be marked failed", marked, 30)
        events = events_of(cp, tenant.namespace, name)
        assert any(
            e["reason"] == "GpuAllocateFailed" and "refusing to guess" in e["message"]
            for e in events
        ), name
    assert_gauges_agree_with_the_recount(stack)


# --- 8. preemption past a PodDisruptionBudget --------------------------------------------------


def test_8_a_preemption_a_budget_blocks_evicts_nobody_and_says_why(
    stack: Stack, tenant: Tenant
) -> None:
    cp, node = stack.cp, stack.main.name
    classes = {"low": 10, "high": 1000}
    for name, value in classes.items():
        cp.create(
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {"metadata": {"name": f"{tenant.namespace}-{name}"}, "value": value},
        )
    budgets = f"/apis/policy/v1/namespaces/{tenant.namespace}/poddisruptionbudgets"
    try:
        cp.create(
            budgets,
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "db"},
                "spec": {"selector": {"matchLabels": {"app": "db"}}, "maxUnavailable": 0},
            },
        )
        # No disruption controller runs here: its status, as it would write it.
        cp.request(
            "PATCH",
            f"{budgets}/db/status",
            {
                "status": {
                    "disruptionsAllowed": 0,
                    "currentHealthy": 4,
                    "desiredHealthy": 4,
                    "expectedPods": 4,
                    "observedGeneration": 1,
                }
            },
            content_type="application/merge-patch+json",
        )
        victims = []
        for index in range(4):
            app = "db" if index == 0 else "batch"
            pod = gpu_pod(f"{app}-{index}", node=node, gpumem=40000)
            pod["metadata"]["labels"] = {"app": app}
            pod["spec"]["priorityClassName"] = f"{tenant.namespace}-low"
            tenant.create_pod(pod)
            victims.append(f"{app}-{index}")
        for name in victims:
            assert wait_received(stack, stack.main, name).error is None
        # Needs every card's room: one of the victims is protected.
        urgent = gpu_pod("urgent", node=node, gpus=4, gpumem=40000)
        urgent["spec"]["priorityClassName"] = f"{tenant.namespace}-high"
        tenant.create_pod(urgent)

        def told() -> Json | None:
            for event in events_of(cp, tenant.namespace, "urgent"):
                if event["reason"] == "PreemptionBlocked":
                    return event
            return None

        event = env.wait_until("the preemptor to be told", told, 60)
        assert event["type"] == "Warning"
        assert f"PodDisruptionBudget {tenant.namespace}/db" in event["message"]
        cond = env.condition(env.get_pod(cp, tenant.namespace, "urgent")) or {}
        assert cond.get("reason") == "PreemptionBlocked"
        assert "no pod was evicted" in cond.get("message", "")
        present = {p["metadata"]["name"] for p in env.list_pods(cp, tenant.namespace)}
        assert set(victims) <= present
        for name in victims:
            assert not env.get_pod(cp, tenant.namespace, name)["metadata"].get("deletionTimestamp")
        assert_gauges_agree_with_the_recount(stack)
    finally:
        cp.delete(f"{budgets}/db")
        for name in classes:
            cp.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{tenant.namespace}-{name}")


# --- critical priority classes ---------------------------------------------------------------


def documented_quota() -> Json:
    """The ResourceQuota docs/operations.md gives for critical priority classes."""
    text = (env.REPO / "docs" / "operations.md").read_text()
    section = text.split("**Critical priority classes.**", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    quota: Json = yaml.safe_load(block)
    return quota


def test_a_tenant_may_preempt_with_critical_priority_only_until_the_documented_quota(
    stack: Stack, tenant: Tenant
) -> None:
    """Any pod may name system-cluster-critical; the ResourceQuota the security section
    gives stops it in the namespace, and leaves other pods alone."""
    cp = stack.cp
    critical = gpu_pod("critical", node=stack.main.name, gpumem=1000)
    critical["spec"]["priorityClassName"] = "system-cluster-critical"
    tenant.create_pod(critical)
    cp.delete(f"/api/v1/namespaces/{tenant.namespace}/pods/critical?gracePeriodSeconds=0")
    quota = documented_quota()
    path = f"/api/v1/namespaces/{tenant.namespace}/resourcequotas"
    cp.create(path, quota)
    name = quota["metadata"]["name"]
    try:
        # No controller manager here: the status its quota controller would write.
        cp.request(
            "PATCH",
            f"{path}/{name}/status",
            {"status": {"hard": quota["spec"]["hard"], "used": {"pods": "0"}}},
            content_type="application/merge-patch+json",
        )
        critical["metadata"]["name"] = "critical-again"

        def refused() -> str | None:
            try:
                tenant.create_pod(critical)
            except Refused as exc:
                return exc.message
            cp.delete(f"/api/v1/namespaces/{tenant.namespace}/pods/critical-again")
            return None

        message = env.wait_until("the quota to refuse critical pods", refused, 30)
        assert f"exceeded quota: {name}" in message
        tenant.create_pod(gpu_pod("ordinary", node=stack.main.name, gpumem=1000))
    finally:
        cp.delete(f"{path}/{name}")


# --- 9. a DRA claim's allocation is the schedulers' to write ---------------------------------


def test_9_a_tenant_cannot_allocate_a_claim_to_itself(stack: Stack, tenant: Tenant) -> None:
    """The DRA path's record of a share is a claim's status.allocation: a tenant's edit role
    covers claims, not their status (nor the resourceclaims/binding that 1.37 asks for),
    so the books may believe every allocation they read (docs/operations.md)."""
    from vgpu_operator.devices import dra

    claims = f"/apis/resource.k8s.io/v1/namespaces/{tenant.namespace}/resourceclaims"
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "mine"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": dra.SHARED_CLASS}}]
            }
        },
    }
    stack.cp.create(claims, body)
    allocation = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": dra.DRIVER,
                            "pool": stack.main.name,
                            "device": "gpu-0",
                            "consumedCapacity": {"memory": "1Mi"},
                        }
                    ]
                }
            }
        }
    }
    message = tenant.refused(
        lambda: tenant.request(
            "PATCH", f"{claims}/mine/status", allocation, "application/merge-patch+json"
        )
    )
    assert "forbidden" in message.lower()
    assert not (stack.cp.get(f"{claims}/mine").get("status") or {}).get("allocation")
    stack.cp.delete(f"{claims}/mine")


# =============================================================================================
# The DRA path (issue 33): the same tenant, on their own token, against the claim policies
# (manifests/claim-policy.yaml, as installed) and the books, with a node on the DRA path
# whose agent publishes its ResourceSlice and the operator allocating the tenant's claims.
# No kube-controller-manager runs here: the tests release their claims themselves.
# =============================================================================================

DRA_CARD_MIB = 46068  # l40s-pcie-4, as the DRA node's agent publishes each card
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"


@pytest.fixture(scope="module")
def dra_node(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A KWOK node on the DRA path, its agent publishing four L40S cards as one slice."""
    from integration.dra_env import dra_agent, node_slice

    from vgpu_operator.devices import dra

    cp = stack.cp
    name = f"gpu-dra-{uuid.uuid4().hex[:6]}"
    cp.create_fake_gpu_node(name, gpus=0, labels={dra.NODE_PATH_LABEL: dra.PATH_DRA})
    work = tmp_path_factory.mktemp("tenant-dra")
    agent = dra_agent(name, "l40s-pcie-4", cp.kubeconfig_path, work, split=4)
    try:
        env.wait_until(f"{name}'s slice", lambda: node_slice(cp, name), 60)
        yield name
    finally:
        agent.stop()


@pytest.fixture
def claims_tenant(stack: Stack, dra_node: str) -> Iterator[Tenant]:
    """The tenant; afterwards their pods go, then their claims (released as the claim
    controller would, which does not run here)."""
    tenant = stack.tenant
    yield tenant
    cp = stack.cp
    _delete_all_pods(cp, tenant.namespace)
    path = f"/apis/resource.k8s.io/v1/namespaces/{tenant.namespace}/resourceclaims"
    for claim in cp.get(path).get("items", []):
        name = claim["metadata"]["name"]
        cp.patch(f"{path}/{name}", {"metadata": {"finalizers": None}})
        cp.delete(f"{path}/{name}")
    env.wait_until("the claims to go", lambda: not cp.get(path).get("items"), 30)
    env.wait_until("the DRA node's cards to be free", lambda: not node_usage(stack, dra_node), 30)


def node_usage(stack: Stack, node: str) -> Usage:
    return {key: value for key, value in gauges(stack).items() if key[0] == node}


def claims_path(tenant: Tenant) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{tenant.namespace}/resourceclaims"


def claim_spec(
    memory_mib: int | None = None,
    *,
    card: int | None = 0,
    hami_core: bool | None = None,
    admin_access: bool = False,
) -> Json:
    """A claim's spec: one share of the driver's class, on card ``card`` of the node."""
    from vgpu_operator.devices import dra

    exactly: Json = {"deviceClassName": dra.SHARED_CLASS}
    if memory_mib is not None:
        exactly["capacity"] = {"requests": {"memory": f"{memory_mib}Mi"}}
    if card is not None:
        expression = f'device.attributes["{dra.DRIVER}"].index == {card}'
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    if admin_access:
        exactly["adminAccess"] = True
    devices: Json = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if hami_core is not None:
        devices["config"] = [
            {"opaque": {"driver": dra.DRIVER, "parameters": {"hamiCore": hami_core}}}
        ]
    return {"devices": devices}


def claim_body(name: str, spec: Json) -> Json:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": spec,
    }


def claim_pod(name: str, claim: str, node: str) -> Json:
    """A tenant's pod on the DRA path: it names its claim and the vgpu-scheduler."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": SCHEDULER,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/cuda",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


def allocated(stack: Stack, tenant: Tenant, claim: str) -> Json | None:
    """The claim, once it is allocated and its pod is running."""
    obj = stack.cp.get(f"{claims_path(tenant)}/{claim}")
    if not (obj.get("status") or {}).get("allocation") or not obj["status"].get("reservedFor"):
        return None
    pod_name = obj["status"]["reservedFor"][0]["name"]
    pod = env.get_pod(stack.cp, tenant.namespace, pod_name)
    return obj if (pod.get("status") or {}).get("phase") == "Running" else None


def waiting(stack: Stack, tenant: Tenant, pod: str) -> str | None:
    """The pod's PodScheduled=False message, once the operator found it does not fit (not
    while it waits for its claim to be seen)."""
    obj = env.get_pod(stack.cp, tenant.namespace, pod)
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition.get("status") == "False":
            message = str(condition.get("message", ""))
            return None if "does not exist" in message else message
    return None


def quota_memory(stack: Stack, namespace: str) -> int:
    """The GPU memory the operator books against the namespace's quota (MiB), scraped."""
    server = stack.operator.app.server
    assert server is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return round(
        sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "vgpu_operator_quota_used"
            and sample.labels["namespace"] == namespace
            and sample.labels["resource"].endswith("gpumem")
        )
    )


def memory_on(stack: Stack, node: str) -> int:
    return sum(mib for _, mib, _ in node_usage(stack, node).values())


# --- 10. HAMi-core off in a claim --------------------------------------------------------------


def test_10_turning_hami_core_off_in_a_claim_is_an_administrators_choice(
    stack: Stack, claims_tenant: Tenant, dra_node: str
) -> None:
    tenant = claims_tenant
    templates = f"/apis/resource.k8s.io/v1/namespaces/{tenant.namespace}/resourceclaimtemplates"
    off = claim_body("raw", claim_spec(1024, hami_core=False))
    message = tenant.refused(lambda: tenant.request("POST", claims_path(tenant), off))
    assert "vgpu-operator.io/allow-hami-core-off=true" in message
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "raw"},
        "spec": {"spec": claim_spec(1024, hami_core=False)},
    }
    message = tenant.refused(lambda: tenant.request("POST", templates, template))
    assert "vgpu-operator.io/allow-hami-core-off=true" in message
    # hamiCore true, or another driver's config, is anyone's to write.
    tenant.request("POST", claims_path(tenant), claim_body("on", claim_spec(1024, hami_core=True)))
    # A string is no boolean (issue 44: "false" was admitted and taken as on), anywhere.
    for body in (
        claim_body("text", claim_spec(1024, hami_core=cast(bool, "false"))),
        dict(
            template,
            metadata={"name": "text"},
            spec={"spec": claim_spec(1024, hami_core=cast(bool, "false"))},
        ),
    ):
        where = claims_path(tenant) if body.get("kind") == "ResourceClaim" else templates
        with allowing(stack, tenant.namespace, "vgpu-operator.io/allow-hami-core-off"):
            message = tenant.refused(
                lambda body=body, where=where: tenant.request("POST", where, body)
            )
        assert (
            "hamiCore (an opaque config of the driver gpu.vgpu-operator.io) must be a boolean"
            in message
        )
    # Allowed by an administrator: booked as the whole card, in the books and the quota.
    with allowing(stack, tenant.namespace, "vgpu-operator.io/allow-hami-core-off"):
        tenant.request("POST", claims_path(tenant), off)
    tenant.create_pod(claim_pod("raw", "raw", dra_node))
    env.wait_until("the raw claim's allocation", lambda: allocated(stack, tenant, "raw"), 60)
    usage = env.wait_until(
        "the whole card booked",
        lambda: node_usage(stack, dra_node) if memory_on(stack, dra_node) else None,
        30,
    )
    assert list(usage.values()) == [(4, DRA_CARD_MIB, 100)]
    assert quota_memory(stack, tenant.namespace) == DRA_CARD_MIB
    # Nothing else goes on that card.
    tenant.request("POST", claims_path(tenant), claim_body("beside", claim_spec(1024)))
    tenant.create_pod(claim_pod("beside", "beside", dra_node))
    env.wait_until("the pod beside to wait", lambda: waiting(stack, tenant, "beside"), 60)
    assert not (stack.cp.get(f"{claims_path(tenant)}/beside").get("status") or {}).get("allocation")
    template_allowed = dict(template, metadata={"name": "raw-allowed"})
    with allowing(stack, tenant.namespace, "vgpu-operator.io/allow-hami-core-off"):
        tenant.request("POST", templates, template_allowed)
    stack.cp.delete(f"{templates}/raw-allowed")


# --- 11. a claim pulled from under its running pod ---------------------------------------------


def test_11_a_claim_cannot_be_pulled_from_under_its_running_pod(
    stack: Stack, claims_tenant: Tenant, dra_node: str
) -> None:
    tenant, cp = claims_tenant, stack.cp
    path = claims_path(tenant)
    tenant.request("POST", path, claim_body("held", claim_spec(20000)))
    tenant.create_pod(claim_pod("holder", "held", dra_node))
    claim = env.wait_until("the held claim's allocation", lambda: allocated(stack, tenant, "held"))
    assert DELETE_PROTECTION in claim["metadata"]["finalizers"]
    env.wait_until("the share booked", lambda: memory_on(stack, dra_node) == 20000, 30)
    # The finalizer is the claim controller's and the allocators' while a pod holds it.
    message = tenant.refused(
        lambda: tenant.request(
            "PATCH", f"{path}/held", {"metadata": {"finalizers": None}}, MERGE_PATCH
        )
    )
    assert "delete the pods first" in message
    assert "holder" in message
    removal = [{"op": "remove", "path": "/metadata/finalizers/0"}]
    tenant.refused(
        lambda: tenant.request("PATCH", f"{path}/held", removal, "application/json-patch+json")
    )
    # Deleting it is allowed, and changes nothing while the finalizer stands.
    tenant.request("DELETE", f"{path}/held")
    assert cp.get(f"{path}/held")["metadata"].get("deletionTimestamp")
    # Should the finalizer go anyway (a cluster without the policy: here the administrator
    # removes it), the books keep the share while the pod runs: a second claim that fits
    # only beside a free card is not placed.
    cp.patch(f"{path}/held", {"metadata": {"finalizers": None}})
    env.wait_until("the held claim to go", lambda: _claim_gone(cp, f"{path}/held"), 30)
    tenant.request("POST", path, claim_body("second", claim_spec(30000)))
    tenant.create_pod(claim_pod("second", "second", dra_node))
    message = env.wait_until("the second pod to wait", lambda: waiting(stack, tenant, "second"))
    assert memory_on(stack, dra_node) == 20000
    assert not (cp.get(f"{path}/second").get("status") or {}).get("allocation")
    assert quota_memory(stack, tenant.namespace) == 20000
    # The pod ends: its share is free, and the second claim is placed.
    cp.delete(f"/api/v1/namespaces/{tenant.namespace}/pods/holder?gracePeriodSeconds=0")
    env.wait_until("the second claim's allocation", lambda: allocated(stack, tenant, "second"))
    env.wait_until("the second share booked", lambda: memory_on(stack, dra_node) == 30000, 30)


def _claim_gone(cp: ControlPlane, path: str) -> bool:
    try:
        cp.get(path)
    except AdminRequestError as exc:
        return exc.status == 404
    return False


MERGE_PATCH = "application/merge-patch+json"


# --- 12. adminAccess -----------------------------------------------------------------------------


def test_12_admin_access_is_an_administrators_and_books_nothing(
    stack: Stack, claims_tenant: Tenant, dra_node: str
) -> None:
    """adminAccess as upstream (issue 44): refused at creation outside a namespace an
    administrator labelled; allocated by the operator inside one, on a card others hold,
    consuming nothing; refused with a sentence once the label is gone."""
    tenant, cp = claims_tenant, stack.cp
    path = claims_path(tenant)
    admin = claim_body("admin", claim_spec(card=0, admin_access=True))
    message = tenant.refused(lambda: tenant.request("POST", path, admin))
    assert "admin-access" in message
    # The whole of card 0 held by an ordinary claim first.
    tenant.request("POST", path, claim_body("whole", claim_spec(DRA_CARD_MIB)))
    tenant.create_pod(claim_pod("whole", "whole", dra_node))
    env.wait_until("the whole card's allocation", lambda: allocated(stack, tenant, "whole"))
    with allowing(stack, tenant.namespace, "resource.kubernetes.io/admin-access"):
        tenant.request("POST", path, admin)
        tenant.create_pod(claim_pod("admin", "admin", dra_node))
        claim = env.wait_until(
            "the admin claim's allocation", lambda: allocated(stack, tenant, "admin")
        )
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["adminAccess"] is True
        assert "consumedCapacity" not in result
        whole = cp.get(f"{path}/whole")
        assert result["device"] == whole["status"]["allocation"]["devices"]["results"][0]["device"]
        # Nothing more is booked: the card and the quota count the whole claim only.
        env.wait_until("the card booked", lambda: memory_on(stack, dra_node) == DRA_CARD_MIB, 30)
        assert quota_memory(stack, tenant.namespace) == DRA_CARD_MIB
        tenant.request(
            "POST", path, claim_body("admin-later", claim_spec(card=0, admin_access=True))
        )
    # The label gone, a claim made while it was there is refused, saying why.
    tenant.create_pod(claim_pod("admin-later", "admin-later", dra_node))
    message = env.wait_until("the refusal", lambda: waiting(stack, tenant, "admin-later"), 60)
    assert (
        "asks adminAccess, which is allowed only in namespaces an administrator labelled" in message
    )
    assert f"namespace {tenant.namespace} is not" in message


# --- 13. the GPU-pod policy for pods with claims --------------------------------------------


def test_13_the_env_rules_hold_for_pods_with_claims(
    stack: Stack, claims_tenant: Tenant, dra_node: str
) -> None:
    tenant = claims_tenant
    for variable, value, named in (
        ("CUDA_DISABLE_CONTROL", "true", "CUDA_DISABLE_CONTROL"),
        ("GPU_CORE_UTILIZATION_POLICY", " Disable", "GPU_CORE_UTILIZATION_POLICY"),
        ("CUDA_DEVICE_MEMORY_LIMIT_0", "46068m", "CUDA_DEVICE_MEMORY_LIMIT*"),
    ):
        pod = claim_pod("env", "any", dra_node)
        pod["spec"]["containers"][0]["env"] = [{"name": variable, "value": value}]
        message = tenant.refused(lambda pod=pod: tenant.create_pod(pod))
        assert named in message
    # In a claim's container even an administrator's label does not allow it: the claim
    # says hamiCore: false instead (booked whole).
    pod = claim_pod("env", "any", dra_node)
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_DISABLE_CONTROL", "value": "1"}]
    with allowing(stack, tenant.namespace, "vgpu-operator.io/allow-hami-core-off"):
        message = tenant.refused(lambda: tenant.create_pod(pod))
    assert "hamiCore: false" in message
    # A pod as the webhook converts it in a DRA namespace (it asks for no GPU resource any
    # more, and names the webhook's claims): placed by the vgpu-scheduler all the same.
    from vgpu_operator.scheduling.dialects.claims import claim_admission

    entry = f"{claim_admission.ENTRY_PREFIX}0"
    converted = claim_pod("converted", "any", dra_node)
    converted["spec"]["resourceClaims"] = [
        {"name": entry, "resourceClaimTemplateName": f"{claim_admission.TEMPLATE_PREFIX}x"}
    ]
    converted["spec"]["containers"][0]["resources"] = {"claims": [{"name": entry}]}
    preset = copy.deepcopy(converted)
    preset["spec"]["nodeName"] = dra_node
    message = tenant.refused(lambda: tenant.create_pod(preset))
    assert "remove spec.nodeName" in message
    elsewhere = copy.deepcopy(converted)
    elsewhere["spec"]["schedulerName"] = "my-scheduler"
    message = tenant.refused(lambda: tenant.create_pod(elsewhere))
    assert "remove spec.schedulerName" in message
    # The core limit lifted in a GPU pod (annotation path): an administrator's choice.
    limited = gpu_pod(
        "cores",
        node=stack.main.name,
        gpumem=1024,
        env_vars={"GPU_CORE_UTILIZATION_POLICY": "disable"},
    )
    message = tenant.refused(lambda: tenant.create_pod(limited))
    assert "vgpu-operator.io/allow-hami-core-off=true" in message


# --- 14. a claim of our classes left to another allocator -------------------------------------


def _as_kube_scheduler(stack: Stack, method: str, path: str, body: Json) -> tuple[int, str]:
    """A request as kube-scheduler's own identity (its bootstrapped RBAC may write claims'
    status and resourceclaims/binding): the status and the answer's text."""
    creds = stack.cp.create_client_credentials("system:kube-scheduler")
    context = ssl.create_default_context(cafile=str(stack.cp.ca_path))
    context.load_cert_chain(str(creds.cert_path), str(creds.key_path))
    req = urllib.request.Request(
        stack.cp.server + path, data=json.dumps(body).encode(), method=method
    )
    req.add_header("Content-Type", "application/merge-patch+json")
    try:
        with urllib.request.urlopen(req, context=context, timeout=30) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return int(exc.code), exc.read().decode()


def test_14_a_claim_of_our_classes_is_allocated_by_the_operator_only(
    stack: Stack, claims_tenant: Tenant, dra_node: str
) -> None:
    """Issue 33 attack 3: kube-scheduler allocated a claim of our DeviceClass for a pod
    that did not name our scheduler, past the namespace's GPU quota."""
    from vgpu_operator.devices import dra

    tenant = claims_tenant
    tenant.request("POST", claims_path(tenant), claim_body("mine", claim_spec(1024)))
    # A pod naming no scheduler: routed to ours by the webhook.
    plain = claim_pod("plain", "mine", dra_node)
    del plain["spec"]["schedulerName"]
    made = tenant.create_pod(plain)
    assert made["spec"]["schedulerName"] == SCHEDULER
    # Another scheduler named: refused, with the fix.
    other = claim_pod("other", "mine", dra_node)
    other["spec"]["schedulerName"] = "default-scheduler-2"
    message = tenant.refused(lambda: tenant.create_pod(other))
    assert "remove schedulerName" in message
    # A pod created before its claim passes unrouted; kube-scheduler's own identity then
    # may not write an allocation of our driver's devices into the claim.
    early = claim_pod("early", "later", dra_node)
    del early["spec"]["schedulerName"]
    assert tenant.create_pod(early)["spec"].get("schedulerName") == "default-scheduler"
    tenant.request("POST", claims_path(tenant), claim_body("later", claim_spec(40000, card=None)))
    allocation = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": dra.DRIVER,
                            "pool": dra_node,
                            "device": "gpu-0",
                            "consumedCapacity": {"memory": "40000Mi"},
                        }
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "early", "uid": "x"}],
        }
    }
    status, text = _as_kube_scheduler(
        stack, "PATCH", f"{claims_path(tenant)}/later/status", allocation
    )
    assert status == 403, text
    assert "only the vgpu-operator allocates" in text
    later = stack.cp.get(f"{claims_path(tenant)}/later")
    assert not (later.get("status") or {}).get("allocation")
    # The books hold the routed pod's share, and nothing of the refused allocation.
    env.wait_until("the routed pod's claim", lambda: allocated(stack, tenant, "mine"), 60)
    assert memory_on(stack, dra_node) == 1024


# --- 15. CEL selectors that cost the operator its loop or disagree with Kubernetes ---------


def _healthz(stack: Stack) -> bool:
    server = stack.operator.app.server
    assert server is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=10) as answer:
        return bool(answer.status == 200)


def test_15_costly_or_deep_selectors_are_refused_with_a_sentence_and_the_operator_answers(
    stack: Stack, claims_tenant: Tenant, dra_node: str
) -> None:
    """Issue 33 attacks 1 and 5, as the tenant: a selector the API server accepts that took
    the interpreter ~25 s a device, 240 nested parentheses (a RecursionError), and string
    functions whose edges Kubernetes treats as errors."""
    tenant = claims_tenant
    big = "[" + ",".join("0" for _ in range(570)) + "]"
    cases = {
        "slow": (f"{big}.all(x, {big}.all(y, true))", "cheaper"),
        "deep": ("(" * 240 + "true" + ")" * 240, "nest"),
        "charat": ('"abc".charAt(-1) == "c"', "CEL"),
    }
    for name, (expression, _) in cases.items():
        spec = claim_spec(1024, card=None)
        spec["devices"]["requests"][0]["exactly"]["selectors"] = [
            {"cel": {"expression": expression}}
        ]
        tenant.request("POST", claims_path(tenant), claim_body(name, spec))
        tenant.create_pod(claim_pod(name, name, dra_node))
    for name, (_, word) in cases.items():

        def refusal(name: str = name) -> str | None:
            message = waiting(stack, tenant, name)
            return None if message is None or "evaluation pending" in message else message

        message = env.wait_until(f"{name}'s refusal", refusal, 120)
        assert word.lower() in message.lower(), message
        assert _healthz(stack)
        claim = stack.cp.get(f"{claims_path(tenant)}/{name}")
        assert not (claim.get("status") or {}).get("allocation")
    assert memory_on(stack, dra_node) == 0
