"""The agent's device plugin driven by kubelet's own device manager (issue 13).

``hack/deviceplugin-conformance`` runs ``k8s.io/kubernetes/pkg/kubelet/cm/devicemanager`` at
the pinned Kubernetes version in a private directory: the agent (simulated machine, real
API server, KWOK node) registers there, and the harness does what kubelet does: counts the
devices, admits pods (Allocate per container, GetPreferredAllocation first), builds the
containers' run options, restarts. The unit tests of the servicer check our side of each
call; these check that kubelet's side accepts it and does with it what we expect.

The harness is built by ``make deviceplugin-conformance`` (``make test`` does it). Without
it these tests skip, or fail when VGPU_REQUIRE_CONTROL_PLANE is set.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from integration import operator_env as env
from integration.conftest import REQUIRE_ENV, control_plane_required
from integration.test_agent import (
    INVENTORIES,
    AgentThread,
    quick_settings,
    reported,
    rewrite,
    wait_for,
)

from vgpu_operator import names
from vgpu_operator.agent.sim_machine import resolve_machine_path
from vgpu_operator.devices import codec, model, nvidia
from vgpu_operator.testing.controlplane import ControlPlane

HARNESS = "deviceplugin-conformance"
HARNESS_ENV = "VGPU_DEVICEPLUGIN_CONFORMANCE"
BUILD_SH = Path(__file__).resolve().parents[2] / "hack" / "control-plane" / "build.sh"
GPU = "nvidia.com/gpu"
SPLIT = 5
CARDS = 4  # l40s-pcie-4


def _harness_path(harness: str, env_var: str) -> tuple[Path | None, str]:
    """The built harness (the Makefile exports its path; else build.sh says where it would be)."""
    if env_path := os.environ.get(env_var):
        where = Path(env_path)
        looked = f"${env_var}={where}"
    else:
        try:
            out = subprocess.run(
                [str(BUILD_SH), "--print-path", harness],
                capture_output=True,
                text=True,
                check=True,
                timeout=30,
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"{BUILD_SH} --print-path {harness} failed: {exc}"
        where = Path(out.strip().splitlines()[-1])
        looked = str(where)
    if where.is_file() and os.access(where, os.X_OK):
        return where, looked
    return None, f"{harness} not found at {looked}"


def require_harness(harness: str, env_var: str, what: str) -> Path:
    """The harness, or skip (fail when the control plane is required) saying how to build it."""
    path, problem = _harness_path(harness, env_var)
    if path is not None:
        return path
    problem += f"\nRun `make {harness}` ({what}, built once)."
    if control_plane_required():
        pytest.fail(f"{problem}\n({REQUIRE_ENV} is set, so this is an error)", pytrace=False)
    pytest.skip(f"{problem}\n(set {REQUIRE_ENV}=1 to fail instead of skipping)")


@pytest.fixture(scope="session")
def harness_binary() -> Path:
    return require_harness(HARNESS, HARNESS_ENV, "kubelet's device manager")


class Kubelet:
    """The harness process: kubelet's device manager, one JSON request and reply per line."""

    def __init__(self, binary: Path, directory: Path, log: Path) -> None:
        self.directory = directory
        self.log = log
        self._log_file = log.open("w")
        self._proc = subprocess.Popen(
            [str(binary), "-dir", str(directory), "-v", "4"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
        )

    def call(self, op: str, *, timeout: float = 30.0, **fields: Any) -> dict[str, Any]:
        stdin: IO[str] | None = self._proc.stdin
        stdout: IO[str] | None = self._proc.stdout
        assert stdin is not None
        assert stdout is not None
        stdin.write(json.dumps({"op": op, **fields}) + "\n")
        stdin.flush()
        ready, _, _ = select.select([stdout], [], [], timeout)
        line = stdout.readline() if ready else ""
        if not line:
            raise AssertionError(f"no answer to {op!r} from the harness; its log:\n{self.tail()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def ok(self, op: str, **fields: Any) -> dict[str, Any]:
        reply = self.call(op, **fields)
        assert reply["ok"], f"{op}: {reply.get('error')}\nharness log:\n{self.tail()}"
        return reply

    def state(self) -> dict[str, Any]:
        return self.ok("state", resource=GPU)

    def wait_state(
        self, what: str, check: Callable[[dict[str, Any]], bool], timeout: float = 30.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        state = self.state()
        while not check(state):
            if time.monotonic() > deadline:
                raise AssertionError(f"kubelet never saw {what}; last state {state}")
            time.sleep(0.1)
            state = self.state()
        return state

    def tail(self, lines: int = 40) -> str:
        self._log_file.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call("stop", timeout=10)
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                pipe.close()
        self._log_file.close()


@dataclass
class GpuNode:
    name: str
    kubelet: Kubelet
    machine: Path
    #: The cards as the agent reported them: (uuid, numaNode).
    cards: list[tuple[str, int | None]]
    #: HAMi-core's host directory the agent was given.
    hami_core_dir: Path


def ids_of(card: str) -> set[str]:
    return {f"{card}-{i}" for i in range(SPLIT)}


def counts(state: dict[str, Any]) -> tuple[int | None, int | None]:
    return state["capacity"], state["allocatable"]


@pytest.fixture
def gpu_node(
    harness_binary: Path, control_plane: ControlPlane, kubeconfig_env: Path, tmp_path: Path
) -> Iterator[GpuNode]:
    """A KWOK node whose kubelet is the harness, and the agent on l40s-pcie-4 (split 5)
    serving the device plugin in the harness's directory."""
    env.install_crd(control_plane)
    name = f"dp-{uuid.uuid4().hex[:8]}"
    control_plane.create_fake_gpu_node(name, gpus=CARDS * SPLIT)
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer.
    directory = Path(tempfile.mkdtemp(prefix="dp-"))
    machine = tmp_path / "l40s.yaml"
    shutil.copy(resolve_machine_path("l40s-pcie-4"), machine)
    kubelet = Kubelet(harness_binary, directory, tmp_path / "kubelet.log")
    agent: AgentThread | None = None
    try:
        kubelet.ok("start")
        settings = quick_settings(
            name,
            split=SPLIT,
            device_plugin_dir=str(directory),
            # Allocate makes each container's cache directory here, on this host.
            hami_core_dir=str(tmp_path / "vgpu"),
        )
        agent = AgentThread(settings, machine, kubeconfig_env)
        agent.start()
        inventory = wait_for("the inventory", lambda: reported(control_plane, name))
        cards = [(d["uuid"], d["numaNode"]) for d in inventory["status"]["devices"]]
        yield GpuNode(name, kubelet, machine, cards, tmp_path / "vgpu")
    finally:
        if agent is not None:
            agent.stop()
        kubelet.close()
        shutil.rmtree(directory, ignore_errors=True)
        control_plane.delete(f"{INVENTORIES}/{name}")
        control_plane.delete(f"/api/v1/nodes/{name}")


def bound_pod(
    control_plane: ControlPlane,
    namespace: str,
    node: str,
    entries: list[list[tuple[str, int, int]]],
    *,
    init: int = 0,
    annotate: bool = True,
) -> dict[str, Any]:
    """A pod bound to ``node`` as the operator leaves it for the device plugin: one entry
    (card, MiB, cores) per container, the first ``init`` of them init containers, placed
    by the vgpu-scheduler on that node (the plugin serves no other pods)."""
    single = tuple(
        tuple(model.ContainerDevice(u, "NVIDIA", m, c) for u, m, c in entry) for entry in entries
    )
    annotations = (
        {
            nvidia.ALLOCATED_ANNOTATION: codec.encode_pod_single_device(
                single, nvidia.ALLOCATED_ANNOTATION
            ),
            nvidia.TO_ALLOCATE_ANNOTATION: codec.encode_pod_single_device(
                single, nvidia.TO_ALLOCATE_ANNOTATION
            ),
            names.BIND_PHASE: "allocating",
            names.ASSIGNED_NODE: node,
        }
        if annotate
        else {}
    )
    containers = [
        {
            "name": f"c{i}",
            "image": "busybox",
            "resources": {"limits": {GPU: str(len(entry))}},
        }
        for i, entry in enumerate(entries)
    ]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"p-{uuid.uuid4().hex[:8]}",
            "namespace": namespace,
            "annotations": annotations,
        },
        "spec": {
            "nodeName": node,
            "schedulerName": names.SCHEDULER_NAME,
            "initContainers": containers[:init],
            "containers": containers[init:],
        },
    }
    return control_plane.create(f"/api/v1/namespaces/{namespace}/pods", pod)


def read_pod(control_plane: ControlPlane, pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod["metadata"]
    return control_plane.get(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")


def running(control_plane: ControlPlane, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod once KWOK has written its status. KWOK, not the harness, plays kubelet's status
    writer; waiting for it keeps its writes from racing the plugin's resourceVersion-guarded
    patch (which would fail the Allocate with a conflict)."""
    meta = pod["metadata"]
    return control_plane.wait_for_pod_phase(meta["namespace"], meta["name"], timeout=30)


def cards_of(ids: list[str]) -> list[str]:
    return sorted(i.rsplit("-", 1)[0] for i in ids)


def test_kubelet_registers_the_plugin_and_counts_every_share(gpu_node: GpuNode) -> None:
    state = gpu_node.kubelet.wait_state(
        "the plugin's devices", lambda s: counts(s) == (CARDS * SPLIT, CARDS * SPLIT)
    )
    # Every share of every card, healthy, with the card's NUMA node for the topology manager.
    expected = {device_id: [numa] for card, numa in gpu_node.cards for device_id in ids_of(card)}
    assert {d["id"]: d["numa"] for d in state["healthy_devices"]} == expected
    assert {numa for _, numa in gpu_node.cards} == {0, 1}


def test_an_unhealthy_card_drops_out_of_allocatable_but_stays_in_capacity(
    gpu_node: GpuNode,
) -> None:
    kubelet = gpu_node.kubelet
    kubelet.wait_state("the plugin's devices", lambda s: counts(s) == (20, 20))
    failing, _ = gpu_node.cards[1]
    rewrite(gpu_node.machine, lambda body: body["gpus"][1].update(xid=79))
    state = kubelet.wait_state("card 1 unhealthy", lambda s: counts(s) == (20, 15))
    healthy = {d["id"] for d in state["healthy_devices"]}
    assert not healthy & ids_of(failing)
    assert len(healthy) == 15


def test_kubelet_takes_the_annotated_cards_and_hands_the_containers_their_shares(
    control_plane: ControlPlane, namespace: str, gpu_node: GpuNode
) -> None:
    kubelet = gpu_node.kubelet
    kubelet.wait_state("the plugin's devices", lambda s: counts(s) == (20, 20))
    (a, _), _, (c, _), (d, _) = gpu_node.cards
    # Two containers on cards kubelet would rarely pick by itself out of 20 shares: the
    # preferred allocation is what steers it (3 of 4 cards wrong for a random pick).
    pod = bound_pod(
        control_plane, namespace, gpu_node.name, [[(d, 1000, 30)], [(c, 2000, 20), (a, 2000, 20)]]
    )
    reply = kubelet.ok("admit", pod=running(control_plane, pod))
    first, second = reply["containers"]
    assert cards_of(first["device_ids"]) == [d]
    assert cards_of(second["device_ids"]) == sorted([c, a])
    # What the runtime is handed: HAMi-core's settings, per container.
    assert first["envs"] == {
        "NVIDIA_VISIBLE_DEVICES": d,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "1000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"/usr/local/vgpu/{pod['metadata']['uid']}_c0.cache",
    }
    assert second["envs"]["NVIDIA_VISIBLE_DEVICES"] == f"{c},{a}"
    assert second["envs"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    assert second["envs"]["CUDA_DEVICE_MEMORY_LIMIT_1"] == "2000m"
    host = gpu_node.hami_core_dir
    cache_dir = host / "containers" / f"{pod['metadata']['uid']}_c0"
    assert {m["container_path"]: (m["host_path"], m["read_only"]) for m in first["mounts"]} == {
        "/usr/local/vgpu": (str(cache_dir), False),
        "/usr/local/vgpu/libvgpu.so": (str(host / "libvgpu.so"), True),
        "/tmp/vgpulock": ("/tmp/vgpulock", False),
        "/etc/ld.so.preload": (str(host / "ld.so.preload"), True),
    }
    assert cache_dir.is_dir()  # made before kubelet got the answer
    assert (first["devices"], first["cdi_devices"], first["annotations"]) == ([], [], {})
    # Every entry handed out: the pod is settled.
    annotations = read_pod(control_plane, pod)["metadata"]["annotations"]
    assert annotations[names.BIND_PHASE] == "success"


def test_kubelet_reuses_an_init_containers_device_and_the_app_still_gets_its_cards(
    control_plane: ControlPlane, namespace: str, gpu_node: GpuNode
) -> None:
    # kubelet hands a finished init container's devices to the next container before it
    # asks the plugin for more: the app container's IDs include one on the init's card.
    kubelet = gpu_node.kubelet
    kubelet.wait_state("the plugin's devices", lambda s: counts(s) == (20, 20))
    (a, _), (b, _), (c, _), _ = gpu_node.cards
    entries = [[(a, 1000, 10)], [(b, 2000, 20), (c, 2000, 20)]]
    pod = bound_pod(control_plane, namespace, gpu_node.name, entries, init=1)
    init, app = kubelet.ok("admit", pod=running(control_plane, pod))["containers"]
    assert cards_of(init["device_ids"]) == [a]
    assert init["device_ids"][0] in app["device_ids"]
    assert app["envs"]["NVIDIA_VISIBLE_DEVICES"] == f"{b},{c}"
    annotations = read_pod(control_plane, pod)["metadata"]["annotations"]
    assert annotations[names.BIND_PHASE] == "success"


def test_an_allocate_no_pod_awaits_fails_in_kubelet_and_frees_the_shares(
    control_plane: ControlPlane, namespace: str, gpu_node: GpuNode
) -> None:
    kubelet = gpu_node.kubelet
    kubelet.wait_state("the plugin's devices", lambda s: counts(s) == (20, 20))
    (card, _), *_ = gpu_node.cards
    stray = bound_pod(control_plane, namespace, gpu_node.name, [[(card, 1000, 10)]], annotate=False)
    reply = kubelet.call("admit", pod=running(control_plane, stray))
    assert not reply["ok"]
    assert "FailedPrecondition" in reply["error"]
    assert f"no pod bound to {gpu_node.name} awaits 1 device(s)" in reply["error"]
    # kubelet gave the shares back: a pod the plugin knows is served afterwards.
    pod = bound_pod(control_plane, namespace, gpu_node.name, [[(card, 1000, 10)]])
    (container,) = kubelet.ok("admit", pod=running(control_plane, pod))["containers"]
    assert cards_of(container["device_ids"]) == [card]


def test_after_a_kubelet_restart_the_plugin_registers_again_and_allocations_survive(
    control_plane: ControlPlane, namespace: str, gpu_node: GpuNode
) -> None:
    kubelet = gpu_node.kubelet
    kubelet.wait_state("the plugin's devices", lambda s: counts(s) == (20, 20))
    (a, _), (b, _), *_ = gpu_node.cards
    before = bound_pod(control_plane, namespace, gpu_node.name, [[(b, 3000, 40)]])
    admitted = kubelet.ok("admit", pod=running(control_plane, before))["containers"]

    kubelet.ok("restart")  # a new device manager: wipes the directory, new kubelet.sock
    kubelet.wait_state("the plugin again", lambda s: counts(s) == (20, 20))
    # The running container's options come from kubelet's checkpoint, unchanged (the pod's
    # entry is consumed: an Allocate now would be refused).
    assert kubelet.ok("options", pod=read_pod(control_plane, before))["containers"] == admitted
    # And the new manager reaches the plugin: a new pod is served.
    after = bound_pod(control_plane, namespace, gpu_node.name, [[(a, 1000, 10)]])
    (container,) = kubelet.ok("admit", pod=running(control_plane, after))["containers"]
    assert cards_of(container["device_ids"]) == [a]
    assert container["envs"]["NVIDIA_VISIBLE_DEVICES"] == a
    # kubelet.sock was re-created by the new manager and the plugin's socket is back.
    assert (kubelet.directory / "kubelet.sock").exists()
    assert (kubelet.directory / "vgpu-operator-nvidia.sock").exists()
