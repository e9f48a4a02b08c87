"""Self-managed webhook TLS on the real API server: with no certificate given, the operator
issues its own CA and serving certificate into a Secret, patches the webhook
configuration's caBundle, and the API server then calls the webhook over verified TLS;
a certificate near expiry is renewed and served without a restart.

The API server reaches the webhook at ``https://localhost:<port>``, so the test names
the webhook Service ``localhost`` (the certificate's first DNS name is the Service name).
"""

from __future__ import annotations

import base64
import datetime
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from integration import operator_env as env
from integration.test_operator_webhook import WEBHOOKS, _free_port

from vgpu_operator.control.options import WebhookOptions
from vgpu_operator.handlers.app import WEBHOOK_ID
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.kube import certs
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane

SECRET = "webhook-tls"


@dataclass
class SelfSigned:
    cp: ControlPlane
    namespace: str
    scheduler: str
    port: int
    configuration: str
    operator: OperatorThread

    @property
    def secret_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets/{SECRET}"

    def secret_tls(self) -> certs.WebhookTls | None:
        try:
            secret = self.cp.get(self.secret_path)
        except AdminRequestError:
            return None
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        return certs.WebhookTls.from_secret_data(data)

    def served_certificate(self) -> bytes:
        """The certificate the webhook presents (empty while its server restarts)."""
        try:
            pem = ssl.get_server_certificate(("127.0.0.1", self.port), timeout=5)
        except OSError:
            return b""
        return pem.encode()


@pytest.fixture
def self_signed(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> Iterator[SelfSigned]:
    cp = control_plane
    scheduler = env.new_scheduler(cp, namespace)
    port = _free_port()
    name = f"vgpu-tls-{namespace}"
    cp.create(
        WEBHOOKS,
        env.pod_webhook_configuration(
            name,
            namespace,
            f"https://localhost:{port}/{WEBHOOK_ID}",
            ca=None,  # the operator fills it in
            timeout_s=5,
        ),
    )
    webhook = WebhookOptions(
        port=port,
        addr="127.0.0.1",
        tls_secret=SECRET,
        service="localhost",
        configuration=name,
        tls_dir=tmp_path / "tls",
        tls_check_interval_s=1.0,
    )
    operator = OperatorThread(env.options(cp, namespace, webhook=webhook)).start()
    try:
        yield SelfSigned(cp, namespace, scheduler, port, name, operator)
    finally:
        operator.stop()
        cp.delete(f"{WEBHOOKS}/{name}")
        env.cleanup_group(cp, namespace)


def _gpu_pod(namespace: str, name: str) -> dict[str, Any]:
    return env.plain_pod(namespace, name, {"nvidia.com/gpu": "1"})


def _routed(s: SelfSigned, name: str) -> bool:
    """A dry-run GPU pod comes back routed to our scheduler: the webhook answered."""
    try:
        pod = s.cp.create(
            f"/api/v1/namespaces/{s.namespace}/pods?dryRun=All", _gpu_pod(s.namespace, name)
        )
    except AdminRequestError:
        return False  # failurePolicy Fail: not reachable or not trusted (yet)
    return bool(pod["spec"].get("schedulerName") == s.scheduler)


def test_the_operator_issues_its_certificate_and_the_api_server_trusts_it(
    self_signed: SelfSigned,
) -> None:
    s = self_signed
    tls = env.wait_until("the TLS Secret", s.secret_tls, 30)
    config = s.cp.get(f"{WEBHOOKS}/{s.configuration}")
    bundle = config["webhooks"][0]["clientConfig"]["caBundle"]
    assert base64.b64decode(bundle) == tls.ca_bundle
    env.wait_until("a GPU pod to be routed over verified TLS", lambda: _routed(s, "p1"), 30)
    assert s.served_certificate().strip() == tls.cert.strip()


def test_a_certificate_near_expiry_is_renewed_and_served_without_a_restart(
    self_signed: SelfSigned,
) -> None:
    s = self_signed
    env.wait_until("the TLS Secret", s.secret_tls, 30)
    # Certificates issued 300 days ago: the serving one has 65 of 365 days left.
    old = certs.plan(
        None,
        certs.service_dns_names("localhost", s.namespace),
        datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=300),
    )
    assert old is not None
    secret = s.cp.get(s.secret_path)
    secret["data"] = {k: base64.b64encode(v).decode() for k, v in old.secret_data().items()}
    s.cp.request("PUT", s.secret_path, secret)

    def renewed() -> certs.WebhookTls | None:
        tls = s.secret_tls()
        if tls is None or tls.cert == old.cert or tls.ca_cert != old.ca_cert:
            return None
        return tls

    fresh = env.wait_until("the operator to renew the certificate", renewed, 30)
    remaining = certs.not_valid_after(fresh.cert) - datetime.datetime.now(datetime.UTC)
    assert remaining > datetime.timedelta(days=300)
    env.wait_until(
        "the renewed certificate to be served",
        lambda: s.served_certificate().strip() == fresh.cert.strip(),
        30,
    )
    # The API server trusts it: the bundle now holds the CA that signed it.
    env.wait_until("a GPU pod to be routed after renewal", lambda: _routed(s, "p2"), 30)
    assert s.operator.alive
