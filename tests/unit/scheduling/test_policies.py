"""Card scores, card order per GPU policy, node scores and scoring weights (§8)."""

from __future__ import annotations

from typing import Any

import pytest
from builders import A100_40, card_uuids, cluster, make_node, make_pod

from vgpu_operator import names
from vgpu_operator.config import load_config
from vgpu_operator.devices import model
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.policies import policies


def usage(
    uuid: str,
    *,
    index: int = 0,
    numa: int = 0,
    used: int = 0,
    count: int = 10,
    used_memory_mib: int = 0,
    memory_mib: int = 10000,
    used_cores: int = 0,
    cores: int = 100,
    type: str = A100_40,
) -> model.DeviceUsage:
    return model.DeviceUsage(
        uuid, index, count, used, memory_mib, used_memory_mib, cores, used_cores, type, numa,
        True, model.MODE_HAMI_CORE,
    )  # fmt: skip


# Four cards: (id, index, numa, used slots) with card scores a=5, b=1, c=3, d=3.
CARDS = (
    usage("a", index=0, numa=0, used=1),
    usage("b", index=1, numa=1, used=0),
    usage("c", index=2, numa=0, used=2),
    usage("d", index=3, numa=1, used=0),
)
SCORES = {"a": 5.0, "b": 1.0, "c": 3.0, "d": 3.0}


def tried_first(policy: str, numa_bind: bool, cards: tuple[model.DeviceUsage, ...] = CARDS,
                scores: dict[str, float] = SCORES) -> list[str]:  # fmt: skip
    """Card ids in the order Fit tries them: the sorted list read from its end."""
    ordered = sorted(cards, key=policies.card_sort_key(policy, numa_bind, scores))
    return [c.id for c in reversed(ordered)]


@pytest.mark.parametrize(
    ("policy", "numa_bind", "order"),
    [
        pytest.param("binpack", False, ["a", "d", "c", "b"], id="binpack-busiest-first"),
        pytest.param("spread", False, ["b", "d", "c", "a"], id="spread-idlest-first"),
        pytest.param("topology-aware", False, ["b", "d", "c", "a"], id="topology-sorts-as-spread"),
        pytest.param("mutex", False, ["d", "b", "a", "c"], id="mutex-idle-then-higher-numa"),
        pytest.param("mutex", True, ["d", "b", "a", "c"], id="mutex-ignores-numa-bind"),
        pytest.param("binpack", True, ["a", "c", "d", "b"], id="binpack-numa-low-group-busiest"),
        pytest.param("spread", True, ["b", "d", "c", "a"], id="spread-numa-high-group-idlest"),
        pytest.param("numa", False, ["d", "b", "c", "a"], id="numa-chain-low-numa-last"),
        pytest.param("binpack,numa", False, ["a", "d", "c", "b"], id="chain-binpack-numa"),
        pytest.param("binpack,numa", True, ["d", "b", "a", "c"], id="chain-numa-bind-numa-first"),
        pytest.param("numa,spread", False, ["b", "d", "c", "a"], id="chain-numa-spread"),
        pytest.param(
            "binpack,spread", True, ["d", "b", "a", "c"], id="numa-bind-puts-numa-first-unnamed"
        ),
        pytest.param("spread,numa", True, ["b", "d", "c", "a"], id="numa-bind-moves-numa-to-front"),
        pytest.param("binpack,", True, ["d", "b", "a", "c"], id="one-token-chain-is-a-chain"),
        pytest.param("mutex,topology-aware", False, ["b", "d", "c", "a"], id="empty-chain-spread"),
    ],
)
def test_card_order_per_policy(policy: str, numa_bind: bool, order: list[str]) -> None:
    assert tried_first(policy, numa_bind) == order


def test_chain_full_tie_lower_index_sorts_first() -> None:
    # Registered in reverse index order: the chain breaks the tie on index, a single
    # policy keeps registration order (stable sort).
    cards = (usage("x", index=1), usage("y", index=0))
    scores = {"x": 2.0, "y": 2.0}
    assert tried_first("binpack,numa", False, cards, scores) == ["x", "y"]
    assert tried_first("binpack", False, cards, scores) == ["y", "x"]


@pytest.mark.parametrize(
    ("value", "normalized"),
    [
        pytest.param("binpack", "binpack", id="known"),
        pytest.param(" binpack ", "binpack", id="trimmed"),
        pytest.param("best-fit", "spread", id="unknown-is-spread"),
        pytest.param("", "spread", id="empty-is-spread"),
        pytest.param("binpack,best-fit,numa", "binpack,numa", id="unknown-token-dropped"),
        pytest.param("binpack,best-fit", "binpack,", id="chain-of-one-stays-a-chain"),
        pytest.param("best-fit,worst-fit", ",", id="chain-of-none-stays-a-chain"),
        pytest.param("numa", "numa", id="bare-numa"),
        pytest.param("topology-aware", "topology-aware", id="topology"),
    ],
)
def test_normalize_gpu_policy(value: str, normalized: str) -> None:
    assert policies.normalize_gpu_policy(value) == normalized


# --- scores ---------------------------------------------------------------------------


def test_card_score_is_usage_over_capacity() -> None:
    card = usage("a", used=2, used_cores=30, used_memory_mib=5000)
    assert policies.card_score(card, []) == pytest.approx(10 * (0.2 + 0.3 + 0.5))


def test_card_score_weighted() -> None:
    card = usage("a", used=2, used_cores=30, used_memory_mib=5000)
    weights = policies.ScoringWeights(slot=1, core=1, memory=3)
    assert policies.card_score(card, [], weights) == pytest.approx(10 * (0.2 + 0.3 + 1.5))


@pytest.mark.parametrize(
    ("card_type", "percent", "expected"),
    [
        pytest.param(A100_40, 101, 10 * (0.2 + 0.3 + 0.5), id="model-type-request-ignored"),
        pytest.param("NVIDIA", 101, 10 * (0.3 + 0.4 + 0.6), id="vendor-type-request-counted"),
        pytest.param("NVIDIA", 50, 10 * (0.3 + 0.4 + 1.0), id="percentage-request-counted"),
    ],
)
def test_card_score_counts_requests_of_the_cards_type(
    card_type: str, percent: int, expected: float
) -> None:
    card = usage("a", used=2, used_cores=30, used_memory_mib=5000, type=card_type)
    memory = 1000 if percent == 101 else 0
    req = model.ContainerRequest(2, "NVIDIA", memory, percent, 10)
    assert policies.card_score(card, [req]) == pytest.approx(expected)


@pytest.mark.parametrize(
    "zero",
    [pytest.param({"count": 0}), pytest.param({"cores": 0}), pytest.param({"memory_mib": 0})],
)
def test_card_score_zero_capacity_scores_zero(zero: dict[str, Any]) -> None:
    assert policies.card_score(usage("a", used=1, **zero), []) == 0.0


def test_node_score_sums_over_cards() -> None:
    cards = [
        usage("a", used=2, used_cores=50, used_memory_mib=4000),
        usage("b", used=0, used_cores=0, used_memory_mib=0),
    ]
    assert policies.node_score(cards) == pytest.approx(10 * (2 / 20 + 50 / 200 + 4000 / 20000))
    assert policies.node_score([]) == 0.0


# --- scoring weights ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "weights"),
    [
        pytest.param(None, (1, 1, 1), id="absent-default"),
        pytest.param("slot=1,core=1,memory=3", (1, 1, 3), id="example"),
        pytest.param("memory=2,slot=0,core=1", (0, 1, 2), id="any-order"),
        pytest.param(" slot = 2 , core=0, memory=0", (2, 0, 0), id="spaces"),
    ],
)
def test_scoring_weights_parse(value: str | None, weights: tuple[int, int, int]) -> None:
    parsed = policies.parse_scoring_weights(value)
    assert (parsed.slot, parsed.core, parsed.memory) == weights


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("", id="empty"),
        pytest.param("slot=1,core=1", id="two-entries"),
        pytest.param("slot=1,core=1,memory=1,slot=1", id="four-entries"),
        pytest.param("slot=1,slot=1,memory=1", id="repeated-key"),
        pytest.param("slot=1,core=1,mem=1", id="unknown-key"),
        pytest.param("slot=1,core=1,memory", id="no-equals"),
        pytest.param("slot=a,core=1,memory=1", id="not-a-number"),
        pytest.param("slot=1.5,core=1,memory=1", id="not-an-integer"),
        pytest.param("slot=-1,core=1,memory=1", id="negative"),
        pytest.param("slot=0,core=0,memory=0", id="all-zero"),
    ],
)
def test_scoring_weights_bad_value_codec_error(value: str) -> None:
    with pytest.raises(CodecError) as caught:
        policies.parse_scoring_weights(value)
    assert caught.value.field == names.DEVICE_SCORING_WEIGHTS


def test_schedule_bad_scoring_weights_fails_with_error() -> None:
    state = cluster(make_node("a").gpu("GPU-a0"))
    pod = (
        make_pod("p").container(gpu=1, gpumem=1024).annotate(names.DEVICE_SCORING_WEIGHTS, "slot=1")
    )
    decision = state.schedule(pod.obj(), 0)
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert names.DEVICE_SCORING_WEIGHTS in decision.diagnosis.message()


# --- policies end to end --------------------------------------------------------------


def _two_nodes(**config: Any) -> Any:
    state = cluster(
        make_node("busy").gpu("GPU-b0"),
        make_node("idle").gpu("GPU-i0"),
        config=load_config({"scheduler": config}),
    )
    state.set_pod(
        make_pod("running").container(gpu=1, gpumem=4096).on_node("busy", "GPU-b0,NVIDIA,4096,0:;")
        .obj()
    )  # fmt: skip
    return state


@pytest.mark.parametrize(
    ("config", "annotation", "node"),
    [
        pytest.param({}, None, "busy", id="default-binpack"),
        pytest.param({}, "spread", "idle", id="pod-spread"),
        pytest.param({"nodeSchedulerPolicy": "spread"}, None, "idle", id="config-spread"),
        pytest.param({"nodeSchedulerPolicy": "spread"}, "binpack", "busy", id="pod-overrides"),
        pytest.param({}, "best-fit", "busy", id="unknown-annotation-uses-config"),
    ],
)
def test_node_policy_chooses_node(
    config: dict[str, str], annotation: str | None, node: str
) -> None:
    pod = make_pod("p").container(gpu=1, gpumem=1024)
    if annotation is not None:
        pod.annotate(names.NODE_SCHEDULER_POLICY, annotation)
    decision = _two_nodes(**config).schedule(pod.obj(), 0)
    assert decision.node == node


@pytest.mark.parametrize(
    ("config", "busy_policy", "idle_policy", "pod_policy", "node"),
    [
        pytest.param({}, "spread", "spread", None, "idle", id="nodes-say-spread"),
        pytest.param({}, None, "spread", None, "idle", id="idle-node-says-spread"),
        pytest.param({"nodeSchedulerPolicy": "spread"}, "binpack", "binpack", None, "busy",
                     id="nodes-say-binpack"),
        pytest.param({}, "spread", "spread", "binpack", "busy", id="pod-over-nodes"),
        pytest.param({}, "tightest", None, None, "busy", id="unreadable-node-value-ignored"),
    ],
)  # fmt: skip
def test_node_annotation_sets_node_policy(
    config: dict[str, str],
    busy_policy: str | None,
    idle_policy: str | None,
    pod_policy: str | None,
    node: str,
) -> None:
    busy = make_node("busy").gpu("GPU-b0")
    idle = make_node("idle").gpu("GPU-i0")
    for built, policy in ((busy, busy_policy), (idle, idle_policy)):
        if policy is not None:
            built.annotate(names.NODE_SCHEDULER_POLICY, policy)
    state = cluster(busy, idle, config=load_config({"scheduler": config}))
    state.set_pod(
        make_pod("running").container(gpu=1, gpumem=4096).on_node("busy", "GPU-b0,NVIDIA,4096,0:;")
        .obj()
    )  # fmt: skip
    pod = make_pod("p").container(gpu=1, gpumem=1024)
    if pod_policy is not None:
        pod.annotate(names.NODE_SCHEDULER_POLICY, pod_policy)
    for use_index in (True, False):
        state.use_index = use_index
        decision = state.schedule(pod.obj(), 0)
        state.rollback(decision.pod)
        assert decision.node == node


@pytest.mark.parametrize(
    ("packed_holds", "spread_holds", "node"),
    [
        # packed 10*(1/2 + 0 + 1000/10000) = 6 against spread 30 - 0 = 30.
        pytest.param((1000, 0), None, "spread", id="empty-spread-node-wins"),
        # packed 10*(1/2 + 50/100 + 9000/10000) = 19 against spread 30 - 15 = 15.
        pytest.param((9000, 50), (5000, 50), "packed", id="full-binpack-node-wins"),
    ],
)
def test_mixed_policies_compare_on_one_scale(
    packed_holds: tuple[int, int], spread_holds: tuple[int, int] | None, node: str
) -> None:
    """A binpack node's fullness weighs against a spread node's emptiness."""
    packed = make_node("packed").gpu("GPU-p0", memory_mib=10000, count=2)
    packed.annotate(names.NODE_SCHEDULER_POLICY, "binpack")
    spread = make_node("spread").gpu("GPU-s0", memory_mib=10000, count=2)
    spread.annotate(names.NODE_SCHEDULER_POLICY, "spread")
    state = cluster(packed, spread)
    for name, holds in (("packed", packed_holds), ("spread", spread_holds)):
        if holds is not None:
            memory, cores = holds
            card = "GPU-p0" if name == "packed" else "GPU-s0"
            state.set_pod(
                make_pod(f"on-{name}").container(gpu=1, gpumem=memory, cores=cores)
                .on_node(name, f"{card},NVIDIA,{memory},{cores}:;").obj()
            )  # fmt: skip
    pod = make_pod("p").container(gpu=1, gpumem=1000).obj()
    for use_index in (True, False):
        state.use_index = use_index
        decision = state.schedule(pod, 0)
        state.rollback(decision.pod)
        assert decision.node == node


@pytest.mark.parametrize(
    ("config", "node_annotation", "pod_annotation", "card"),
    [
        pytest.param({}, None, None, "GPU-1", id="default-spread"),
        pytest.param({"gpuSchedulerPolicy": "binpack"}, None, None, "GPU-0", id="config-binpack"),
        pytest.param({}, "binpack", None, "GPU-0", id="node-over-config"),
        pytest.param({"gpuSchedulerPolicy": "binpack"}, "spread", None, "GPU-1", id="node-spread"),
        pytest.param({}, "binpack", "spread", "GPU-1", id="pod-over-node"),
        pytest.param({}, "best-fit", None, "GPU-1", id="unreadable-node-value-ignored"),
        pytest.param({}, None, "binpack", "GPU-0", id="pod-binpack"),
    ],
)
def test_gpu_policy_chooses_card(
    config: dict[str, str], node_annotation: str | None, pod_annotation: str | None, card: str
) -> None:
    node = make_node("n").gpu("GPU-0").gpu("GPU-1")
    if node_annotation is not None:
        node.annotate(names.GPU_SCHEDULER_POLICY, node_annotation)
    state = cluster(node, config=load_config({"scheduler": config}))
    state.set_pod(
        make_pod("running").container(gpu=1, gpumem=4096).on_node("n", "GPU-0,NVIDIA,4096,0:;")
        .obj()
    )  # fmt: skip
    pod = make_pod("p").container(gpu=1, gpumem=1024)
    if pod_annotation is not None:
        pod.annotate(names.GPU_SCHEDULER_POLICY, pod_annotation)
    assert card_uuids(state.schedule(pod.obj(), 0)) == [[card]]


def test_mutex_policy_refuses_used_cards() -> None:
    state = cluster(make_node("n").gpu("GPU-0"))
    state.set_pod(
        make_pod("running").container(gpu=1, gpumem=1024).on_node("n", "GPU-0,NVIDIA,1024,0:;")
        .obj()
    )  # fmt: skip
    pod = make_pod("p").container(gpu=1, gpumem=1024).annotate(names.GPU_SCHEDULER_POLICY, "mutex")
    decision = state.schedule(pod.obj(), 0)
    assert decision.diagnosis is not None
    assert decision.diagnosis.to_json() == {"n": {"ExclusiveDeviceAllocateConflict": 1}}


# --- bounded weights (a 400-digit weight overflowed every decision) -------------------

HUGE = "9" * 400


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(f"slot={HUGE},core=1,memory=1", id="400-digits"),
        pytest.param("slot=1000001,core=1,memory=1", id="just-over"),
        pytest.param("slot=1,core=1_000,memory=1", id="underscores"),
        pytest.param("slot=1,core=+1,memory=1", id="sign"),
    ],
)
def test_scoring_weights_out_of_range_are_refused_with_the_range(value: str) -> None:
    with pytest.raises(CodecError) as caught:
        policies.parse_scoring_weights(value)
    assert "each weight must be an integer from 0 to 1000000" in caught.value.message


def test_scoring_weight_at_the_bound_is_read() -> None:
    parsed = policies.parse_scoring_weights("slot=1000000,core=0,memory=000001")
    assert (parsed.slot, parsed.core, parsed.memory) == (1_000_000, 0, 1)


def test_card_score_of_unbounded_weights_does_not_raise() -> None:
    """Weights built past the parser (a bug, a future caller) are bounded where used."""
    card = usage("a", used=2, used_cores=30, used_memory_mib=5000)
    weights = policies.ScoringWeights(slot=int(HUGE), core=1, memory=1)
    bounded = policies.ScoringWeights(slot=policies.MAX_SCORING_WEIGHT, core=1, memory=1)
    assert policies.card_score(card, [], weights) == policies.card_score(card, [], bounded)


def test_schedule_with_a_400_digit_weight_waits_with_the_range() -> None:
    state = cluster(make_node("a").gpu("GPU-a0"))
    pod = make_pod("p").container(gpu=1, gpumem=1024)
    pod = pod.annotate(names.DEVICE_SCORING_WEIGHTS, f"slot={HUGE},core=1,memory=1")
    decision = state.schedule(pod.obj(), 0)
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert "from 0 to 1000000" in decision.diagnosis.message()
