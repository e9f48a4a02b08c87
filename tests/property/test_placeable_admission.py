"""Kueue's quota counts totals, the cards count per card: over generated clusters and
workloads where the two disagree, the AdmissionCheck ``vgpu-operator.io/placeable`` lets
no workload be admitted that then waits for placement longer than one pass.

A model of Kueue in front of the engine: one ClusterQueue whose nominal quota of GPU memory is
the cards' total (the ResourceTransformation of Kueue's HAMi guide: ``gpumem x gpu``; pods
running outside Kueue use some of the cards and none of the quota), workloads
taken in order; a workload is admitted when its total fits the quota left and, with the
check, when the check answers Ready. Kueue admits it (the hold ends) and its pods are
then scheduled in the next pass. Without the check the same model admits workloads whose
pods fit on no card (the contrast, asserted to happen in the generated examples).
"""

from __future__ import annotations

from typing import Any

from builders import cluster, make_node, make_pod
from hypothesis import event, given, settings
from hypothesis import strategies as st

from vgpu_operator.control.placeable_check import PlaceableCheck
from vgpu_operator.scheduling.cycle.cluster import ClusterState

GIB = 1024

#: Per node, the cards' memory in GiB and what is already used on each.
nodes_st = st.lists(
    st.lists(st.tuples(st.sampled_from([16, 24, 40]), st.integers(0, 12)), min_size=1, max_size=4),
    min_size=1,
    max_size=3,
)
#: Per workload: pods, GiB per pod, cards per pod.
workloads_st = st.lists(
    st.tuples(st.integers(1, 4), st.integers(2, 30), st.sampled_from([1, 1, 1, 2])),
    min_size=1,
    max_size=5,
)


def build(nodes: list[list[tuple[int, int]]]) -> tuple[ClusterState, int]:
    builders = []
    running = []
    total = 0
    for n, cards in enumerate(nodes):
        node = make_node(f"n{n}")
        for c, (size, used) in enumerate(cards):
            used = min(used, size)
            node.gpu(f"GPU-{n}-{c}", memory_mib=size * GIB)
            total += size
            if used:
                allocated = f"GPU-{n}-{c},NVIDIA,{used * GIB},0:;"
                running.append(
                    make_pod(f"used-{n}-{c}", "other")
                    .container(gpu=1, gpumem=used * GIB)
                    .on_node(f"n{n}", allocated)
                    .obj()
                )
        builders.append(node)
    state = cluster(*builders)
    for pod in running:
        state.set_pod(pod)
    return state, total * GIB


def workload(i: int, count: int, gib: int, gpus: int) -> dict[str, Any]:
    template = make_pod("t", "team").container(gpu=gpus, gpumem=gib * GIB).obj()
    return {
        "metadata": {"name": f"w{i}", "namespace": "team", "uid": f"u{i}"},
        "spec": {"podSets": [{"name": "main", "count": count, "template": template}]},
    }


def run(
    nodes: list[list[tuple[int, int]]], specs: list[tuple[int, int, int]], with_check: bool
) -> tuple[int, int]:
    """(admitted workloads, admitted workloads with a pod that found no card in the pass
    after admission)."""
    state, quota = build(nodes)
    check = PlaceableCheck(state)
    admitted = waiting = 0
    now = 0.0
    for i, (count, gib, gpus) in enumerate(specs):
        now += 1.0
        total = count * gib * gpus * GIB  # what Kueue's transformation counts
        if total > quota:
            continue  # Kueue: no quota, not admitted
        wl = workload(i, count, gib, gpus)
        if with_check:
            if check.judge(wl, now).state != "Ready":
                continue  # Retry: quota released, not admitted
            check.release(f"team/w{i}")  # admitted: the hold ends, the pods come
        quota -= total
        admitted += 1
        placed = [
            state.schedule(
                make_pod(f"w{i}-{p}", "team").container(gpu=gpus, gpumem=gib * GIB).obj(), now
            ).scheduled
            for p in range(count)
        ]
        if not all(placed):
            waiting += 1
    return admitted, waiting


@settings(max_examples=300, deadline=None)
@given(nodes_st, workloads_st)
def test_with_the_check_no_admitted_workload_waits(
    nodes: list[list[tuple[int, int]]], specs: list[tuple[int, int, int]]
) -> None:
    _, waiting = run(nodes, specs, with_check=True)
    assert waiting == 0
    _, waiting_without = run(nodes, specs, with_check=False)
    # The contrast: quota alone admits workloads that then wait (counted, and seen).
    event(f"without the check: {'some wait' if waiting_without else 'none wait'}")


def test_quota_alone_admits_a_workload_that_waits() -> None:
    """The issue's case: four cards with 19 GiB free each, four pods of 20 GiB."""
    nodes = [[(24, 5), (24, 5)], [(24, 5), (24, 5)]]
    assert run(nodes, [(4, 20, 1)], with_check=False) == (1, 1)
    assert run(nodes, [(4, 20, 1)], with_check=True) == (0, 0)
