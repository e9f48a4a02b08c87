"""A real, throw-away Kubernetes control plane for tests and the demo.

Starts ``etcd`` and ``kube-apiserver`` on loopback with generated certificates (RBAC on), and
optionally ``kwok`` to simulate nodes: nodes annotated ``kwok.x-k8s.io/node: fake`` become Ready,
pods bound to them become Running, and deleted pods go away. There is no scheduler, no
kube-controller-manager and no kubelet: pods stay Pending until something binds them, namespaces
never finish deleting and no ``default`` ServiceAccount exists (its admission plugin is off).

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
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, Self, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

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
    "run_forever",
]

JSON = dict[str, Any]
T = TypeVar("T")

BIN_DIR_ENV = "VGPU_CONTROL_PLANE_BIN_DIR"
CACHE_DIR_ENV = "VGPU_CACHE_DIR"
KUBEBUILDER_ASSETS_ENV = "KUBEBUILDER_ASSETS"

#: Marks a node as managed by kwok (``--manage-nodes-with-annotation-selector``).
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
POD_CIDR = "10.244.0.0/16"
FAKE_NODE_IP = "10.1.0.1"

_LOG_TAIL_LINES = 40


class ControlPlaneError(RuntimeError):
    """The control plane could not be started, or a request to it failed."""


class BinariesNotFoundError(ControlPlaneError):
    """kube-apiserver, etcd or kwok is missing; ``make control-plane-bins`` builds them."""


class ApiError(ControlPlaneError):
    """A request made with :meth:`ControlPlane.request` got an unexpected HTTP status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.body = body
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        self.reason: str = parsed.get("reason", "") if isinstance(parsed, dict) else ""
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")


# --------------------------------------------------------------------------------------------------
# Binaries
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    etcd: Path
    kwok: Path | None


def default_cache_dir() -> Path:
    """`$VGPU_CACHE_DIR` or `~/.cache/vgpu-operator`: where `make control-plane-bins` builds."""
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "vgpu-operator"


def _version_key(path: Path) -> tuple[int, ...]:
    # <component>-v1.34.10 -> (1, 34, 10); unparsable names sort first.
    return tuple(int(n) for n in re.findall(r"\d+", path.parent.name.rsplit("-v", 1)[-1]))


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _search_dirs() -> list[tuple[str, Path, tuple[str, ...]]]:
    """(description, directory, binaries it may provide), in order of preference."""
    dirs: list[tuple[str, Path, tuple[str, ...]]] = []
    if env := os.environ.get(BIN_DIR_ENV):
        dirs.append((f"${BIN_DIR_ENV}", Path(env), ("kube-apiserver", "etcd", "kwok", *TOOLS)))
    if env := os.environ.get(KUBEBUILDER_ASSETS_ENV):
        dirs.append((f"${KUBEBUILDER_ASSETS_ENV}", Path(env), ("kube-apiserver", "etcd", "kwok")))
    return dirs


def _find_binary(name: str) -> tuple[Path | None, list[str]]:
    looked: list[str] = []
    for description, directory, provides in _search_dirs():
        if name not in provides:
            continue
        candidate = directory / name
        looked.append(f"{description}={directory}")
        if _is_executable(candidate):
            return candidate, looked
    # The build cache: <cache>/bin/<name>-<version>/<name>, newest version first.
    bin_root = default_cache_dir() / "bin"
    looked.append(f"{bin_root}/{name}-*/")
    cached = sorted(
        (p for p in bin_root.glob(f"{name}-v*/{name}") if _is_executable(p)),
        key=_version_key,
        reverse=True,
    )
    return (cached[0] if cached else None), looked


#: Test tools built beside the control plane (hack/control-plane/build.sh).
TOOLS: Final = ("kubectl", "promtool")


def find_tool(name: str) -> Path:
    """One of ``TOOLS`` (kubectl, promtool), or raise BinariesNotFoundError."""
    path, looked = _find_binary(name)
    if path is None:
        raise BinariesNotFoundError(
            f"{name} not found: looked in {', '.join(looked)}\n"
            "Run `make control-plane-bins` (builds it once beside the control plane)."
        )
    return path


def find_binaries(*, need_kwok: bool = True) -> Binaries:
    """Locate kube-apiserver, etcd and (if ``need_kwok``) kwok, or raise BinariesNotFoundError."""
    found: dict[str, Path | None] = {}
    missing: list[str] = []
    for name in ("kube-apiserver", "etcd", "kwok"):
        path, looked = _find_binary(name)
        found[name] = path
        if path is None and (need_kwok or name != "kwok"):
            missing.append(f"  {name}: looked in {', '.join(looked)}")
    if missing:
        raise BinariesNotFoundError(
            "control-plane binaries not found:\n"
            + "\n".join(missing)
            + "\nRun `make control-plane-bins` (builds them once into "
            f"{default_cache_dir() / 'bin'}; slow the first time), or point "
            f"${BIN_DIR_ENV} or ${KUBEBUILDER_ASSETS_ENV} at a directory that has them."
        )
    apiserver, etcd = found["kube-apiserver"], found["etcd"]
    assert apiserver is not None
    assert etcd is not None
    return Binaries(kube_apiserver=apiserver, etcd=etcd, kwok=found["kwok"])


# --------------------------------------------------------------------------------------------------
# Certificates
# --------------------------------------------------------------------------------------------------


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


class _CertificateAuthority:
    """An ECDSA P-256 CA that signs serving and client certificates (strict-X.509 compliant)."""

    def __init__(self, common_name: str, validity: datetime.timedelta) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self._validity = validity
        now = datetime.datetime.now(datetime.UTC)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        self.ski = x509.SubjectKeyIdentifier.from_public_key(self.key.public_key())
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(self.ski, critical=False)
            .sign(self.key, hashes.SHA256())
        )

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
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
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
        return _pem_cert(cert), _pem_key(key)


@dataclass(frozen=True)
class ClientCredentials:
    """A client certificate for ``user`` (CN) in ``groups`` (O), and a kubeconfig that uses it."""

    user: str
    groups: tuple[str, ...]
    cert_path: Path
    key_path: Path
    kubeconfig_path: Path


def _kubeconfig(server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, user: str) -> str:
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


# --------------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------------

# Runs as a separate process holding the read end of a pipe from us. Lines "+pg N"/"-pg N" and
# "+dir P"/"-dir P" register or forget process groups and directories. At EOF (we closed the pipe
# or died, even by SIGKILL) it kills the remaining groups and removes the remaining directories.
_GUARDIAN = r"""
import os, shutil, signal, sys
groups, dirs = set(), set()
for line in sys.stdin:
    op, _, arg = line.rstrip("\n").partition(" ")
    if op == "+pg": groups.add(int(arg))
    elif op == "-pg": groups.discard(int(arg))
    elif op == "+dir": dirs.add(arg)
    elif op == "-dir": dirs.discard(arg)
for pg in groups:
    try: os.killpg(pg, signal.SIGKILL)
    except OSError: pass
for d in dirs:
    shutil.rmtree(d, ignore_errors=True)
"""


class _Guardian:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _GUARDIAN],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # no terminal signals: it must outlive us
            text=True,
        )

    def send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.stdin is None:
                return
            try:
                self._proc.stdin.write(line + "\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Process:
    """A child in its own process group, logging stdout+stderr to a file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        guardian: _Guardian,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._guardian = guardian
        self._log: IO[bytes] | None = log_path.open("ab")
        self._log.write(f"--- {time.strftime('%H:%M:%S')} starting {' '.join(argv)}\n".encode())
        self._log.flush()
        try:
            self.popen: subprocess.Popen[bytes] = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(env) if env is not None else None,
                cwd=cwd,
            )
        except OSError:
            self._log.close()
            self._log = None
            raise
        self.pgid = self.popen.pid  # start_new_session: pid == pgid
        guardian.send(f"+pg {self.pgid}")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=timeout)
        # Kill whatever is left in the group (the leader may have exited before its children).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGKILL)
        self.popen.wait()
        self._guardian.send(f"-pg {self.pgid}")
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_until(
    what: str,
    check: Callable[[], T | None],
    timeout: float,
    *,
    interval: float = 0.2,
    alive: Callable[[], str | None] | None = None,
) -> T:
    """Call ``check`` until it returns non-None; ``alive`` returns an error text to stop early."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        if alive is not None and (problem := alive()):
            raise ControlPlaneError(f"{what}: {problem}")
        try:
            result = check()
        except (OSError, ControlPlaneError, ValueError) as exc:
            last_error = f" (last error: {exc})"
            result = None
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"timed out after {timeout:.0f}s: {what}{last_error}")
        time.sleep(interval)


# --------------------------------------------------------------------------------------------------
# KWOK
# --------------------------------------------------------------------------------------------------

#: Stages for kwok >= 0.8 (which has no built-in stages): the "fast" set from kwok v0.8.0
#: kustomize/stage/{node/fast,node/heartbeat-with-lease,pod/fast} (kubernetes-sigs/kwok,
#: Apache-2.0; one template action wrapped onto two lines).
#: Nodes become Ready at once; bound pods go Pending -> Running; Job pods complete; pods with a
#: deletionTimestamp are deleted (no kubelet finishes graceful deletion otherwise).
KWOK_STAGES = r"""
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type  | Quote}}
      {{ end }}

      {{ $hasInternalIP := false }}
      {{ $hasHostname := false }}
      {{ range .status.addresses }}
        {{ if eq .type "InternalIP" }}
          {{ $hasInternalIP = true }}
        {{ end }}
        {{ if eq .type "Hostname" }}
          {{ $hasHostname = true }}
        {{ end }}
      {{ end }}
      {{ if or (not $hasInternalIP) (not $hasHostname) }}
      addresses:
      {{ end }}
      {{ if not $hasInternalIP }}
      {{ with NodeIP }}
      - address: {{ . | Quote }}
        type: InternalIP
      {{ end }}
      {{ end }}
      {{ if not $hasHostname }}
      {{ with NodeName }}
      - address: {{ . | Quote }}
        type: Hostname
      {{ end }}
      {{ end }}

      {{ with NodePort }}
      daemonEndpoints:
        kubeletEndpoint:
          Port: {{ . }}
      {{ end }}

      allocatable:
      {{ with .status.allocatable }}
      {{ YAML . 1 }}
      {{ else }}
        cpu: 1k
        memory: 1Ti
        pods: 1M
      {{ end }}
      capacity:
      {{ with .status.capacity }}
      {{ YAML . 1 }}
      {{ else }}
        cpu: 1k
        memory: 1Ti
        pods: 1M
      {{ end }}

      {{ $nodeInfo := .status.nodeInfo }}
      {{ $kwokVersion := printf "kwok-%s" Version }}
      nodeInfo:
        architecture: {{ or $nodeInfo.architecture "amd64" }}
        bootID: {{ or $nodeInfo.bootID `""` }}
        containerRuntimeVersion: {{ or $nodeInfo.containerRuntimeVersion $kwokVersion }}
        kernelVersion: {{ or $nodeInfo.kernelVersion $kwokVersion }}
        kubeProxyVersion: {{ or $nodeInfo.kubeProxyVersion $kwokVersion }}
        kubeletVersion: {{ or $nodeInfo.kubeletVersion $kwokVersion }}
        machineID: {{ or $nodeInfo.machineID `""` }}
        operatingSystem: {{ or $nodeInfo.operatingSystem "linux" }}
        osImage: {{ or $nodeInfo.osImage `""` }}
        systemUUID: {{ or $nodeInfo.systemUUID `""` }}
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-heartbeat-with-lease
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values:
      - 'True'
  delay:
    durationMilliseconds: 600000
    jitterDurationMilliseconds: 610000
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}

      addresses:
      {{ with .status.addresses }}
      {{ YAML . 1 }}
      {{ else }}
      {{ with NodeIP }}
      - address: {{ . | Quote }}
        type: InternalIP
      {{ end }}
      {{ with NodeName }}
      - address: {{ . | Quote }}
        type: Hostname
      {{ end }}
      {{ end }}

      {{ with NodePort }}
      daemonEndpoints:
        kubeletEndpoint:
          Port: {{ . }}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Pending'
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
  next:
    statusTemplate: |
      {{ $now := Now }}

      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: ContainersReady
      {{ range .spec.readinessGates }}
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: {{ .conditionType | Quote }}
      {{ end }}

      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}

      initContainerStatuses:
      {{ range .spec.initContainers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        {{ if eq .restartPolicy "Always" }}
        started: true
        state:
          running:
            startedAt: {{ $now | Quote }}
        {{ else }}
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
        {{ end }}
      {{ end }}
      {{ $hostIPs := NodeIPsWith .spec.nodeName }}
      {{ with $hostIPs }}
      hostIP: {{ index . 0 | Quote }}
      hostIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" )
          ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      {{ with $podIPs }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values:
      - 'Job'
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $root := . }}
      containerStatuses:
      {{ range $index, $item := .spec.containers }}
      {{ $origin := index $root.status.containerStatuses $index }}
      - image: {{ $item.image | Quote }}
        name: {{ $item.name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    delete: true
"""


def fake_gpu_node_manifest(
    name: str,
    *,
    gpus: int = 8,
    gpu_resource: str = "nvidia.com/gpu",
    cpu: str = "64",
    memory: str = "512Gi",
    pods: str = "110",
    extra_capacity: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
) -> JSON:
    """A Node object that kwok manages (annotation ``kwok.x-k8s.io/node: fake``).

    Capacity and allocatable are set in ``status``; kwok's node-initialize stage keeps them.
    """
    capacity = {"cpu": cpu, "memory": memory, "pods": pods, gpu_resource: str(gpus)}
    capacity.update(extra_capacity or {})
    key, value = FAKE_NODE_ANNOTATION
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **(labels or {}),
            },
            "annotations": {key: value, **(annotations or {})},
        },
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
    }


# --------------------------------------------------------------------------------------------------
# The control plane
# --------------------------------------------------------------------------------------------------

_live: weakref.WeakSet[ControlPlane] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    for plane in list(_live):
        with contextlib.suppress(Exception):
            plane.stop()


@dataclass
class _Pki:
    ca: _CertificateAuthority
    ca_path: Path
    ca_pem: bytes
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    admin: ClientCredentials | None = None
    extra: dict[str, ClientCredentials] = field(default_factory=dict)


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
    ) -> None:
        self._want_kwok = kwok
        self._binaries = binaries
        self._base_dir = base_dir
        self._keep_workdir = keep_workdir
        self.startup_timeout = startup_timeout
        self._extra_apiserver_args = tuple(extra_apiserver_args)
        self._kwok_stages = KWOK_STAGES if kwok_stages is None else kwok_stages
        self._lock = threading.RLock()
        self._guardian: _Guardian | None = None
        self._workdir: Path | None = None
        self._pki: _Pki | None = None
        self._etcd: _Process | None = None
        self._apiserver: _Process | None = None
        self._kwok: _Process | None = None
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
        procs = {"etcd": self._etcd, "kube-apiserver": self._apiserver, "kwok": self._kwok}
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
            self._guardian = _Guardian()
            base = str(self._base_dir) if self._base_dir is not None else None
            self._workdir = Path(tempfile.mkdtemp(prefix="vgpu-control-plane-", dir=base))
            if not self._keep_workdir:
                self._guardian.send(f"+dir {self._workdir}")
            _live.add(self)
            try:
                (self._workdir / "logs").mkdir()
                self._apiserver_port = _free_port()
                self._make_pki()
                self._start_etcd(binaries.etcd)
                self._start_apiserver(binaries.kube_apiserver)
                if self._want_kwok:
                    self.start_kwok()
            except BaseException:
                self.stop()
                raise

    def stop(self) -> None:
        """Stop every process started (kwok, kube-apiserver, etcd) and remove the workdir."""
        with self._lock:
            for attr in ("_kwok", "_apiserver", "_etcd"):
                proc: _Process | None = getattr(self, attr)
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
            self._kwok_port = _free_port()
            key, value = FAKE_NODE_ANNOTATION
            argv = [
                str(kwok_bin),
                f"--kubeconfig={self.kubeconfig_path}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={key}={value}",
                f"--cidr={POD_CIDR}",
                f"--node-ip={FAKE_NODE_IP}",
                "--node-lease-duration-seconds=40",
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
                _kubeconfig(self.server, self._pki.ca_pem, cert_pem, key_pem, user).encode(),
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

        return _wait_until(f"node {name} to become Ready", check, timeout)

    def wait_for_pod_phase(
        self, namespace: str, name: str, phase: str = "Running", *, timeout: float = 60.0
    ) -> JSON:
        def check() -> JSON | None:
            pod = self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            return pod if pod.get("status", {}).get("phase") == phase else None

        return _wait_until(f"pod {namespace}/{name} to reach phase {phase}", check, timeout)

    # -- internals ---------------------------------------------------------------------------------

    def _spawn(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> _Process:
        assert self._guardian is not None
        return _Process(name, argv, self.log_path(name), self._guardian, env=env, cwd=self.workdir)

    def _wait_healthy(self, what: str, proc: _Process, check: Callable[[], bool]) -> None:
        def alive() -> str | None:
            if proc.alive():
                return None
            return f"{proc.name} exited with status {proc.popen.returncode}"

        try:
            _wait_until(
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
        ca = _CertificateAuthority("vgpu-test-ca", datetime.timedelta(days=30))
        ca_pem = _pem_cert(ca.cert)
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
        _write_private(sa_key, _pem_key(sa))
        sa_pub.write_bytes(
            sa.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        self._pki = _Pki(
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
        self._etcd_port = _free_port()
        peer = f"http://127.0.0.1:{_free_port()}"
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
