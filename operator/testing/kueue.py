"""Kueue's controller manager on the test control plane (``ControlPlane.start_kueue``).

Built from source by ``hack/control-plane/build.sh kueue`` (``make kueue``) with its CRDs
(``kueue-crd/``) and webhook configurations (``kueue-webhooks.yaml``) copied beside it
from the same module. Kueue runs with its webhooks on: its pod webhook is what puts the
``kueue.x-k8s.io/admission`` scheduling gate on a queued pod, and its Workload and
ClusterQueue webhooks default and validate them.

Certificates. Kueue's own certificate management (on by default) is kept on, because
without it Kueue reads its metrics certificate from a fixed path under ``/etc``; but its
rotator is handed a certificate made here instead of making one: before Kueue starts, the
Secret it keeps them in (``kueue-webhook-server-cert``) already holds a CA (RSA, as the
rotator reads it, and valid for more than its 90 days of look-ahead) and a serving
certificate for both the Service name the rotator checks and ``127.0.0.1``; the same files
are in its ``certDir``. The rotator finds them valid and keeps them, and injects that CA
into the webhook configurations and CRD conversion webhooks, which call Kueue on loopback
by URL (no Service, no kube-proxy here).
"""

from __future__ import annotations

import base64
import copy
import datetime
import ipaddress
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vgpu_operator.devices import nvidia
from vgpu_operator.testing.errors import JSON, AdminRequestError
from vgpu_operator.testing.pki import write_private
from vgpu_operator.testing.processes import free_port

NAMESPACE: Final = "kueue-system"
SERVICE: Final = "kueue-webhook-service"
SECRET: Final = "kueue-webhook-server-cert"
MUTATING: Final = "kueue-mutating-webhook-configuration"
VALIDATING: Final = "kueue-validating-webhook-configuration"
#: The CRDs whose conversion webhook Kueue's rotator injects its CA into (it fails its
#: readiness when one has none).
CONVERTED: Final = (
    "localqueues.kueue.x-k8s.io",
    "clusterqueues.kueue.x-k8s.io",
    "workloads.kueue.x-k8s.io",
    "cohorts.kueue.x-k8s.io",
    "multikueueclusters.kueue.x-k8s.io",
)
#: Webhooks kept: Kueue's own kinds, Jobs and Pods (the integrations the tests enable; a
#: webhook of an integration that is off has no handler and would refuse its kind).
_KEPT_PATHS: Final = ("kueue-x-k8s-io", "-batch-v1-job", "--v1-pod")
#: The ResourceTransformation of Kueue's guide for HAMi's resources: per-card memory and
#: cores times the number of cards, as one total each.
HAMI_TRANSFORMATIONS: Final = (
    {
        "input": nvidia.CORES_RESOURCE,
        "strategy": "Replace",
        "multiplyBy": nvidia.COUNT_RESOURCE,
        "outputs": {nvidia.TOTAL_CORES_RESOURCE: "1"},
    },
    {
        "input": nvidia.MEMORY_RESOURCE,
        "strategy": "Replace",
        "multiplyBy": nvidia.COUNT_RESOURCE,
        "outputs": {nvidia.TOTAL_MEMORY_RESOURCE: "1"},
    },
)
_SYSTEM_NAMESPACES: Final = {
    "matchExpressions": [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", NAMESPACE],
        }
    ]
}


#: kwok's stages for a pod being deleted while a finalizer holds it (Kueue's
#: ``kueue.x-k8s.io/managed`` on the pods it manages): as kubelet does, the pod is moved to
#: a terminal phase first (Failed); Kueue then drops its finalizer and the pod goes.
_TERMINATE_STAGE: Final = """---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-terminate-held
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'Exists'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Pending'
      - 'Running'
  next:
    statusTemplate: |
      phase: Failed
      reason: Terminated
"""


def kwok_stages(base: str) -> str:
    """``base`` (the test control plane's stages) with pods held by a finalizer terminated
    when deleted, and deleted only once no finalizer holds them."""
    delete_at = base.index("name: pod-delete")
    selector = "    - key: '.metadata.deletionTimestamp'\n      operator: 'Exists'\n"
    at = base.index(selector, delete_at) + len(selector)
    no_finalizer = "    - key: '.metadata.finalizers'\n      operator: 'DoesNotExist'\n"
    return base[:at] + no_finalizer + base[at:].rstrip("\n") + "\n" + _TERMINATE_STAGE


@dataclass(frozen=True, slots=True)
class KueueCerts:
    ca_pem: bytes
    ca_key_pem: bytes
    cert_pem: bytes
    key_pem: bytes


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(parts)


def _pkcs1(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def make_certs(valid_days: int = 365) -> KueueCerts:
    """A CA as Kueue's rotator makes one (CN and DNS name ``kueue-ca``, RSA) and a serving
    certificate for the webhook Service's name and ``127.0.0.1``."""
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=valid_days)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = _name("kueue-ca", "kueue")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("kueue-ca")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    dns = f"{SERVICE}.{NAMESPACE}.svc"
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(dns))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(dns), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return KueueCerts(ca.public_bytes(pem), _pkcs1(ca_key), cert.public_bytes(pem), _pkcs1(key))


def secret_manifest(certs: KueueCerts) -> dict[str, Any]:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": NAMESPACE},
        "data": {
            "ca.crt": b64(certs.ca_pem),
            "ca.key": b64(certs.ca_key_pem),
            "tls.crt": b64(certs.cert_pem),
            "tls.key": b64(certs.key_pem),
        },
    }


def crd_manifests(crd_dir: Path, port: int, ca_pem: bytes) -> Iterator[dict[str, Any]]:
    """Kueue's CRDs, those it converts calling it on loopback."""
    for path in sorted(crd_dir.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                continue
            if doc["metadata"]["name"] in CONVERTED:
                doc["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{port}/convert",
                            "caBundle": base64.b64encode(ca_pem).decode(),
                        },
                        "conversionReviewVersions": ["v1"],
                    },
                }
            yield doc


def webhook_manifests(path: Path, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Kueue's mutating and validating configurations, by URL on loopback, the kept
    webhooks only, its pod webhooks away from the system namespaces (as its kustomization
    sets them)."""
    out: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(path.read_text()):
        if not isinstance(doc, dict):
            continue
        kind = doc.get("kind")
        if kind not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        config = copy.deepcopy(doc)
        config["metadata"] = {
            "name": MUTATING if kind == "MutatingWebhookConfiguration" else VALIDATING
        }
        hooks = []
        for hook in config.get("webhooks") or ():
            hook_path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path", "")
            if not any(p in hook_path for p in _KEPT_PATHS):
                continue
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{hook_path}",
                "caBundle": base64.b64encode(ca_pem).decode(),
            }
            if hook_path.endswith("--v1-pod"):
                hook["namespaceSelector"] = copy.deepcopy(_SYSTEM_NAMESPACES)
            hooks.append(hook)
        config["webhooks"] = hooks
        out.append(config)
    return out


def configuration(
    *,
    webhook_port: int,
    health_port: int,
    cert_dir: Path,
    frameworks: Sequence[str] = ("batch/job", "pod"),
    transformations: Sequence[Mapping[str, Any]] = HAMI_TRANSFORMATIONS,
    device_class_mappings: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Kueue's Configuration (``config.kueue.x-k8s.io/v1beta2``) for one test cluster.
    ``device_class_mappings``: resource name -> the DeviceClasses Kueue counts as it
    (its ``DynamicResourceAllocation`` gate counts claims only through them)."""
    resources: dict[str, Any] = {"transformations": [dict(t) for t in transformations]}
    if device_class_mappings:
        resources["deviceClassMappings"] = [
            {"name": name, "deviceClassNames": list(classes)}
            for name, classes in device_class_mappings.items()
        ]
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        # "0": no metrics server (nothing here scrapes it).
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": SERVICE,
            "webhookSecretName": SECRET,
        },
        "integrations": {"frameworks": list(frameworks)},
        "managedJobsNamespaceSelector": copy.deepcopy(_SYSTEM_NAMESPACES),
        "resources": resources,
    }


class KueueApi(Protocol):
    """The control plane's calls that installing Kueue makes (``ControlPlane``)."""

    def get(self, path: str) -> JSON: ...
    def create(self, path: str, body: Mapping[str, Any]) -> JSON: ...
    def ensure_namespace(self, name: str) -> JSON: ...
    def wait_established(self, crd: str, timeout: float = 60.0) -> None: ...


def install(
    api: KueueApi,
    workdir: Path,
    kueue_bin: Path,
    *,
    frameworks: Sequence[str],
    feature_gates: str,
    device_class_mappings: Mapping[str, Sequence[str]],
) -> tuple[list[str], int]:
    """Kueue's certificates (under ``workdir``), Secret, CRDs and webhook configurations
    on the API server, and its configuration file: the controller manager's command line
    and the port its readiness is served on."""
    beside = kueue_bin.resolve().parent
    beside = kueue_bin.resolve().parent
    certs = make_certs()
    cert_dir = workdir / "kueue-certs"
    cert_dir.mkdir(mode=0o700, exist_ok=True)
    (cert_dir / "tls.crt").write_bytes(certs.cert_pem)
    write_private(cert_dir / "tls.key", certs.key_pem)
    webhook_port, health_port = free_port(), free_port()
    api.ensure_namespace(NAMESPACE)
    secrets = f"/api/v1/namespaces/{NAMESPACE}/secrets"
    api.create(secrets, secret_manifest(certs))
    crds = list(crd_manifests(beside / "crd", webhook_port, certs.ca_pem))
    for crd in crds:
        api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    for crd in crds:
        api.wait_established(crd["metadata"]["name"])
    for config in webhook_manifests(beside / "webhooks.yaml", webhook_port, certs.ca_pem):
        plural = (
            "mutatingwebhookconfigurations"
            if config["kind"] == "MutatingWebhookConfiguration"
            else "validatingwebhookconfigurations"
        )
        api.create(f"/apis/admissionregistration.k8s.io/v1/{plural}", config)
    config_path = workdir / "kueue-config.yaml"
    config_path.write_text(
        json.dumps(
            configuration(
                webhook_port=webhook_port,
                health_port=health_port,
                cert_dir=cert_dir,
                frameworks=frameworks,
                device_class_mappings=device_class_mappings,
            )
        )
    )
    argv = [
        str(kueue_bin),
        f"--config={config_path}",
        f"--feature-gates={feature_gates}",
        f"--visibility-server-port={free_port()}",
        "--zap-log-level=2",
    ]
    return argv, health_port


def served(api: KueueApi) -> bool | None:
    for kind in ("clusterqueues", "workloads", "localqueues", "admissionchecks"):
        try:
            api.get(f"/apis/kueue.x-k8s.io/v1beta2/{kind}?limit=1")
        except AdminRequestError as exc:
            if exc.status in (404, 429, 503):
                return None
            raise
    return True
