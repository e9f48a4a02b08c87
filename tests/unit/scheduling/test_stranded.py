"""Stranded memory: free card memory that no pending request could use (``stranded``),
as the books compute it for ``vgpu_operator_stranded_memory_bytes{node}``."""

from __future__ import annotations

from builders import bound, cluster, make_node, make_pod

from vgpu_operator.devices import model
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.policies.stranded import CardRequest

MIB = 16384


def run_pod(state: ClusterState, name: str, **request: int) -> None:
    """Schedule a pod and record it as bound and running (its shares are booked)."""
    pod = make_pod(name, "team").container(gpu=1, **request).obj()
    decision = state.schedule(pod, 0)
    assert decision.scheduled, decision.diagnosis
    state.set_pod(bound(pod, decision))


def pending(**request: int) -> dict[str, object]:
    return make_pod("waiting", "team").container(gpu=1, **request).obj()


def two_nodes() -> ClusterState:
    return cluster(
        make_node("a").gpu("GPU-a0", memory_mib=MIB),
        make_node("b").gpu("GPU-b0", memory_mib=MIB).gpu("GPU-b1", memory_mib=MIB),
    )


def test_nothing_is_stranded_while_no_gpu_pod_waits() -> None:
    state = two_nodes()
    run_pod(state, "p", gpumem=12288)
    assert state.stranded_memory_mib([]) == {"a": 0, "b": 0}
    cpu_only = make_pod("cpu", "team").container(cpu="1").obj()
    assert state.stranded_memory_mib([cpu_only]) == {"a": 0, "b": 0}


def test_free_memory_smaller_than_every_request_is_stranded() -> None:
    state = cluster(make_node("a").gpu("GPU-a0", memory_mib=MIB))
    run_pod(state, "p", gpumem=12288)  # 4096 MiB left on the card
    assert state.stranded_memory_mib([pending(gpumem=8192)]) == {"a": 4096}
    # One request that fits is enough for the memory to count as usable.
    assert state.stranded_memory_mib([pending(gpumem=8192), pending(gpumem=2048)]) == {"a": 0}
    # A percentage is of the card's memory: 50 % of 16384 MiB does not fit in 4096.
    assert state.stranded_memory_mib([pending(percentage=50)]) == {"a": 4096}
    assert state.stranded_memory_mib([pending(percentage=25)]) == {"a": 0}


def test_memory_on_a_card_without_a_free_share_or_compute_is_stranded() -> None:
    state = cluster(make_node("a").gpu("GPU-a0", memory_mib=MIB, count=1))
    run_pod(state, "one", gpumem=1024)  # takes the card's only share
    assert state.stranded_memory_mib([pending(gpumem=1024)]) == {"a": MIB - 1024}
    # Compute: a card whose cores are all booked takes no request that wants cores.
    state = cluster(make_node("c").gpu("GPU-c0", memory_mib=MIB))
    run_pod(state, "busy", gpumem=1024, cores=100)
    assert state.stranded_memory_mib([pending(gpumem=1024, cores=10)]) == {"c": MIB - 1024}


def test_an_exclusive_request_cannot_use_a_shared_card() -> None:
    state = cluster(make_node("a").gpu("GPU-a0", memory_mib=MIB))
    run_pod(state, "p", gpumem=1024, cores=10)
    assert state.stranded_memory_mib([pending(gpumem=1024, cores=100)]) == {"a": MIB - 1024}
    assert state.stranded_memory_mib([pending(gpumem=1024, cores=90)]) == {"a": 0}


def test_unhealthy_and_mig_cards_are_left_out() -> None:
    state = cluster(
        make_node("a")
        .gpu("GPU-a0", memory_mib=MIB, health=False)
        .gpu("GPU-a1", memory_mib=MIB, mode=model.MODE_MIG),
    )
    assert state.stranded_memory_mib([pending(gpumem=MIB * 2)]) == {"a": 0}


def test_an_unreadable_request_adds_nothing() -> None:
    state = cluster(make_node("a").gpu("GPU-a0", memory_mib=MIB))
    bad = make_pod("bad", "team").container(gpu=1, gpumem="lots").obj()
    assert state.stranded_memory_mib([bad]) == {"a": 0}
    assert state.stranded_memory_mib([bad, pending(gpumem=MIB * 2)]) == {"a": MIB}


def test_a_request_fits_only_cards_of_its_vendor() -> None:
    card = model.DeviceUsage("GPU-0", 0, 10, 0, MIB, 0, 100, 0, "T4", 0, True, "hami-core")
    assert CardRequest("NVIDIA", 1024, None, 0).fits(card)
    assert not CardRequest("DCU", 1024, None, 0).fits(card)
