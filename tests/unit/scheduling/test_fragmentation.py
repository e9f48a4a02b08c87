"""The ``fragmentation`` node and GPU policy: FGD's measure, the mix it learns, and where
it places pods against binpack on the annotation path."""

from __future__ import annotations

import pytest

from tests.builders import T4, cluster, make_node, make_pod
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
    # Shares too, in proportion: 8 cores run one 8-core half, so a card and a half are
    # stranded for the class; 32 cores run all four halves.
    halves: fragmentation.Classes = ((1.0, ("", 1, 0, 50, 50, 8.0, 0.0, ())),)
    assert fragmentation.node_fragmentation(cards, 8.0, 1e9, halves) == pytest.approx(1.5)
    assert fragmentation.node_fragmentation(cards, 32.0, 1e9, halves) == 0.0


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


T4_WHOLE: fragmentation.Klass = ("NVIDIA", 1, 0, 100, 100, 0.0, 0.0, ("T4",))
ANY_PAIR: fragmentation.Klass = ("NVIDIA", 2, 0, 100, 100, 0.0, 0.0, ())


def test_a_class_that_accepts_scarce_cards_weighs_as_many_times_more() -> None:
    census = {("NVIDIA", "NVIDIA-TESLA T4", 2): 2, ("NVIDIA", "NVIDIA A100", 6): 6}
    both: fragmentation.Klass = (*T4_WHOLE[:7], ("A100", "T4"))
    nowhere: fragmentation.Klass = (*T4_WHOLE[:7], ("V100",))
    classes: fragmentation.Classes = ((0.5, ANY_PAIR), (0.2, T4_WHOLE), (0.2, both), (0.1, nowhere))
    weighted = fragmentation.scarcity_weighted(classes, census)
    # T4s are a quarter of the cards: the T4 class weighs four times; a class that takes
    # every card, or none of the census's, keeps its weight.
    assert [w for w, _k in weighted] == pytest.approx([0.5, 0.8, 0.2, 0.1])
    assert [k for _w, k in weighted] == [k for _w, k in classes]
    lone = {("NVIDIA", "NVIDIA-TESLA T4", 1): 1, ("NVIDIA", "NVIDIA A100", 8): 999}
    assert fragmentation.scarcity_weighted(((0.1, T4_WHOLE),), lone)[0][0] == pytest.approx(3.2)
    assert fragmentation.scarcity_weighted(classes, {}) == classes


def test_a_class_of_many_cards_weighs_by_the_cards_of_nodes_that_hold_as_many() -> None:
    # Six A100s alone on their nodes, two on a node of two: a pair can use two cards of
    # the eight, so it weighs four times; a T4 pair finds no node of two T4s (none the
    # census holds: its weight stays); one card may use any.
    census = {("NVIDIA", "NVIDIA A100", 1): 6, ("NVIDIA", "NVIDIA A100", 2): 2}
    t4_pair: fragmentation.Klass = (*ANY_PAIR[:7], ("T4",))
    one: fragmentation.Klass = ("NVIDIA", 1, 0, 100, 100, 0.0, 0.0, ())
    classes: fragmentation.Classes = ((0.5, ANY_PAIR), (0.2, t4_pair), (0.3, one))
    weighted = fragmentation.scarcity_weighted(classes, census)
    assert [w for w, _k in weighted] == pytest.approx([2.0, 0.2, 0.3])


def test_the_mix_takes_a_census_and_moves_its_version_only_when_weights_do() -> None:
    mix = fragmentation.WorkloadMix(window=8, top=4, refresh_every=4, prior_weight=2.0)
    for _ in range(4):
        mix.observe(T4_WHOLE)
    version, learned = mix.version, mix.classes
    assert mix.weighted == learned
    mix.take_census({("NVIDIA", "NVIDIA A100", 4): 4})  # no T4 at all: nothing scarcer
    assert (mix.version, mix.weighted) == (version, learned)
    mix.take_census({("NVIDIA", "NVIDIA-TESLA T4", 1): 1, ("NVIDIA", "NVIDIA A100", 3): 3})
    assert mix.version == version + 1
    assert mix.classes == learned  # what was learned (the metric) is unchanged
    weights = {k: w for w, k in mix.weighted}
    assert weights[T4_WHOLE] == pytest.approx(4 * {k: w for w, k in learned}[T4_WHOLE])


def test_a_pod_that_takes_any_card_leaves_the_scarce_model_to_the_pods_that_need_it() -> None:
    """Three T4s and two free A100s (four more A100s dead): a whole card on the A100 node
    breaks the pair it could hold, one on the T4 node breaks nothing; but the pods that
    accept only T4s (a third of the cards) ask all their demand of those, so their
    weight is three times their frequency, and the card goes to the A100 node."""
    config = load_config(
        {
            "scheduler": {
                "nodeSchedulerPolicy": "fragmentation",
                "gpuSchedulerPolicy": "fragmentation",
            }
        }
    )
    t4 = make_node("t4")
    for i in range(3):
        t4.gpu(f"T{i}", type=T4)
    a100 = make_node("a100").gpu("A0").gpu("A1")
    dead = make_node("dead")
    for i in range(4):
        dead.gpu(f"D{i}", health=False)
    state = cluster(t4, a100, dead, config=config)
    mix = state.cycle.placer.mix
    for _ in range(400):
        mix.observe(ANY_PAIR)
    for _ in range(300):
        mix.observe(T4_WHOLE)
    # The census is taken at a decision's start, of the nodes measured before it.
    assert state.schedule(make_pod("first", "ns").container(cpu="1").obj(), 0.0).scheduled
    decision = state.schedule(make_pod("p", "ns").container(gpu=1).obj(), 0.0)
    assert (decision.scheduled, decision.node) == (True, "a100")
    weights = {k: w for w, k in mix.weighted}
    assert weights[T4_WHOLE] == pytest.approx(3 * {k: w for w, k in mix.classes}[T4_WHOLE])
