"""The FGD replay's reference scorer (tests/bench/fgd_reference.py) on small cases
checked by hand, and the harness that carries its choices out on the engine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if _BENCH not in sys.path:
    sys.path.append(_BENCH)

import fgd_harness  # noqa: E402  (needs the path above)
import fgd_reference as ref  # noqa: E402
from fgd_trace import Task  # noqa: E402

SHARE_500 = ref.Shape(cpu=1000, milli=500, count=1)
WHOLE_1 = ref.Shape(cpu=1000, milli=1000, count=1)
WHOLE_2 = ref.Shape(cpu=1000, milli=1000, count=2)
CPU_ONLY = ref.Shape(cpu=1000, milli=0, count=0)


def node(cards: list[int], cpu: int = 10_000, model: str = "T4", name: str = "n") -> ref.Node:
    out = ref.Node(name, model, cpu, 100_000, len(cards))
    out.cards = list(cards)
    return out


def frag(mix: ref.Mix, n: ref.Node) -> float:
    return ref.Measure(mix).node(n)


def test_a_request_that_fits_strands_only_the_cards_too_small_for_its_share() -> None:
    # [1000, 300]: the share of 500 and the whole card both fit (one card each), and
    # each leaves the 300 card unusable: 0.5 * 300 + 0.5 * 300.
    mix = ((0.5, SHARE_500), (0.5, WHOLE_1))
    assert frag(mix, node([1000, 300])) == pytest.approx(300)


def test_too_little_cpu_strands_all_the_idle_gpu() -> None:
    mix = ((0.5, SHARE_500), (0.5, WHOLE_1))
    assert frag(mix, node([1000, 300], cpu=999)) == pytest.approx(1300)
    # The measure reads the CPU left per class: 1000 fits the 1000-milli classes.
    assert frag(mix, node([1000, 300], cpu=1000)) == pytest.approx(300)


def test_too_few_cards_for_a_multi_card_request_strand_the_whole_node() -> None:
    assert frag(((1.0, WHOLE_2),), node([1000, 600])) == pytest.approx(1600)
    assert frag(((1.0, WHOLE_2),), node([1000, 1000, 600])) == pytest.approx(600)


def test_a_cpu_only_request_counts_every_idle_gpu_as_stranded() -> None:
    mix = ((0.5, CPU_ONLY), (0.5, SHARE_500))
    assert frag(mix, node([1000])) == pytest.approx(500)


def test_a_card_model_the_request_does_not_accept_strands_the_node() -> None:
    t4_only = ref.Shape(cpu=1000, milli=500, count=1, models=frozenset({"T4"}))
    assert frag(((1.0, t4_only),), node([1000], model="P100")) == pytest.approx(1000)
    assert frag(((1.0, t4_only),), node([1000], model="T4")) == pytest.approx(0)


def test_memory_is_not_in_the_measure_but_is_in_the_filter() -> None:
    n = node([1000])
    n.mem_left = 10
    assert frag(((1.0, SHARE_500),), n) == pytest.approx(0)
    assert not n.fits(SHARE_500, mem=11)
    assert n.fits(SHARE_500, mem=10)


def test_the_target_mix_is_the_most_frequent_shapes_up_to_95_percent() -> None:
    a, b, c, d = (ref.Shape(cpu=i, milli=0, count=0) for i in (1, 2, 3, 4))
    mix = ref.target_mix([a] * 60 + [b] * 30 + [c] * 6 + [d] * 4)
    # 60 and 90 are below 95 of 100; the third shape crosses it and is the last.
    assert [s for _w, s in mix] == [a, b, c]
    assert [w for w, _s in mix] == pytest.approx([60 / 96, 30 / 96, 6 / 96])


def test_the_score_is_a_0_to_100_integer_of_the_fall_so_small_falls_tie() -> None:
    assert ref.sigmoid_score(0) == 50
    assert ref.sigmoid_score(40) == 50  # 100 * sigmoid(0.04) = 50.99
    assert ref.sigmoid_score(-40) == 49
    assert ref.sigmoid_score(100) == 52
    assert ref.sigmoid_score(-1e9) == 0


def test_fgd_puts_a_share_on_the_card_that_keeps_the_node_whole_for_two_card_pods() -> None:
    # [1000, 1000, 600], pod of 300: on the 600 card the node still takes a 2-card pod
    # (fragmentation 300 -> 300, score 50); on a free card it cannot (300 -> 1150).
    mix = ((0.5, SHARE_500), (0.5, WHOLE_2))
    fgd = ref.Fgd(ref.Measure(mix))
    score, cards = fgd.score(node([1000, 1000, 600]), ref.Shape(cpu=0, milli=300, count=1))
    assert (score, cards) == (50, [2])


def test_ties_go_to_the_node_first_in_the_order_given_not_by_name() -> None:
    nodes = [node([1000], name="z"), node([1000], name="a")]
    decided = ref.Reference("fgd", nodes, ((1.0, SHARE_500),)).decide(SHARE_500, mem=0)
    assert decided is not None
    assert decided[0].name == "z"


def test_best_fit_takes_the_tightest_node_and_card() -> None:
    loose, tight = node([1000, 1000], name="a"), node([1000, 600], name="b")
    decided = ref.Reference("bestfit", [loose, tight], ()).decide(SHARE_500, mem=0)
    assert decided is not None
    assert (decided[0].name, decided[1]) == ("b", [1])


def test_normalised_scores_are_integer_scaled_to_0_100() -> None:
    assert ref.normalised([0, 1, 3]) == [0, 33, 100]
    assert ref.normalised([7, 7]) == [0, 0]


def test_a_placement_the_model_finds_impossible_is_refused() -> None:
    n = node([1000, 300])
    with pytest.raises(ValueError, match="card 1"):
        n.place(SHARE_500, 0, [1])
    n.place(SHARE_500, 0, [0])
    assert n.cards == [500, 300]
    assert n.cpu_left == 9000


ROWS = [
    {"sn": "node-a", "cpu_milli": "8000", "memory_mib": "65536", "gpu": "2", "model": "T4"},
    {"sn": "node-b", "cpu_milli": "8000", "memory_mib": "65536", "gpu": "2", "model": "T4"},
]


def test_the_engine_carries_out_the_reference_choice_on_its_node_and_card() -> None:
    tasks = [Task("t1", 1000, 1024, 1, 500), Task("t2", 1000, 1024, 1, 300)]
    harness = fgd_harness.Harness("bestfit", tasks, seed=0, rows=ROWS)
    first = harness.place(tasks[0])
    second = harness.place(tasks[1])
    assert first is not None
    assert second is not None
    # Best fit puts the second share on the first one's card (tightest): the engine
    # placed it there, the model booked it there.
    assert (second.node, second.cards) == (first.node, first.cards)
    assert harness.model[first.node].cards[first.cards[0]] == 200
    assert harness.allocated_milli() == 800


def test_an_engine_policy_is_booked_on_the_model_and_removed_from_both() -> None:
    tasks = [Task("t1", 1000, 1024, 2, 1000)]
    harness = fgd_harness.Harness("binpack", tasks, rows=ROWS)
    placed = harness.place(tasks[0])
    assert placed is not None
    assert placed.cards == (0, 1)
    assert harness.model[placed.node].cards == [0, 0]
    harness.remove("t1")
    assert harness.allocated_milli() == 0
    assert harness.place(tasks[0]) is not None  # the engine freed its cards too
