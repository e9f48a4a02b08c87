"""The mutating webhook, called by the real API server: routing, defaults, quota denial.

Kopf serves the webhook over HTTPS on loopback with certificates made here with
``cryptography`` (Kopf's self-signed path needs oscrypto, broken on this OpenSSL). The
MutatingWebhookConfiguration selects only the test's namespace, so other tests' pods
never reach it.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from integration import operator_env as env

from vgpu_operator import names
from vgpu_operator.control.options import WebhookOptions
from vgpu_operator.handlers.app import WEBHOOK_ID
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane
from vgpu_operator.testing.pki import CertificateAuthority, pem_cert
from vgpu_operator.testing.processes import free_port as _free_port

WEBHOOKS = env.WEBHOOKS


@dataclass(frozen=True)
class Pki:
    ca: Path
    cert: Path
    key: Path


def make_pki(directory: Path) -> Pki:
    """A CA and a serving certificate for 127.0.0.1 / localhost."""
    ca = CertificateAuthority("vgpu-test-webhook-ca", datetime.timedelta(days=1))
    cert, key = ca.issue(
        "127.0.0.1", server=True, dns_names=["localhost"], ip_addresses=["127.0.0.1"]
    )
    pki = Pki(directory / "ca.crt", directory / "webhook.crt", directory / "webhook.key")
    pki.ca.write_bytes(pem_cert(ca.cert))
    pki.cert.write_bytes(cert)
    pki.key.write_bytes(key)
    return pki


@dataclass
class Webhooked:
    cp: ControlPlane
    namespace: str
    scheduler: str
    operator: OperatorThread


@pytest.fixture
def webhooked(control_plane: ControlPlane, namespace: str, tmp_path: Path) -> Iterator[Webhooked]:
    cp = control_plane
    scheduler = env.new_scheduler(cp, namespace)
    pki = make_pki(tmp_path)
    port = _free_port()
    webhook = WebhookOptions(
        port=port, addr="127.0.0.1", certfile=pki.cert, pkeyfile=pki.key, cafile=pki.ca
    )
    config_name = f"vgpu-test-{namespace}"
    operator = OperatorThread(env.options(cp, namespace, webhook=webhook)).start()
    try:
        env.register_pod_webhook(
            cp,
            config_name,
            namespace,
            f"https://127.0.0.1:{port}/{WEBHOOK_ID}",
            pki.ca.read_bytes(),
        )
        _wait_webhook_serving(cp, namespace)
        yield Webhooked(cp, namespace, scheduler, operator)
    finally:
        cp.delete(f"{WEBHOOKS}/{config_name}")
        operator.stop()
        env.cleanup_group(cp, namespace)


def _wait_webhook_serving(cp: ControlPlane, namespace: str) -> None:
    """Until the API server reaches our webhook (a dry-run create goes through it)."""
    probe = env.plain_pod(namespace, "probe", {})

    def reachable() -> bool:
        try:
            cp.create(f"/api/v1/namespaces/{namespace}/pods?dryRun=All", probe)
        except AdminRequestError:
            return False
        return True

    env.wait_until("the webhook to answer", reachable, 30)


def test_gpu_pod_is_routed_to_us_with_defaults_and_bound(webhooked: Webhooked) -> None:
    w = webhooked
    node = f"{w.namespace}-w"
    env.gpu_node(w.cp, node, env.cards(node, 1), group=w.namespace)
    pod = env.plain_pod(w.namespace, "whole-card", {"nvidia.com/gpu": "1"})
    pod["spec"]["nodeSelector"] = {env.TEST_LABEL: w.namespace}
    created = env.create_pod(w.cp, pod)
    assert created["spec"]["schedulerName"] == w.scheduler
    limits = created["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpucores"] == "100"  # a whole card is exclusive
    bound = env.wait_bound(w.cp, w.namespace, "whole-card")
    assert bound["spec"]["nodeName"] == node


def test_memory_only_request_gets_a_gpu_count(webhooked: Webhooked) -> None:
    pod = env.plain_pod(webhooked.namespace, "mem-only", {"nvidia.com/gpumem": "2000"})
    created = env.create_pod(webhooked.cp, pod)
    assert created["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert created["spec"]["schedulerName"] == webhooked.scheduler


def test_pod_without_gpus_is_left_alone(webhooked: Webhooked) -> None:
    created = env.create_pod(
        webhooked.cp, env.plain_pod(webhooked.namespace, "cpu-only", {"cpu": "1"})
    )
    assert created["spec"]["schedulerName"] == "default-scheduler"


def test_pod_over_its_namespace_quota_is_refused(webhooked: Webhooked) -> None:
    w = webhooked
    w.cp.create(
        f"/api/v1/namespaces/{w.namespace}/resourcequotas",
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": w.namespace},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "10000"}},
        },
    )
    state = w.operator.app.running.state
    assert state is not None
    env.wait_until(
        "the operator to know the quota", lambda: w.namespace in state.quota_usage() or None
    )
    pod = env.plain_pod(
        w.namespace, "too-big", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}
    )
    with pytest.raises(AdminRequestError) as denied:
        env.create_pod(w.cp, pod)
    assert denied.value.status == 403
    assert "quota" in str(denied.value).lower()


@pytest.mark.parametrize("gpumem", ["4Gi", "16G", "2147483648", "1e30"])
def test_memory_in_bytes_is_refused_naming_the_unit(webhooked: Webhooked, gpumem: str) -> None:
    pod = env.plain_pod(
        webhooked.namespace, "bytes", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": gpumem}
    )
    with pytest.raises(AdminRequestError) as denied:
        env.create_pod(webhooked.cp, pod)
    assert denied.value.status == 403
    message = str(denied.value)
    assert "nvidia.com/gpumem" in message
    assert "MiB" in message
    assert env.list_pods(webhooked.cp, webhooked.namespace) == []


def test_unreadable_scoring_weights_are_refused(webhooked: Webhooked) -> None:
    pod = env.plain_pod(webhooked.namespace, "weights", {"nvidia.com/gpu": "1"})
    pod["metadata"]["annotations"] = {names.DEVICE_SCORING_WEIGHTS: "slot=lots"}
    with pytest.raises(AdminRequestError) as denied:
        env.create_pod(webhooked.cp, pod)
    assert denied.value.status == 403
    assert names.DEVICE_SCORING_WEIGHTS in str(denied.value)
