"""Two replicas with Kopf peering: one decides, the other stands by and takes over.

Both operators run in this process (each with its own Kopf registry and event loop) and
record themselves in a ClusterKopfPeering object of the test's own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from integration import operator_env as env
from integration.test_operator_webhook import WEBHOOKS, _free_port, make_pki

from vgpu_operator.control.options import WebhookOptions
from vgpu_operator.handlers.app import WEBHOOK_ID
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.metrics import Result
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane

PEERING_MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "peering.yaml"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
PEERINGS = "/apis/kopf.dev/v1/clusterkopfpeerings"


def _install_peering_crds(cp: ControlPlane) -> None:
    for doc in yaml.safe_load_all(PEERING_MANIFEST.read_text()):
        if doc and doc["kind"] == "CustomResourceDefinition":
            env.create_unless_present(cp, CRDS, doc)

    def served() -> bool:
        try:
            cp.get(PEERINGS)
        except AdminRequestError:
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
    for result in Result:
        value = operator.app.metrics.registry.get_sample_value(
            "vgpu_operator_scheduling_attempts_total", {"result": result.value}
        )
        total += value or 0.0
    return total


def _leader(operator: OperatorThread) -> bool:
    return operator.app.metrics.registry.get_sample_value("vgpu_operator_leader") == 1


def test_one_replica_decides_and_the_other_takes_over(
    control_plane: ControlPlane, namespace: str, peering: str
) -> None:
    cp = control_plane
    scheduler = env.new_scheduler(cp, namespace)
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
        state = second.app.running.state
        assert state is not None
        held = state.holding_pods()
        assert all(f"{namespace}/a{i}" in held for i in range(5))
    finally:
        if first.alive:
            first.stop()
        if second is not None:
            second.stop()


def test_a_standby_answers_the_webhook_from_current_quotas(
    control_plane: ControlPlane,
    namespace: str,
    peering: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The Service sends admission requests to any Ready replica. A standby's Kopf watches
    are paused; its webhook must still see a quota created after it started."""
    cp = control_plane
    env.new_scheduler(cp, namespace)  # the operator needs its config; no pod names it
    pki = make_pki(tmp_path)
    port = _free_port()
    webhook = WebhookOptions(
        port=port, addr="127.0.0.1", certfile=pki.cert, pkeyfile=pki.key, cafile=pki.ca
    )
    first = OperatorThread(env.options(cp, namespace, standalone=False, peering=peering)).start()
    second: OperatorThread | None = None
    config_name = f"vgpu-standby-{namespace}"
    try:
        env.wait_until("the first replica to lead", lambda: _leader(first), 30)
        options = env.options(cp, namespace, standalone=False, peering=peering, webhook=webhook)
        second = OperatorThread(options).start()
        env.register_pod_webhook(
            cp,
            config_name,
            namespace,
            f"https://127.0.0.1:{port}/{WEBHOOK_ID}",
            pki.ca.read_bytes(),
        )
        quota_path = f"/api/v1/namespaces/{namespace}/resourcequotas"
        cp.create(
            quota_path,
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "gpu"},
                "spec": {"hard": {"limits.nvidia.com/gpumem": "100000"}},
            },
        )

        def pod(name: str, memory: int) -> dict[str, Any]:
            limits = {"nvidia.com/gpumem": str(memory)}
            container = {"name": "main", "image": "registry.invalid/x"}
            container["resources"] = {"limits": limits}
            meta = {"name": name, "namespace": namespace}
            return {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": meta,
                "spec": {"containers": [container]},
            }

        def refused(memory: int) -> Callable[[], str | None]:
            def attempt() -> str | None:
                try:
                    cp.create(f"/api/v1/namespaces/{namespace}/pods?dryRun=All", pod("p", memory))
                except AdminRequestError as exc:
                    return exc.body if "exceeding resource quota" in exc.body else None
                return None

            return attempt

        # The standby knows the quota as it was (its listing or its watch)...
        env.wait_until("the standby to refuse by the quota", refused(200000), 30)
        # ...and the quota changes while it stands by.
        cp.patch(f"{quota_path}/gpu", {"spec": {"hard": {"limits.nvidia.com/gpumem": "1000"}}})
        assert not _leader(second)
        message = env.wait_until("the standby to refuse by the new quota", refused(4000), 30)
        assert "limit 1000" in message
        assert not _leader(second), "the answer must come from the standby"
        # A denial is an ordinary answer: never an error line.
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    finally:
        cp.delete(f"{WEBHOOKS}/{config_name}")
        first.stop()
        if second is not None:
            second.stop()
