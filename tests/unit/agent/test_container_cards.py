"""Which container holds which card (``agent.containers``), from the pods on the node."""

from __future__ import annotations

from typing import Any

from vgpu_operator.agent.containers import ContainerCard, container_cards
from vgpu_operator.devices import nvidia

NODE = "gpu-1"


def pod(
    name: str,
    allocated: str,
    to_allocate: str | None = None,
    *,
    node: str = NODE,
    phase: str = "Running",
    inits: list[dict[str, Any]] | None = None,
    containers: tuple[str, ...] = ("main",),
) -> dict[str, Any]:
    annotations = {nvidia.ALLOCATED_ANNOTATION: allocated}
    if to_allocate is not None:
        annotations[nvidia.TO_ALLOCATE_ANNOTATION] = to_allocate
    return {
        "metadata": {"namespace": "team", "name": name, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "initContainers": inits or [],
            "containers": [{"name": c} for c in containers],
        },
        "status": {"phase": phase},
    }


def test_each_container_holds_the_cards_of_its_entry() -> None:
    two = pod(
        "two",
        "GPU-a,NVIDIA,1000,10:GPU-b,NVIDIA,1000,10:;GPU-c,NVIDIA,500,0:;",
        containers=("first", "second"),
    )
    assert container_cards([two], NODE) == {
        ContainerCard("team", "two", "first", "GPU-a"),
        ContainerCard("team", "two", "first", "GPU-b"),
        ContainerCard("team", "two", "second", "GPU-c"),
    }


def test_entries_not_handed_out_yet_and_finished_or_foreign_pods_hold_nothing() -> None:
    waiting = pod("waiting", "GPU-a,NVIDIA,1000,10:;", "GPU-a,NVIDIA,1000,10:;")
    done = pod("done", "GPU-a,NVIDIA,1000,10:;", phase="Succeeded")
    elsewhere = pod("elsewhere", "GPU-a,NVIDIA,1000,10:;", node="gpu-2")
    unreadable = pod("bad", "not an allocation")
    assert container_cards([waiting, done, elsewhere, unreadable], NODE) == set()


def test_init_containers_that_finish_hold_nothing_sidecars_do() -> None:
    inits = [{"name": "setup"}, {"name": "sidecar", "restartPolicy": "Always"}]
    with_inits = pod(
        "p", "GPU-a,NVIDIA,100,0:;GPU-b,NVIDIA,100,0:;GPU-c,NVIDIA,100,0:;", inits=inits
    )
    assert container_cards([with_inits], NODE) == {
        ContainerCard("team", "p", "sidecar", "GPU-b"),
        ContainerCard("team", "p", "main", "GPU-c"),
    }


def test_a_mig_instance_counts_as_its_card() -> None:
    mig = pod("mig", "GPU-a[1-3],NVIDIA,5120,0:;")
    assert container_cards([mig], NODE) == {ContainerCard("team", "mig", "main", "GPU-a")}
