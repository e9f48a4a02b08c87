"""Self-managed webhook TLS: the operator's own CA and serving certificate, kept in a Secret.

An install without cert-manager runs the operator with ``--webhook-tls-secret``: every
replica makes sure the Secret holds a CA and a serving certificate for the webhook
Service that are not close to expiry (``kube.certs.plan``; the first replica to write
wins, the others read its result), puts the CA bundle into the
MutatingWebhookConfiguration's ``caBundle``, and writes the certificate and key to files
that Kopf's webhook server reads (it reloads them when they change). The check repeats
every ``interval_s``, so certificates are renewed long before they expire, without a
restart.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog

from vgpu_operator.control.options import OperatorOptions
from vgpu_operator.kube import certs, requests
from vgpu_operator.kube.client import api_client
from vgpu_operator.kube.requests import ApiClient

log = structlog.get_logger("vgpu_operator.webhook_tls")

_WEBHOOK_CONFIGURATIONS: Final = (
    "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
)
_JSON_PATCH: Final = "application/json-patch+json"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True, slots=True)
class TlsTarget:
    """Where the certificates live and whom they serve."""

    namespace: str
    secret: str
    service: str
    #: The MutatingWebhookConfiguration whose caBundle is kept current (None: none).
    configuration: str | None
    directory: Path

    # Both files are read through the link ``current``, which is swapped in one rename, so
    # a reader never pairs a new key with an old certificate.
    @property
    def certfile(self) -> Path:
        return self.directory / "current" / certs.TLS_CRT

    @property
    def keyfile(self) -> Path:
        return self.directory / "current" / certs.TLS_KEY


class SelfManagedTls:
    def __init__(self, target: TlsTarget, *, clock: Callable[[], datetime.datetime] = _now) -> None:
        self.target = target
        self._clock = clock

    async def sync(self, api: ApiClient) -> certs.WebhookTls:
        """One round: Secret, caBundle, files. Raises ``requests.ApiError`` on API faults."""
        tls = await self._settle_secret(api)
        if self.target.configuration is not None:
            await self._patch_ca_bundle(api, tls.ca_bundle)
        self._write_files(tls)
        return tls

    async def keep_fresh(
        self, api: ApiClient, interval_s: float, on_error: Callable[[], None] = lambda: None
    ) -> None:
        """``sync`` every ``interval_s`` forever; failures are logged and retried."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.sync(api)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                on_error()
                log.warning("webhook_tls_sync_failed", error=str(exc))

    # --- the Secret ---------------------------------------------------------------------
    def _secret_path(self, name: str | None = None) -> str:
        base = f"/api/v1/namespaces/{self.target.namespace}/secrets"
        return base if name is None else f"{base}/{name}"

    async def _settle_secret(self, api: ApiClient) -> certs.WebhookTls:
        names = certs.service_dns_names(self.target.service, self.target.namespace)
        for _ in range(3):  # another replica may write between our read and our write
            secret = await self._read_secret(api)
            current = None if secret is None else certs.WebhookTls.from_secret_data(_data(secret))
            wanted = certs.plan(current, names, self._clock())
            if wanted is None:
                assert current is not None
                return current
            try:
                await self._write_secret(api, secret, wanted)
            except requests.ApiError as exc:
                if exc.status == 409:
                    continue  # lost the race: read the winner's certificates
                raise
            log.info(
                "webhook_tls_issued",
                secret=f"{self.target.namespace}/{self.target.secret}",
                new_ca=current is None or current.ca_cert != wanted.ca_cert,
                expires=certs.not_valid_after(wanted.cert).isoformat(),
            )
            return wanted
        raise RuntimeError("the webhook TLS Secret kept changing under us")

    async def _read_secret(self, api: ApiClient) -> dict[str, Any] | None:
        try:
            return await requests.request_json(api, "GET", self._secret_path(self.target.secret))
        except requests.ApiError as exc:
            if exc.status == 404:
                return None
            raise

    async def _write_secret(
        self, api: ApiClient, existing: dict[str, Any] | None, tls: certs.WebhookTls
    ) -> None:
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {
                "name": self.target.secret,
                "namespace": self.target.namespace,
                "labels": {"app.kubernetes.io/part-of": "vgpu-operator"},
            },
            "data": {k: base64.b64encode(v).decode() for k, v in tls.secret_data().items()},
        }
        if existing is None:
            await requests.request_json(api, "POST", self._secret_path(), body=body)
            return
        # Optimistic concurrency: a PUT with the version we read fails with 409 if another
        # replica wrote first.
        body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        await requests.request_json(api, "PUT", self._secret_path(self.target.secret), body=body)

    # --- the webhook configuration ------------------------------------------------------
    async def _patch_ca_bundle(self, api: ApiClient, bundle: bytes) -> None:
        path = f"{_WEBHOOK_CONFIGURATIONS}/{self.target.configuration}"
        try:
            config = await requests.request_json(api, "GET", path)
        except requests.ApiError as exc:
            if exc.status == 404:
                log.warning("webhook_configuration_missing", name=self.target.configuration)
                return
            raise
        wanted = base64.b64encode(bundle).decode()
        ops: list[dict[str, Any]] = []
        for i, hook in enumerate(config.get("webhooks") or []):
            if (hook.get("clientConfig") or {}).get("caBundle") == wanted:
                continue
            # The test guards against a concurrent reordering of the list.
            ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook.get("name")})
            ops.append(
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": wanted}
            )
        if ops:
            await requests.request_json(api, "PATCH", path, body=ops, content_type=_JSON_PATCH)
            log.info("webhook_ca_bundle_patched", name=self.target.configuration)

    # --- files for Kopf's server --------------------------------------------------------
    def _write_files(self, tls: certs.WebhookTls) -> None:
        if self.target.certfile.exists() and self.target.certfile.read_bytes() == tls.cert:
            return
        self.target.directory.mkdir(parents=True, exist_ok=True)
        generation = self.target.directory / f"gen-{uuid.uuid4().hex[:12]}"
        generation.mkdir(mode=0o700)
        _write(generation / certs.TLS_KEY, tls.key, 0o600)
        _write(generation / certs.TLS_CRT, tls.cert, 0o644)
        link = self.target.directory / "current"
        previous = link.resolve() if link.is_symlink() else None
        tmp_link = self.target.directory / f".current-{generation.name}"
        tmp_link.symlink_to(generation.name)
        os.replace(tmp_link, link)
        if previous is not None and previous != generation:
            shutil.rmtree(previous, ignore_errors=True)


def _data(secret: dict[str, Any]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value)
        except (ValueError, TypeError):
            continue
    return out


def _write(path: Path, content: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)


#: Waits between tries to make the certificate files before Kopf starts (then it fails).
_PREPARE_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)


def tls_target(options: OperatorOptions) -> TlsTarget:
    """Where self-managed webhook TLS keeps its certificates (``--webhook-tls-secret``)."""
    webhook = options.webhook
    assert webhook is not None
    assert webhook.tls_secret is not None
    return TlsTarget(
        namespace=options.namespace,
        secret=webhook.tls_secret,
        service=webhook.service,
        configuration=webhook.configuration,
        directory=webhook.tls_dir,
    )


async def prepare_webhook_tls(options: OperatorOptions) -> None:
    """Before Kopf starts its webhook server: the certificate files must exist."""
    if options.webhook is None or options.webhook.tls_secret is None:
        return
    tls = SelfManagedTls(tls_target(options))
    delays = iter(_PREPARE_RETRY_S)
    async with api_client(options.kubeconfig) as api:
        while True:
            try:
                await tls.sync(api)
                return
            except Exception as exc:
                delay = next(delays, None)
                if delay is None:
                    raise
                log.warning("webhook_tls_sync_failed", error=str(exc), retry_after_s=delay)
                await asyncio.sleep(delay)
