"""A test control plane's throw-away PKI: a CA, serving and client certificates, kubeconfigs."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vgpu_operator.kube import certs


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


class CertificateAuthority:
    """An ECDSA P-256 CA that signs serving and client certificates (strict-X.509 compliant)."""

    def __init__(self, common_name: str, validity: datetime.timedelta) -> None:
        self._validity = validity
        now = datetime.datetime.now(datetime.UTC)
        self.cert, self.key = certs.new_ca(
            common_name, now - datetime.timedelta(hours=1), now + validity
        )
        self.ski = x509.SubjectKeyIdentifier.from_public_key(self.key.public_key())

    def issue(
        self,
        common_name: str,
        *,
        organizations: Sequence[str] = (),
        server: bool = False,
        client: bool = False,
        dns_names: Sequence[str] = (),
        ip_addresses: Sequence[str] = (),
    ) -> tuple[bytes, bytes]:
        """Return (certificate PEM, PKCS8 key PEM)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + self._validity)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(certs.signing_key_usage(signs_certificates=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(self.ski),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return pem_cert(cert), pem_key(key)


@dataclass(frozen=True)
class ClientCredentials:
    """A client certificate for ``user`` (CN) in ``groups`` (O), and a kubeconfig that uses it."""

    user: str
    groups: tuple[str, ...]
    cert_path: Path
    key_path: Path
    kubeconfig_path: Path


def kubeconfig_yaml(server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, user: str) -> str:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "vgpu-test",
                "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(cert_pem),
                    "client-key-data": b64(key_pem),
                },
            }
        ],
        "contexts": [{"name": "vgpu-test", "context": {"cluster": "vgpu-test", "user": user}}],
        "current-context": "vgpu-test",
        "preferences": {},
    }
    # JSON is valid YAML; no YAML dependency needed.
    return json.dumps(config, indent=2) + "\n"


@dataclass
class Pki:
    ca: CertificateAuthority
    ca_path: Path
    ca_pem: bytes
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    admin: ClientCredentials | None = None
    extra: dict[str, ClientCredentials] = field(default_factory=dict)


def cluster_pki(workdir: Path, service_ip_range: str) -> Pki:
    """A new CA, kube-apiserver's serving certificate and the service-account key pair,
    under ``workdir/pki`` (the admin's credentials are issued by the caller)."""
    pki_dir = workdir / "pki"
    pki_dir.mkdir(mode=0o700)
    ca = CertificateAuthority("vgpu-test-ca", datetime.timedelta(days=30))
    ca_pem = pem_cert(ca.cert)
    ca_path = pki_dir / "ca.crt"
    ca_path.write_bytes(ca_pem)
    service_ip = str(next(ipaddress.ip_network(service_ip_range).hosts()))
    cert, key = ca.issue(
        "kube-apiserver",
        server=True,
        dns_names=(
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        ip_addresses=("127.0.0.1", service_ip),
    )
    serving_cert, serving_key = pki_dir / "apiserver.crt", pki_dir / "apiserver.key"
    serving_cert.write_bytes(cert)
    write_private(serving_key, key)
    sa = ec.generate_private_key(ec.SECP256R1())
    sa_key, sa_pub = pki_dir / "sa.key", pki_dir / "sa.pub"
    write_private(sa_key, pem_key(sa))
    sa_pub.write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return Pki(
        ca=ca,
        ca_path=ca_path,
        ca_pem=ca_pem,
        serving_cert=serving_cert,
        serving_key=serving_key,
        sa_key=sa_key,
        sa_pub=sa_pub,
    )


def write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
