"""Alibaba's cluster-trace-gpu-v2023 (the trace of FGD, USENIX ATC '23) as scenarios.

The trace is public data published for research and study, with no licence to
redistribute it: it is fetched at bench time from its GitHub repository into
``.bench/clusterdata/`` (or read from ``VGPU_FGD_TRACE_DIR``), never shipped here.

FGD's method (its simulator, "Beware of Fragmentation" §6): the trace's GPU nodes
(1,213 nodes, 6,212 GPUs), its tasks shuffled by a seed, then copies of randomly drawn
tasks appended until the GPUs asked for reach 130 % of capacity; nothing leaves. A
task's ``num_gpu`` whole GPUs, or for one GPU a fraction ``gpu_milli``, becomes a pod
asking ``nvidia.com/gpu`` with ``gpucores`` and ``gpumem-percentage`` both the fraction
(1000 milli = 100); its CPU and memory become the pod's requests. Each card has 100
cores, a model's memory and ``SPLIT`` slots (more than the smallest share needs, so
that slots never bind, as in FGD's simulator where only milli-GPUs count).
"""

from __future__ import annotations

import csv
import os
import random
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

REPO_URL: Final = (
    "https://raw.githubusercontent.com/alibaba/clusterdata/master/cluster-trace-gpu-v2023/csv/"
)
NODE_FILE: Final = "openb_node_list_gpu_node.csv"
#: The task lists FGD publishes figures for: the default list, a GPU-sharing-heavy and a
#: multi-GPU-heavy one.
TASK_FILES: Final = {
    "default": "openb_pod_list_default.csv",
    "gpushare100": "openb_pod_list_gpushare100.csv",
    "multigpu50": "openb_pod_list_multigpu50.csv",
}
CACHE: Final = Path(__file__).resolve().parents[2] / ".bench" / "clusterdata"
INFLATE: Final = 1.3
SPLIT: Final = 20
#: Card memory (MiB) per model; percentages make it matter only for rounding.
MODEL_MIB: Final = {
    "P100": 16384,
    "T4": 15360,
    "V100M16": 16384,
    "V100M32": 32768,
    "A10": 24576,
    "G2": 32768,
    "G3": 81920,
}


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int

    @property
    def gpu_demand(self) -> float:
        """GPUs asked for (a share as its fraction)."""
        if self.num_gpu == 1:
            return self.gpu_milli / 1000
        return float(self.num_gpu)


def trace_dir() -> Path:
    configured = os.environ.get("VGPU_FGD_TRACE_DIR")
    return Path(configured) if configured else CACHE


def fetch(name: str) -> Path:
    """The trace file, fetched once into the cache (or found in VGPU_FGD_TRACE_DIR)."""
    folder = trace_dir()
    path = folder / name
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(REPO_URL + name, timeout=60) as answer:
            data = answer.read()
        path.with_suffix(".part").write_bytes(data)
        path.with_suffix(".part").rename(path)
    return path


def _rows(path: Path) -> Iterator[dict[str, str]]:
    with path.open(newline="") as handle:
        yield from csv.DictReader(handle)


def load_nodes() -> list[dict[str, Any]]:
    nodes = []
    for row in _rows(fetch(NODE_FILE)):
        model, count = row["model"], int(row["gpu"])
        mib = MODEL_MIB.get(model, 16384)
        name = row["sn"]
        nodes.append(
            {
                "metadata": {"name": name, "labels": {}, "annotations": {}},
                "status": {
                    "allocatable": {
                        "cpu": f"{int(row['cpu_milli'])}m",
                        "memory": f"{int(row['memory_mib'])}Mi",
                        "pods": "1000",
                    }
                },
                "devices": [
                    {
                        "id": f"GPU-{name}-{i}",
                        "index": i,
                        "count": SPLIT,
                        "devmem": mib,
                        "devcore": 100,
                        "type": f"NVIDIA-{model}",
                        "numa": 0,
                        "health": True,
                        "mode": "hami-core",
                    }
                    for i in range(count)
                ],
            }
        )
    return nodes


def load_tasks(mix: str = "default") -> list[Task]:
    return [
        Task(
            r["name"],
            int(r["cpu_milli"]),
            int(r["memory_mib"]),
            int(r["num_gpu"]),
            int(r["gpu_milli"]),
        )
        for r in _rows(fetch(TASK_FILES[mix]))
    ]


def arrivals(tasks: list[Task], capacity: float, seed: int) -> list[Task]:
    """FGD's arrivals: the tasks shuffled, then random copies until 130 % of capacity."""
    rng = random.Random(seed)
    order = list(tasks)
    rng.shuffle(order)
    asked = sum(t.gpu_demand for t in order)
    copies = 0
    while asked < INFLATE * capacity:
        task = rng.choice(tasks)
        copies += 1
        order.append(
            Task(
                f"{task.name}-c{copies}",
                task.cpu_milli,
                task.memory_mib,
                task.num_gpu,
                task.gpu_milli,
            )
        )
        asked += task.gpu_demand
    return order


def pod_of(task: Task, node_policy: str, gpu_policy: str) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if task.num_gpu > 0:
        share = task.gpu_milli // 10 if task.num_gpu == 1 else 100
        limits = {
            "nvidia.com/gpu": task.num_gpu,
            "nvidia.com/gpucores": share,
            "nvidia.com/gpumem-percentage": share,
        }
    requests = {"cpu": f"{task.cpu_milli}m", "memory": f"{task.memory_mib}Mi"}
    annotations = {
        "hami.io/node-scheduler-policy": node_policy,
        "hami.io/gpu-scheduler-policy": gpu_policy,
    }
    return {
        "metadata": {"namespace": "trace", "name": task.name, "annotations": annotations},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "containers": [{"name": "main", "resources": {"requests": requests, "limits": limits}}],
        },
    }


def scenario(
    mix: str, seed: int, node_policy: str, gpu_policy: str
) -> tuple[dict[str, Any], list[Task], float]:
    """The scenario of one replay, its arrivals in order, and the GPU capacity."""
    nodes = load_nodes()
    capacity = float(sum(len(n["devices"]) for n in nodes))
    tasks = arrivals(load_tasks(mix), capacity, seed)
    pods = [pod_of(t, node_policy, gpu_policy) for t in tasks]
    config = {
        "nvidia": {"deviceSplitCount": SPLIT},
        "scheduler": {"nodeSchedulerPolicy": node_policy, "gpuSchedulerPolicy": gpu_policy},
    }
    return (
        {"name": f"fgd-{mix}-{seed}", "config": config, "nodes": nodes, "pods": pods},
        tasks,
        capacity,
    )
