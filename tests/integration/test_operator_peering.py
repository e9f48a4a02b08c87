"""Two replicas with Kopf peering: one decides, the other stands by and takes over.

Both operators run in this process (each with its own Kopf registry and event loop) and
record themselves in a ClusterKopfPeering object of the test's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from integration import operator_env as env

from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.controlplane import ApiError, ControlPlane

PEERING_MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "peering.yaml"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
PEERINGS = "/apis/kopf.dev/v1/clusterkopfpeerings"


def _install_peering_crds(cp: ControlPlane) -> None:
    for doc in yaml.safe_load_all(PEERING_MANIFEST.read_text()):
        if doc and doc["kind"] == "CustomResourceDefinition":
            try:
                cp.create(CRDS, doc)
            except ApiError as exc:
                if exc.status != 409:
                    raise

    def served() -> bool:
        try:
            cp.get(PEERINGS)
        except ApiError:
            return False
        return True

    env.wait_until("the peering CRDs to be served", served, 30)


@pytest.fixture
def peering(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    _install_peering_crds(control_plane)
    name = f"peering-{namespace}"
    control_plane.create(
        PEERINGS,
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}},
    )
    yield name
    control_plane.delete(f"{PEERINGS}/{name}")
    env.cleanup_group(control_plane, namespace)


def _attempts(operator: OperatorThread) -> float:
    total = 0.0
    for result in ("scheduled", "unschedulable", "rejected", "bind_conflict", "error"):
        value = operator.app.metrics.registry.get_sample_value(
            "vgpu_operator_scheduling_attempts_total", {"result": result}
        )
        total += value or 0.0
    return total


def _leader(operator: OperatorThread) -> bool:
    return operator.app.metrics.registry.get_sample_value("vgpu_operator_leader") == 1


def test_one_replica_decides_and_the_other_takes_over(
    control_plane: ControlPlane, namespace: str, peering: str
) -> None:
    cp = control_plane
    env.install_crd(cp)
    scheduler = env.unique("sched")
    env.put_config_map(cp, namespace, env.config_text(scheduler))
    node = f"{namespace}-p"
    env.gpu_node(cp, node, env.cards(node, 2), group=namespace)

    def pod(name: str) -> dict[str, object]:
        return env.gpu_pod(namespace, name, scheduler=scheduler, group=namespace, gpumem=1000)

    options = env.options(cp, namespace, standalone=False, peering=peering)
    first = OperatorThread(options).start()
    second: OperatorThread | None = None
    try:
        env.wait_until("the first replica to lead", lambda: _leader(first), 30)
        second = OperatorThread(options).start()
        for i in range(5):
            env.create_pod(cp, pod(f"a{i}"))
        for i in range(5):
            env.wait_bound(cp, namespace, f"a{i}")
        assert _attempts(first) >= 5
        assert _attempts(second) == 0
        assert not _leader(second)

        first.stop()  # a clean exit removes its peering record
        env.wait_until("the second replica to lead", lambda: _leader(second), 60)
        for i in range(5):
            env.create_pod(cp, pod(f"b{i}"))
        for i in range(5):
            env.wait_bound(cp, namespace, f"b{i}")
        assert _attempts(second) >= 5
        # The new leader rebuilt the bookings of the pods the first one bound.
        state = second.app.state
        assert state is not None
        held = state.holding_pods()
        assert all(f"{namespace}/a{i}" in held for i in range(5))
    finally:
        if first.alive:
            first.stop()
        if second is not None:
            second.stop()
