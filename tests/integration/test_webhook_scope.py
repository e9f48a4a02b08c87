"""The manifests' webhook configuration, on the real API server, in front of a hung operator:
only pods that name a managed resource are sent to it (matchConditions), and those are
still created when it does not answer (failurePolicy Ignore, a short timeout).

The "operator" here is an HTTPS server that reads each request and never answers, as a
hung process would; it records what reached it.
"""

from __future__ import annotations

import base64
import copy
import http.server
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from integration import operator_env as env
from integration.test_operator_webhook import make_pki

from vgpu_operator.testing.controlplane import ControlPlane

MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "webhook.yaml"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


@dataclass
class HungWebhook:
    port: int
    release: threading.Event = field(default_factory=threading.Event)
    paths: list[str] = field(default_factory=list)


@pytest.fixture
def hung(tmp_path: Path) -> Iterator[tuple[HungWebhook, bytes]]:
    pki = make_pki(tmp_path)
    state = HungWebhook(port=0)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            state.paths.append(self.path)
            state.release.wait(30)  # hung: the API server gives up first

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki.cert), str(pki.key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, pki.ca.read_bytes()
    finally:
        state.release.set()
        server.shutdown()
        server.server_close()


@pytest.fixture
def manifest_webhook(
    control_plane: ControlPlane, namespace: str, hung: tuple[HungWebhook, bytes]
) -> Iterator[HungWebhook]:
    """manifests/webhook.yaml's configuration, pointed at the hung server, for one namespace."""
    state, ca = hung
    config = next(
        doc
        for doc in yaml.safe_load_all(MANIFEST.read_text())
        if doc["kind"] == "MutatingWebhookConfiguration"
    )
    config = copy.deepcopy(config)
    config["metadata"] = {"name": f"vgpu-scope-{namespace}"}
    for hook in config["webhooks"]:
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{state.port}/mutate-pods",
            "caBundle": base64.b64encode(ca).decode(),
        }
        hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    control_plane.create(WEBHOOKS, config)
    try:
        yield state
    finally:
        control_plane.delete(f"{WEBHOOKS}/{config['metadata']['name']}")
        env.cleanup_group(control_plane, namespace)


def _pod(namespace: str, name: str, resources: dict[str, Any], init: bool = False) -> Any:
    container = {
        "name": "init" if init else "main",
        "image": "registry.invalid/x",
        "resources": resources,
    }
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.invalid/x"}]}
    if init:
        spec["initContainers"] = [container]
    else:
        spec["containers"] = [container]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _wait_configuration_active(cp: ControlPlane, namespace: str, state: HungWebhook) -> None:
    """The API server picks new webhook configurations up asynchronously: until a GPU pod
    reaches the hung server, the test would prove nothing."""
    count = 0

    def reached() -> bool:
        nonlocal count
        count += 1
        pod = _pod(namespace, f"probe-{count}", {"limits": {"nvidia.com/gpu": "1"}})
        cp.create(f"/api/v1/namespaces/{namespace}/pods?dryRun=All", pod)
        return bool(state.paths)

    env.wait_until("the webhook configuration to take effect", reached, 60)


def test_cpu_pods_never_reach_a_hung_webhook_and_gpu_pods_are_still_created(
    control_plane: ControlPlane, namespace: str, manifest_webhook: HungWebhook
) -> None:
    cp, state = control_plane, manifest_webhook
    _wait_configuration_active(cp, namespace, state)
    seen = len(state.paths)
    cpu = {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1"}}
    for i in range(3):
        cp.create(f"/api/v1/namespaces/{namespace}/pods", _pod(namespace, f"cpu-{i}", cpu))
    plain = _pod(namespace, "no-resources", {})
    cp.create(f"/api/v1/namespaces/{namespace}/pods", plain)
    assert len(state.paths) == seen, "a pod without GPU resources was sent to the webhook"

    # Pods that name a managed resource go to the webhook, in containers or init
    # containers, of either vendor; with no answer they are created all the same.
    gpu_pods = {
        "gpu-limits": _pod(namespace, "gpu-limits", {"limits": {"nvidia.com/gpumem": "1024"}}),
        "gpu-init": _pod(namespace, "gpu-init", {"limits": {"nvidia.com/gpu": "1"}}, init=True),
        "dcu": _pod(namespace, "dcu", {"limits": {"hygon.com/dcunum": "1"}}),
    }
    for name, pod in gpu_pods.items():
        before = len(state.paths)
        created = cp.create(f"/api/v1/namespaces/{namespace}/pods", pod)
        assert created["metadata"]["name"] == name
        assert len(state.paths) > before, f"{name} did not reach the webhook"
