"""The self-managed webhook certificates: issued, kept while fresh, renewed in time, and
a CA change that keeps the old CA trusted (kube.certs.plan, no cluster needed)."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

from cryptography import x509

from vgpu_operator.kube import certs

NAMES = certs.service_dns_names("vgpu-operator-webhook", "vgpu-operator")
T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _issue(now: datetime.datetime = T0) -> certs.WebhookTls:
    tls = certs.plan(None, NAMES, now)
    assert tls is not None
    return tls


def test_a_missing_secret_gets_a_ca_and_a_serving_certificate_for_the_service(
    tmp_path: Path,
) -> None:
    tls = _issue()
    cert = x509.load_pem_x509_certificate(tls.cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "vgpu-operator-webhook.vgpu-operator.svc" in sans.get_values_for_type(x509.DNSName)
    assert tls.ca_bundle == tls.ca_cert
    # A TLS client that trusts the bundle accepts the certificate for the Service name.
    (tmp_path / "cert").write_bytes(tls.cert)
    (tmp_path / "key").write_bytes(tls.key)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(tmp_path / "cert", tmp_path / "key")  # key matches cert
    client = ssl.create_default_context(cadata=tls.ca_bundle.decode())
    assert client.verify_mode == ssl.CERT_REQUIRED
    assert cert.issuer == x509.load_pem_x509_certificate(tls.ca_cert).subject


def test_fresh_certificates_are_kept() -> None:
    tls = _issue()
    assert certs.plan(tls, NAMES, T0 + datetime.timedelta(days=200)) is None


def test_a_serving_certificate_near_expiry_is_renewed_by_the_same_ca() -> None:
    tls = _issue()
    later = T0 + datetime.timedelta(days=250)  # 115 of 365 days left: under a third
    renewed = certs.plan(tls, NAMES, later)
    assert renewed is not None
    assert renewed.cert != tls.cert
    assert renewed.ca_cert == tls.ca_cert
    assert renewed.ca_bundle == tls.ca_bundle  # the API server's trust does not change
    assert certs.not_valid_after(renewed.cert) > later + datetime.timedelta(days=300)


def test_a_certificate_missing_the_service_name_is_reissued() -> None:
    tls = _issue()
    other = certs.service_dns_names("renamed", "vgpu-operator")
    assert certs.plan(tls, other, T0) is not None


def test_a_ca_near_expiry_is_replaced_and_the_old_one_stays_trusted() -> None:
    tls = _issue()
    later = T0 + datetime.timedelta(days=2500)  # 1150 of 3650 days left
    replaced = certs.plan(tls, NAMES, later)
    assert replaced is not None
    assert replaced.ca_cert != tls.ca_cert
    assert replaced.ca_bundle == replaced.ca_cert + tls.ca_cert


def test_secret_data_round_trips_and_garbage_reads_as_missing() -> None:
    tls = _issue()
    assert certs.WebhookTls.from_secret_data(tls.secret_data()) == tls
    broken = {**tls.secret_data(), certs.TLS_CRT: b"not a certificate"}
    assert certs.WebhookTls.from_secret_data(broken) is None
    assert certs.WebhookTls.from_secret_data({}) is None
