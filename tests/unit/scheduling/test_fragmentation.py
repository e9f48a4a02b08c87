"""The ``fragmentation`` node and GPU policy: FGD's measure, the mix it learns, and where
it places pods against binpack on the annotation path."""

from __future__ import annotations

import pytest

from tests.builders import cluster, make_node, make_pod
from tests.unit.scheduling.test_claim_best_fit import held, place
from vgpu_operator import names
from vgpu_operator.config import DeviceConfig, load_config
from vgpu_operator.devices import dra, model, nvidia
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.policies import fragmentation, node_layer, policies

HALF: fragmentation.Classes = ((1.0, ("", 1, 0, 50, 50, 0.0, 0.0, ())),)
WHOLE_AND_HALF: fragmentation.Classes = (
    (0.5, ("", 1, 0, 100, 100, 0.0, 0.0, ())),
    (0.5, ("", 1, 0, 50, 50, 0.0, 0.0, ())),
)


def card(
    uuid: str, used_cores: int, *, index: int = 0, slots_used: int | None = None
) -> model.DeviceUsage:
    usage = model.DeviceUsage.from_info(
        model.DeviceInfo(uuid, index, 10, 1000, 100, "NVIDIA-T4", 0, True, "hami-core")
    )
    usage.used_cores = used_cores
    usage.used_memory_mib = used_cores * 10
    usage.used = (1 if used_cores else 0) if slots_used is None else slots_used
    return usage


def test_free_capacity_counts_a_card_whose_slots_are_all_taken_as_stranded() -> None:
    full_slots = card("a", 40, slots_used=10)
    assert fragmentation.free_capacity(full_slots) == pytest.approx(0.6)
    # Nobody can use it: all of it is fragmented, whatever the mix.
    assert fragmentation.node_fragmentation([full_slots], 1e9, 1e9, HALF) == pytest.approx(0.6)


def test_node_fragmentation_is_the_capacity_each_class_cannot_use() -> None:
    cards = [card("a", 70), card("b", 0)]  # 0.3 free and 1.0 free
    # Halves: the 0.3 remainder is unusable; the empty card is usable.
    assert fragmentation.node_fragmentation(cards, 1e9, 1e9, HALF) == pytest.approx(0.3)
    # Wholes cannot use the 0.3 either; so 0.5 * 0.3 + 0.5 * 0.3.
    assert fragmentation.node_fragmentation(cards, 1e9, 1e9, WHOLE_AND_HALF) == pytest.approx(0.3)


def test_a_node_without_cpu_for_a_class_strands_all_its_free_capacity_for_it() -> None:
    cpu_heavy: fragmentation.Classes = ((1.0, ("", 1, 0, 50, 50, 8.0, 0.0, ())),)
    cards = [card("a", 0), card("b", 0)]
    assert fragmentation.node_fragmentation(cards, 4.0, 1e9, cpu_heavy) == pytest.approx(2.0)
    assert fragmentation.node_fragmentation(cards, 32.0, 1e9, cpu_heavy) == 0.0


def test_cpu_or_memory_for_fewer_pods_than_the_cards_hold_strands_the_rest() -> None:
    # Two free cards; whole-card pods of 8 cores: 8 cores run one of them, so the other
    # card is stranded for the class; 16 cores run both.
    whole: fragmentation.Classes = ((1.0, ("", 1, 0, 100, 100, 8.0, 0.0, ())),)
    cards = [card("a", 0), card("b", 0)]
    assert fragmentation.node_fragmentation(cards, 8.0, 1e9, whole) == pytest.approx(1.0)
    assert fragmentation.node_fragmentation(cards, 16.0, 1e9, whole) == 0.0
    # The same with memory: 2 GiB a pod, 2 GiB free.
    ram_heavy: fragmentation.Classes = ((1.0, ("", 1, 0, 100, 100, 0.0, 2.0 * 2**30, ())),)
    assert fragmentation.node_fragmentation(cards, 1e9, 2.0 * 2**30, ram_heavy) == pytest.approx(
        1.0
    )
    # A pod that asks no GPU, placed where CPU is short, raises the measure for the class.
    rise = fragmentation.placement_delta(cards, [], 16.0, 1e9, 8.0, 0.0, whole)
    assert rise == pytest.approx(1.0)
    # Shares: many pods a card, CPU only as a threshold (an 8-core half fits 8 cores).
    halves: fragmentation.Classes = ((1.0, ("", 1, 0, 50, 50, 8.0, 0.0, ())),)
    assert fragmentation.node_fragmentation(cards, 8.0, 1e9, halves) == 0.0


def test_a_class_that_accepts_other_card_types_strands_the_whole_node() -> None:
    # The cards are T4s: a class that asks for V100s can use none of them, so all their
    # free capacity is stranded for it; one that accepts T4 uses them.
    v100: fragmentation.Classes = ((1.0, ("", 1, 0, 50, 50, 0.0, 0.0, ("V100",))),)
    t4: fragmentation.Classes = ((1.0, ("", 1, 0, 50, 50, 0.0, 0.0, ("V100", "T4"))),)
    cards = [card("a", 0), card("b", 0)]
    assert fragmentation.node_fragmentation(cards, 1e9, 1e9, v100) == pytest.approx(2.0)
    assert fragmentation.node_fragmentation(cards, 1e9, 1e9, t4) == 0.0
    # A pod placed there lowers the idle capacity the V100 class cannot use.
    rise = fragmentation.placement_delta(cards, [("", 1, 0, 50, 50)], 1e9, 1e9, 0, 0, v100)
    assert rise == pytest.approx(-0.5)
    # A pod that accepts only V100s finds no card of its type: no room.
    assert (
        fragmentation.placement_delta(cards, [("", 1, 0, 50, 50)], 1e9, 1e9, 0, 0, t4, ("V100",))
        is None
    )


def test_a_multi_card_class_strands_a_node_with_too_few_free_cards() -> None:
    pair: fragmentation.Classes = ((1.0, ("", 2, 0, 100, 100, 0.0, 0.0, ())),)
    assert fragmentation.node_fragmentation([card("a", 0), card("b", 50)], 1e9, 1e9, pair) == (
        pytest.approx(1.5)
    )
    assert fragmentation.node_fragmentation([card("a", 0), card("b", 0)], 1e9, 1e9, pair) == 0.0


def test_placement_delta_prefers_the_card_a_share_fills_exactly() -> None:
    cards = [card("a", 50), card("b", 0)]
    need: fragmentation.Need = ("", 1, 0, 50, 50)
    rise = fragmentation.placement_delta(cards, [need], 1e9, 1e9, 0.0, 0.0, WHOLE_AND_HALF)
    # On "a" the remainder 0.5 that wholes cannot use is filled: fragmentation falls.
    assert rise == pytest.approx(-0.25)
    scores = fragmentation.card_order_key(cards, need, WHOLE_AND_HALF)
    assert scores["a"] > scores["b"]  # sorts last: tried first


def test_placement_delta_is_none_where_the_estimate_sees_no_room() -> None:
    cards = [card("a", 80)]
    assert fragmentation.placement_delta(cards, [("", 1, 0, 50, 50)], 1e9, 1e9, 0, 0, HALF) is None
    assert (
        fragmentation.placement_delta([card("b", 0)], [("", 1, 0, 50, 50)], 1.0, 1e9, 2.0, 0, HALF)
        is None
    )


def test_the_mix_starts_from_the_prior_and_learns_the_requests_seen() -> None:
    mix = fragmentation.WorkloadMix(window=8, top=4, refresh_every=4, prior_weight=2.0)
    assert mix.version == 0
    assert sum(w for w, _k in mix.classes) == pytest.approx(1.0)
    seen: fragmentation.Klass = ("NVIDIA", 1, 0, 30, 30, 1.0, 0.0, ())
    for _ in range(3):
        mix.observe(seen)
    assert seen not in [k for _w, k in mix.classes]  # not until the refresh
    mix.observe(seen)
    assert mix.version == 1
    weights = {k: w for w, k in mix.classes}
    assert max(weights, key=lambda k: weights[k]) == seen
    # The window is bounded: eight other requests push it out entirely.
    other: fragmentation.Klass = ("NVIDIA", 2, 0, 100, 100, 1.0, 0.0, ())
    for _ in range(8):
        mix.observe(other)
    assert seen not in [k for _w, k in mix.classes]


def test_the_policy_is_known_to_the_config_the_node_layer_and_the_pod() -> None:
    config = load_config(
        {
            "scheduler": {
                "nodeSchedulerPolicy": "fragmentation",
                "gpuSchedulerPolicy": "fragmentation",
            }
        }
    )
    assert config.scheduler.node_scheduler_policy == policies.FRAGMENTATION
    layer = node_layer.read(
        {
            names.NODE_SCHEDULER_POLICY: "fragmentation",
            names.GPU_SCHEDULER_POLICY: "fragmentation",
        },
        (),
    )
    assert (layer.node_policy, layer.gpu_policy, layer.problems) == (
        "fragmentation",
        "fragmentation",
        (),
    )
    assert policies.normalize_gpu_policy("fragmentation") == policies.FRAGMENTATION


def _two_nodes(config: DeviceConfig) -> tuple[object, ...]:
    # "full" is fuller by HAMi's score (binpack's choice): three cards 90 % used and an
    # empty one. "half" has a card half used: a half share fills it exactly.
    full = make_node("full")
    for i in range(3):
        full.gpu(f"F{i}", memory_mib=1000)
    full.gpu("F3", memory_mib=1000)
    half = make_node("half").gpu("H0", memory_mib=1000).gpu("H1", memory_mib=1000)
    state = cluster(full, half, config=config)
    for i in range(3):
        pod = (
            make_pod(f"r{i}", "ns")
            .container(gpu=1, cores=90, percentage=90)
            .on_node("full", f"F{i},NVIDIA,900,90:;")
            .obj()
        )
        state.set_pod(pod)
    state.set_pod(
        make_pod("h", "ns")
        .container(gpu=1, cores=50, percentage=50)
        .on_node("half", "H0,NVIDIA,500,50:;")
        .obj()
    )
    return (state,)


@pytest.mark.parametrize(
    ("policy", "node", "card_id"),
    [("binpack", "full", "F3"), ("fragmentation", "half", "H0")],
)
def test_fragmentation_fills_the_remainder_binpack_would_leave(
    policy: str, node: str, card_id: str
) -> None:
    config = load_config(
        {"scheduler": {"nodeSchedulerPolicy": policy, "gpuSchedulerPolicy": policy}}
    )
    (state,) = _two_nodes(config)
    pod = make_pod("p", "ns").container(gpu=1, cores=50, percentage=50).obj()
    decision = state.schedule(pod, 0.0)  # type: ignore[attr-defined]
    assert decision.scheduled
    assert decision.node == node
    assert [d.uuid for d in decision.devices["NVIDIA"][0]] == [card_id]


def test_the_pod_annotation_chooses_the_policy_over_the_configmap() -> None:
    (state,) = _two_nodes(DeviceConfig())
    pod = (
        make_pod("p", "ns")
        .annotate(names.NODE_SCHEDULER_POLICY, "fragmentation")
        .annotate(names.GPU_SCHEDULER_POLICY, "fragmentation")
        .container(gpu=1, cores=50, percentage=50)
        .obj()
    )
    decision = state.schedule(pod, 0.0)  # type: ignore[attr-defined]
    assert (decision.node, [d.uuid for d in decision.devices["NVIDIA"][0]]) == ("half", ["H0"])


def test_the_job_carries_the_cycles_mix_for_the_card_order() -> None:
    (state,) = _two_nodes(DeviceConfig())
    pod = make_pod("p", "ns").container(gpu=1, cores=50, percentage=50).obj()
    state.schedule(pod, 0.0)  # type: ignore[attr-defined]
    read = state.books.pod_read(PodKey("ns/p"))  # type: ignore[attr-defined]
    job = getattr(read, "job", None)
    assert isinstance(job, placement.Job)
    assert job.mix is state.cycle.placer.mix  # type: ignore[attr-defined]


def test_a_pods_card_types_are_part_of_its_class_in_the_mix() -> None:
    (state,) = _two_nodes(DeviceConfig())
    pod = (
        make_pod("p", "ns")
        .annotate(names.NODE_SCHEDULER_POLICY, "fragmentation")
        .annotate(nvidia.USE_TYPE_ANNOTATION, "t4,V100")
        .container(gpu=1, cores=50, percentage=50)
        .obj()
    )
    state.schedule(pod, 0.0)  # type: ignore[attr-defined]
    mix = state.cycle.placer.mix  # type: ignore[attr-defined]
    assert mix._recent[-1][7] == ("T4", "V100")


def test_the_dra_path_walks_nodes_by_fragmentation_too() -> None:
    """On the DRA path, the claim goes where it fills a card exactly (fragmentation falls),
    not to the fuller node that binpack's ranking tries first."""
    policy = "fragmentation"
    config = load_config(
        {"scheduler": {"nodeSchedulerPolicy": policy, "gpuSchedulerPolicy": policy}}
    )
    state = ClusterState(config)
    for device_class in dra.device_classes():
        state.set_device_class(device_class)
    for node in ("a", "b"):
        state.set_node({"metadata": {"name": node, "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA}}})
        cards = [
            dra.CardShape(f"GPU-{node}{i}", i, "A100", "NVIDIA-A100", 40960, 100, 8, "hami-core")
            for i in range(2)
        ]
        state.set_slice(dra.slice_wire(node, cards, 1, None))
    held(state, "a0", "a", "gpu-a0", 24, 60)
    held(state, "a1", "a", "gpu-a1", 24, 60)
    held(state, "b0", "b", "gpu-b0", 30, 75)
    assert place(state, 10, 25) == ("b", "gpu-b0")
