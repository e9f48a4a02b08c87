"""Latency of one gang decision (``gangs.decide_group``) on 5,000 half-loaded nodes; reports,
asserts nothing.

Run standalone (``PYTHONSAFEPATH=1 .venv/bin/python tests/bench/bench_gangs.py``) or call
``run()``; ``--index`` runs the index case alone (below). The cluster is
``bench_scheduling``'s (8 GPUs of 80 GiB per node, about half of every card in use), its
nodes labelled with a rack of 100 nodes for the topology case. Each repetition decides one
PodGroup of four pending pods, all reserved together, then gives every reservation back
(``gangs.release``) so that each sees the same load. Timed on the wall clock and on this
thread's CPU (which other processes on a shared machine do not inflate). kube-scheduler's
gang plugin averages 3.7-5.7 ms per 3-pod gang at 5,000 nodes
(scheduler_perf); the aim here is a p99 of 10 ms for 4-pod gangs.

The index case (issue 47.4, ``run_index``): the runtime's side, a real ``StateFeed`` and
``GangRuntime`` over ``INDEX_NODES`` nodes, with ``WAITING_GROUPS`` PodGroups of
``GROUP_SIZE`` pending members (one tenant's, fitting nowhere) against none. Timed: a plain
pod's decision as the worker makes it (the pending copy looked up, its group read, the
engine's decision, then given back), and another tenant's 8-member group decided by
``GangRuntime.decide`` (its members gathered, all reserved, then given back), both through
the feed's index by group; and the same group decision with the members gathered by a walk
over every unbound pod, as before the index, for comparison. The aim: the plain pod's CPU
p99 with the waiting groups within 10 % of the same without.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))

from bench_scheduling import _pending, _row, build_cluster

from vgpu_operator import names
from vgpu_operator.control.feed import StateFeed
from vgpu_operator.control.gang_runtime import GangRuntime, PodGroupStore
from vgpu_operator.control.queue import SchedulingQueue
from vgpu_operator.devices import nvidia
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.scheduling.gangs.gangs import GroupSpec

NODES = 5_000
RUNS = 300
WARMUP = 20
AIM_P99_MS = 10.0
RACK = "bench.vgpu.io/rack"


def _members(prefix: str, gpus: int, memory_mib: int, cores: int, **last: str) -> list[Any]:
    """Four members of the group ``prefix``; ``last``: annotations of the fourth only."""
    pods = []
    for i in range(4):
        pod = _pending(f"{prefix}-{i}", gpus, memory_mib, cores, **(last if i == 3 else {}))
        pod["spec"]["schedulingGroup"] = {"podGroupName": prefix}
        pods.append(pod)
    return pods


#: (case, members, topology, fits)
CASES: tuple[tuple[str, list[Any], str | None, bool], ...] = (
    ("4-pod gang, 1 GPU 8 GiB 20 cores each", _members("frac", 1, 8192, 20), None, True),
    ("4-pod gang, 2 GPUs 8 GiB 20 cores each", _members("two", 2, 8192, 20), None, True),
    ("4-pod gang in one rack of 100 nodes", _members("rack", 1, 8192, 20), RACK, True),
    (
        "4-pod gang whose 4th member fits nowhere (3 reserved, rolled back)",
        _members("short", 1, 8192, 20, **{nvidia.USE_TYPE_ANNOTATION: "B200"}),
        None,
        False,
    ),
)


def _label_racks(state: ClusterState, nodes: int) -> None:
    for index in range(nodes):
        name = f"node-{index:05d}"
        allocatable = {"cpu": "128", "memory": "1Ti", "pods": "250", "nvidia.com/gpu": "80"}
        labels = {"kubernetes.io/hostname": name, RACK: f"rack-{index // 100:03d}"}
        state.set_node(
            {
                "metadata": {"name": name, "labels": labels},
                "status": {
                    "allocatable": allocatable,
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        )


def time_gang(
    state: ClusterState,
    members: Sequence[Mapping[str, Any]],
    topology: str | None,
    fits: bool,
    runs: int = RUNS,
    warmup: int = WARMUP,
) -> tuple[list[float], list[float]]:
    spec = GroupSpec("bench/gang", True, len(members), topology)
    wall: list[float] = []
    cpu: list[float] = []
    for repetition in range(warmup + runs):
        started, started_cpu = time.perf_counter(), time.thread_time()
        out = gangs.decide_group(state, spec, spec.key, members, {}, 0.0)
        elapsed_ms = (time.perf_counter() - started) * 1000
        cpu_ms = (time.thread_time() - started_cpu) * 1000
        if bool(out.placed) != fits:
            raise RuntimeError(f"{spec.key}: placed={len(out.placed)}: {out.reason}")
        gangs.release(state, [d.pod for d in out.placed])
        if repetition >= warmup:
            wall.append(elapsed_ms)
            cpu.append(cpu_ms)
    return wall, cpu


def run(nodes: int = NODES) -> list[dict[str, Any]]:
    started = time.perf_counter()
    state = build_cluster(nodes)
    _label_racks(state, nodes)
    print(f"built {nodes} nodes in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    rows = []
    for case, members, topology, fits in CASES:
        wall, cpu = time_gang(state, members, topology, fits)
        rows.append(_row(f"gang {nodes} nodes: {case}", wall, AIM_P99_MS, cpu))
    return rows + run_index()


WAITING_GROUPS = 500
GROUP_SIZE = 8
INDEX_NODES = 1_000
INDEX_RUNS = 2_000


def _member(name: str, group: str, fits: bool) -> Any:
    annotations = {} if fits else {nvidia.USE_TYPE_ANNOTATION: "B200"}  # no such card: it waits
    pod = _pending(name, 1, 8192, 20, **annotations)
    pod["metadata"].update(uid=f"uid-{name}", resourceVersion="1")
    pod["spec"].update(schedulerName=names.SCHEDULER_NAME, schedulingGroup={"podGroupName": group})
    return pod


def _pod_group(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": GROUP_SIZE}}},
    }


def _runtimes(state: ClusterState, waiting: int) -> tuple[StateFeed, GangRuntime, GangRuntime]:
    """The feed (``waiting`` groups pending, another tenant's group and a plain pod), and
    two runtimes: one gathering through the index, one by a walk over every unbound pod."""
    feed = StateFeed(state, SchedulingQueue())
    groups = [_pod_group("train")]
    for g in range(waiting):
        groups.append(_pod_group(f"wait-{g}"))
        for i in range(GROUP_SIZE):
            feed.pod_event("ADDED", _member(f"wait-{g}-{i}", f"wait-{g}", fits=False))
    for i in range(GROUP_SIZE):
        feed.pod_event("ADDED", _member(f"train-{i}", "train", fits=True))
    plain = _pending("plain", 1, 8192, 20)
    plain["metadata"].update(uid="uid-plain", resourceVersion="1")
    plain["spec"]["schedulerName"] = names.SCHEDULER_NAME
    feed.pod_event("ADDED", plain)
    store = PodGroupStore()
    asyncio.run(store.listed(groups, None))

    def walk(group: str) -> list[Any]:
        return [p for p in feed.unbound_pods() if gangs.group_of(p) == group]

    def name() -> str:
        return names.SCHEDULER_NAME

    return (
        feed,
        GangRuntime(state, feed.group_members, name, store),
        GangRuntime(state, walk, name, store),
    )


def _interleaved(steps: Sequence[Any]) -> list[list[float]]:
    """Each step's CPU times (ms), every step taken once per repetition in a shuffled order,
    so that the load of a shared machine, and what one step leaves for the next (a
    ranking to read again after a release), fall on all of them alike."""
    cpu: list[list[float]] = [[] for _ in steps]
    order = list(range(len(steps)))
    rng = random.Random(47)
    for repetition in range(WARMUP + INDEX_RUNS):
        rng.shuffle(order)
        for index in order:
            started = time.thread_time()
            steps[index]()
            if repetition >= WARMUP:
                cpu[index].append((time.thread_time() - started) * 1000)
    return cpu


def _plain_decision(state: ClusterState, feed: StateFeed) -> None:
    """What the worker does for a plain pod it popped, up to the Binding."""
    pod = feed.pending_pod("bench/plain")
    if pod is None or GangRuntime.group_of(pod) is not None:
        raise RuntimeError("the plain pod is not pending")
    decision = state.schedule(pod, 0.0)
    if not decision.scheduled:
        raise RuntimeError(f"the plain pod did not fit: {decision.diagnosis}")
    gangs.release(state, [decision.pod])


def _group_decision(state: ClusterState, runtime: GangRuntime) -> None:
    out = runtime.decide("bench/train", 0.0)
    if len(out.placed) != GROUP_SIZE:
        raise RuntimeError(f"the group did not fit: {out.reason}")
    gangs.release(state, [d.pod for d in out.placed])


def run_index(nodes: int = INDEX_NODES) -> list[dict[str, Any]]:
    """Both feeds (none waiting, ``WAITING_GROUPS`` waiting) over one engine, their cases
    interleaved; one row per case and feed, and the ratios of the plain pod's p99."""
    state = build_cluster(nodes)
    cases: list[tuple[str, Any]] = []
    for waiting in (0, WAITING_GROUPS):
        feed, indexed, walking = _runtimes(state, waiting)
        label = f"{waiting} waiting groups of {GROUP_SIZE}, {nodes} nodes"
        cases += [
            (f"a plain pod's decision, {label}", partial(_plain_decision, state, feed)),
            (f"an 8-pod group's decision, {label}", partial(_group_decision, state, indexed)),
            (
                f"an 8-pod group's decision, members by a walk, {label}",
                partial(_group_decision, state, walking),
            ),
        ]
    timings = _interleaved([step for _, step in cases])
    rows = [_row(f"gang index: {c}", t, None, t) for (c, _), t in zip(cases, timings, strict=True)]
    for what, none, many in (("plain pod", 0, 3), ("8-pod group", 1, 4), ("walk", 2, 5)):
        ratios = [rows[many][k] / rows[none][k] for k in ("cpu_p50_ms", "cpu_p99_ms")]
        print(
            f"{what}: CPU p50 and p99 with {WAITING_GROUPS} waiting groups / none: "
            f"{ratios[0]:.3f} {ratios[1]:.3f}",
            file=sys.stderr,
        )
    return rows


if __name__ == "__main__":
    if "--index" in sys.argv:
        for row in run_index():
            print(row)
        sys.exit(0)
    for row in run(int(sys.argv[1]) if len(sys.argv) > 1 else NODES):
        print(row)
