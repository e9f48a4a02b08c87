"""A real, throw-away Kubernetes control plane for tests and the demo.

Starts ``etcd`` and ``kube-apiserver`` on loopback with generated certificates (RBAC on), and
optionally ``kwok`` to simulate nodes: nodes annotated ``kwok.x-k8s.io/node: fake`` become Ready,
pods bound to them become Running, and deleted pods go away. By default there is no scheduler, no
kube-controller-manager and no kubelet: pods stay Pending until something binds them, namespaces
never finish deleting and no ``default`` ServiceAccount exists (its admission plugin is off).
A test that needs them asks: :meth:`ControlPlane.start_scheduler` runs kube-scheduler (as the
``system:kube-scheduler`` user, with the RBAC the API server bootstraps for it), and
:meth:`ControlPlane.start_controller_manager` runs kube-controller-manager with only the
controllers named (e.g. ``resourceclaim-controller``, which makes a pod's ResourceClaims from
its templates and releases them when the pod is done).

Modelled on ``kopf.testing`` and envtest. Synchronous on purpose: use it from pytest fixtures::

    with ControlPlane(kwok=True) as cp:
        cp.create_fake_gpu_node("gpu-0", gpus=4)
        os.environ["KUBECONFIG"] = str(cp.kubeconfig_path)

The binaries are found in ``$VGPU_CONTROL_PLANE_BIN_DIR`` (set by the Makefile), else in
``$KUBEBUILDER_ASSETS``, else in the build cache ``${VGPU_CACHE_DIR:-~/.cache/vgpu-operator}/bin``;
``make control-plane-bins`` builds them.

Every process runs in its own process group. A small guardian process kills those groups and
removes the temporary directory if the Python process dies without cleaning up (even SIGKILL);
an ``atexit`` hook stops whatever is still running at a normal interpreter exit.

The parts live beside it: ``binaries`` (finding them), ``pki`` (certificates and
kubeconfigs), ``processes`` (children and the guardian), ``kwok`` (stages and fake nodes),
``errors``; the names below are re-exported so that callers import from here.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import ipaddress
import json
import os
import re
import shutil
import signal
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from vgpu_operator.testing import karpenter, kueue
from vgpu_operator.testing.binaries import Binaries, default_cache_dir, find_binaries, find_tool
from vgpu_operator.testing.errors import JSON, ApiError, BinariesNotFoundError, ControlPlaneError
from vgpu_operator.testing.kwok import (
    FAKE_NODE_ANNOTATION,
    FAKE_NODE_IP,
    KWOK_STAGES,
    POD_CIDR,
    SERVICE_CLUSTER_IP_RANGE,
    fake_gpu_node_manifest,
)
from vgpu_operator.testing.pki import (
    CertificateAuthority,
    ClientCredentials,
    Pki,
    kubeconfig_yaml,
    pem_cert,
    pem_key,
)
from vgpu_operator.testing.processes import ChildProcess, Guardian, free_port, wait_until

__all__ = [
    "FAKE_NODE_ANNOTATION",
    "KWOK_STAGES",
    "ApiError",
    "Binaries",
    "BinariesNotFoundError",
    "ClientCredentials",
    "ControlPlane",
    "ControlPlaneError",
    "default_cache_dir",
    "fake_gpu_node_manifest",
    "find_binaries",
    "find_tool",
    "run_forever",
]

_live: weakref.WeakSet[ControlPlane] = weakref.WeakSet()

# Gang scheduling's API (scheduling.k8s.io/v1beta1 PodGroup and Workload) is beta and off by
# default in 1.37: the gate goes to kube-apiserver, kube-scheduler and kube-controller-manager
# alike (a component without it ignores a pod's spec.schedulingGroup), and the group version
# must be served. DRAWorkloadResourceClaims adds a PodGroup's own ResourceClaims.
WORKLOAD_FEATURE_GATES = "GenericWorkload=true,DRAWorkloadResourceClaims=true"
WORKLOAD_RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true"


@atexit.register
def _stop_all_at_exit() -> None:
    for plane in list(_live):
        with contextlib.suppress(Exception):
            plane.stop()


class ControlPlane:
    """etcd + kube-apiserver (+ kwok) on loopback; a context manager. See the module docstring.

    ``kwok=True`` also starts kwok (or call :meth:`start_kwok` later). ``workdir`` is created
    under ``base_dir`` (default: the system temp dir) and removed by :meth:`stop` unless
    ``keep_workdir``. Logs are ``<workdir>/logs/{etcd,kube-apiserver,kwok}.log``.
    """

    def __init__(
        self,
        *,
        kwok: bool = False,
        binaries: Binaries | None = None,
        base_dir: Path | None = None,
        keep_workdir: bool = False,
        startup_timeout: float = 120.0,
        extra_apiserver_args: Sequence[str] = (),
        kwok_stages: str | None = None,
        kwok_node_lease_s: int = 40,
    ) -> None:
        self._want_kwok = kwok
        # How long KWOK's node Leases last: the shorter, the more renewals. At 2,000 nodes
        # 40 s meant 193 lease writes/s at rest (the bench), about 1,450/s at 15,000: more
        # than a two-core machine's API server carries.
        self._kwok_node_lease_s = kwok_node_lease_s
        self._binaries = binaries
        self._base_dir = base_dir
        self._keep_workdir = keep_workdir
        self.startup_timeout = startup_timeout
        self._extra_apiserver_args = tuple(extra_apiserver_args)
        self._kwok_stages = KWOK_STAGES if kwok_stages is None else kwok_stages
        self._lock = threading.RLock()
        self._guardian: Guardian | None = None
        self._workdir: Path | None = None
        self._pki: Pki | None = None
        self._etcd: ChildProcess | None = None
        self._apiserver: ChildProcess | None = None
        self._kwok: ChildProcess | None = None
        self._scheduler: ChildProcess | None = None
        self._controller_manager: ChildProcess | None = None
        self._kueue: ChildProcess | None = None
        self._karpenter: ChildProcess | None = None
        self._etcd_port = 0
        self._apiserver_port = 0
        self._kwok_port = 0
        self._ssl: ssl.SSLContext | None = None
        self._opener: urllib.request.OpenerDirector | None = None

    # -- context manager ---------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- properties --------------------------------------------------------------------------------

    @property
    def binaries(self) -> Binaries:
        if self._binaries is None:
            self._binaries = find_binaries(need_kwok=self._want_kwok)
        return self._binaries

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise ControlPlaneError("the control plane is not started")
        return self._workdir

    @property
    def server(self) -> str:
        """``https://127.0.0.1:<port>``."""
        if not self._apiserver_port:
            raise ControlPlaneError("the control plane is not started")
        return f"https://127.0.0.1:{self._apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self._etcd_port}"

    @property
    def kubeconfig_path(self) -> Path:
        """A kubeconfig for ``admin`` in ``system:masters`` (certificates embedded)."""
        return self.admin.kubeconfig_path

    @property
    def admin(self) -> ClientCredentials:
        if self._pki is None or self._pki.admin is None:
            raise ControlPlaneError("the control plane is not started")
        return self._pki.admin

    @property
    def ca_path(self) -> Path:
        if self._pki is None:
            raise ControlPlaneError("the control plane is not started")
        return self._pki.ca_path

    @property
    def ca_pem(self) -> bytes:
        if self._pki is None:
            raise ControlPlaneError("the control plane is not started")
        return self._pki.ca_pem

    @property
    def running(self) -> bool:
        return self._apiserver is not None and self._apiserver.alive()

    @property
    def kwok_running(self) -> bool:
        return self._kwok is not None and self._kwok.alive()

    @property
    def pids(self) -> dict[str, int]:
        """Process ids (== process-group ids) of the children that are running now."""
        procs = {
            "etcd": self._etcd,
            "kube-apiserver": self._apiserver,
            "kwok": self._kwok,
            "kube-scheduler": self._scheduler,
            "kube-controller-manager": self._controller_manager,
            "kueue": self._kueue,
            "karpenter": self._karpenter,
        }
        return {name: p.pgid for name, p in procs.items() if p is not None and p.alive()}

    def log_path(self, component: str) -> Path:
        return self.workdir / "logs" / f"{component}.log"

    def env(self) -> dict[str, str]:
        """``os.environ`` plus KUBECONFIG for this cluster and NO_PROXY for loopback."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig_path)
        no_proxy = [p for p in env.get("NO_PROXY", "").split(",") if p]
        env["NO_PROXY"] = ",".join([*no_proxy, "127.0.0.1", "localhost"])
        return env

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._workdir is not None:
                raise ControlPlaneError("already started")
            binaries = self.binaries
            self._guardian = Guardian()
            base = str(self._base_dir) if self._base_dir is not None else None
            self._workdir = Path(tempfile.mkdtemp(prefix="vgpu-control-plane-", dir=base))
            if not self._keep_workdir:
                self._guardian.send(f"+dir {self._workdir}")
            _live.add(self)
            try:
                (self._workdir / "logs").mkdir()
                self._apiserver_port = free_port()
                self._make_pki()
                self._start_etcd(binaries.etcd)
                self._start_apiserver(binaries.kube_apiserver)
                if self._want_kwok:
                    self.start_kwok()
            except BaseException:
                self.stop()
                raise

    def stop(self) -> None:
        """Stop every process started (kube-scheduler, kube-controller-manager, kwok,
        kube-apiserver, etcd) and remove the workdir."""
        with self._lock:
            for attr in (
                "_karpenter",
                "_kueue",
                "_scheduler",
                "_controller_manager",
                "_kwok",
                "_apiserver",
                "_etcd",
            ):
                proc: ChildProcess | None = getattr(self, attr)
                if proc is not None:
                    proc.stop()
                    setattr(self, attr, None)
            if self._workdir is not None and not self._keep_workdir:
                shutil.rmtree(self._workdir, ignore_errors=True)
                if self._guardian is not None:
                    self._guardian.send(f"-dir {self._workdir}")
            if self._guardian is not None:
                self._guardian.close()
                self._guardian = None
            self._workdir = None
            self._pki = None
            self._ssl = None
            self._opener = None
            self._apiserver_port = self._etcd_port = self._kwok_port = 0
            _live.discard(self)

    def restart_apiserver(self, *, down_for: float = 0.0) -> None:
        """Stop kube-apiserver (SIGTERM) and start it again on the same port, etcd and certs."""
        with self._lock:
            if self._apiserver is None:
                raise ControlPlaneError("kube-apiserver is not running")
            self._apiserver.stop()
            self._apiserver = None
            if down_for > 0:
                time.sleep(down_for)
            self._start_apiserver(self.binaries.kube_apiserver)

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver only (see :meth:`start_apiserver`), e.g. to test outages."""
        with self._lock:
            if self._apiserver is not None:
                self._apiserver.stop()
                self._apiserver = None

    def start_apiserver(self) -> None:
        with self._lock:
            if self._apiserver is None:
                self._start_apiserver(self.binaries.kube_apiserver)

    def start_kwok(self) -> None:
        """Start kwok, managing nodes annotated ``kwok.x-k8s.io/node: fake``."""
        with self._lock:
            if self._kwok is not None:
                return
            kwok_bin = self.binaries.kwok
            if kwok_bin is None:
                kwok_bin = find_binaries(need_kwok=True).kwok
                assert kwok_bin is not None
            home = self.workdir / "kwok-home"  # kwok reads ~/.kwok/kwok.yaml if present
            home.mkdir(exist_ok=True)
            stages = self.workdir / "kwok-stages.yaml"
            stages.write_text(self._kwok_stages)
            self._kwok_port = free_port()
            key, value = FAKE_NODE_ANNOTATION
            argv = [
                str(kwok_bin),
                f"--kubeconfig={self.kubeconfig_path}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={key}={value}",
                f"--cidr={POD_CIDR}",
                f"--node-ip={FAKE_NODE_IP}",
                f"--node-lease-duration-seconds={self._kwok_node_lease_s}",
                f"--server-address=127.0.0.1:{self._kwok_port}",
            ]
            env = {**self.env(), "HOME": str(home)}
            self._kwok = self._spawn("kwok", argv, env=env)
            url = f"http://127.0.0.1:{self._kwok_port}/healthz"
            self._wait_healthy("kwok", self._kwok, lambda: _http_ok(url, None))

    def stop_kwok(self) -> None:
        with self._lock:
            if self._kwok is not None:
                self._kwok.stop()
                self._kwok = None

    def start_scheduler(self, binary: Path | None = None) -> None:
        """Start kube-scheduler (default profile, no leader election) as the user
        ``system:kube-scheduler``; returns once it is healthy. ``binary`` defaults to the one
        built beside the control plane (``find_tool``)."""
        with self._lock:
            if self._scheduler is not None:
                return
            creds = self.create_client_credentials("system:kube-scheduler")
            kubeconfig = str(creds.kubeconfig_path)
            config = self.workdir / "kube-scheduler.yaml"
            config.write_text(
                json.dumps(
                    {
                        "apiVersion": "kubescheduler.config.k8s.io/v1",
                        "kind": "KubeSchedulerConfiguration",
                        "clientConnection": {"kubeconfig": kubeconfig},
                        "leaderElection": {"leaderElect": False},
                    }
                )
            )
            port = free_port()
            argv = [
                str(binary or find_tool("kube-scheduler")),
                f"--config={config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--feature-gates={WORKLOAD_FEATURE_GATES}",
                "--v=2",
            ]
            self._scheduler = self._spawn("kube-scheduler", argv, env=self.env())
            self._wait_healthy(
                "kube-scheduler",
                self._scheduler,
                lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", _insecure_ssl()),
            )

    def stop_scheduler(self) -> None:
        with self._lock:
            if self._scheduler is not None:
                self._scheduler.stop()
                self._scheduler = None

    def start_controller_manager(
        self, controllers: Sequence[str], binary: Path | None = None
    ) -> None:
        """Start kube-controller-manager running only ``controllers`` (its ``--controllers``
        names, e.g. ``resourceclaim-controller``, ``garbage-collector-controller``), with the
        admin's credentials (no service-account token controller runs here to give each
        controller its own); returns once it is healthy."""
        with self._lock:
            if self._controller_manager is not None:
                return
            if not controllers:
                raise ControlPlaneError("start_controller_manager needs at least one controller")
            kubeconfig = str(self.kubeconfig_path)
            port = free_port()
            argv = [
                str(binary or find_tool("kube-controller-manager")),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--controllers={','.join(controllers)}",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--feature-gates={WORKLOAD_FEATURE_GATES}",
                "--v=2",
            ]
            self._controller_manager = self._spawn("kube-controller-manager", argv, env=self.env())
            self._wait_healthy(
                "kube-controller-manager",
                self._controller_manager,
                lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", _insecure_ssl()),
            )

    def stop_controller_manager(self) -> None:
        with self._lock:
            if self._controller_manager is not None:
                self._controller_manager.stop()
                self._controller_manager = None

    def start_kueue(
        self,
        binary: Path | None = None,
        *,
        frameworks: Sequence[str] = ("batch/job", "pod"),
        feature_gates: str = "VisibilityOnDemand=false",
        device_class_mappings: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """Install Kueue's CRDs and webhook configurations and start its controller manager
        (``make kueue``; ``testing/kueue.py`` says how its webhooks and certificates are
        served), with the ResourceTransformation of its HAMi guide and the ``frameworks``
        integrations; returns once it is ready. Its pod webhook then gates every pod
        created outside kube-system and kueue-system that names a queue: a control plane
        that runs Kueue should serve only the tests that want it."""
        with self._lock:
            if self._kueue is not None:
                return
            kueue_bin = binary or find_tool("kueue")
            beside = kueue_bin.resolve().parent
            certs = kueue.make_certs()
            cert_dir = self.workdir / "kueue-certs"
            cert_dir.mkdir(mode=0o700, exist_ok=True)
            (cert_dir / "tls.crt").write_bytes(certs.cert_pem)
            _write_private(cert_dir / "tls.key", certs.key_pem)
            webhook_port, health_port = free_port(), free_port()
            self.ensure_namespace(kueue.NAMESPACE)
            secrets = f"/api/v1/namespaces/{kueue.NAMESPACE}/secrets"
            self.create(secrets, kueue.secret_manifest(certs))
            crds = list(kueue.crd_manifests(beside / "crd", webhook_port, certs.ca_pem))
            for crd in crds:
                self.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            for crd in crds:
                self._wait_established(crd["metadata"]["name"])
            for config in kueue.webhook_manifests(
                beside / "webhooks.yaml", webhook_port, certs.ca_pem
            ):
                plural = (
                    "mutatingwebhookconfigurations"
                    if config["kind"] == "MutatingWebhookConfiguration"
                    else "validatingwebhookconfigurations"
                )
                self.create(f"/apis/admissionregistration.k8s.io/v1/{plural}", config)
            config_path = self.workdir / "kueue-config.yaml"
            config_path.write_text(
                json.dumps(
                    kueue.configuration(
                        webhook_port=webhook_port,
                        health_port=health_port,
                        cert_dir=cert_dir,
                        frameworks=frameworks,
                        device_class_mappings=device_class_mappings or {},
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
            self._kueue = self._spawn("kueue", argv, env=self.env())
            self._wait_healthy(
                "kueue",
                self._kueue,
                lambda: _http_ok(f"http://127.0.0.1:{health_port}/readyz", None),
            )
            # Its rotator rewrote the CRDs' conversion caBundle: their storage restarts.
            wait_until("Kueue's kinds to be served", self._kueue_served, self.startup_timeout)

    def stop_kueue(self) -> None:
        """Stop Kueue (its webhook configurations stay: pods naming a queue are then
        refused, as in a cluster whose Kueue is down)."""
        with self._lock:
            if self._kueue is not None:
                self._kueue.stop()
                self._kueue = None

    def start_karpenter(
        self,
        instance_types: Path,
        binary: Path | None = None,
        *,
        feature_gates: str | None = None,
    ) -> None:
        """Install Karpenter's CRDs and a KWOKNodeClass (``karpenter.NODE_CLASS``) and start
        its controller with the KWOK provider and ``instance_types`` (``make karpenter``;
        ``testing/karpenter.py`` says what it needs); returns once it is ready. The nodes it
        makes are kwok's (annotated ``kwok.x-k8s.io/node: fake``): start kwok too."""
        with self._lock:
            if self._karpenter is not None:
                return
            karpenter_bin = binary or find_tool("karpenter")
            beside = karpenter_bin.resolve().parent
            crds = list(karpenter.crd_manifests(beside / "crd"))
            for crd in crds:
                self.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            for crd in crds:
                self._wait_established(crd["metadata"]["name"])
            health_port = free_port()
            argv = karpenter.argv(
                karpenter_bin, instance_types, health_port=health_port, feature_gates=feature_gates
            )
            self._karpenter = self._spawn("karpenter", argv, env=self.env())
            self._wait_healthy(
                "karpenter",
                self._karpenter,
                lambda: _http_ok(f"http://127.0.0.1:{health_port}/readyz", None),
            )
            self.create(karpenter.NODE_CLASSES, karpenter.node_class())

    def stop_karpenter(self) -> None:
        """Stop Karpenter (its CRDs and objects stay; the nodes it made stay too)."""
        with self._lock:
            if self._karpenter is not None:
                self._karpenter.stop()
                self._karpenter = None

    def _kueue_served(self) -> bool | None:
        for kind in ("clusterqueues", "workloads", "localqueues", "admissionchecks"):
            try:
                self.get(f"/apis/kueue.x-k8s.io/v1beta2/{kind}?limit=1")
            except ApiError as exc:
                if exc.status in (404, 429, 503):
                    return None
                raise
        return True

    def _wait_established(self, crd: str, timeout: float = 60.0) -> None:
        def check() -> bool | None:
            got = self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
            return True if _condition_true(got, "Established") else None

        wait_until(f"CRD {crd} to be established", check, timeout)

    # -- credentials -------------------------------------------------------------------------------

    def create_client_credentials(self, user: str, groups: Sequence[str] = ()) -> ClientCredentials:
        """A client certificate (CN=user, O=groups) and a kubeconfig using it.

        ``groups=("system:masters",)`` is cluster-admin; otherwise grant RBAC as needed.
        """
        with self._lock:
            if self._pki is None:
                raise ControlPlaneError("the control plane is not started")
            cert_pem, key_pem = self._pki.ca.issue(user, organizations=groups, client=True)
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", user)
            pki_dir = self.workdir / "pki"
            cert_path = pki_dir / f"client-{safe}.crt"
            key_path = pki_dir / f"client-{safe}.key"
            kubeconfig_path = self.workdir / f"{safe}.kubeconfig"
            cert_path.write_bytes(cert_pem)
            _write_private(key_path, key_pem)
            _write_private(
                kubeconfig_path,
                kubeconfig_yaml(self.server, self._pki.ca_pem, cert_pem, key_pem, user).encode(),
            )
            creds = ClientCredentials(
                user=user,
                groups=tuple(groups),
                cert_path=cert_path,
                key_path=key_path,
                kubeconfig_path=kubeconfig_path,
            )
            self._pki.extra[user] = creds
            return creds

    # -- REST --------------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | Sequence[Any] | None = None,
        *,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> JSON:
        """A JSON request as admin. Raises :class:`ApiError` for HTTP status >= 400."""
        opener = self._admin_opener()
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with opener.open(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            with exc:
                text = exc.read().decode(errors="replace")
            raise ApiError(method, path, exc.code, text) from None
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
        except ApiError as exc:
            if missing_ok and exc.status == 404:
                return {}
            raise

    def ensure_namespace(self, name: str) -> JSON:
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        try:
            return self.create("/api/v1/namespaces", body)
        except ApiError as exc:
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
            if not self.kwok_running:
                raise ControlPlaneError("wait_ready=True needs kwok: call start_kwok() first")
            node = self.wait_for_node_ready(name, timeout=timeout)
        return node

    def wait_for_node_ready(self, name: str, *, timeout: float = 60.0) -> JSON:
        def check() -> JSON | None:
            node = self.get(f"/api/v1/nodes/{name}")
            return node if _condition_true(node, "Ready") else None

        return wait_until(f"node {name} to become Ready", check, timeout)

    def wait_for_pod_phase(
        self, namespace: str, name: str, phase: str = "Running", *, timeout: float = 60.0
    ) -> JSON:
        def check() -> JSON | None:
            pod = self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            return pod if pod.get("status", {}).get("phase") == phase else None

        return wait_until(f"pod {namespace}/{name} to reach phase {phase}", check, timeout)

    # -- internals ---------------------------------------------------------------------------------

    def _spawn(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> ChildProcess:
        assert self._guardian is not None
        return ChildProcess(
            name, argv, self.log_path(name), self._guardian, env=env, cwd=self.workdir
        )

    def _wait_healthy(self, what: str, proc: ChildProcess, check: Callable[[], bool]) -> None:
        def alive() -> str | None:
            if proc.alive():
                return None
            return f"{proc.name} exited with status {proc.popen.returncode}"

        try:
            wait_until(
                f"{what} to become healthy",
                lambda: True if check() else None,
                self.startup_timeout,
                alive=alive,
            )
        except ControlPlaneError as exc:
            raise ControlPlaneError(
                f"{exc}\n--- last lines of {proc.log_path.name}:\n{proc.log_tail()}"
            ) from None

    def _make_pki(self) -> None:
        pki_dir = self.workdir / "pki"
        pki_dir.mkdir(mode=0o700)
        ca = CertificateAuthority("vgpu-test-ca", datetime.timedelta(days=30))
        ca_pem = pem_cert(ca.cert)
        ca_path = pki_dir / "ca.crt"
        ca_path.write_bytes(ca_pem)
        service_ip = str(next(ipaddress.ip_network(SERVICE_CLUSTER_IP_RANGE).hosts()))
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
        _write_private(serving_key, key)
        sa = ec.generate_private_key(ec.SECP256R1())
        sa_key, sa_pub = pki_dir / "sa.key", pki_dir / "sa.pub"
        _write_private(sa_key, pem_key(sa))
        sa_pub.write_bytes(
            sa.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        self._pki = Pki(
            ca=ca,
            ca_path=ca_path,
            ca_pem=ca_pem,
            serving_cert=serving_cert,
            serving_key=serving_key,
            sa_key=sa_key,
            sa_pub=sa_pub,
        )
        self._pki.admin = self.create_client_credentials("admin", ("system:masters",))

    def _start_etcd(self, etcd_bin: Path) -> None:
        self._etcd_port = free_port()
        peer = f"http://127.0.0.1:{free_port()}"
        client = self.etcd_url
        argv = [
            str(etcd_bin),
            "--name=test",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=test={peer}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]
        self._etcd = self._spawn("etcd", argv)
        health = f"{client}/health"
        self._wait_healthy("etcd", self._etcd, lambda: _http_ok(health, None, b'"true"'))

    def _apiserver_argv(self, apiserver_bin: Path) -> list[str]:
        assert self._pki is not None
        pki = self._pki
        return [
            str(apiserver_bin),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self._apiserver_port}",
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_path}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-issuer={self.server}",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            # No controller creates the default ServiceAccount or removes the not-ready taint.
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            "--profiling=false",
            # Close watches on SIGTERM instead of waiting up to a minute for them to end.
            "--shutdown-watch-termination-grace-period=2s",
            f"--feature-gates={WORKLOAD_FEATURE_GATES}",
            f"--runtime-config={WORKLOAD_RUNTIME_CONFIG}",
            *self._extra_apiserver_args,
        ]

    def _start_apiserver(self, apiserver_bin: Path) -> None:
        self._apiserver = self._spawn("kube-apiserver", self._apiserver_argv(apiserver_bin))
        self._wait_healthy(
            "kube-apiserver",
            self._apiserver,
            lambda: _http_ok(f"{self.server}/readyz", self._admin_ssl()),
        )

    def _admin_ssl(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = ssl.create_default_context(cafile=str(self.ca_path))
            ctx.load_cert_chain(str(self.admin.cert_path), str(self.admin.key_path))
            self._ssl = ctx
        return self._ssl

    def _admin_opener(self) -> urllib.request.OpenerDirector:
        if self._opener is None:
            self._opener = urllib.request.build_opener(
                urllib.request.ProxyHandler({}),  # never proxy loopback
                urllib.request.HTTPSHandler(context=self._admin_ssl()),
            )
        return self._opener


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _insecure_ssl() -> ssl.SSLContext:
    """For the health checks of kube-scheduler and kube-controller-manager, which serve on
    loopback with a certificate they made themselves at start."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _http_ok(url: str, context: ssl.SSLContext | None, must_contain: bytes = b"") -> bool:
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(url, timeout=5) as resp:
            return bool(resp.status == 200 and must_contain in resp.read())
    except urllib.error.HTTPError as exc:
        exc.close()
        return False
    except OSError:
        return False


def _condition_true(obj: Mapping[str, Any], kind: str) -> bool:
    conditions = obj.get("status", {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


@contextlib.contextmanager
def _terminate_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into SystemExit (so ``finally`` blocks run) while in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_forever(
    *, fake_gpu_nodes: int = 0, gpus_per_node: int = 8, kubeconfig_out: Path | None = None
) -> None:
    """Start a control plane with kwok (and fake GPU nodes) and keep it up until Ctrl-C/SIGTERM."""
    with _terminate_on_sigterm(), ControlPlane(kwok=True) as plane:
        for i in range(fake_gpu_nodes):
            plane.create_fake_gpu_node(f"gpu-node-{i}", gpus=gpus_per_node)
        kubeconfig = plane.kubeconfig_path
        if kubeconfig_out is not None:
            shutil.copyfile(kubeconfig, kubeconfig_out)
            kubeconfig = kubeconfig_out
        print(f"control plane at {plane.server}; export KUBECONFIG={kubeconfig}", flush=True)
        print("press Ctrl-C to stop", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while plane.running:
                time.sleep(1)
