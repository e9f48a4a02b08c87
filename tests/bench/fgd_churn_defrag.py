"""The churn replay with the project's defragmentation planner on (``bench_fgd_churn --defrag``).

Every ``EVERY_S`` of compressed time while pods wait, the planner (``defrag.plan``, the
operator's own) is asked for plans for the waiting pods, in order of arrival; each plan
is carried out as the operator carries it out, on the harness (engine and model alike):
each pod to move leaves its cards and its replacement lands where the plan put it
(pinned there: the engine must agree), then the waiting pod is placed on the node the
plan held for it (pinned to the plan's node and cards). A moved pod keeps its name and
the time it leaves (its controller recreates it; its work goes on).

Which pods may move: every pod of the replay (the trace's tasks are taken as recreated
by a controller: ``allow_bare_pods``), at most ``MAX_EVICTIONS`` for one waiting pod.
The replacements are decided by the engine with the column's policy where it is one of
the engine's, and with binpack for a reference scorer (FGD, best fit): the planner is
the project's, whatever chose the nodes of the arrivals.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

import fgd_harness  # noqa: E402
import fgd_trace  # noqa: E402
from fgd_trace import Task  # noqa: E402

from vgpu_operator.scheduling.defrag import defrag  # noqa: E402
from vgpu_operator.scheduling.pod_key import PodKey  # noqa: E402

#: How often the planner runs while pods wait (s of compressed time), as the operator's
#: planning round runs on a period rather than on every event.
EVERY_S = 300.0
#: The operator's default (``PlanOptions``); ``--max-evictions`` changes it.
MAX_EVICTIONS = 3
#: At most this many waiting pods (the oldest) are looked at in one round: the planner's
#: work stays bounded when a queue builds up.
WAITING_LOOKED_AT = 16


@dataclass
class DefragFigures:
    rounds: int = 0
    plans: int = 0
    moves: int = 0
    surprises: int = 0
    cpu_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "defrag_rounds": self.rounds,
            "defrag_plans": self.plans,
            "defrag_moves": self.moves,
            "defrag_surprises": self.surprises,
            "defrag_cpu_s": round(self.cpu_s, 1),
        }


class Waiting(Protocol):
    waiting: list[tuple[Task, float]]
    harness: fgd_harness.Harness


class Planner:
    """The planner's rounds over one replay."""

    def __init__(self, max_evictions: int = MAX_EVICTIONS) -> None:
        self.options = defrag.PlanOptions(max_evictions=max_evictions, allow_bare_pods=True)
        self.figures = DefragFigures()
        self.last = float("-inf")

    def due(self, now: float, churn: Waiting) -> bool:
        return bool(churn.waiting) and now - self.last >= EVERY_S

    def round(self, churn: Waiting, now: float) -> list[tuple[Task, float]]:
        """One planning round; the waiting pods it placed, with when they arrived."""
        self.last = now
        harness = churn.harness
        started = time.process_time()
        self.figures.rounds += 1
        running = {
            PodKey(f"{fgd_harness.NAMESPACE}/{name}"): fgd_trace.pod_of(task, *harness.pair)
            for name, (task, _placed) in harness.placed.items()
        }
        looked = churn.waiting[:WAITING_LOOKED_AT]
        pods = [fgd_trace.pod_of(task, *harness.pair) for task, _since in looked]
        report = defrag.plan(harness.state, pods, running, now, self.options)
        by_key = {PodKey(f"{fgd_harness.NAMESPACE}/{t.name}"): (t, s) for t, s in looked}
        placed: list[tuple[Task, float]] = []
        for made in report.plans:
            if not self._carry_out(harness, made, by_key[made.pod][0]):
                self.figures.surprises += 1
                break  # the later plans counted on this one
            placed.append(by_key[made.pod])
            self.figures.plans += 1
        self.figures.cpu_s += time.process_time() - started
        return placed

    def _carry_out(self, harness: fgd_harness.Harness, made: defrag.Plan, task: Task) -> bool:
        for move in made.moves:
            name = move.pod.partition("/")[2]
            moved, before = harness.placed[name]
            harness.remove(name)
            cards = [fgd_trace.card_index(move.to_node, c) for c in move.to_cards]
            if harness.place(moved, pin=(move.to_node, cards)) is None:
                harness.place(moved, pin=(before.node, list(before.cards)))
                return False
            self.figures.moves += 1
        cards = [fgd_trace.card_index(made.node, c) for group in made.cards for c in group]
        return harness.place(task, pin=(made.node, cards)) is not None
