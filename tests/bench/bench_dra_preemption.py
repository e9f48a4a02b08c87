"""Latency of one preemption decision on the DRA path (issue 35); reports, asserts nothing.

Run standalone (``PYTHONSAFEPATH=1 .venv/bin/python tests/bench/bench_dra_preemption.py``)
or call ``run()``. The cluster: DRA nodes of 8 cards (80 GiB, 100 cores, 4 shares each),
every card full: two claims of 40 GiB, each reserved for one bound pod (one in five
claims shared by two pods), priorities 0 to 3 and start times at random. The pending
pod asks one claim of 50 GiB at priority 10: it fits nowhere, every node is a candidate,
and the decision (``ClusterState.schedule``: the DRA Fit on every node, then the victim
search on up to 100 candidate nodes and the choice) nominates a node and its victims.
``cancel_preemption`` then gives the hold back, so that every repetition sees the same
cluster; the heap is frozen once the cluster is built, as the operator freezes it once
its first listing is in (``control.heap``). Timed in wall time and in the thread's CPU
time (which other processes on a shared machine do not inflate). Twice: as a pod's next
attempt (its verdict kept: only the nodes changed since are judged again) and as a
pod's first attempt (verdicts off, a new pod object each time whose claim asks a size no
pod asked before: every node is judged by the walk's fit, a simple claim by its node's
class, ``claim_classes``, then the victim search).
"""

from __future__ import annotations

import gc
import math
import random
import sys
import time
from typing import Any

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cycle import preempting
from vgpu_operator.scheduling.cycle.cluster import ClusterState

CARDS = 8
CARD_MIB = 81920
SIZES = (1_000,)
#: Issue 35's aim: the DRA preemption decision's p99 at 1,000 nodes.
AIM_P99_MS = {1_000: 50.0}
RUNS = 20
WARMUP = 3
Json = dict[str, Any]


def _claim(name: str, node: str, card: str, holders: list[str]) -> Json:
    result = {
        "request": "gpu",
        "driver": dra.DRIVER,
        "pool": node,
        "device": card,
        "consumedCapacity": {"memory": "40Gi", "cores": "50", "shares": "1"},
    }
    terms = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    exactly = {"deviceClassName": dra.SHARED_CLASS, "capacity": {"requests": {"memory": "40Gi"}}}
    return {
        "metadata": {"namespace": "bench", "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        "status": {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {"nodeSelectorTerms": terms},
            },
            "reservedFor": [{"resource": "pods", "name": h, "uid": f"uid-{h}"} for h in holders],
        },
    }


def _pod(name: str, node: str | None, claim: str, priority: int, start: int = 0) -> Json:
    pod: Json = {
        "metadata": {"namespace": "bench", "name": name, "uid": f"uid-{name}"},
        "spec": {
            "priority": priority,
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }
    if node is not None:
        pod["spec"]["nodeName"] = node
        minute, second = divmod(start, 60)
        pod["status"] = {
            "phase": "Running",
            "startTime": f"2026-11-28T10:{minute:02d}:{second:02d}Z",
        }
    return pod


def build_cluster(nodes: int, seed: int = 35) -> ClusterState:
    rng = random.Random(seed)
    state = ClusterState(DeviceConfig())
    state.preemption_enabled = True
    for device_class in dra.device_classes():
        state.set_device_class(device_class)
    number = 0
    for n in range(nodes):
        node = f"dra-{n:05d}"
        state.set_node({"metadata": {"name": node, "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA}}})
        shapes = [
            dra.CardShape(
                f"GPU-{n:05d}-{c}", c, "A100", "NVIDIA-A100", CARD_MIB, 100, 4, "hami-core"
            )
            for c in range(CARDS)
        ]
        state.set_slice(dra.slice_wire(node, shapes, 1, None))
        for shape in shapes:
            for _ in range(2):
                number += 1
                holders = [f"p{number}"] + ([f"p{number}b"] if rng.random() < 0.2 else [])
                claim = f"c{number}"
                state.set_claim(_claim(claim, node, dra.device_name(shape.uuid), holders))
                for holder in holders:
                    state.set_pod(
                        _pod(holder, node, claim, rng.randint(0, 3), rng.randint(0, 3599))
                    )
    return state


def _pending_claim(name: str, memory_mib: int) -> Json:
    exactly = {
        "deviceClassName": dra.SHARED_CLASS,
        "capacity": {"requests": {"memory": f"{memory_mib}Mi"}},
    }
    return {
        "metadata": {"namespace": "bench", "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _case(nodes: int, verdicts: bool = True) -> dict[str, Any]:
    state = build_cluster(nodes)
    gc.freeze()  # as the operator does once its first listing is in (``heap.settle``)
    state.settings.verdicts = verdicts
    state.set_claim(_pending_claim("c-urgent", 50 * 1024))
    urgent = _pod("urgent", None, "c-urgent", 10)
    walls: list[float] = []
    cpus: list[float] = []
    searches: list[float] = []
    choose = preempting.choose

    def timed(*args: Any) -> Any:
        started = time.thread_time()
        try:
            return choose(*args)
        finally:
            searches.append((time.thread_time() - started) * 1000)

    preempting.choose = timed  # type: ignore[assignment]
    victims = 0
    try:
        for attempt in range(WARMUP + RUNS):
            if not verdicts:
                # A first attempt: a new pod object (read afresh) whose claim asks a size
                # no pod asked before (no failure judged for it yet).
                state.set_claim(_pending_claim(f"c-urgent-{attempt}", 50 * 1024 + attempt))
                urgent = _pod("urgent", None, f"c-urgent-{attempt}", 10)
            started, started_cpu = time.perf_counter(), time.thread_time()
            decision = state.schedule(urgent, now=attempt)
            wall, cpu = time.perf_counter() - started, time.thread_time() - started_cpu
            if decision.nominated_node is None or not decision.victims:
                raise RuntimeError("the bench's pod did not preempt")
            victims = len(decision.victims)
            state.cancel_preemption("bench/urgent")
            if attempt >= WARMUP:
                walls.append(wall * 1000)
                cpus.append(cpu * 1000)
            else:
                searches.pop()
    finally:
        preempting.choose = choose  # type: ignore[assignment]
    return {
        "case": f"dra preemption, {nodes} nodes ({victims} victims), "
        + ("next attempt, verdict kept" if verdicts else "first attempt, no verdict"),
        "runs": RUNS,
        "p50_ms": _percentile(walls, 0.5),
        "p99_ms": _percentile(walls, 0.99),
        "max_ms": max(walls),
        "cpu_p50_ms": _percentile(cpus, 0.5),
        "cpu_p99_ms": _percentile(cpus, 0.99),
        "search_cpu_p50_ms": _percentile(searches, 0.5),
        "search_cpu_p99_ms": _percentile(searches, 0.99),
        "aim_p99_ms": AIM_P99_MS.get(nodes),
    }


def run() -> list[dict[str, Any]]:
    return [_case(nodes, verdicts) for nodes in SIZES for verdicts in (True, False)]


def main() -> None:
    for row in run():
        print(
            f"{row['case']}: p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms, max "
            f"{row['max_ms']:.1f} ms (CPU p50 {row['cpu_p50_ms']:.1f}, p99 "
            f"{row['cpu_p99_ms']:.1f} ms; of which the victim search: CPU p50 "
            f"{row['search_cpu_p50_ms']:.1f}, p99 {row['search_cpu_p99_ms']:.1f} ms), "
            f"{row['runs']} runs, aim p99 {row['aim_p99_ms']} ms",
            file=sys.stdout,
        )


if __name__ == "__main__":
    main()
