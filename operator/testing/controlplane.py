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
kubeconfigs), ``processes`` (children, the guardian, health checks), ``components`` (the
processes' command lines), ``admin_rest`` (the admin's REST calls), ``kwok`` (stages and
fake nodes), ``kueue`` and ``karpenter`` (their installation), ``standalone`` (a plane
kept up by hand), ``errors``; the names below are re-exported so that callers import
from here.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from vgpu_operator.testing import components, karpenter, kueue
from vgpu_operator.testing.admin_rest import AdminRest
from vgpu_operator.testing.binaries import Binaries, default_cache_dir, find_binaries, find_tool
from vgpu_operator.testing.errors import AdminRequestError, BinariesNotFoundError, ControlPlaneError
from vgpu_operator.testing.kwok import (
    FAKE_NODE_ANNOTATION,
    FAKE_NODE_IP,
    KWOK_STAGES,
    POD_CIDR,
    SERVICE_CLUSTER_IP_RANGE,
    fake_gpu_node_manifest,
)
from vgpu_operator.testing.pki import (
    ClientCredentials,
    Pki,
    cluster_pki,
    kubeconfig_yaml,
    write_private,
)
from vgpu_operator.testing.processes import (
    ChildProcess,
    Guardian,
    free_port,
    http_ok,
    insecure_ssl,
    wait_until,
)

__all__ = [
    "FAKE_NODE_ANNOTATION",
    "KWOK_STAGES",
    "AdminRequestError",
    "Binaries",
    "BinariesNotFoundError",
    "ClientCredentials",
    "ControlPlane",
    "ControlPlaneError",
    "default_cache_dir",
    "fake_gpu_node_manifest",
    "find_binaries",
    "find_tool",
]

_live: weakref.WeakSet[ControlPlane] = weakref.WeakSet()
#: Children stopped first to last (each after what depends on it).
_STOP_ORDER: Final = (
    "karpenter",
    "kueue",
    "kube-scheduler",
    "kube-controller-manager",
    "kwok",
    "kube-apiserver",
    "etcd",
)

WORKLOAD_FEATURE_GATES = components.WORKLOAD_FEATURE_GATES
WORKLOAD_RUNTIME_CONFIG = components.WORKLOAD_RUNTIME_CONFIG


@atexit.register
def _stop_all_at_exit() -> None:
    for plane in list(_live):
        with contextlib.suppress(Exception):
            plane.stop()


class ControlPlane(AdminRest):
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
        #: The processes running, by component name (``_STOP_ORDER``'s names).
        self._children: dict[str, ChildProcess] = {}
        self._etcd_port = 0
        self._apiserver_port = 0
        self._kwok_port = 0

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

    def target(self) -> tuple[str, Path, ClientCredentials]:
        return self.server, self.ca_path, self.admin

    def kwok_runs(self) -> bool:
        return self.kwok_running

    @property
    def running(self) -> bool:
        return self._alive("kube-apiserver")

    @property
    def kwok_running(self) -> bool:
        return self._alive("kwok")

    @property
    def pids(self) -> dict[str, int]:
        """Process ids (== process-group ids) of the children that are running now."""
        return {name: p.pgid for name, p in self._children.items() if p.alive()}

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
            for name in _STOP_ORDER:
                self._stop_child(name)
            if self._workdir is not None and not self._keep_workdir:
                shutil.rmtree(self._workdir, ignore_errors=True)
                if self._guardian is not None:
                    self._guardian.send(f"-dir {self._workdir}")
            if self._guardian is not None:
                self._guardian.close()
                self._guardian = None
            self._workdir = None
            self._pki = None
            self.forget_connection()
            self._apiserver_port = self._etcd_port = self._kwok_port = 0
            _live.discard(self)

    def restart_apiserver(self, *, down_for: float = 0.0) -> None:
        """Stop kube-apiserver (SIGTERM) and start it again on the same port, etcd and certs."""
        with self._lock:
            if "kube-apiserver" not in self._children:
                raise ControlPlaneError("kube-apiserver is not running")
            self._stop_child("kube-apiserver")
            if down_for > 0:
                time.sleep(down_for)
            self._start_apiserver(self.binaries.kube_apiserver)

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver only (see :meth:`start_apiserver`), e.g. to test outages."""
        self._stop_child("kube-apiserver")

    def start_apiserver(self) -> None:
        with self._lock:
            if "kube-apiserver" not in self._children:
                self._start_apiserver(self.binaries.kube_apiserver)

    def start_kwok(self) -> None:
        """Start kwok, managing nodes annotated ``kwok.x-k8s.io/node: fake``."""
        with self._lock:
            if "kwok" in self._children:
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
            self._spawn("kwok", argv, env=env)
            url = f"http://127.0.0.1:{self._kwok_port}/healthz"
            self._wait_healthy("kwok", lambda: http_ok(url, None))

    def stop_kwok(self) -> None:
        self._stop_child("kwok")

    def start_scheduler(self, binary: Path | None = None) -> None:
        """Start kube-scheduler (default profile, no leader election) as the user
        ``system:kube-scheduler``; returns once it is healthy. ``binary`` defaults to the one
        built beside the control plane (``find_tool``)."""
        with self._lock:
            if "kube-scheduler" in self._children:
                return
            creds = self.create_client_credentials("system:kube-scheduler")
            port = free_port()
            argv = components.scheduler_argv(
                binary or find_tool("kube-scheduler"),
                self.workdir,
                str(creds.kubeconfig_path),
                port,
            )
            self._run_until("kube-scheduler", argv, f"https://127.0.0.1:{port}/healthz")

    def stop_scheduler(self) -> None:
        self._stop_child("kube-scheduler")

    def start_controller_manager(
        self, controllers: Sequence[str], binary: Path | None = None
    ) -> None:
        """Start kube-controller-manager running only ``controllers`` (its ``--controllers``
        names, e.g. ``resourceclaim-controller``, ``garbage-collector-controller``), with the
        admin's credentials (no service-account token controller runs here to give each
        controller its own); returns once it is healthy."""
        with self._lock:
            if "kube-controller-manager" in self._children:
                return
            if not controllers:
                raise ControlPlaneError("start_controller_manager needs at least one controller")
            port = free_port()
            argv = components.controller_manager_argv(
                binary or find_tool("kube-controller-manager"),
                str(self.kubeconfig_path),
                controllers,
                port,
            )
            self._run_until("kube-controller-manager", argv, f"https://127.0.0.1:{port}/healthz")

    def stop_controller_manager(self) -> None:
        self._stop_child("kube-controller-manager")

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
            if "kueue" in self._children:
                return
            argv, health_port = kueue.install(
                self,
                self.workdir,
                binary or find_tool("kueue"),
                frameworks=frameworks,
                feature_gates=feature_gates,
                device_class_mappings=device_class_mappings or {},
            )
            self._run_until("kueue", argv, f"http://127.0.0.1:{health_port}/readyz")
            # Its rotator rewrote the CRDs' conversion caBundle: their storage restarts.
            wait_until(
                "Kueue's kinds to be served", lambda: kueue.served(self), self.startup_timeout
            )

    def stop_kueue(self) -> None:
        """Stop Kueue (its webhook configurations stay: pods naming a queue are then
        refused, as in a cluster whose Kueue is down)."""
        self._stop_child("kueue")

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
            if "karpenter" in self._children:
                return
            karpenter_bin = binary or find_tool("karpenter")
            beside = karpenter_bin.resolve().parent
            crds = list(karpenter.crd_manifests(beside / "crd"))
            for crd in crds:
                self.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            for crd in crds:
                self.wait_established(crd["metadata"]["name"])
            health_port = free_port()
            argv = karpenter.argv(
                karpenter_bin, instance_types, health_port=health_port, feature_gates=feature_gates
            )
            self._run_until("karpenter", argv, f"http://127.0.0.1:{health_port}/readyz")
            self.create(karpenter.NODE_CLASSES, karpenter.node_class())

    def stop_karpenter(self) -> None:
        """Stop Karpenter (its CRDs and objects stay; the nodes it made stay too)."""
        self._stop_child("karpenter")

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
            write_private(key_path, key_pem)
            write_private(
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

    # -- internals ---------------------------------------------------------------------------------

    def _spawn(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> ChildProcess:
        assert self._guardian is not None
        child = ChildProcess(
            name, argv, self.log_path(name), self._guardian, env=env, cwd=self.workdir
        )
        self._children[name] = child
        return child

    def _alive(self, name: str) -> bool:
        child = self._children.get(name)
        return child is not None and child.alive()

    def _stop_child(self, name: str) -> None:
        with self._lock:
            child = self._children.pop(name, None)
            if child is not None:
                child.stop()

    def _run_until(self, name: str, argv: Sequence[str], url: str) -> None:
        """Start the child ``name`` (with the admin's environment) and wait until ``url``,
        its health or readiness endpoint, answers 200 (HTTPS: unverified, on loopback)."""
        self._spawn(name, argv, env=self.env())
        context = insecure_ssl() if url.startswith("https:") else None
        self._wait_healthy(name, lambda: http_ok(url, context))

    def _wait_healthy(self, what: str, check: Callable[[], bool]) -> None:
        """Wait until the child ``what`` answers ``check``; its log's tail if it dies."""
        proc = self._children[what]

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
        self._pki = cluster_pki(self.workdir, SERVICE_CLUSTER_IP_RANGE)
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
        self._spawn("etcd", argv)
        health = f"{client}/health"
        self._wait_healthy("etcd", lambda: http_ok(health, None, b'"true"'))

    def _start_apiserver(self, apiserver_bin: Path) -> None:
        assert self._pki is not None
        argv = components.apiserver_argv(
            apiserver_bin,
            self._pki,
            etcd_url=self.etcd_url,
            port=self._apiserver_port,
            workdir=self.workdir,
            extra=self._extra_apiserver_args,
        )
        self._spawn("kube-apiserver", argv)
        self._wait_healthy(
            "kube-apiserver",
            lambda: http_ok(f"{self.server}/readyz", self.admin_ssl()),
        )
