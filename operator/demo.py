"""``vgpu-operator demo``: the whole system on one machine, from start to finish.

It starts a throw-away control plane (etcd, kube-apiserver and KWOK on loopback) and
creates KWOK nodes shaped like real GPU servers. For each node it runs the node agent
over a simulated machine (``agent/machines/``), so every DeviceInventory is written
exactly as the agent DaemonSet writes it, heartbeats included. It then starts the
operator as its own process (``vgpu-operator run``), applies the manifests of
``examples/`` in file order, waits until every pod is bound or reported as waiting,
then plays ``examples/preemption/`` one file at a time (a batch job fills a card, an
urgent pod preempts it), prints where each pod went, why the others wait and who was
preempted, and stops everything.

The admission webhook is not installed: the example pods name the scheduler
themselves, and the engine applies the admission defaults when it schedules.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final, TypeVar

import click
import yaml

from vgpu_operator import names, resources
from vgpu_operator.agent.backends import backend_from_spec
from vgpu_operator.agent.main import AgentSettings, run_agent
from vgpu_operator.devices import codec
from vgpu_operator.errors import CodecError
from vgpu_operator.testing.controlplane import (
    ApiError,
    Binaries,
    BinariesNotFoundError,
    ControlPlane,
    ControlPlaneError,
)

Json = dict[str, Any]
Say = Callable[[str], None]
_T = TypeVar("_T")

#: The device-config ConfigMap (and its namespace) the operator is started with.
CONFIG_FILE_NAME: Final = "device-config.yaml"
OPERATOR_NAMESPACE: Final = "vgpu-operator"
CONFIG_MAP: Final = "vgpu-device-config"

DEFAULT_TIMEOUT_S: Final = 90.0
_POLL_S: Final = 0.5
_INVENTORIES: Final = f"/apis/{names.CRD_GROUP}/{names.CRD_VERSION}/{names.DEVICE_INVENTORY_PLURAL}"
_CRDS: Final = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


class DemoError(RuntimeError):
    """The demo could not run to the end (not: a pod had to wait, which is expected)."""


# --------------------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DemoNode:
    """A KWOK node and the simulated machine its agent reads."""

    name: str
    machine: str  # a bundled machine: operator/agent/machines/<machine>.yaml
    cpu: str
    memory: str
    pods: str = "110"
    taints: tuple[Mapping[str, str], ...] = ()


#: Keeps pods that do not ask for MIG off the MIG node (the MIG example tolerates it).
#: Under HAMi's rules a pod that names no ``nvidia.com/vgpu-mode`` may take a MIG
#: instance: the exclusive example would take the whole card as a 7g.40gb instance.
MIG_TAINT: Final = {"key": "nvidia.com/mig", "value": "true", "effect": "NoSchedule"}

DEMO_NODES: Final = (
    DemoNode("gpu-h100-sxm", "h100-sxm-8", cpu="192", memory="2Ti"),
    DemoNode("gpu-l40s", "l40s-pcie-4", cpu="64", memory="512Gi"),
    DemoNode("gpu-a100-mig", "a100-mig", cpu="128", memory="1Ti", taints=(MIG_TAINT,)),
    DemoNode("gpu-h100-failing", "h100-pcie-failing", cpu="96", memory="1Ti"),
    DemoNode("gpu-islands-16", "islands-16", cpu="224", memory="4Ti"),
)


@dataclass(frozen=True, slots=True)
class CardFacts:
    """One card as its node's DeviceInventory reports it."""

    node: str
    index: int
    uuid: str
    model: str
    memory_mib: int
    numa_node: int | None
    healthy: bool
    mode: str
    nvlink_peers: frozenset[str]


@dataclass(frozen=True, slots=True)
class GpuGrant:
    """One container's share of one card, from ``hami.io/vgpu-devices-allocated``.

    ``uuid`` is the card's UUID as written, with a MIG instance's ``[geometry-slot]``
    suffix; ``card_uuid`` is without it.
    """

    container: int
    uuid: str
    card_uuid: str
    memory_mib: int
    cores: int


@dataclass(frozen=True, slots=True)
class PlacedPod:
    """A pod bound to a node, with the cards named in its allocation annotation."""

    namespace: str
    name: str
    node: str
    gpus: tuple[GpuGrant, ...]


@dataclass(frozen=True, slots=True)
class WaitingPod:
    """A pod the operator reported as unschedulable (condition ``PodScheduled=False``)."""

    namespace: str
    name: str
    reason: str
    message: str
    #: The latest FailedScheduling Event's text (with devices ruled out per reason).
    event_message: str


@dataclass(frozen=True, slots=True)
class PreemptedPod:
    """A pod evicted to make room for a higher-priority one (its ``Preempted`` Event)."""

    namespace: str
    name: str
    message: str


@dataclass(frozen=True, slots=True)
class DemoResult:
    """What the operator decided for the example pods, and the cards it chose from."""

    #: Card UUID -> the card as its DeviceInventory reports it.
    cards: Mapping[str, CardFacts]
    placed: tuple[PlacedPod, ...]
    waiting: tuple[WaitingPod, ...]
    #: Pods neither bound nor reported as waiting when the wait ended ("ns/name").
    undecided: tuple[str, ...]
    #: Seconds per phase, in the order they ran.
    timings_s: Mapping[str, float] = field(default_factory=dict)
    preempted: tuple[PreemptedPod, ...] = ()

    def placed_pod(self, name: str) -> PlacedPod:
        """The bound pod called ``name`` (any namespace); KeyError if it is not bound."""
        for pod in self.placed:
            if pod.name == name:
                return pod
        raise KeyError(name)

    def waiting_pod(self, name: str) -> WaitingPod:
        """The waiting pod called ``name`` (any namespace); KeyError if it is not waiting."""
        for pod in self.waiting:
            if pod.name == name:
                return pod
        raise KeyError(name)


# --------------------------------------------------------------------------------------
# Manifests
# --------------------------------------------------------------------------------------

#: kind -> (apiVersion, plural, namespaced) for the kinds the examples may use. There is
#: no controller manager, so workload kinds (Deployments, Jobs) would never make pods.
_KINDS: Final[Mapping[str, tuple[str, str, bool]]] = {
    "Namespace": ("v1", "namespaces", False),
    "ConfigMap": ("v1", "configmaps", True),
    "ResourceQuota": ("v1", "resourcequotas", True),
    "LimitRange": ("v1", "limitranges", True),
    "Secret": ("v1", "secrets", True),
    "Pod": ("v1", "pods", True),
    "PriorityClass": ("scheduling.k8s.io/v1", "priorityclasses", False),
}


@dataclass(frozen=True, slots=True)
class Manifest:
    """One object of an example file."""

    source: Path
    body: Json

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", ""))

    @property
    def namespace(self) -> str:
        return str((self.body.get("metadata") or {}).get("namespace") or "default")

    @property
    def name(self) -> str:
        return str((self.body.get("metadata") or {}).get("name") or "")

    def collection_path(self) -> str:
        api_version = str(self.body.get("apiVersion", ""))
        known = _KINDS.get(self.kind)
        if known is None or api_version != known[0]:
            supported = ", ".join(f"{v} {k}" for k, (v, _, _) in sorted(_KINDS.items()))
            raise DemoError(
                f"{self.source.name}: {api_version} {self.kind} is not supported by the demo "
                f"(supported: {supported})"
            )
        _, plural, namespaced = known
        root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced:
            return f"{root}/namespaces/{self.namespace}/{plural}"
        return f"{root}/{plural}"


def default_examples_dir() -> Path:
    """The repository's ``examples/`` (found through the source of this module)."""
    return Path(__file__).resolve().parent.parent / "examples"


def load_manifests(path: Path) -> list[Manifest]:
    """Every object of a YAML file (``---`` separated), empty documents skipped."""
    try:
        documents = list(yaml.safe_load_all(path.read_text()))
    except (OSError, yaml.YAMLError) as exc:
        raise DemoError(f"cannot read {path}: {exc}") from exc
    manifests = []
    for document in documents:
        if document is None:
            continue
        if not isinstance(document, dict) or "kind" not in document:
            raise DemoError(f"{path.name}: every document must be a Kubernetes object")
        manifests.append(Manifest(path, document))
    return manifests


def example_files(examples_dir: Path) -> tuple[Path | None, list[Path]]:
    """(the device config file if present, the other ``*.yaml`` files in name order)."""
    config = examples_dir / CONFIG_FILE_NAME
    others = sorted(
        p for p in examples_dir.glob("*.yaml") if p.name != CONFIG_FILE_NAME and p.is_file()
    )
    return (config if config.is_file() else None), others


#: The subfolder of examples played after the others, one file at a time.
PREEMPTION_DIR: Final = "preemption"


def story_files(examples_dir: Path) -> list[Path]:
    """The preemption story's ``*.yaml`` files in name order (none when absent)."""
    return sorted(p for p in (examples_dir / PREEMPTION_DIR).glob("*.yaml") if p.is_file())


def apply_manifest(cp: ControlPlane, manifest: Manifest) -> None:
    """Create the object; one that exists already is left as it is."""
    try:
        cp.create(manifest.collection_path(), manifest.body)
    except ApiError as exc:
        if exc.status != 409:
            raise DemoError(
                f"{manifest.source.name}: {manifest.kind} {manifest.name}: {exc}"
            ) from None


# --------------------------------------------------------------------------------------
# Nodes and their agents
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _MachineSummary:
    gpus: int
    healthy: int


def _read_machine(node: DemoNode) -> _MachineSummary:
    """What the node's agent will report once settled: the card count (the Node's
    ``nvidia.com/gpu`` capacity) and how many stay healthy after the machine's health
    events (a simulated XID shows up as an event, not in the first reading)."""
    backend = backend_from_spec(f"sim:{node.machine}", node.name)
    backend.open()
    try:
        for _ in range(20):
            if not backend.watch_health(0.05):
                break
        reading = backend.read()
    finally:
        backend.close()
    present = [gpu for gpu in reading.gpus if gpu.present]
    return _MachineSummary(len(present), sum(1 for gpu in present if gpu.healthy))


def install_crd(cp: ControlPlane, timeout_s: float = 30.0) -> None:
    """Create the DeviceInventory CRD and wait until its API is served."""
    crd = resources.render_crd()
    try:
        cp.create(_CRDS, crd)
    except ApiError as exc:
        if exc.status != 409:
            raise

    def served() -> bool:
        try:
            cp.get(_INVENTORIES)
        except ApiError:
            return False
        return True

    _wait_for("the DeviceInventory API", served, timeout_s)


def create_nodes(cp: ControlPlane, nodes: Sequence[DemoNode]) -> dict[str, _MachineSummary]:
    """A KWOK node per machine, with ``nvidia.com/gpu`` capacity = its card count."""
    machines = {}
    for node in nodes:
        machine = _read_machine(node)
        machines[node.name] = machine
        cp.create_fake_gpu_node(
            node.name,
            gpus=machine.gpus,
            cpu=node.cpu,
            memory=node.memory,
            pods=node.pods,
            labels={
                "nvidia.com/gpu.present": "true",
                "vgpu-operator.io/simulated-machine": node.machine,
            },
            taints=node.taints,
            wait_ready=False,
        )
    for node in nodes:
        cp.wait_for_node_ready(node.name)
    return machines


class AgentFleet:
    """One node agent per node (simulated backend), as asyncio tasks in one thread.

    Each is the agent's own ``run_agent``: it creates the DeviceInventory, writes the
    status and keeps the heartbeat fresh until ``stop``.
    """

    def __init__(
        self, kubeconfig: Path, nodes: Sequence[DemoNode], heartbeat_interval_s: float = 20.0
    ) -> None:
        self._kubeconfig = kubeconfig
        self._nodes = tuple(nodes)
        self._heartbeat_interval_s = heartbeat_interval_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._running = threading.Event()
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._main, name="demo-agents", daemon=True)

    def start(self, timeout_s: float = 10.0) -> None:
        self._thread.start()
        if not self._running.wait(timeout_s):
            raise DemoError("the node agents did not start")

    def stop(self, timeout_s: float = 15.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop has just finished
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise DemoError("the node agents did not stop in time")

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported by the caller through .errors
            self.errors.append(exc)
        finally:
            self._running.set()

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._running.set()
        runs = [
            run_agent(
                AgentSettings(
                    node_name=node.name,
                    heartbeat_interval_s=self._heartbeat_interval_s,
                    poll_interval_s=self._heartbeat_interval_s,
                ),
                backend_from_spec(f"sim:{node.machine}", node.name),
                kubeconfig=str(self._kubeconfig),
                metrics_port=0,
                stop=self._stop,
            )
            for node in self._nodes
        ]
        results = await asyncio.gather(*runs, return_exceptions=True)
        self.errors.extend(r for r in results if isinstance(r, BaseException))


def wait_for_inventories(
    cp: ControlPlane, machines: Mapping[str, _MachineSummary], fleet: AgentFleet, timeout_s: float
) -> list[Json]:
    """Wait until every node's DeviceInventory reports all of its cards, and as many
    healthy ones as the machine shows."""

    def reported() -> list[Json] | None:
        if fleet.errors:
            raise DemoError(f"a node agent failed: {fleet.errors[0]!r}")
        items: list[Json] = cp.get(_INVENTORIES).get("items", [])
        by_node = {str(item["metadata"]["name"]): item for item in items}
        for node, machine in machines.items():
            status = (by_node.get(node) or {}).get("status") or {}
            summary = status.get("summary") or {}
            if len(status.get("devices") or []) != machine.gpus:
                return None
            if summary.get("healthyCount") != machine.healthy:
                return None
        return [by_node[node] for node in machines]

    return _wait_for("every node's DeviceInventory", reported, timeout_s)


def cards_from_inventories(inventories: Sequence[Mapping[str, Any]]) -> dict[str, CardFacts]:
    """uuid -> the card's facts, from DeviceInventory objects."""
    cards = {}
    for item in inventories:
        status = item.get("status") or {}
        node = str(status.get("nodeName") or item["metadata"]["name"])
        for device in status.get("devices") or []:
            peers = frozenset(
                str(link["peer"])
                for link in device.get("links") or []
                if int(link.get("nvlinks") or 0) > 0
            )
            numa = device.get("numaNode")
            cards[str(device["uuid"])] = CardFacts(
                node=node,
                index=int(device["index"]),
                uuid=str(device["uuid"]),
                model=str(device.get("model") or device.get("type") or ""),
                memory_mib=int(device.get("memoryMiB") or 0),
                numa_node=int(numa) if numa is not None else None,
                healthy=device.get("health") == "Healthy",
                mode=str(device.get("mode") or ""),
                nvlink_peers=peers,
            )
    return cards


# --------------------------------------------------------------------------------------
# The operator
# --------------------------------------------------------------------------------------

# Runs ``vgpu-operator run``; the thread ends the operator if the demo dies without
# stopping it (the operator would otherwise retry a vanished API server forever).
_OPERATOR_MAIN: Final = """
import os, signal, threading, time
parent = os.getppid()
def _orphaned():
    while os.getppid() == parent:
        time.sleep(1)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=_orphaned, daemon=True).start()
from vgpu_operator.operator_cli import run
run(prog_name="vgpu-operator run")
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class OperatorProcess:
    """``vgpu-operator run --standalone`` as a child process, logging to a file."""

    def __init__(self, kubeconfig: Path, log_path: Path, env: Mapping[str, str]) -> None:
        self.log_path = log_path
        self.metrics_port = _free_port()
        self._argv = [
            sys.executable,
            "-c",
            _OPERATOR_MAIN,
            "--kubeconfig",
            str(kubeconfig),
            "--standalone",
            "--namespace",
            OPERATOR_NAMESPACE,
            "--config-map",
            CONFIG_MAP,
            "--metrics-port",
            str(self.metrics_port),
            "--log-format",
            "json",
        ]
        # The package directory is called operator/: never let the working directory
        # shadow the standard library's module of that name.
        self._env = {**env, "PYTHONSAFEPATH": "1"}
        self._log: IO[bytes] | None = None
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self._popen = subprocess.Popen(
            self._argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self._env,
            cwd=self.log_path.parent,
            start_new_session=True,  # Ctrl-C reaches the demo, which stops it in order
        )

    @property
    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def check_alive(self) -> None:
        if self._popen is not None and self._popen.poll() is not None:
            raise DemoError(
                f"the operator exited with status {self._popen.returncode}\n"
                f"--- last lines of {self.log_path}:\n{self.log_tail()}"
            )

    def wait_ready(self, timeout_s: float) -> None:
        url = f"http://127.0.0.1:{self.metrics_port}/readyz"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def ready() -> bool:
            self.check_alive()
            try:
                with opener.open(url, timeout=2) as response:
                    return bool(response.status == 200)
            except urllib.error.HTTPError as exc:
                exc.close()
                return False
            except OSError:
                return False

        try:
            _wait_for("the operator to become ready", ready, timeout_s)
        except DemoError as exc:
            tail = self.log_tail()
            raise DemoError(f"{exc}\n--- last lines of {self.log_path}:\n{tail}") from None

    def stop(self, timeout_s: float = 20.0) -> int | None:
        """SIGTERM (Kopf exits cleanly), SIGKILL after ``timeout_s``; the exit status."""
        popen, self._popen = self._popen, None
        status = None
        if popen is not None:
            if popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGTERM)
                try:
                    popen.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(popen.pid, signal.SIGKILL)
                    popen.wait()
            status = popen.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return status

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------------------
# Waiting for decisions and reading them back
# --------------------------------------------------------------------------------------


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return None


def is_bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def is_unschedulable(pod: Mapping[str, Any]) -> bool:
    """Reported as waiting by the scheduler (condition ``PodScheduled=False``)."""
    scheduled = _condition(pod, "PodScheduled")
    return scheduled is not None and scheduled.get("status") == "False"


def _pod_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The example pods as the API server has them, and their latest FailedScheduling
    Event texts ("ns/name" -> message)."""

    pods: Mapping[str, Json]
    failed_scheduling: Mapping[str, str]

    def complete(self, keys: Sequence[str]) -> bool:
        """Every pod bound, or reported as waiting with its Event written (the Event
        follows the condition)."""
        for key in keys:
            pod = self.pods.get(key)
            if pod is None:
                return False
            if not is_bound(pod) and not (is_unschedulable(pod) and key in self.failed_scheduling):
                return False
        return True


def _event_time(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or "")


def read_snapshot(cp: ControlPlane, keys: Sequence[str]) -> Snapshot:
    """One listing of pods and Events per namespace of ``keys``."""
    wanted = set(keys)
    pods: dict[str, Json] = {}
    latest: dict[str, Json] = {}
    for namespace in sorted({key.split("/", 1)[0] for key in keys}):
        for pod in cp.get(f"/api/v1/namespaces/{namespace}/pods").get("items", []):
            if _pod_key(pod) in wanted:
                pods[_pod_key(pod)] = pod
        for event in cp.get(f"/api/v1/namespaces/{namespace}/events").get("items", []):
            involved = event.get("involvedObject") or {}
            key = f"{involved.get('namespace')}/{involved.get('name')}"
            if event.get("reason") != "FailedScheduling" or key not in wanted:
                continue
            if key not in latest or _event_time(event) >= _event_time(latest[key]):
                latest[key] = event
    messages = {key: str(event.get("message") or "") for key, event in latest.items()}
    return Snapshot(pods, messages)


def read_preempted(cp: ControlPlane, namespaces: Sequence[str]) -> tuple[PreemptedPod, ...]:
    """The pods of ``namespaces`` that carry a ``Preempted`` Event, oldest first."""
    found: list[tuple[str, PreemptedPod]] = []
    for namespace in sorted(set(namespaces)):
        for event in cp.get(f"/api/v1/namespaces/{namespace}/events").get("items", []):
            if event.get("reason") != "Preempted":
                continue
            involved = event.get("involvedObject") or {}
            pod = PreemptedPod(
                str(involved.get("namespace")),
                str(involved.get("name")),
                str(event.get("message") or ""),
            )
            found.append((_event_time(event), pod))
    return tuple(pod for _, pod in sorted(found, key=lambda item: item[0]))


def wait_for_decisions(
    cp: ControlPlane, keys: Sequence[str], operator: OperatorProcess, timeout_s: float
) -> Snapshot:
    """Poll until every pod is decided or ``timeout_s`` passes; the last reading."""
    deadline = time.monotonic() + timeout_s
    while True:
        operator.check_alive()
        snapshot = read_snapshot(cp, keys)
        if snapshot.complete(keys) or time.monotonic() >= deadline:
            return snapshot
        time.sleep(_POLL_S)


def _grants(pod: Mapping[str, Any]) -> tuple[GpuGrant, ...]:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    try:
        devices = codec.decode_pod_devices(annotations, {"NVIDIA": names.NVIDIA_DEVICES_ALLOCATED})
    except CodecError as exc:
        raise DemoError(f"{_pod_key(pod)}: unreadable allocation: {exc}") from exc
    grants = []
    for per_vendor in devices.values():
        for container, container_devices in enumerate(per_vendor):
            for device in container_devices:
                grants.append(
                    GpuGrant(
                        container=container,
                        uuid=device.uuid,
                        card_uuid=device.uuid.split("[", 1)[0],
                        memory_mib=device.memory_mib,
                        cores=device.cores,
                    )
                )
    return tuple(grants)


def collect_result(
    keys: Sequence[str],
    snapshot: Snapshot,
    cards: Mapping[str, CardFacts],
    timings_s: Mapping[str, float],
) -> DemoResult:
    """Sort the pods into placed, waiting and undecided, in the order of ``keys``."""
    placed: list[PlacedPod] = []
    waiting: list[WaitingPod] = []
    undecided: list[str] = []
    for key in keys:
        namespace, name = key.split("/", 1)
        pod = snapshot.pods.get(key)
        if pod is not None and is_bound(pod):
            placed.append(PlacedPod(namespace, name, str(pod["spec"]["nodeName"]), _grants(pod)))
        elif pod is not None and is_unschedulable(pod):
            scheduled = _condition(pod, "PodScheduled") or {}
            waiting.append(
                WaitingPod(
                    namespace,
                    name,
                    reason=str(scheduled.get("reason") or ""),
                    message=str(scheduled.get("message") or ""),
                    event_message=snapshot.failed_scheduling.get(key, ""),
                )
            )
        else:
            undecided.append(key)
    return DemoResult(
        cards=dict(cards),
        placed=tuple(placed),
        waiting=tuple(waiting),
        undecided=tuple(undecided),
        timings_s=dict(timings_s),
    )


# --------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------


def _short_model(model: str) -> str:
    return model.removeprefix("NVIDIA ").removeprefix("NVIDIA-")


def _short_uuid(uuid: str) -> str:
    """``GPU-6f3e1a52…0003`` (+ a MIG suffix): the part that tells cards apart."""
    card, bracket, suffix = uuid.partition("[")
    short = card if len(card) <= 18 else f"{card[:12]}…{card[-4:]}"
    return short + bracket + suffix


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        return "  ".join(cells).rstrip()

    return [line(header), *(line(row) for row in rows)]


def render_nodes(cards: Mapping[str, CardFacts]) -> list[str]:
    """One line per node: its cards by model, and the unhealthy ones."""
    by_node: dict[str, list[CardFacts]] = {}
    for card in cards.values():
        by_node.setdefault(card.node, []).append(card)
    lines = []
    for node, node_cards in by_node.items():
        models: dict[str, int] = {}
        for card in sorted(node_cards, key=lambda c: c.index):
            models[_short_model(card.model)] = models.get(_short_model(card.model), 0) + 1
        text = ", ".join(f"{n}x {model}" for model, n in models.items())
        unhealthy = [str(c.index) for c in node_cards if not c.healthy]
        mig = [str(c.index) for c in node_cards if c.mode == "mig"]
        extras = []
        if mig:
            extras.append(f"MIG mode: #{', #'.join(mig)}")
        if unhealthy:
            extras.append(f"unhealthy: #{', #'.join(unhealthy)}")
        suffix = f" ({'; '.join(extras)})" if extras else ""
        lines.append(f"  {node:<18} {text}{suffix}")
    return lines


def render_result(result: DemoResult) -> str:
    """The placement table, then each waiting pod and why it waits."""
    rows: list[list[str]] = []
    for pod in result.placed:
        label = f"{pod.namespace}/{pod.name}"
        if not pod.gpus:
            rows.append([label, pod.node, "-", "-", "-"])
        for i, grant in enumerate(pod.gpus):
            card = result.cards.get(grant.card_uuid)
            where = f"#{card.index} " if card is not None else ""
            model = f"  {_short_model(card.model)}" if card is not None else ""
            rows.append(
                [
                    label if i == 0 else "",
                    pod.node if i == 0 else "",
                    f"{where}{_short_uuid(grant.uuid)}{model}",
                    str(grant.memory_mib),
                    str(grant.cores),
                ]
            )
    header = ["POD", "NODE", "GPU", "MEMORY MiB", "CORES %"]
    lines = _table(header, rows, right={3, 4}) if rows else ["(no pod was bound)"]
    if result.waiting:
        lines += ["", "Waiting:"]
        for waiting in result.waiting:
            lines.append(f"  {waiting.namespace}/{waiting.name}: {waiting.message}")
            details = waiting.event_message.removeprefix(waiting.message).strip()
            if details:
                lines.append(f"      {details}")
    if result.preempted:
        lines += ["", "Preempted:"]
        lines += [f"  {p.namespace}/{p.name}: {p.message}" for p in result.preempted]
    if result.undecided:
        lines += ["", "Not decided in time:", *(f"  {key}" for key in result.undecided)]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


def _wait_for(what: str, check: Callable[[], _T | None], timeout_s: float) -> _T:
    """Call ``check`` until it returns something other than None or False."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            raise DemoError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.2)


class _Clock:
    """Seconds per phase, for the closing line."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._mark = self.started
        self.phases: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = round(now - self._mark, 1)
        self._mark = now

    @property
    def total_s(self) -> float:
        return round(time.monotonic() - self.started, 1)


def play_story(
    cp: ControlPlane,
    steps: Sequence[Sequence[Manifest]],
    operator: OperatorProcess,
    timeout_s: float,
) -> list[str]:
    """Apply each step's objects, then wait until its pods are decided before the next
    step (so the batch job runs before the urgent pod arrives); the pods' keys."""
    keys: list[str] = []
    for step in steps:
        step_keys = []
        for manifest in step:
            apply_manifest(cp, manifest)
            if manifest.kind == "Pod":
                step_keys.append(f"{manifest.namespace}/{manifest.name}")
        wait_for_decisions(cp, step_keys, operator, timeout_s)
        keys += step_keys
    return keys


@contextlib.contextmanager
def _running_operator(
    cp: ControlPlane, say: Say, startup_timeout_s: float
) -> Iterator[OperatorProcess]:
    operator = OperatorProcess(cp.kubeconfig_path, cp.log_path("operator"), cp.env())
    operator.start()
    try:
        operator.wait_ready(startup_timeout_s)
        yield operator
    finally:
        status = operator.stop()
        if status not in (None, 0, -signal.SIGTERM):
            say(f"the operator exited with status {status} (log: {operator.log_path})")


def _wait_for_interrupt(cp: ControlPlane, operator: OperatorProcess, say: Say) -> None:
    say("")
    say("The cluster keeps running. Try:")
    say(f"  export KUBECONFIG={cp.kubeconfig_path}")
    say("  kubectl get pods -A -o wide; kubectl get deviceinventories")
    say(f"Operator log: {operator.log_path}")
    say("Press Ctrl-C to stop.")
    with contextlib.suppress(KeyboardInterrupt):
        while cp.running:
            operator.check_alive()
            time.sleep(1)


def run_demo(
    examples_dir: Path | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    keep_running: bool = False,
    nodes: Sequence[DemoNode] = DEMO_NODES,
    binaries: Binaries | None = None,
    say: Say = print,
) -> DemoResult:
    """Run the demo end to end and return what the operator decided.

    Progress lines and the final table go to ``say``. Raises ``DemoError`` (or
    ``ControlPlaneError``) when something could not be started or stopped working;
    pods that wait are part of the result, not an error.
    """
    source = examples_dir if examples_dir is not None else default_examples_dir()
    config_file, files = example_files(source)
    if not files:
        raise DemoError(f"no *.yaml manifests in {source}")
    setup = load_manifests(config_file) if config_file is not None else []
    examples = [m for path in files for m in load_manifests(path)]
    story = [load_manifests(path) for path in story_files(source)]
    for manifest in (*setup, *examples, *(m for step in story for m in step)):
        manifest.collection_path()  # refuse an unsupported kind before starting anything
    clock = _Clock()
    say("starting the control plane (etcd, kube-apiserver, KWOK)...")
    with ControlPlane(kwok=True, binaries=binaries) as cp:
        say(f"control plane up at {cp.server}")
        clock.lap("control plane")
        install_crd(cp)
        for manifest in setup:
            apply_manifest(cp, manifest)
        machines = create_nodes(cp, nodes)
        fleet = AgentFleet(cp.kubeconfig_path, nodes)
        fleet.start()
        try:
            inventories = wait_for_inventories(cp, machines, fleet, timeout_s=60)
            cards = cards_from_inventories(inventories)
            total = sum(m.gpus for m in machines.values())
            say(f"{len(machines)} GPU nodes ready, {total} GPUs reported by the node agents:")
            for line in render_nodes(cards):
                say(line)
            clock.lap("nodes and agents")
            say("starting the operator...")
            with _running_operator(cp, say, startup_timeout_s=60) as operator:
                say("operator ready")
                clock.lap("operator start")
                keys = []
                for manifest in examples:
                    apply_manifest(cp, manifest)
                    if manifest.kind == "Pod":
                        keys.append(f"{manifest.namespace}/{manifest.name}")
                say(f"applied {len(examples)} objects from {source} ({len(keys)} pods)")
                say("waiting for the scheduler's decisions...")
                snapshot = wait_for_decisions(cp, keys, operator, timeout_s)
                clock.lap("scheduling")
                if story:
                    say(f"preemption: {len(story)} steps from {source / PREEMPTION_DIR}...")
                    keys += play_story(cp, story, operator, timeout_s)
                    clock.lap("preemption")
                preempted = read_preempted(cp, [key.split("/", 1)[0] for key in keys])
                gone = {f"{p.namespace}/{p.name}" for p in preempted}
                keys = [key for key in keys if key not in gone]
                snapshot = read_snapshot(cp, keys)
                result = collect_result(keys, snapshot, cards, clock.phases)
                result = dataclasses.replace(result, preempted=preempted)
                say("")
                say(render_result(result))
                say("")
                if keep_running:
                    _wait_for_interrupt(cp, operator, say)
                    clock.lap("kept running")
                say("stopping the operator, the agents and the control plane...")
        finally:
            fleet.stop()
    clock.lap("stop")
    phases = ", ".join(f"{phase} {seconds:.1f}s" for phase, seconds in clock.phases.items())
    say(f"done in {clock.total_s:.1f}s ({phases})")
    return dataclasses.replace(result, timings_s=dict(clock.phases))


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM acts as Ctrl-C: everything started is stopped on the way out, and it ends
    ``--keep-running`` normally."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@click.command("demo")
@click.option(
    "--examples",
    "examples_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Folder of manifests to apply in file order (default: the repository's examples/).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for every pod to be bound or reported as waiting.",
)
@click.option(
    "--keep-running",
    is_flag=True,
    help="Leave the cluster up after the table, until Ctrl-C; prints the kubeconfig path.",
)
def demo_command(examples_dir: Path | None, timeout_s: float, keep_running: bool) -> None:
    """Local control plane, simulated GPU nodes, the operator and the example pods: print
    where each pod went and why the others wait, then stop everything."""
    from vgpu_operator import logging as vgpu_logging

    # The agents run in this process: only their errors belong next to the table (the
    # simulated failing card's XID warning is shown in the node summary instead).
    vgpu_logging.configure("console", "ERROR")
    try:
        with _sigterm_as_interrupt():
            result = run_demo(
                examples_dir,
                timeout_s=timeout_s,
                keep_running=keep_running,
                say=click.echo,
            )
    except BinariesNotFoundError as exc:
        click.echo(f"demo failed: {exc}", err=True)
        sys.exit(2)
    except (DemoError, ControlPlaneError) as exc:
        click.echo(f"demo failed: {exc}", err=True)
        sys.exit(1)
    if result.undecided:
        click.echo(
            f"demo failed: {len(result.undecided)} pods were neither bound nor reported "
            f"as waiting within {timeout_s:.0f}s: {', '.join(result.undecided)}",
            err=True,
        )
        sys.exit(1)
