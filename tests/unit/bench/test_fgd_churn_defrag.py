"""The churn replay's planning round (tests/bench/fgd_churn_defrag.py): the project's
planner moves a pod so that a waiting one fits, on the engine and the model alike."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

_BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if _BENCH not in sys.path:
    sys.path.append(_BENCH)

import fgd_churn_defrag  # noqa: E402  (needs the path above)
import fgd_harness  # noqa: E402
from fgd_trace import Task  # noqa: E402

ROWS = [
    {"sn": "node-a", "cpu_milli": "8000", "memory_mib": "65536", "gpu": "2", "model": "T4"},
    {"sn": "node-b", "cpu_milli": "8000", "memory_mib": "65536", "gpu": "2", "model": "T4"},
]


@dataclass
class _Churn:
    harness: fgd_harness.Harness
    waiting: list[tuple[Task, float]] = field(default_factory=list)


def _share(name: str, milli: int) -> Task:
    return Task(name, 1000, 1024, 1, milli)


@pytest.mark.parametrize("policy", ["fragmentation", "bestfit"])
def test_a_round_moves_a_share_so_that_a_waiting_share_fits(policy: str) -> None:
    # node-a: 600 on card 0, 300 + 300 on card 1 (400 free on each: 800 pooled);
    # node-b: 700 on each card. A share of 500 fits no card; moving a 300 (to node-b,
    # or to card 0) makes room for it on node-a.
    running = {
        "a1": ("node-a", 0, 600),
        "a2": ("node-a", 1, 300),
        "a3": ("node-a", 1, 300),
        "b1": ("node-b", 0, 700),
        "b2": ("node-b", 1, 700),
    }
    waiting = _share("w", 500)
    tasks = [_share(name, milli) for name, (_n, _c, milli) in running.items()]
    harness = fgd_harness.Harness(policy, [*tasks, waiting], rows=ROWS)
    for task in tasks:
        node, card, _milli = running[task.name]
        assert harness.place(task, pin=(node, [card])) is not None
    assert harness.place(waiting) is None
    churn = _Churn(harness, [(waiting, 5.0)])
    planner = fgd_churn_defrag.Planner()
    assert planner.due(10.0, churn)
    assert planner.round(churn, 10.0) == [(waiting, 5.0)]
    assert not planner.due(11.0, churn)  # not before the period
    assert (planner.figures.plans, planner.figures.moves) == (1, 1)
    assert harness.placed["w"][1].node == "node-a"
    assert harness.allocated_milli() == 3100  # on the model as on the engine
    harness.remove("w")  # the engine booked it too: its room comes free
    assert harness.place(waiting) is not None


def test_nothing_is_moved_when_no_move_makes_room() -> None:
    ones = [Task("a1", 1000, 1024, 2, 1000), Task("b1", 1000, 1024, 2, 1000)]
    pair = Task("p2", 1000, 1024, 2, 1000)
    harness = fgd_harness.Harness("fragmentation", [*ones, pair], rows=ROWS)
    assert harness.place(ones[0]) is not None
    assert harness.place(ones[1]) is not None
    planner = fgd_churn_defrag.Planner()
    assert planner.round(_Churn(harness, [(pair, 0.0)]), 0.0) == []
    assert planner.figures.moves == 0
