"""The admin's REST calls on a test control plane (JSON over HTTPS, as ``system:masters``),
and the waits built on them; ``ControlPlane`` serves them (``controlplane.py``)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vgpu_operator.testing.errors import JSON, AdminRequestError, ControlPlaneError
from vgpu_operator.testing.kwok import fake_gpu_node_manifest
from vgpu_operator.testing.pki import ClientCredentials
from vgpu_operator.testing.processes import wait_until


class AdminRest:
    """REST as the admin of a running API server; ``target`` says which (the control
    plane's), ``forget_connection`` after it restarts with new certificates."""

    _ssl: ssl.SSLContext | None = None
    _opener: urllib.request.OpenerDirector | None = None

    def target(self) -> tuple[str, Path, ClientCredentials]:
        """The API server's URL, its CA's file and the admin's credentials."""
        raise NotImplementedError

    def kwok_runs(self) -> bool:
        """Whether KWOK manages the fake nodes (they become Ready)."""
        raise NotImplementedError

    def forget_connection(self) -> None:
        self._ssl = None
        self._opener = None

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | Sequence[Any] | None = None,
        *,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> JSON:
        """A JSON request as admin. Raises :class:`AdminRequestError` for HTTP status >= 400."""
        opener = self._admin_opener()
        data = json.dumps(body).encode() if body is not None else None
        server, _, _ = self.target()
        req = urllib.request.Request(server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with opener.open(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            with exc:
                text = exc.read().decode(errors="replace")
            raise AdminRequestError(method, path, exc.code, text) from None
        if not raw:
            return {}
        result = json.loads(raw)
        if not isinstance(result, dict):
            raise ControlPlaneError(f"{method} {path}: expected a JSON object, got {raw[:200]!r}")
        return result

    def get(self, path: str) -> JSON:
        return self.request("GET", path)

    def create(self, path: str, body: Mapping[str, Any]) -> JSON:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Mapping[str, Any]) -> JSON:
        """A JSON merge patch."""
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, *, missing_ok: bool = True) -> JSON:
        try:
            return self.request("DELETE", path)
        except AdminRequestError as exc:
            if missing_ok and exc.status == 404:
                return {}
            raise

    def ensure_namespace(self, name: str) -> JSON:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        try:
            return self.create("/api/v1/namespaces", body)
        except AdminRequestError as exc:
            if exc.status != 409:
                raise
            return self.get(f"/api/v1/namespaces/{name}")

    def create_fake_gpu_node(
        self,
        name: str,
        *,
        gpus: int = 8,
        wait_ready: bool = True,
        timeout: float = 60.0,
        **manifest_kwargs: Any,
    ) -> JSON:
        """Create a kwok-managed node with ``gpus`` x ``nvidia.com/gpu`` (see
        :func:`fake_gpu_node_manifest` for the other keywords) and by default wait until Ready."""
        manifest = fake_gpu_node_manifest(name, gpus=gpus, **manifest_kwargs)
        node = self.create("/api/v1/nodes", manifest)
        wanted = manifest["status"]["capacity"]
        if node.get("status", {}).get("capacity") != wanted:
            node = self.request(
                "PATCH",
                f"/api/v1/nodes/{name}/status",
                {"status": manifest["status"]},
                content_type="application/merge-patch+json",
            )
        if wait_ready:
            if not self.kwok_runs():
                raise ControlPlaneError("wait_ready=True needs kwok: call start_kwok() first")
            node = self.wait_for_node_ready(name, timeout=timeout)
        return node

    def wait_for_node_ready(self, name: str, *, timeout: float = 60.0) -> JSON:
        def check() -> JSON | None:
            node = self.get(f"/api/v1/nodes/{name}")
            return node if condition_true(node, "Ready") else None

        return wait_until(f"node {name} to become Ready", check, timeout)

    def wait_for_pod_phase(
        self, namespace: str, name: str, phase: str = "Running", *, timeout: float = 60.0
    ) -> JSON:
        def check() -> JSON | None:
            pod = self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            return pod if pod.get("status", {}).get("phase") == phase else None

        return wait_until(f"pod {namespace}/{name} to reach phase {phase}", check, timeout)

    def wait_established(self, crd: str, timeout: float = 60.0) -> None:
        def check() -> bool | None:
            got = self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
            return True if condition_true(got, "Established") else None

        wait_until(f"CRD {crd} to be established", check, timeout)

    def admin_ssl(self) -> ssl.SSLContext:
        if self._ssl is None:
            _, ca_path, admin = self.target()
            ctx = ssl.create_default_context(cafile=str(ca_path))
            ctx.load_cert_chain(str(admin.cert_path), str(admin.key_path))
            self._ssl = ctx
        return self._ssl

    def _admin_opener(self) -> urllib.request.OpenerDirector:
        if self._opener is None:
            self._opener = urllib.request.build_opener(
                urllib.request.ProxyHandler({}),  # never proxy loopback
                urllib.request.HTTPSHandler(context=self.admin_ssl()),
            )
        return self._opener


def condition_true(obj: Mapping[str, Any], kind: str) -> bool:
    conditions = obj.get("status", {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)
