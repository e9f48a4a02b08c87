"""Best fit on the DRA path: under binpack the engine tries first the node, and the card,
that a claim fills most tightly, where the annotation path's ranking would take the
fullest node and the busiest card."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from vgpu_operator.config import load_config
from vgpu_operator.devices import dra, model
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.dialects.claims import claim_best_fit, claims

GIB = 2**30


def engine(nodes: dict[str, int]) -> ClusterState:
    """Nodes of ``count`` 40 GiB cards, binpack for nodes and cards."""
    config = load_config(
        {"scheduler": {"gpuSchedulerPolicy": "binpack", "nodeSchedulerPolicy": "binpack"}}
    )
    state = ClusterState(config)
    for device_class in dra.device_classes():
        state.set_device_class(device_class)
    for node, count in nodes.items():
        state.set_node({"metadata": {"name": node, "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA}}})
        cards = [
            dra.CardShape(f"GPU-{node}{i}", i, "A100", "NVIDIA-A100", 40960, 100, 8, "hami-core")
            for i in range(count)
        ]
        state.set_slice(dra.slice_wire(node, cards, 1, None))
    return state


def spec(memory_gib: int, cores: int) -> dict[str, Any]:
    exactly = {
        "deviceClassName": dra.SHARED_CLASS,
        "capacity": {"requests": {"memory": f"{memory_gib}Gi", "cores": str(cores)}},
    }
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def held(state: ClusterState, name: str, node: str, device: str, gib: int, cores: int,
         shares: int = 1) -> None:  # fmt: skip
    """A claim allocated already (by anyone) holding a share of ``device``."""
    result = {
        "request": "gpu",
        "driver": dra.DRIVER,
        "pool": node,
        "device": device,
        "consumedCapacity": {"memory": f"{gib}Gi", "cores": str(cores), "shares": str(shares)},
    }
    selector = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    state.set_claim(
        {
            "metadata": {"namespace": "ns", "name": name, "uid": name, "resourceVersion": "1"},
            "spec": spec(gib, cores),
            "status": {
                "allocation": {
                    "devices": {"results": [result]},
                    "nodeSelector": {"nodeSelectorTerms": [selector]},
                }
            },
        }
    )


def place(state: ClusterState, gib: int, cores: int) -> tuple[str | None, str]:
    """Decide a pod with one new claim; (node, device) it got."""
    state.set_claim(
        {
            "metadata": {"namespace": "ns", "name": "new", "uid": "new", "resourceVersion": "1"},
            "spec": spec(gib, cores),
        }
    )
    pod = {
        "metadata": {"namespace": "ns", "name": "p", "uid": "p"},
        "spec": {
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "new"}],
        },
    }
    decision = state.schedule(pod, 0)
    assert decision.scheduled, decision.diagnosis
    [write] = decision.claim_writes
    assert write.allocation is not None
    [result] = write.allocation["devices"]["results"]
    return decision.node, result["device"]


def test_the_node_the_claim_fills_exactly_wins_over_the_fuller_one() -> None:
    state = engine({"a": 2, "b": 2})
    # a is fuller (binpack's node ranking puts it first) but a 10 GiB claim would leave
    # its cards with 6 GiB each; b's first card has exactly 10 GiB and 25 cores free.
    held(state, "a0", "a", "gpu-a0", 24, 60)
    held(state, "a1", "a", "gpu-a1", 24, 60)
    held(state, "b0", "b", "gpu-b0", 30, 75)
    assert place(state, 10, 25) == ("b", "gpu-b0")


def test_within_a_node_the_tightest_card_wins_over_the_busiest() -> None:
    state = engine({"a": 2})
    # gpu-a0 scores higher under HAMi's binpack (six of eight shares taken), but the
    # claim fills gpu-a1 exactly.
    held(state, "a0", "a", "gpu-a0", 20, 50, shares=6)
    held(state, "a1", "a", "gpu-a1", 30, 75)
    assert place(state, 10, 25) == ("a", "gpu-a1")


def card(index: int, memory_used: int, cores_used: int, used: int = 1) -> model.DeviceUsage:
    return model.DeviceUsage(
        id=f"c{index}", index=index, count=8, used=used, total_memory_mib=40960,
        used_memory_mib=memory_used, total_cores=100, used_cores=cores_used, type="A100",
        numa=0, health=True, mode="hami-core",
    )  # fmt: skip


def request(memory_gib: int | None, cores: int | None, count: int = 1) -> claims.Request:
    capacity: dict[str, Fraction] = {}
    if memory_gib is not None:
        capacity[f"{dra.DRIVER}/{dra.MEMORY}"] = Fraction(memory_gib * GIB)
    if cores is not None:
        capacity[dra.CORES] = Fraction(cores)
    return claims.Request("gpu", dra.SHARED_CLASS, count, (), capacity, ())


def test_nodes_that_seem_too_small_keep_their_ranking_after_the_others() -> None:
    nodes = {
        "full": [card(0, 40960, 100)],
        "loose": [card(0, 0, 0, used=0)],
        "tight": [card(0, 30720, 75)],
        "no-slot": [card(0, 0, 0, used=8)],
    }
    order = claim_best_fit.tightest_first(list(nodes), nodes.__getitem__, [request(10, 25)])
    assert order == ["tight", "loose", "full", "no-slot"]


def test_a_request_for_two_cards_is_measured_by_its_second_best_card() -> None:
    one_tight = [card(0, 30720, 75), card(1, 0, 0, used=0)]
    two_half = [card(0, 20480, 50), card(1, 20480, 50)]
    nodes = {"one-tight": one_tight, "two-half": two_half}
    order = claim_best_fit.tightest_first(list(nodes), nodes.__getitem__, [request(10, 25, 2)])
    assert order == ["two-half", "one-tight"]


def test_a_request_without_memory_counts_as_the_whole_card() -> None:
    nodes = {"busy": [card(0, 1024, 0)], "idle": [card(0, 0, 0, used=0)]}
    order = claim_best_fit.tightest_first(list(nodes), nodes.__getitem__, [request(None, None)])
    assert order == ["idle", "busy"]
