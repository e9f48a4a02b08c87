"""The pods of each workload: what they ask for and which ones cannot fit."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from e2e.api import Json
from vgpu_operator import names

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
            choice = {names.GPU_USE_UUID: uuids[(i // 4) % len(uuids)]}
        else:
            choice = {names.GPU_USE_TYPE: models[i % len(models)]}
        return pod(
            ns, f"sel-{i:05d}", scheduler=OPERATOR_SCHEDULER, limits=limits, annotations=choice
        )

    return make


def mixed_unfit(every: int = 10) -> tuple[Callable[[str, int], Json], Callable[[int], bool]]:
    """Fractional pods, and every ``every``-th one asks for more memory than any card has."""

    def unfit(i: int) -> bool:
        return i % every == every - 1

    def make(ns: str, i: int) -> Json:
        memory = "1048576" if unfit(i) else "4096"
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": memory, "nvidia.com/gpucores": "10"}
        return pod(ns, f"unfit-{i:05d}", scheduler=OPERATOR_SCHEDULER, limits=limits)

    return make, unfit
