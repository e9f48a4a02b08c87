"""The test control plane itself: API, RBAC, kwok nodes and pods, restart, clean shutdown."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from vgpu_operator.testing.controlplane import (
    AdminRequestError,
    Binaries,
    ControlPlane,
    fake_gpu_node_manifest,
)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _pod(name: str, node: str | None) -> dict[str, object]:
    spec: dict[str, object] = {"containers": [{"name": "main", "image": "registry.invalid/x:1"}]}
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _live_pids_in_groups(pgids: set[int]) -> list[int]:
    """Processes (not zombies) whose process group is one of ``pgids``."""
    live = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces, so split after ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) in pgids:
            live.append(int(entry.name))
    return live


def _wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return bool(predicate())


def test_api_is_reachable(control_plane: ControlPlane) -> None:
    version = control_plane.get("/version")
    assert version["major"] == "1"
    assert version["gitVersion"].startswith("v1.")
    assert control_plane.server.startswith("https://127.0.0.1:")
    assert control_plane.kubeconfig_path.is_file()
    # The whole API is served: discovery for core and a few groups the operator uses.
    groups = {g["name"] for g in control_plane.get("/apis")["groups"]}
    wanted = {"apps", "coordination.k8s.io", "apiextensions.k8s.io", "rbac.authorization.k8s.io"}
    assert wanted <= groups


def test_rbac_is_enforced_for_extra_credentials(control_plane: ControlPlane) -> None:
    creds = control_plane.create_client_credentials(_unique("nobody"), groups=("testers",))
    assert creds.kubeconfig_path.is_file()
    config = json.loads(creds.kubeconfig_path.read_text())
    assert config["clusters"][0]["cluster"]["server"] == control_plane.server

    ctx = ssl.create_default_context(cafile=str(control_plane.ca_path))
    ctx.load_cert_chain(str(creds.cert_path), str(creds.key_path))
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx)
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        opener.open(f"{control_plane.server}/api/v1/nodes", timeout=10)
    info.value.close()
    assert info.value.code == 403


def test_namespace_can_be_created(control_plane: ControlPlane) -> None:
    name = _unique("ns")
    created = control_plane.ensure_namespace(name)
    assert created["metadata"]["name"] == name
    assert control_plane.get(f"/api/v1/namespaces/{name}")["status"]["phase"] == "Active"
    # Idempotent.
    assert control_plane.ensure_namespace(name)["metadata"]["name"] == name


def test_fake_gpu_node_becomes_ready(control_plane: ControlPlane) -> None:
    name = _unique("gpu-node")
    node = control_plane.create_fake_gpu_node(
        name,
        gpus=4,
        labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        annotations={"example.com/note": "x"},
    )
    try:
        status = node["status"]
        assert status["capacity"]["nvidia.com/gpu"] == "4"
        assert status["allocatable"]["nvidia.com/gpu"] == "4"
        assert status["allocatable"]["cpu"] == "64"
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        # TaintNodesByCondition is off: no node.kubernetes.io/not-ready taint to work around.
        assert not node.get("spec", {}).get("taints")
    finally:
        control_plane.delete(f"/api/v1/nodes/{name}")


def test_nodes_without_the_annotation_are_not_managed(control_plane: ControlPlane) -> None:
    name = _unique("real-node")
    manifest = fake_gpu_node_manifest(name)
    del manifest["metadata"]["annotations"]["kwok.x-k8s.io/node"]
    control_plane.create("/api/v1/nodes", manifest)
    try:
        time.sleep(2)
        node = control_plane.get(f"/api/v1/nodes/{name}")
        assert not node["status"].get("conditions")
    finally:
        control_plane.delete(f"/api/v1/nodes/{name}")


def test_bound_pod_becomes_running_and_is_deleted(
    control_plane: ControlPlane, namespace: str
) -> None:
    node = _unique("gpu-node")
    control_plane.create_fake_gpu_node(node, gpus=2)
    try:
        pods = f"/api/v1/namespaces/{namespace}/pods"
        control_plane.create(pods, _pod("bound", node))
        pod = control_plane.wait_for_pod_phase(namespace, "bound", "Running", timeout=30)
        assert pod["status"]["podIP"].startswith("10.244.")
        assert pod["status"]["containerStatuses"][0]["ready"] is True

        # No scheduler: an unbound pod stays Pending.
        control_plane.create(pods, _pod("unbound", None))
        time.sleep(1)
        assert control_plane.get(f"{pods}/unbound")["status"]["phase"] == "Pending"

        # kwok's pod-delete stage finishes graceful deletion (there is no kubelet).
        control_plane.delete(f"{pods}/bound")

        def gone() -> bool:
            try:
                control_plane.get(f"{pods}/bound")
            except AdminRequestError as exc:
                return exc.status == 404
            return False

        assert _wait_for(gone, timeout=30)
    finally:
        control_plane.delete(f"/api/v1/nodes/{node}")


def test_separate_instance_restart_and_clean_stop(control_plane_binaries: Binaries) -> None:
    plane = ControlPlane(kwok=True, binaries=control_plane_binaries)
    with plane:
        workdir = plane.workdir
        pids = plane.pids
        assert set(pids) == {"etcd", "kube-apiserver", "kwok"}
        server = plane.server
        plane.ensure_namespace("survives-restart")
        plane.create_fake_gpu_node("before-restart", gpus=1)

        old_apiserver = pids["kube-apiserver"]
        plane.restart_apiserver()
        assert plane.server == server
        assert plane.pids["kube-apiserver"] != old_apiserver
        assert plane.get("/api/v1/namespaces/survives-restart")["metadata"]["name"]
        # kwok reconnects by itself and keeps managing nodes.
        plane.create_fake_gpu_node("after-restart", gpus=1, timeout=60)
        assert plane.kwok_running
    assert not plane.running
    assert not workdir.exists()
    assert _wait_for(lambda: not _live_pids_in_groups(set(pids.values())), timeout=5)


_CHILD = """
import json, sys, time
from vgpu_operator.testing.controlplane import Binaries, ControlPlane
from pathlib import Path
b = json.loads(sys.argv[1])
plane = ControlPlane(binaries=Binaries(Path(b[0]), Path(b[1]), None))
plane.start()
print(json.dumps({"pids": plane.pids, "workdir": str(plane.workdir)}), flush=True)
time.sleep(600)
"""


def test_nothing_survives_a_killed_test_process(control_plane_binaries: Binaries) -> None:
    """SIGKILL the Python process that owns a control plane: the guardian cleans up."""
    b = control_plane_binaries
    argv = [sys.executable, "-c", _CHILD, json.dumps([str(b.kube_apiserver), str(b.etcd)])]
    # The child imports vgpu_operator like we do; leave out a repository root, whose operator/
    # directory would shadow the standard library's `operator` module.
    path = [p for p in sys.path if p and not Path(p, "operator", "__init__.py").exists()]
    env = {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONPATH": os.pathsep.join(path)}
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env) as child:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, "the child did not start a control plane"
        info = json.loads(line)
        groups = set(info["pids"].values())
        assert _live_pids_in_groups(groups)
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert _wait_for(lambda: not _live_pids_in_groups(groups), timeout=20)
    assert _wait_for(lambda: not Path(info["workdir"]).exists(), timeout=20)
