"""Alibaba's cluster-trace-gpu-v2023 (the trace of FGD, USENIX ATC '23) as scenarios.

The trace is public data published for research and study, with no licence to
redistribute it: it is fetched at bench time from its GitHub repository into
``.bench/clusterdata/`` (or read from ``VGPU_FGD_TRACE_DIR``), never shipped here. FGD's
own per-seed results (its simulator's repository, ``expected_results``) are fetched the
same way, to compare with (``fgd_published``).

FGD's method (its simulator, "Beware of Fragmentation" §6): the trace's GPU nodes
(1,213 nodes, 6,212 GPUs), the task list shuffled by a seed, then tuned to 130 % of the
GPU capacity: copies of randomly drawn tasks appended while the GPUs asked stay under
it, or (a list asking more) randomly drawn tasks removed until they do; nothing leaves.
A task's ``num_gpu`` whole GPUs, or for one GPU a fraction ``gpu_milli``, becomes a pod
asking ``nvidia.com/gpu`` with ``gpucores`` and ``gpumem-percentage`` both the fraction
(1000 milli = 100); its ``gpu_spec`` (card models it accepts) becomes
``nvidia.com/use-gputype``; its CPU and memory become the pod's requests. Each card has
100 cores, a model's memory and ``SPLIT`` slots (more than the smallest share needs, so
that slots never bind, as in FGD's simulator where only milli-GPUs count).
"""

from __future__ import annotations

import csv
import os
import random
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

REPO_URL: Final = (
    "https://raw.githubusercontent.com/alibaba/clusterdata/master/cluster-trace-gpu-v2023/csv/"
)
#: FGD's simulator: its published per-seed results (allocation per percent arrived).
RESULTS_URL: Final = (
    "https://raw.githubusercontent.com/hkust-adsl/kubernetes-scheduler-simulator/"
    "master/experiments/analysis/expected_results/"
)
RESULTS_FILE: Final = "analysis_allo_discrete.csv"
NODE_FILE: Final = "openb_node_list_gpu_node.csv"
#: The task lists FGD publishes figures for (§6: Fig. 7, 11-14): the default list, more
#: GPU-sharing tasks, more multi-GPU tasks, card-model constraints, more CPU-only tasks.
LISTS: Final = (
    "default",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
)
TASK_FILES: Final = {name: f"openb_pod_list_{name}.csv" for name in LISTS}
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
HOSTNAME: Final = "kubernetes.io/hostname"


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    #: Card models the task accepts (empty: any).
    models: frozenset[str] = frozenset()
    #: The trace's creation and deletion times (s; None where the list has none).
    created: int | None = None
    deleted: int | None = None

    @property
    def gpu_demand(self) -> float:
        """GPUs asked for (a share as its fraction)."""
        return self.milli_per_card * self.num_gpu / 1000

    @property
    def milli_per_card(self) -> int:
        """GPU milli per card (whole cards are 1000; nothing for a CPU-only task)."""
        if self.num_gpu == 0:
            return 0
        return min(self.gpu_milli, 1000) if self.num_gpu == 1 else 1000


def trace_dir() -> Path:
    configured = os.environ.get("VGPU_FGD_TRACE_DIR")
    return Path(configured) if configured else CACHE


def fetch(name: str, base: str = REPO_URL) -> Path:
    """The file, fetched once into the cache (or found in VGPU_FGD_TRACE_DIR)."""
    folder = trace_dir()
    path = folder / name
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(base + name, timeout=60) as answer:
            data = answer.read()
        path.with_suffix(".part").write_bytes(data)
        path.with_suffix(".part").rename(path)
    return path


def _rows(path: Path) -> Iterator[dict[str, str]]:
    with path.open(newline="") as handle:
        yield from csv.DictReader(handle)


def node_rows() -> list[dict[str, str]]:
    return list(_rows(fetch(NODE_FILE)))


def load_nodes(rows: Sequence[dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """The trace's GPU nodes (or these rows of its node list) as scenario nodes."""
    nodes = []
    for row in node_rows() if rows is None else rows:
        model, count = row["model"], int(row["gpu"])
        mib = MODEL_MIB.get(model, 16384)
        name = row["sn"]
        nodes.append(
            {
                "metadata": {"name": name, "labels": {HOSTNAME: name}, "annotations": {}},
                "status": {
                    "allocatable": {
                        "cpu": f"{int(row['cpu_milli'])}m",
                        "memory": f"{int(row['memory_mib'])}Mi",
                        "pods": "1000",
                    }
                },
                "devices": [
                    {
                        "id": card_id(name, i),
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


def card_id(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


def card_index(node: str, card: str) -> int:
    """The index of a card named by ``card_id``."""
    prefix = f"GPU-{node}-"
    if not card.startswith(prefix):
        raise ValueError(f"card {card!r} is not one of node {node}'s")
    return int(card[len(prefix) :])


def _int(value: str | None) -> int | None:
    return int(value) if value not in (None, "") else None


def load_tasks(mix: str = "default") -> list[Task]:
    if mix not in TASK_FILES:
        raise ValueError(f"task list {mix!r}: choose one of {', '.join(LISTS)}")
    return [
        Task(
            r["name"],
            int(r["cpu_milli"]),
            int(r["memory_mib"]),
            int(r["num_gpu"]),
            int(r["gpu_milli"]),
            frozenset(m for m in (r.get("gpu_spec") or "").split("|") if m),
            _int(r.get("creation_time")),
            _int(r.get("deletion_time")),
        )
        for r in _rows(fetch(TASK_FILES[mix]))
    ]


def arrivals(tasks: Sequence[Task], capacity: float, seed: int) -> list[Task]:
    """FGD's arrivals: the tasks shuffled, then tuned to 130 % of capacity (random
    copies appended, or random tasks removed when the list asks more)."""
    rng = random.Random(seed)
    order = sorted(tasks, key=lambda t: t.name)
    rng.shuffle(order)
    asked = sum(t.gpu_demand for t in order)
    target = INFLATE * capacity
    while asked > target and order:
        asked -= order.pop(rng.randrange(len(order))).gpu_demand
    copies = 0
    while asked < target:
        task = tasks[rng.randrange(len(tasks))]
        copies += 1
        order.append(replace(task, name=f"{task.name}-c{copies}"))
        asked += task.gpu_demand
    return order


def pod_of(
    task: Task,
    node_policy: str,
    gpu_policy: str,
    pin: tuple[str, Sequence[int]] | None = None,
) -> dict[str, Any]:
    """The task as a pod; ``pin`` (node, card indices) restricts it to that node and
    those cards (a reference scorer's choice, carried out by the engine)."""
    limits: dict[str, Any] = {}
    if task.num_gpu > 0:
        share = task.milli_per_card // 10
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
    if task.models and task.num_gpu > 0:
        annotations["nvidia.com/use-gputype"] = ",".join(sorted(task.models))
    spec: dict[str, Any] = {
        "schedulerName": "vgpu-scheduler",
        "containers": [{"name": "main", "resources": {"requests": requests, "limits": limits}}],
    }
    if pin is not None:
        node, cards = pin
        spec["nodeSelector"] = {HOSTNAME: node}
        if cards:
            annotations["nvidia.com/use-gpuuuid"] = ",".join(card_id(node, i) for i in cards)
    return {
        "metadata": {"namespace": "trace", "name": task.name, "annotations": annotations},
        "spec": spec,
    }


def scenario(
    mix: str, seed: int, node_policy: str, gpu_policy: str
) -> tuple[dict[str, Any], list[Task], float]:
    """The scenario of one replay, its arrivals in order, and the GPU capacity."""
    nodes = load_nodes()
    capacity = float(sum(len(n["devices"]) for n in nodes))
    tasks = arrivals(load_tasks(mix), capacity, seed)
    pods = [pod_of(t, node_policy, gpu_policy) for t in tasks]
    document = {
        "name": f"fgd-{mix}-{seed}",
        "config": config(node_policy, gpu_policy),
        "nodes": nodes,
        "pods": pods,
    }
    return document, tasks, capacity


def config(node_policy: str, gpu_policy: str) -> dict[str, Any]:
    return {
        "nvidia": {"deviceSplitCount": SPLIT},
        "scheduler": {"nodeSchedulerPolicy": node_policy, "gpuSchedulerPolicy": gpu_policy},
    }


def fgd_published() -> dict[tuple[str, str], dict[int, float]]:
    """FGD's published runs: per (task list, policy) and seed, the GPUs left unallocated
    (%) at 100 % arrived (its analysis's bucket ``100``: the allocation averaged over the
    events whose arrived GPUs round to 100 % of capacity)."""
    out: dict[tuple[str, str], dict[int, float]] = {}
    for row in _rows(fetch(RESULTS_FILE, RESULTS_URL)):
        name = row["workload"].removeprefix("openb_pod_list_")
        policy = row["sc_policy"].split("-", 1)[-1]
        if row.get("100"):
            out.setdefault((name, policy), {})[int(row["seed"])] = round(
                100.0 - float(row["100"]), 2
            )
    return out
