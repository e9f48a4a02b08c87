"""The README's install steps, run with kubectl on a fresh API server, then the operator and
the agent on their own ServiceAccounts' tokens under the manifests' RBAC and admission
policy: what each must be able to do, and what each must be refused.

This module starts its own control plane: the install must work on a cluster that has
seen nothing of ours (the session control plane has CRDs installed by other tests).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import json
import re
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from integration import operator_env as env
from integration.test_agent import AgentThread, quick_settings
from integration.test_operator_webhook import _free_port

from vgpu_operator import names, node_leases
from vgpu_operator.agent.sim_machine import resolve_machine_path
from vgpu_operator.control.options import OperatorOptions, WebhookOptions
from vgpu_operator.devices.dra import CardShape
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.kube import certs
from vgpu_operator.kube.client import api_client
from vgpu_operator.kube.node_lease import renew_node_lease
from vgpu_operator.kube.requests import ApiError as KubeApiError
from vgpu_operator.testing.controlplane import AdminRequestError, Binaries, ControlPlane

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
NAMESPACE = "vgpu-operator"
INVENTORIES = env.INVENTORIES
PEERINGS = "/apis/kopf.dev/v1/clusterkopfpeerings"
LEASES = node_leases.NAMESPACE
ROLES = "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles"


def readme_install_commands() -> list[str]:
    """The kubectl lines of the first console block under "Installing in a cluster" that
    applies something (the blocks before it put kubectl on PATH)."""
    text = README.read_text()
    section = text.split("## Installing in a cluster", 1)[1].split("\n## ", 1)[0]
    for block in re.findall(r"```console\n(.*?)```", section, re.S):
        lines = [line.split(" #", 1)[0].strip() for line in block.splitlines()]
        commands = [line for line in lines if line.startswith("kubectl ")]
        if any(command.startswith("kubectl apply ") for command in commands):
            return commands
    raise AssertionError("the README's install section has no console block with kubectl apply")


@dataclass
class Cluster:
    cp: ControlPlane
    kubectl: Path

    def run(self, args: list[str], token: str | None = None) -> subprocess.CompletedProcess[str]:
        """kubectl from the repository root, as admin or with a bearer token."""
        auth = (
            [
                "--kubeconfig=/dev/null",
                f"--server={self.cp.server}",
                f"--certificate-authority={self.cp.ca_path}",
                f"--token={token}",
            ]
            if token
            else []
        )
        return subprocess.run(
            [str(self.kubectl), *auth, *args],
            cwd=REPO,
            env={**self.cp.env(), "HOME": str(self.cp.workdir)},
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.fixture(scope="module")
def installed(control_plane_binaries: Binaries, kubectl: Path) -> Iterator[Cluster]:
    """A fresh control plane on which the README's install commands have been run."""
    with ControlPlane(kwok=True, binaries=control_plane_binaries) as cp:
        cluster = Cluster(cp, kubectl)
        for command in readme_install_commands():
            done = cluster.run(shlex.split(command)[1:])
            assert done.returncode == 0, f"`{command}` failed:\n{done.stdout}\n{done.stderr}"
        yield cluster


# --- tokens -------------------------------------------------------------------------------


def service_account_token(cp: ControlPlane, account: str, pod: str | None = None) -> str:
    """A TokenRequest token for ``account``, bound to ``pod`` (and so to its node) if given."""
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if pod is not None:
        spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": pod}
    answer = cp.create(
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(answer["status"]["token"])


def token_kubeconfig(cp: ControlPlane, token: str, path: Path) -> Path:
    ca = base64.b64encode(cp.ca_pem).decode()
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {"server": cp.server, "certificate-authority-data": ca},
                    }
                ],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def agent_pod(cp: ControlPlane, node: str) -> str:
    """A pod of the agent's DaemonSet shape on ``node`` (KWOK plays its kubelet)."""
    name = f"vgpu-agent-{node}"
    cp.create(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "vgpu-agent"}},
            "spec": {
                "nodeName": node,
                "serviceAccountName": "vgpu-agent",
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "agent", "image": "vgpu-operator:0.1.0"}],
            },
        },
    )
    return name


@contextlib.contextmanager
def running_agent(node: str, kubeconfig: Path) -> Iterator[AgentThread]:
    """The agent on an l40s-pcie-4 for ``node``, started with ``kubeconfig``, stopped after."""
    machine = resolve_machine_path("l40s-pcie-4")
    agent = AgentThread(quick_settings(node), machine, kubeconfig)
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


@pytest.fixture(scope="module")
def gpu_nodes(installed: Cluster) -> tuple[str, str]:
    """Two KWOK GPU nodes, A and B, labelled for the test."""
    nodes = (f"gpu-a-{uuid.uuid4().hex[:6]}", f"gpu-b-{uuid.uuid4().hex[:6]}")
    for node in nodes:
        installed.cp.create_fake_gpu_node(node, gpus=4)
    return nodes


@pytest.fixture(scope="module")
def agent_token(installed: Cluster, gpu_nodes: tuple[str, str]) -> str:
    """The agent's token as the kubelet would mount it on node A: bound to its pod there."""
    return service_account_token(installed.cp, "vgpu-agent", agent_pod(installed.cp, gpu_nodes[0]))


@pytest.fixture(scope="module")
def operator_token(installed: Cluster) -> str:
    return service_account_token(installed.cp, "vgpu-operator")


# --- install ------------------------------------------------------------------------------


def test_the_readme_install_creates_every_object_in_one_run(installed: Cluster) -> None:
    cp = installed.cp
    for path in (
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/vgpu-operator",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/vgpu-agent",
        f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/vgpu-operator",
        f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/vgpu-agent",
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/vgpu-operator",
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/vgpu-agent-own-node",
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/vgpu-allocation-record",
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/vgpu-gpu-pods",
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/vgpu-claims",
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/vgpu-claim-templates",
        f"/api/v1/namespaces/{LEASES}",
        f"{ROLES.format(ns=LEASES)}/vgpu-agent-node-lease",
        f"{ROLES.format(ns=LEASES)}/vgpu-operator-node-leases",
        INVENTORIES,
        PEERINGS,
    ):
        # A CRD just established may answer 429 while its storage initialises.
        env.wait_until(f"{path} to be served", lambda path=path: _served(cp, path), 30)
    # Applying again changes nothing and fails nothing (upgrades re-run the same command):
    # the manifests are written as the API server stores them.
    again = installed.run(["apply", "-k", "manifests/"])
    assert again.returncode == 0, again.stderr
    changed = [line for line in again.stdout.splitlines() if not line.endswith(" unchanged")]
    assert not changed, again.stdout


def test_a_reapply_keeps_the_administrators_device_config(installed: Cluster) -> None:
    """The device config is the administrator's: created by hand from the shipped file,
    edited, and left as edited by the next `kubectl apply -k manifests/`."""
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/vgpu-device-config"
    if not _served(installed.cp, path):
        created = installed.run(["create", "-f", "manifests/device-config.yaml"])
        assert created.returncode == 0, created.stderr
    config_map = installed.cp.get(path)
    text = config_map["data"]["device-config.yaml"]
    edited = text.replace("deviceSplitCount: 10", "deviceSplitCount: 7")
    assert edited != text
    installed.cp.patch(path, {"data": {"device-config.yaml": edited}})
    again = installed.run(["apply", "-k", "manifests/"])
    assert again.returncode == 0, again.stderr
    assert installed.cp.get(path)["data"]["device-config.yaml"] == edited
    installed.cp.patch(path, {"data": {"device-config.yaml": text}})


def _served(cp: ControlPlane, path: str) -> bool:
    try:
        cp.get(path)
    except AdminRequestError:
        return False
    return True


def test_the_crd_folder_applies_with_dash_f(installed: Cluster) -> None:
    done = installed.run(["apply", "-f", "crds/"])
    assert done.returncode == 0, done.stderr
    assert "deviceinventories.vgpu-operator.io" in done.stdout


def test_the_hami_annotation_opt_in_applies(installed: Cluster) -> None:
    done = installed.run(["apply", "-f", "manifests/agent-hami-annotations.yaml"])
    assert done.returncode == 0, done.stderr
    installed.run(["delete", "-f", "manifests/agent-hami-annotations.yaml"])


# --- the agent's identity -----------------------------------------------------------------


def test_the_agent_reports_its_own_node_on_its_own_token(
    installed: Cluster, gpu_nodes: tuple[str, str], agent_token: str, tmp_path: Path
) -> None:
    cp = installed.cp
    node = gpu_nodes[0]
    kubeconfig = token_kubeconfig(cp, agent_token, tmp_path / "agent.kubeconfig")
    with running_agent(node, kubeconfig):

        def reported() -> dict[str, Any] | None:
            try:
                obj = cp.get(f"{INVENTORIES}/{node}")
            except AdminRequestError:
                return None
            return obj if (obj.get("status") or {}).get("devices") else None

        inventory = env.wait_until("the agent's inventory of node A", reported, 60)
        # Its heartbeat: the node's Lease, created, then renewed (patched) on its token.
        first = env.wait_until("the Lease of node A", lambda: _renewal(cp, node), 30)
        env.wait_until("a renewal of it", lambda: (_renewal(cp, node) or 0.0) > first, 30)
    lease = cp.get(node_leases.lease_path(node))
    assert lease["spec"]["holderIdentity"] == node
    assert inventory["status"]["nodeName"] == node
    assert len(inventory["status"]["devices"]) == 4
    # `-o wide` adds where the readings come from and the driver, after the summary.
    wide = installed.run(["get", "dinv", node, "-o", "wide"])
    assert wide.returncode == 0, wide.stderr
    header, row = wide.stdout.splitlines()[:2]
    assert header.split() == [
        "NAME",
        "NODE",
        "GPUS",
        "HEALTHY",
        "MODEL",
        "MEMORY",
        "MIB",
        "LAST",
        "REPORT",
        "BACKEND",
        "DRIVER",
        "CUDA",
        "CORDONED",
    ]
    assert inventory["status"]["backend"] in row.split()
    narrow = installed.run(["get", "dinv", node])
    assert "BACKEND" not in narrow.stdout


def _renewal(cp: ControlPlane, node: str) -> float | None:
    try:
        return node_leases.read_renewal(cp.get(node_leases.lease_path(node)))
    except AdminRequestError:
        return None


def _lease_file(tmp_path: Path, node: str, namespace: str = LEASES) -> str:
    path = tmp_path / f"lease-{namespace}-{node}.yaml"
    manifest = {
        "apiVersion": node_leases.API_VERSION,
        "kind": node_leases.KIND,
        "metadata": {"name": node, "namespace": namespace},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 120},
    }
    path.write_text(yaml.safe_dump(manifest))
    return str(path)


def _renew_as(kubeconfig: Path, node: str) -> None:
    """The agent's own renewal (``kube.node_lease``: a merge patch, a create when there is
    no Lease) on the credentials of ``kubeconfig``. (kubectl patch reads the object
    first, which the agent may not.)"""

    async def renew() -> None:
        async with api_client(kubeconfig) as api:
            await renew_node_lease(api, node, datetime.datetime.now(datetime.UTC), 120)

    asyncio.run(renew())


def _refused_write(kubeconfig: Path, node: str) -> str:
    with pytest.raises(KubeApiError) as refused:
        _renew_as(kubeconfig, node)
    assert refused.value.status == 403, refused.value
    return str(json.loads(refused.value.body)["message"])


def _refused(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0, f"expected a refusal, got: {done.stdout}"
    assert "Forbidden" in done.stderr or "forbidden" in done.stderr, done.stderr
    return done.stderr


def _inventory_file(tmp_path: Path, node: str) -> str:
    path = tmp_path / f"{node}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": f"{names.CRD_GROUP}/{names.CRD_VERSION}",
                "kind": names.DEVICE_INVENTORY_KIND,
                "metadata": {"name": node},
                "spec": {},
            }
        )
    )
    return str(path)


def test_the_agent_may_not_write_another_nodes_inventory(
    installed: Cluster, gpu_nodes: tuple[str, str], agent_token: str, tmp_path: Path
) -> None:
    node_b = gpu_nodes[1]
    message = _refused(
        installed.run(["create", "-f", _inventory_file(tmp_path, node_b)], token=agent_token)
    )
    assert "vgpu-agent-own-node" in message
    assert f"may write only its own node, not {node_b}" in message
    # Node B's inventory written by someone allowed to; the agent of A may not change it.
    env.write_inventory(installed.cp, node_b, env.cards("b", 2))
    status = json.dumps({"status": {"devices": [], "nodeName": node_b}})
    message = _refused(
        installed.run(
            [
                "patch",
                f"{names.DEVICE_INVENTORY_PLURAL}.{names.CRD_GROUP}",
                node_b,
                "--subresource=status",
                "--type=merge",
                f"-p={status}",
            ],
            token=agent_token,
        )
    )
    assert "may write only its own node" in message
    assert len(installed.cp.get(f"{INVENTORIES}/{node_b}")["status"]["devices"]) == 2


def test_the_agent_may_not_make_its_own_inventory_describe_another_node(
    installed: Cluster, gpu_nodes: tuple[str, str], agent_token: str
) -> None:
    node_a, node_b = gpu_nodes
    env.write_inventory(installed.cp, node_a, env.cards("a", 2))  # a full, valid status
    status = json.dumps({"status": {"nodeName": node_b}})
    done = installed.run(
        [
            "patch",
            f"{names.DEVICE_INVENTORY_PLURAL}.{names.CRD_GROUP}",
            node_a,
            "--subresource=status",
            "--type=merge",
            f"-p={status}",
        ],
        token=agent_token,
    )
    # Two layers refuse it: the CRD's own rule (for any writer) and, behind it, the
    # admission policy on the agent's node claim.
    assert done.returncode != 0, done.stdout
    assert (
        "status.nodeName must equal metadata.name" in done.stderr
        or f"not status.nodeName {node_b}" in done.stderr
    ), done.stderr


def test_an_agent_token_bound_to_no_node_writes_no_inventory(
    installed: Cluster, gpu_nodes: tuple[str, str], tmp_path: Path
) -> None:
    unbound = service_account_token(installed.cp, "vgpu-agent")
    message = _refused(
        installed.run(["create", "-f", _inventory_file(tmp_path, "gpu-x")], token=unbound)
    )
    assert "this token names no node" in message
    message = _refused(
        installed.run(["create", "-f", _lease_file(tmp_path, "gpu-x")], token=unbound)
    )
    assert "this token names no node" in message


def test_the_agent_renews_only_its_own_nodes_lease(
    installed: Cluster, gpu_nodes: tuple[str, str], agent_token: str, tmp_path: Path
) -> None:
    """RBAC lets the agent create and patch Leases in vgpu-node-leases; the admission
    policy keeps it to the one named after the node in its token."""
    cp = installed.cp
    node_a, node_b = gpu_nodes
    kubeconfig = token_kubeconfig(cp, agent_token, tmp_path / "agent.kubeconfig")
    # Its own: created when missing, renewed when there.
    cp.delete(node_leases.lease_path(node_a))
    _renew_as(kubeconfig, node_a)
    first = _renewal(cp, node_a)
    assert first is not None
    _renew_as(kubeconfig, node_a)
    assert (_renewal(cp, node_a) or 0.0) > first
    # Another node's: neither created nor renewed.
    cp.delete(node_leases.lease_path(node_b))
    message = _refused_write(kubeconfig, node_b)  # the create, after a 404 on the patch
    assert "vgpu-agent-own-node" in message
    assert f"may write only its own node, not {node_b}" in message
    with pytest.raises(AdminRequestError):
        cp.get(node_leases.lease_path(node_b))
    before = env.renew_lease(cp, node_b)  # node B's Lease, renewed by its own agent
    message = _refused_write(kubeconfig, node_b)
    assert f"may write only its own node, not {node_b}" in message
    after = cp.get(node_leases.lease_path(node_b))
    assert after["spec"]["renewTime"] == before["spec"]["renewTime"]


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        pytest.param(["get", "lease", "-n", LEASES, "{a}"], "cannot get", id="read-own-lease"),
        pytest.param(["get", "leases", "-n", LEASES], "cannot list", id="list-leases"),
        pytest.param(
            ["delete", "lease", "-n", LEASES, "{a}"], "cannot delete", id="delete-own-lease"
        ),
        pytest.param(
            ["create", "-f", "{elsewhere}"],
            f'cannot create resource "leases" in API group "coordination.k8s.io" in the '
            f'namespace "{NAMESPACE}"',
            id="lease-in-the-agents-namespace",
        ),
        pytest.param(
            ["create", "-f", "{node_lease}"],
            'in the namespace "kube-node-lease"',
            id="lease-in-kube-node-lease",
        ),
    ],
)
def test_the_agent_is_refused_other_lease_verbs_and_namespaces(
    installed: Cluster,
    gpu_nodes: tuple[str, str],
    agent_token: str,
    tmp_path: Path,
    args: list[str],
    refusal: str,
) -> None:
    node_a = gpu_nodes[0]
    env.renew_lease(installed.cp, node_a)
    installed.cp.ensure_namespace("kube-node-lease")
    files = {
        "elsewhere": _lease_file(tmp_path, node_a, NAMESPACE),
        "node_lease": _lease_file(tmp_path, node_a, "kube-node-lease"),
    }
    filled = [arg.format(a=node_a, **files) for arg in args]
    assert refusal in _refused(installed.run(filled, token=agent_token))


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["patch", "node", "{b}", "--type=merge", "-p={{}}"], id="patch-foreign-node"),
        pytest.param(["patch", "node", "{a}", "--type=merge", "-p={{}}"], id="patch-own-node"),
        pytest.param(["get", "secrets", "-A"], id="read-secrets"),
        pytest.param(["delete", "pod", "-n", NAMESPACE, "--all"], id="delete-pods"),
        pytest.param(["delete", "deviceinventories.vgpu-operator.io", "{a}"], id="delete-inv"),
    ],
)
def test_the_agent_is_refused(
    installed: Cluster, gpu_nodes: tuple[str, str], agent_token: str, args: list[str]
) -> None:
    node_a, node_b = gpu_nodes
    filled = [arg.format(a=node_a, b=node_b) for arg in args]
    _refused(installed.run(filled, token=agent_token))


def test_with_the_hami_opt_in_the_agent_patches_only_its_own_node(
    installed: Cluster, gpu_nodes: tuple[str, str], agent_token: str
) -> None:
    node_a, node_b = gpu_nodes
    opt_in = ["apply", "-f", "manifests/agent-hami-annotations.yaml"]
    assert installed.run(opt_in).returncode == 0
    try:
        patch = '-p={"metadata":{"annotations":{"hami.io/node-handshake":"x"}}}'
        own = installed.run(["patch", "node", node_a, "--type=merge", patch], token=agent_token)
        assert own.returncode == 0, own.stderr
        message = _refused(
            installed.run(["patch", "node", node_b, "--type=merge", patch], token=agent_token)
        )
        assert f"not {node_b}" in message
    finally:
        installed.run(["delete", "-f", "manifests/agent-hami-annotations.yaml"])


def test_the_agent_reads_the_device_config_and_no_other_configmap(
    installed: Cluster, agent_token: str
) -> None:
    """It lists and watches the device config by name (how it follows its nodeconfig
    entry), and may not list the namespace's other ConfigMaps."""
    by_name = "--field-selector=metadata.name=vgpu-device-config"
    if not _served(installed.cp, f"/api/v1/namespaces/{NAMESPACE}/configmaps/vgpu-device-config"):
        created = installed.run(["create", "-f", "manifests/device-config.yaml"])  # the admin's
        assert created.returncode == 0, created.stderr
    listed = installed.run(["get", "configmaps", "-n", NAMESPACE, by_name], token=agent_token)
    assert listed.returncode == 0, listed.stderr
    assert "vgpu-device-config" in listed.stdout
    watched = installed.run(
        ["get", "configmaps", "-n", NAMESPACE, by_name, "--watch", "--request-timeout=2s"],
        token=agent_token,
    )
    assert "forbidden" not in watched.stderr.lower(), watched.stderr
    _refused(installed.run(["get", "configmaps", "-n", NAMESPACE], token=agent_token))


def test_the_device_plugin_settles_pods_on_its_node_and_says_why(
    installed: Cluster, gpu_nodes: tuple[str, str], agent_token: str, tmp_path: Path
) -> None:
    """What the device plugin writes on its own token: it lists the pods bound to its node,
    patches one's annotations, and writes a GpuAllocateFailed Event on it."""
    pod = f"vgpu-agent-{gpu_nodes[0]}"
    event = tmp_path / "event.yaml"
    event.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{pod}.allocate", "namespace": NAMESPACE},
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod,
                    "namespace": NAMESPACE,
                },
                "reason": "GpuAllocateFailed",
                "message": "kubelet chose devices on another card",
                "type": "Warning",
                "source": {"component": "vgpu-agent"},
            }
        )
    )
    listed = installed.run(
        ["get", "pods", "-A", f"--field-selector=spec.nodeName={gpu_nodes[0]}"],
        token=agent_token,
    )
    assert listed.returncode == 0, listed.stderr
    assert pod in listed.stdout
    patch = '-p={"metadata":{"annotations":{"hami.io/bind-phase":"failed"}}}'
    patched = installed.run(
        ["patch", "pod", "-n", NAMESPACE, pod, "--type=merge", patch], token=agent_token
    )
    assert patched.returncode == 0, patched.stderr
    created = installed.run(["create", "-f", str(event)], token=agent_token)
    assert created.returncode == 0, created.stderr


def test_the_device_plugin_may_not_touch_pods_elsewhere_or_their_spec(
    installed: Cluster, gpu_nodes: tuple[str, str], agent_token: str
) -> None:
    node_a, node_b = gpu_nodes
    other = agent_pod(installed.cp, node_b)  # any pod bound to node B
    patch = '-p={"metadata":{"annotations":{"hami.io/bind-phase":"success"}}}'
    message = _refused(
        installed.run(
            ["patch", "pod", "-n", NAMESPACE, other, "--type=merge", patch], token=agent_token
        )
    )
    assert f"the agent on node {node_a} may change only pods bound to it" in message
    own = f"vgpu-agent-{node_a}"
    spec = '-p={"spec":{"activeDeadlineSeconds":5}}'
    message = _refused(
        installed.run(
            ["patch", "pod", "-n", NAMESPACE, own, "--type=merge", spec], token=agent_token
        )
    )
    assert "annotations only" in message


@pytest.mark.parametrize(
    ("patch", "refusal"),
    [
        pytest.param(
            {"metadata": {"labels": {"app": "adopted"}}},
            "not its labels, finalizers or owner references",
            id="labels",
        ),
        pytest.param(
            {"metadata": {"finalizers": ["example.com/never"]}},
            "not its labels, finalizers or owner references",
            id="finalizers",
        ),
        pytest.param(
            {
                "metadata": {
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "name": "gone",
                            "uid": "00000000-0000-0000-0000-000000000000",
                        }
                    ]
                }
            },
            "not its labels, finalizers or owner references",
            id="dangling-owner",
        ),
        pytest.param(
            {"metadata": {"annotations": {"example.com/note": "x"}}},
            "only the annotations hami.io/bind-phase and",
            id="other-annotation",
        ),
        pytest.param(
            {"metadata": {"annotations": {"hami.io/vgpu-devices-allocated": "GPU-x,NVIDIA,1,0:;"}}},
            # Both policies refuse it; the API server names one of them.
            "only the annotations hami.io/bind-phase and|are the GPU allocation record",
            id="the-allocation-itself",
        ),
    ],
)
def test_the_device_plugin_may_change_only_its_two_annotations_of_a_pod(
    installed: Cluster,
    gpu_nodes: tuple[str, str],
    agent_token: str,
    patch: dict[str, Any],
    refusal: str,
) -> None:
    """Issue 22, attack 9: on pods of its own node, the agent's patches were held to
    "annotations only"; labels (a Service or controller adopts the pod), finalizers (it
    can never be deleted) and a dangling owner (the garbage collector deletes it) went
    through. Each is refused now, and the pod is left as it was."""
    own = f"vgpu-agent-{gpu_nodes[0]}"
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{own}"
    before = installed.cp.get(path)["metadata"]
    message = _refused(
        installed.run(
            ["patch", "pod", "-n", NAMESPACE, own, "--type=merge", f"-p={json.dumps(patch)}"],
            token=agent_token,
        )
    )
    assert any(alternative in message for alternative in refusal.split("|")), message
    after = installed.cp.get(path)["metadata"]
    for key in ("labels", "finalizers", "ownerReferences", "annotations"):
        assert after.get(key) == before.get(key)


# --- the operator's identity --------------------------------------------------------------


def test_the_operator_lists_and_watches_the_node_leases(
    installed: Cluster, gpu_nodes: tuple[str, str], operator_token: str
) -> None:
    """How it reads the agents' heartbeats (its watches run on these verbs)."""
    env.renew_lease(installed.cp, gpu_nodes[1])
    listed = installed.run(["get", "leases", "-n", LEASES], token=operator_token)
    assert listed.returncode == 0, listed.stderr
    assert gpu_nodes[1] in listed.stdout
    watched = installed.run(
        ["get", "leases", "-n", LEASES, "--watch", "--request-timeout=2s"], token=operator_token
    )
    assert "forbidden" not in watched.stderr.lower(), watched.stderr
    assert gpu_nodes[1] in watched.stdout


def test_the_operator_writes_no_lease(
    installed: Cluster, gpu_nodes: tuple[str, str], operator_token: str, tmp_path: Path
) -> None:
    """A renewal as the agent makes it, on the operator's token: refused by RBAC (patch),
    and the Lease stays as its agent left it."""
    cp = installed.cp
    before = env.renew_lease(cp, gpu_nodes[0])
    kubeconfig = token_kubeconfig(cp, operator_token, tmp_path / "operator.kubeconfig")
    message = _refused_write(kubeconfig, gpu_nodes[0])
    assert 'cannot patch resource "leases"' in message
    after = cp.get(node_leases.lease_path(gpu_nodes[0]))
    assert after["spec"]["renewTime"] == before["spec"]["renewTime"]


def test_the_operator_schedules_on_its_own_token(
    installed: Cluster, gpu_nodes: tuple[str, str], operator_token: str, tmp_path: Path
) -> None:
    cp = installed.cp
    node = gpu_nodes[1]
    env.write_inventory(cp, node, env.cards(node, 2))
    namespace = f"team-{uuid.uuid4().hex[:6]}"
    cp.ensure_namespace(namespace)
    kubeconfig = token_kubeconfig(cp, operator_token, tmp_path / "operator.kubeconfig")
    # As the Deployment runs it: peering, and the webhook with self-managed TLS.
    webhook = WebhookOptions(
        port=_free_port(),
        addr="127.0.0.1",
        tls_secret="vgpu-operator-webhook-tls",
        tls_dir=tmp_path / "tls",
    )
    options = env.options(
        cp,
        NAMESPACE,
        kubeconfig=kubeconfig,
        config_map="vgpu-device-config",
        standalone=False,
        peering="vgpu-operator",
        webhook=webhook,
    )
    with OperatorThread(options):
        # The manifests ship only the peering CRD: the operator makes its peering object.
        env.wait_until("the operator's peering object", lambda: _exists(cp, PEERINGS), 30)
        # Its own Secret and the manifests' webhook configuration, under its own RBAC.
        secret = cp.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/vgpu-operator-webhook-tls")
        webhooks = cp.get(
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/vgpu-operator"
        )
        bundle = webhooks["webhooks"][0]["clientConfig"]["caBundle"]
        assert bundle == secret["data"][certs.CA_BUNDLE]
        pod = env.gpu_pod(namespace, "shared", scheduler="vgpu-scheduler", group="-", gpumem=4096)
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        env.create_pod(cp, pod)
        bound = env.wait_bound(cp, namespace, "shared", 90)
    assert bound["spec"]["nodeName"] == node
    assert env.allocation(bound)


def test_the_operator_preempts_on_its_own_token(
    installed: Cluster, operator_token: str, tmp_path: Path
) -> None:
    """Evictions, nominatedNodeName, Events and the PodDisruptionBudget watch are allowed."""
    cp = installed.cp
    node = f"gpu-p-{uuid.uuid4().hex[:6]}"
    cp.create_fake_gpu_node(node, gpus=1)
    env.write_inventory(cp, node, env.cards(node, 1, memory_mib=10000))
    namespace = f"team-{uuid.uuid4().hex[:6]}"
    cp.ensure_namespace(namespace)
    classes = {"low": 10, "high": 1000}
    for name, value in classes.items():
        body = {"metadata": {"name": f"{namespace}-{name}"}, "value": value}
        cp.create("/apis/scheduling.k8s.io/v1/priorityclasses", body)
    kubeconfig = token_kubeconfig(cp, operator_token, tmp_path / "operator.kubeconfig")
    options = env.options(
        cp,
        NAMESPACE,
        kubeconfig=kubeconfig,
        config_map="vgpu-device-config",
        standalone=False,
        peering="vgpu-operator",
    )

    def create(name: str, priority: str, gpumem: int) -> None:
        pod = env.gpu_pod(namespace, name, scheduler="vgpu-scheduler", group="-", gpumem=gpumem)
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        pod["spec"]["priorityClassName"] = f"{namespace}-{priority}"
        env.create_pod(cp, pod)

    with OperatorThread(options):
        create("batch", "low", 8000)
        env.wait_bound(cp, namespace, "batch", 90)
        create("urgent", "high", 6000)
        bound = env.wait_bound(cp, namespace, "urgent", 90)
    assert bound["spec"]["nodeName"] == node
    assert "batch" not in {p["metadata"]["name"] for p in env.list_pods(cp, namespace)}
    reasons = {e["reason"] for e in env.events_for(cp, namespace, "urgent")}
    assert "Preempting" in reasons
    for name in classes:
        cp.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{namespace}-{name}")


def _exists(cp: ControlPlane, path: str) -> bool:
    try:
        return bool(cp.get(f"{path}/vgpu-operator"))
    except AdminRequestError:
        return False


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["patch", "node", "{a}", "--type=merge", "-p={{}}"], id="patch-node"),
        pytest.param(["patch", "pod", "-n", NAMESPACE, "{pod}", "-p={{}}"], id="patch-pod"),
        pytest.param(["delete", "pod", "-n", NAMESPACE, "{pod}"], id="delete-pod"),
        pytest.param(["get", "secrets", "-A"], id="read-secrets"),
        pytest.param(["get", "secrets", "-n", NAMESPACE], id="list-own-secrets"),
        # It lists and watches namespaces (those labelled for adminAccess), but may not
        # label one (and so allow adminAccess or anything else itself).
        pytest.param(["label", "namespace", NAMESPACE, "vgpu-test=1"], id="label-namespace"),
        pytest.param(["get", "kopfpeerings.kopf.dev", "-A"], id="namespaced-peerings"),
        pytest.param(["get", "configmaps", "-A"], id="configmaps-elsewhere"),
        pytest.param(
            ["create", "-f", "{inventory}"],
            id="write-inventory",
        ),
        pytest.param(["create", "-f", "{lease}"], id="create-lease"),
        pytest.param(["delete", "lease", "-n", LEASES, "{a}"], id="delete-lease"),
        pytest.param(["get", "lease", "-n", LEASES, "{a}"], id="get-one-lease"),
        pytest.param(["get", "leases", "-n", "kube-system"], id="leases-elsewhere"),
        # The DRA path: it reads slices and classes, patches claims and their status,
        # creates and deletes pods' special claims (extended resources backed by DRA, as
        # kube-scheduler does), makes templates and collects the ones it made (so it may
        # delete templates); nothing else.
        pytest.param(["create", "-f", "{slice}"], id="write-slice"),
        pytest.param(["delete", "deviceclass", "gpu.vgpu-operator.io"], id="delete-class"),
    ],
)
def test_the_operator_is_refused(
    installed: Cluster,
    gpu_nodes: tuple[str, str],
    agent_token: str,
    operator_token: str,
    tmp_path: Path,
    args: list[str],
) -> None:
    pod = f"vgpu-agent-{gpu_nodes[0]}"
    inventory = _inventory_file(tmp_path, "gpu-op")
    lease = _lease_file(tmp_path, "gpu-op")
    slice_file = _slice_file(tmp_path, gpu_nodes[0])
    claim = tmp_path / "claim.yaml"
    claim.write_text(yaml.safe_dump(_claim_body(NAMESPACE, "op-claim", "1Gi")))
    filled = [
        arg.format(
            a=gpu_nodes[0], pod=pod, inventory=inventory, lease=lease, slice=slice_file, claim=claim
        )
        for arg in args
    ]
    done = installed.run(filled, token=operator_token)
    assert done.returncode != 0, done.stdout
    # The namespaced KopfPeering type is not even installed any more.
    assert re.search(r"[Ff]orbidden|doesn't have a resource type", done.stderr), done.stderr


# --- the DRA driver -------------------------------------------------------------------------


def _slice_file(tmp_path: Path, node: str, driver: str = "gpu.vgpu-operator.io") -> str:
    from vgpu_operator.devices import dra

    body = dra.slice_wire(node, [], 1, None)
    body["spec"]["driver"] = driver
    path = tmp_path / f"slice-{node}-{driver}.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


def test_the_deviceclasses_are_installed(installed: Cluster) -> None:
    for name in ("gpu.vgpu-operator.io", "exclusive.gpu.vgpu-operator.io"):
        got = installed.cp.get(f"/apis/resource.k8s.io/v1/deviceclasses/{name}")
        assert got["metadata"]["name"] == name


def test_the_dra_driver_writes_only_its_own_nodes_slices(
    installed: Cluster, gpu_nodes: tuple[str, str], agent_token: str, tmp_path: Path
) -> None:
    node_a, node_b = gpu_nodes
    own = installed.run(["create", "-f", _slice_file(tmp_path, node_a)], token=agent_token)
    assert own.returncode == 0, own.stderr
    try:
        listed = installed.run(
            ["get", "resourceslices", f"--field-selector=spec.nodeName={node_a}"],
            token=agent_token,
        )
        assert listed.returncode == 0, listed.stderr
        message = _refused(
            installed.run(["create", "-f", _slice_file(tmp_path, node_b)], token=agent_token)
        )
        assert "its own node" in message
        # Not another driver's slice of its own node either.
        _refused(
            installed.run(
                ["create", "-f", _slice_file(tmp_path, node_a, "gpu.example.com")],
                token=agent_token,
            )
        )
        # It reads claims (kubelet names the one to prepare) and may not write them.
        _refused(installed.run(["delete", "resourceclaims", "-A", "--all"], token=agent_token))
        deleted = installed.run(
            ["delete", "resourceslice", f"{node_a}-gpu.vgpu-operator.io"], token=agent_token
        )
        assert deleted.returncode == 0, deleted.stderr
    finally:
        installed.run(
            ["delete", "resourceslice", f"{node_a}-gpu.vgpu-operator.io", "--ignore-not-found"]
        )


def _one_card_dra_node(cp: ControlPlane, prefix: str) -> tuple[str, CardShape]:
    """A KWOK node on the DRA path with one published L40S: its name and card."""
    from vgpu_operator.devices import dra

    node = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cp.create_fake_gpu_node(node, gpus=0, labels={dra.NODE_PATH_LABEL: dra.PATH_DRA})
    card = dra.CardShape(f"GPU-{node}-0", 0, "L40S", "NVIDIA-L40S", 46068, 100, 4, "hami-core")
    cp.create("/apis/resource.k8s.io/v1/resourceslices", dra.slice_wire(node, [card], 1, None))
    return node, card


def _operator_on_its_token(cp: ControlPlane, token: str, tmp_path: Path) -> OperatorOptions:
    """The installed operator's options, logged in with its service account's token."""
    kubeconfig = token_kubeconfig(cp, token, tmp_path / "operator.kubeconfig")
    return env.options(
        cp,
        NAMESPACE,
        kubeconfig=kubeconfig,
        config_map="vgpu-device-config",
        standalone=False,
        peering="vgpu-operator",
        inventory_timeout_s=None,
    )


def _claim_body(namespace: str, name: str, memory: str) -> dict[str, object]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.vgpu-operator.io",
                            "capacity": {"requests": {"memory": memory}},
                        },
                    }
                ]
            }
        },
    }


def test_the_operator_allocates_a_claim_on_its_own_token(
    installed: Cluster, operator_token: str, tmp_path: Path
) -> None:
    """The DRA path's reads and writes (slices, classes, claims; the claim's finalizer,
    allocation and reservation; the Binding) are allowed by the manifests' RBAC."""
    cp = installed.cp
    node, card = _one_card_dra_node(cp, "gpu-dra")
    namespace = f"team-{uuid.uuid4().hex[:6]}"
    cp.ensure_namespace(namespace)
    cp.create(
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
        _claim_body(namespace, "share", "4Gi"),
    )
    options = _operator_on_its_token(cp, operator_token, tmp_path)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "dra", "namespace": namespace},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "containers": [
                {"name": "main", "image": "cuda", "resources": {"claims": [{"name": "gpu"}]}}
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "share"}],
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
        },
    }
    with OperatorThread(options):
        env.create_pod(cp, pod)
        bound = env.wait_bound(cp, namespace, "dra", 90)
    assert bound["spec"]["nodeName"] == node
    claim = cp.get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/share")
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (node, card.name)
    assert claim["status"]["reservedFor"][0]["name"] == "dra"
    assert "resource.kubernetes.io/delete-protection" in claim["metadata"]["finalizers"]


def test_the_operator_makes_a_pods_special_claim_on_its_own_token(
    installed: Cluster, operator_token: str, tmp_path: Path
) -> None:
    """With examples/dra/extended-resource.yaml applied, a plain nvidia.com/gpu pod is
    served through its special claim: the claim's create, its allocation and the pod's
    extendedResourceClaimStatus are allowed by the manifests' RBAC and claim policies."""
    cp = installed.cp
    node, card = _one_card_dra_node(cp, "gpu-ext")
    namespace = f"team-{uuid.uuid4().hex[:6]}"
    cp.ensure_namespace(namespace)
    options = _operator_on_its_token(cp, operator_token, tmp_path)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain", "namespace": namespace},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "cuda",
                    "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}},
                }
            ],
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
        },
    }
    applied = installed.run(["apply", "-f", "examples/dra/extended-resource.yaml"])
    assert applied.returncode == 0, applied.stderr
    try:
        with OperatorThread(options):
            env.create_pod(cp, pod)
            bound = env.wait_bound(cp, namespace, "plain", 90)
    finally:
        restored = installed.run(["apply", "-f", "manifests/dra-deviceclasses.yaml"])
        assert restored.returncode == 0, restored.stderr
    assert bound["spec"]["nodeName"] == node
    name = bound["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    claim = cp.get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert (result["pool"], result["device"]) == (node, card.name)
    assert claim["metadata"]["ownerReferences"][0]["uid"] == bound["metadata"]["uid"]
