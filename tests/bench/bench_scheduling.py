"""Latency of one scheduling decision on big, half-loaded clusters; reports, asserts nothing.

Run standalone (``PYTHONSAFEPATH=1 .venv/bin/python tests/bench/bench_scheduling.py``) or
call ``run()``. Each cluster has nodes of 8 GPUs (80 GiB, 10 slots, 100 cores, NUMA 0/1,
two models) carrying running pods of 1-8 GPUs, about half of every card in use. Each case
times ``ClusterState.schedule()`` of one pending pod, then rolls the reservation back so
that every repetition sees the same load.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

from vgpu_operator import names
from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import codec, model
from vgpu_operator.scheduling import placement
from vgpu_operator.scheduling.cluster import ClusterState

GPUS_PER_NODE = 8
CARD_MEMORY_MIB = 81920
MODELS = ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
SIZES = (1_000, 5_000)
#: What ``make bench`` is judged against: p99 per decision, by cluster size.
AIM_P99_MS = {1_000: 2.0, 5_000: 5.0}

#: Repetitions per case; cases that visit most nodes get fewer.
RUNS = 1000
WARMUP = 50
FEW_RUNS = 20


def _node(name: str) -> dict[str, Any]:
    allocatable = {"cpu": "128", "memory": "1Ti", "pods": "250", "nvidia.com/gpu": "80"}
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": allocatable, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _cards(node_index: int, rng: random.Random) -> list[model.DeviceInfo]:
    card_type = MODELS[node_index % len(MODELS)]
    return [
        model.DeviceInfo(
            id=f"GPU-{node_index:05d}-{i}",
            index=i,
            count=10,
            memory_mib=CARD_MEMORY_MIB,
            cores=100,
            type=card_type,
            numa=i * 2 // GPUS_PER_NODE,
            health=rng.random() > 0.002,
        )
        for i in range(GPUS_PER_NODE)
    ]


def _running_pods(
    node: str, cards: list[model.DeviceInfo], rng: random.Random
) -> Iterable[dict[str, Any]]:
    """3-7 rounds; each round splits the 8 cards into groups of 1, 2, 4 or 8, one pod per
    group. Averages 5 tasks, ~40 GiB and ~50 cores per card, never more than a card holds."""
    serial = 0
    for _round in range(rng.randint(3, 7)):
        free = [c.id for c in cards]
        rng.shuffle(free)
        while free:
            size = rng.choice([s for s in (1, 2, 4, 8) if s <= len(free)])
            group, free = free[:size], free[size:]
            memory_mib = rng.choice((4096, 8192, 10240))
            cores = rng.choice((5, 10, 12))
            devices = (tuple(model.ContainerDevice(u, "NVIDIA", memory_mib, cores) for u in group),)
            allocated = codec.encode_pod_single_device(devices)
            serial += 1
            yield {
                "metadata": {
                    "name": f"{node}-run-{serial}",
                    "namespace": "running",
                    "annotations": {
                        names.ASSIGNED_NODE: node,
                        names.NVIDIA_DEVICES_ALLOCATED: allocated,
                    },
                },
                "spec": {
                    "nodeName": node,
                    "schedulerName": names.SCHEDULER_NAME,  # placed by us: booked
                    "containers": [
                        {
                            "name": "main",
                            "resources": {
                                "limits": {
                                    "nvidia.com/gpu": size,
                                    "nvidia.com/gpumem": memory_mib,
                                    "nvidia.com/gpucores": cores,
                                },
                                "requests": {"cpu": "1", "memory": "4Gi"},
                            },
                        }
                    ],
                },
                "status": {"phase": "Running"},
            }


def build_cluster(nodes: int, seed: int = 7) -> ClusterState:
    """A ClusterState of ``nodes`` half-loaded 8-GPU nodes (deterministic for a seed)."""
    rng = random.Random(seed)
    state = ClusterState(DeviceConfig())
    for index in range(nodes):
        name = f"node-{index:05d}"
        cards = _cards(index, rng)
        state.set_node(_node(name))
        state.set_inventory(name, cards, {}, heartbeat=0.0)
        for pod in _running_pods(name, cards, rng):
            state.set_pod(pod)
    return state


def _pending(name: str, gpus: int, memory_mib: int, cores: int, **annotations: str) -> Any:
    return {
        "metadata": {"name": name, "namespace": "bench", "annotations": dict(annotations)},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": gpus,
                            "nvidia.com/gpumem": memory_mib,
                            "nvidia.com/gpucores": cores,
                        },
                        "requests": {"cpu": "2", "memory": "8Gi"},
                    },
                }
            ]
        },
    }


#: (case name, pending pod, repetitions, whether it is expected to fit, judged by the aim).
#: The last two are there to show the costly paths: a whole-node job that few half-loaded
#: nodes can take (most nodes pass the summary and are fitted in full), and a pod that
#: fits nowhere (every node is fitted, then fitted again for the diagnosis).
CASES: tuple[tuple[str, Mapping[str, Any], int, bool, bool], ...] = (
    ("1 GPU 8 GiB 20 cores", _pending("one-gpu", 1, 8192, 20), RUNS, True, True),
    ("2 GPUs 8 GiB 20 cores", _pending("two-gpu", 2, 8192, 20), RUNS, True, True),
    ("8 GPUs 30 GiB 20 cores", _pending("eight-gpu", 8, 30000, 20), FEW_RUNS, True, False),
    (
        "unschedulable (diagnosis)",
        _pending("no-fit", 1, 8192, 20, **{names.GPU_USE_TYPE: "B200"}),
        FEW_RUNS,
        False,
        False,
    ),
)


def _percentile(sorted_ms: list[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    rank = max(1, math.ceil(fraction * len(sorted_ms)))
    return sorted_ms[rank - 1]


def time_case(state: ClusterState, pod: Mapping[str, Any], runs: int, fits: bool) -> list[float]:
    """Milliseconds per ``schedule()``; each reservation is rolled back before the next."""
    timings: list[float] = []
    warmup = min(WARMUP, max(1, runs // 10))
    for repetition in range(warmup + runs):
        started = time.perf_counter()
        decision = state.schedule(pod, 0.0)
        elapsed_ms = (time.perf_counter() - started) * 1000
        if decision.scheduled != fits:
            raise RuntimeError(f"{decision.pod}: scheduled={decision.scheduled}, expected {fits}")
        state.rollback(decision.pod)
        if repetition >= warmup:
            timings.append(elapsed_ms)
    return timings


def time_parse(state: ClusterState, pod: Mapping[str, Any], runs: int) -> list[float]:
    """Milliseconds per attempt spent before any node is looked at: admission defaults and
    the one parsed job (requests, policies, card filters) that every node is tried with."""
    timings: list[float] = []
    for _ in range(runs):
        started = time.perf_counter()
        admitted = state.admit(pod)
        placement.Job.from_pod(
            admitted.pod if admitted.allowed else pod, state.config, state.vendors, state.quota
        )
        timings.append((time.perf_counter() - started) * 1000)
    return timings


def _row(case: str, timings: list[float], aim: float | None) -> dict[str, Any]:
    timings = sorted(timings)
    return {
        "case": case,
        "p50_ms": round(_percentile(timings, 0.50), 3),
        "p99_ms": round(_percentile(timings, 0.99), 3),
        "max_ms": round(timings[-1], 3),
        "runs": len(timings),
        "aim_p99_ms": aim,
    }


def run(sizes: Iterable[int] = SIZES) -> list[dict[str, Any]]:
    """One row per (cluster size, case): case, p50_ms, p99_ms, max_ms, runs, aim_p99_ms."""
    rows: list[dict[str, Any]] = []
    for nodes in sizes:
        started = time.perf_counter()
        state = build_cluster(nodes)
        build_s = time.perf_counter() - started
        pods = len(state.holding_pods())
        print(f"built {nodes} nodes, {pods} running pods in {build_s:.1f} s", file=sys.stderr)
        for name, pod, runs, fits, judged in CASES:
            timings = time_case(state, pod, runs, fits)
            aim = AIM_P99_MS.get(nodes) if judged else None
            rows.append(_row(f"schedule {nodes} nodes: {name}", timings, aim))
        pod = CASES[0][1]
        rows.append(_row(f"parse one attempt ({nodes} nodes)", time_parse(state, pod, RUNS), None))
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
