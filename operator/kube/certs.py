"""The webhook's own CA and serving certificate, made with ``cryptography`` (no I/O).

For installs without cert-manager: the operator keeps a CA and a serving certificate for
its webhook Service in one Secret, and renews them before they expire. ``plan`` decides,
from what the Secret holds now, whether anything must be (re)issued:

- the serving certificate is renewed, by the same CA, when less than a third of its
  lifetime is left or it does not name the Service; the CA bundle does not change, so
  the API server never sees an unknown certificate;
- the CA is replaced when less than a third of its lifetime is left; the previous CA
  stays in the bundle until it expires, so certificates it signed stay trusted while the
  other replica still serves one.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_LIFETIME: Final = datetime.timedelta(days=3650)
SERVING_LIFETIME: Final = datetime.timedelta(days=365)
#: Renew when less than this share of a certificate's lifetime is left.
RENEW_FRACTION: Final = 1 / 3
#: Clock skew the API server may have relative to us.
BACKDATE: Final = datetime.timedelta(minutes=5)

# Keys of the Secret (type kubernetes.io/tls, as cert-manager writes it, plus the CA key).
TLS_CRT: Final = "tls.crt"
TLS_KEY: Final = "tls.key"
CA_CRT: Final = "ca.crt"
CA_KEY: Final = "ca.key"
#: The CA bundle for the webhook configuration: the current CA, then a previous one.
CA_BUNDLE: Final = "ca-bundle.crt"


@dataclass(frozen=True, slots=True)
class WebhookTls:
    """PEM texts: what the server presents and what the API server must trust."""

    cert: bytes
    key: bytes
    ca_cert: bytes
    ca_key: bytes
    ca_bundle: bytes

    def secret_data(self) -> dict[str, bytes]:
        return {
            TLS_CRT: self.cert,
            TLS_KEY: self.key,
            CA_CRT: self.ca_cert,
            CA_KEY: self.ca_key,
            CA_BUNDLE: self.ca_bundle,
        }

    @classmethod
    def from_secret_data(cls, data: Mapping[str, bytes]) -> WebhookTls | None:
        """The Secret's certificates, or None when a key is missing or unreadable."""
        try:
            tls = cls(data[TLS_CRT], data[TLS_KEY], data[CA_CRT], data[CA_KEY], data[CA_BUNDLE])
            x509.load_pem_x509_certificate(tls.cert)
            x509.load_pem_x509_certificate(tls.ca_cert)
            serialization.load_pem_private_key(tls.key, None)
            serialization.load_pem_private_key(tls.ca_key, None)
        except (KeyError, ValueError, TypeError):
            return None
        return tls


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names the API server may use for a Service (it uses ``<svc>.<ns>.svc``)."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def plan(
    current: WebhookTls | None, dns_names: Sequence[str], now: datetime.datetime
) -> WebhookTls | None:
    """What the Secret should hold now, or None when ``current`` is still good."""
    if current is not None and _fresh(current.ca_cert, now):
        if _fresh(current.cert, now) and _names_of(current.cert) >= set(dns_names):
            return None
        cert, key = _issue_serving(current.ca_cert, current.ca_key, dns_names, now)
        return WebhookTls(cert, key, current.ca_cert, current.ca_key, current.ca_bundle)
    ca_cert, ca_key = _issue_ca(now)
    cert, key = _issue_serving(ca_cert, ca_key, dns_names, now)
    bundle = ca_cert
    if current is not None and _valid(current.ca_cert, now):
        bundle += current.ca_cert  # certificates of the old CA stay trusted until it expires
    return WebhookTls(cert, key, ca_cert, ca_key, bundle)


def not_valid_after(pem: bytes) -> datetime.datetime:
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc


def _valid(pem: bytes, now: datetime.datetime) -> bool:
    return now < not_valid_after(pem)


def _fresh(pem: bytes, now: datetime.datetime) -> bool:
    cert = x509.load_pem_x509_certificate(pem)
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    return cert.not_valid_after_utc - now > lifetime * RENEW_FRACTION


def _names_of(pem: bytes) -> set[str]:
    cert = x509.load_pem_x509_certificate(pem)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(sans.get_values_for_type(x509.DNSName))


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def signing_key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """A key that signs (ECDSA: no encipherment); a CA's also signs certificates and CRLs."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def new_ca(
    common_name: str, not_before: datetime.datetime, not_after: datetime.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed ECDSA P-256 CA that signs leaf certificates only (the project's
    single CA builder: the webhook's, and the test control plane's)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(signing_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _issue_ca(now: datetime.datetime) -> tuple[bytes, bytes]:
    cert, key = new_ca("vgpu-operator-webhook-ca", now - BACKDATE, now + CA_LIFETIME)
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _issue_serving(
    ca_pem: bytes, ca_key_pem: bytes, dns_names: Sequence[str], now: datetime.datetime
) -> tuple[bytes, bytes]:
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the webhook CA key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    # Never valid beyond the CA that signs it.
    expires = min(now + SERVING_LIFETIME, ca.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(expires)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)
