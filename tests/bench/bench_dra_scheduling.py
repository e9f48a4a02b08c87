"""Latency of one DRA decision on big, half-loaded clusters; reports, asserts nothing.

Run standalone (``PYTHONSAFEPATH=1 .venv/bin/python tests/bench/bench_dra_scheduling.py
[nodes ...]``) or call ``run()``. The DRA twin of ``bench_scheduling``: nodes of 8 cards
(80 GiB, 100 cores, 4 shares each, two products) that publish a ResourceSlice, each card
holding one to three allocated claims of 8, 16 or 24 GiB (about half of every card in
use), each reserved for one running pod. Each case times ``ClusterState.schedule()`` of
one pending pod with one claim, then rolls the decision back (``rollback`` releases its
claim holds) so that every repetition sees the same load:

- a claim of 8 GiB, which the first node visited takes;
- the first pod of its request: a claim that fits nowhere (more memory than any card
  has free) whose size differs at each repetition, so no verdict, kin or judgement
  made for an earlier request applies and every node is judged.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))

from bench_scheduling import _row

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cycle.cluster import ClusterState

CARDS = 8
CARD_MIB = 81920
PRODUCTS = (("A100", "NVIDIA-A100"), ("H100", "NVIDIA-H100"))
SIZES = (1_000, 5_000)
#: Issue 48's aims for the first pod of a never-seen request, p99 by cluster size.
AIM_NEW_P99_MS = {1_000: 5.0, 5_000: 20.0}
RUNS = 300
FEW_RUNS = 20
WARMUP = 5
Json = dict[str, Any]


def _claim(name: str, node: str, card: str, mib: int, holder: str) -> Json:
    result = {
        "request": "gpu",
        "driver": dra.DRIVER,
        "pool": node,
        "device": card,
        "consumedCapacity": {"memory": f"{mib}Mi", "cores": "10", "shares": "1"},
    }
    terms = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    exactly = {
        "deviceClassName": dra.SHARED_CLASS,
        "capacity": {"requests": {"memory": f"{mib}Mi"}},
    }
    return {
        "metadata": {"namespace": "running", "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        "status": {
            "allocation": {
                "devices": {"results": [result]},
                "nodeSelector": {"nodeSelectorTerms": terms},
            },
            "reservedFor": [{"resource": "pods", "name": holder, "uid": f"uid-{holder}"}],
        },
    }


def _pod(name: str, namespace: str, claim: str, node: str | None = None) -> Json:
    pod: Json = {
        "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
        "spec": {
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }
    if node is not None:
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running"}
    return pod


def build_cluster(nodes: int, seed: int = 48) -> ClusterState:
    """``nodes`` half-loaded DRA nodes (deterministic for a seed)."""
    rng = random.Random(seed)
    state = ClusterState(DeviceConfig())
    for device_class in dra.device_classes():
        state.set_device_class(device_class)
    number = 0
    for n in range(nodes):
        node = f"dra-{n:05d}"
        state.set_node({"metadata": {"name": node, "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA}}})
        product, hami_type = PRODUCTS[n % len(PRODUCTS)]
        shapes = [
            dra.CardShape(f"GPU-{n:05d}-{c}", c, product, hami_type, CARD_MIB, 100, 4, "hami-core")
            for c in range(CARDS)
        ]
        state.set_slice(dra.slice_wire(node, shapes, 1, None))
        for shape in shapes:
            for _ in range(rng.randint(1, 3)):
                number += 1
                claim, holder = f"c{number}", f"p{number}"
                mib = rng.choice((8192, 16384, 24576))
                state.set_claim(_claim(claim, node, dra.device_name(shape.uuid), mib, holder))
                state.set_pod(_pod(holder, "running", claim, node))
    return state


def pending_claim(name: str, mib: int) -> Json:
    request = {
        "deviceClassName": dra.SHARED_CLASS,
        "capacity": {"requests": {"memory": f"{mib}Mi"}},
    }
    return {
        "metadata": {"namespace": "bench", "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }


def time_claim(
    state: ClusterState, mib: int, runs: int, fits: bool, new_request: bool
) -> tuple[list[float], list[float]]:
    """Milliseconds (wall, thread CPU) per ``schedule()`` of a pod with one claim of
    ``mib``; ``new_request``: the claim asks one MiB more at each repetition."""
    wall: list[float] = []
    cpu: list[float] = []
    for repetition in range(WARMUP + runs):
        size = mib + repetition if new_request else mib
        name = f"ask-{size}" if new_request else "ask"
        state.set_claim(pending_claim(name, size))
        pod = _pod(f"pending-{name}", "bench", name)
        started, started_cpu = time.perf_counter(), time.thread_time()
        decision = state.schedule(pod, 0.0)
        elapsed_ms = (time.perf_counter() - started) * 1000
        cpu_ms = (time.thread_time() - started_cpu) * 1000
        if decision.scheduled != fits:
            raise RuntimeError(f"{decision.pod}: scheduled={decision.scheduled}, expected {fits}")
        state.rollback(decision.pod)
        if new_request:
            state.remove_pod(decision.pod)
            state.remove_claim(f"bench/{name}")
        if repetition >= WARMUP:
            wall.append(elapsed_ms)
            cpu.append(cpu_ms)
    return wall, cpu


#: (case, claim MiB, runs, fits, new request each time, aims)
CASES: tuple[tuple[str, int, int, bool, bool, Mapping[int, float] | None], ...] = (
    ("claim of 8 GiB", 8192, RUNS, True, False, None),
    (
        "unschedulable, first of its request (diagnosis)",
        81920,
        FEW_RUNS,
        False,
        True,
        AIM_NEW_P99_MS,
    ),
)


def run(sizes: tuple[int, ...] = SIZES, new_only: bool = False) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for nodes in sizes:
        started = time.process_time()
        state = build_cluster(nodes)
        print(
            f"built {nodes} DRA nodes in {time.process_time() - started:.1f} s CPU", file=sys.stderr
        )
        for case, mib, runs, fits, new_request, aims in CASES:
            if new_only and not new_request:
                continue
            wall, cpu = time_claim(state, mib, runs, fits, new_request)
            aim = None if aims is None else aims.get(nodes)
            rows.append(_row(f"dra schedule {nodes} nodes: {case}", wall, aim, cpu))
    return rows


if __name__ == "__main__":
    arguments = [a for a in sys.argv[1:] if not a.startswith("--")]
    chosen = tuple(int(a) for a in arguments) or SIZES
    for row in run(chosen, new_only="--new" in sys.argv):
        print(row)
