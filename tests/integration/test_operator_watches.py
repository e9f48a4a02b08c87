"""The operator's own watches (control/watching.py) across an API server restart: they
resume from their resourceVersion and miss nothing, so a card freed after the restart
is seen free and a pod created after it is placed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from integration import operator_env as env

from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.controlplane import AdminRequestError, ControlPlane


@pytest.fixture
def scheduler(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    yield env.new_scheduler(control_plane, namespace)
    env.cleanup_group(control_plane, namespace)


def _api_up(cp: ControlPlane) -> bool:
    try:
        cp.get("/api/v1/namespaces/default")
    except (AdminRequestError, OSError):
        return False
    return True


def test_watches_resume_after_an_api_server_restart(
    control_plane: ControlPlane, namespace: str, scheduler: str
) -> None:
    cp = control_plane
    node = f"{namespace}-a"
    card = env.cards(node, 1, memory_mib=16000)
    env.gpu_node(cp, node, card, group=namespace)

    def pod(name: str) -> dict[str, object]:
        return env.gpu_pod(namespace, name, scheduler=scheduler, group=namespace)

    with OperatorThread(env.options(cp, namespace)):
        env.create_pod(cp, pod("first"))
        env.wait_bound(cp, namespace, "first")
        cp.restart_apiserver(down_for=1.0)
        env.wait_until("the API server", lambda: _api_up(cp), 60)
        # The only card is taken: a pod created now waits...
        env.create_pod(cp, pod("second"))
        # ...until the first pod goes, which only a resumed pod watch can tell.
        cp.delete(f"/api/v1/namespaces/{namespace}/pods/first")
        bound = env.wait_bound(cp, namespace, "second", timeout_s=90)
    assert bound["spec"]["nodeName"] == node
    assert [uuid for uuid, _, _ in env.allocation(bound)] == [card[0].uuid]
