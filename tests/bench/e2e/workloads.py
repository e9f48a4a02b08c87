"""The pods of each workload: what they ask for and which ones cannot fit."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from e2e.api import Json
from vgpu_operator import names
from vgpu_operator.devices import nvidia

OPERATOR_SCHEDULER: Final = names.SCHEDULER_NAME
KUBE_SCHEDULER: Final = "default-scheduler"
#: Pods no scheduler watches: the binding ceiling binds them itself.
NOBODY: Final = "vgpu-bench-nobody"
IMAGE: Final = "registry.invalid/cuda:12"


def pod(
    namespace: str,
    name: str,
    *,
    scheduler: str,
    limits: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    node: str | None = None,
) -> Json:
    spec: Json = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": IMAGE, "resources": {"limits": dict(limits)}}],
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
    }


@dataclass(frozen=True, slots=True)
class Workload:
    """``count`` pods made by ``make(namespace, index)``; ``unfit`` of them cannot fit."""

    name: str
    what: str
    count: int
    make: Callable[[str, int], Json]
    unfit: Callable[[int], bool] = lambda index: False


def whole(scheduler: str = OPERATOR_SCHEDULER) -> Callable[[str, int], Json]:
    """One whole card (memory defaults to all of it, as in HAMi)."""
    return lambda ns, i: pod(
        ns, f"whole-{i:05d}", scheduler=scheduler, limits={"nvidia.com/gpu": "1"}
    )


def fractional(memory_mib: int = 8192, cores: int = 20) -> Callable[[str, int], Json]:
    limits = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": str(memory_mib),
        "nvidia.com/gpucores": str(cores),
    }
    return lambda ns, i: pod(ns, f"frac-{i:05d}", scheduler=OPERATOR_SCHEDULER, limits=limits)


def multi(gpus: int = 4) -> Callable[[str, int], Json]:
    """Several whole cards chosen for their links (topology-aware policy)."""
    return lambda ns, i: pod(
        ns,
        f"multi-{i:05d}",
        scheduler=OPERATOR_SCHEDULER,
        limits={"nvidia.com/gpu": str(gpus)},
        annotations={"hami.io/gpu-scheduler-policy": "topology-aware"},
    )


def selected(models: list[str], uuids: list[str]) -> Callable[[str, int], Json]:
    """Every fourth pod names one card by UUID; the others a model by type."""

    def make(ns: str, i: int) -> Json:
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "10"}
        if i % 4 == 3:
            choice = {nvidia.USE_UUID_ANNOTATION: uuids[(i // 4) % len(uuids)]}
        else:
            choice = {nvidia.USE_TYPE_ANNOTATION: models[i % len(models)]}
        return pod(
            ns, f"sel-{i:05d}", scheduler=OPERATOR_SCHEDULER, limits=limits, annotations=choice
        )

    return make


#: What an unfittable fractional pod asks for: more memory than any card has (1 TiB).
UNFIT_MEMORY_MIB: Final = 1 << 20
#: What an unfittable whole-GPU pod asks for: more cards than any node has (8 each).
UNFIT_GPUS: Final = 9


def mixed_unfit(
    every: int = 10, *, whole_gpus: bool = False, scheduler: str = OPERATOR_SCHEDULER
) -> tuple[Callable[[str, int], Json], Callable[[int], bool]]:
    """Every ``every``-th pod cannot fit, the others are the ``fractional()`` pods (8 GiB,
    20 cores; ``whole_gpus``: the ``whole()`` pods, which kube-scheduler can place too).
    An unfittable fractional pod asks for 1 TiB of one card, an unfittable whole-GPU pod
    for 9 cards."""

    def unfit(i: int) -> bool:
        return i % every == every - 1

    def make(ns: str, i: int) -> Json:
        if whole_gpus:
            limits = {"nvidia.com/gpu": str(UNFIT_GPUS if unfit(i) else 1)}
        else:
            memory = UNFIT_MEMORY_MIB if unfit(i) else 8192
            limits = {
                "nvidia.com/gpu": "1",
                "nvidia.com/gpumem": str(memory),
                "nvidia.com/gpucores": "20",
            }
        return pod(ns, f"unfit-{i:05d}", scheduler=scheduler, limits=limits)

    return make, unfit


def unfittable(namespace: str, index: int) -> Json:
    """A pod of the standing backlog: one card with 1 TiB, which no card has."""
    limits = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": str(UNFIT_MEMORY_MIB),
        "nvidia.com/gpucores": "20",
    }
    return pod(namespace, f"standing-{index:05d}", scheduler=OPERATOR_SCHEDULER, limits=limits)
