"""``simulate`` streamed: each decision written as it is made, not gathered first.

Only how the document is written differs from ``simulation.simulate``: both take the
decisions from one replay (``simulation_replay.Replay``: gangs, DRA claims, preemption),
and the document is the same.

A replay of a large trace (the FGD replay: 10,771 pods on 1,213 nodes) made a list of
every decision and then one JSON document of hundreds of MB; here each decision is
rendered and written at once, so memory stays flat and output starts at the first pod.
The document is the same JSON object ``simulation.simulate`` returns (``decisions``,
then ``podGroups``, ``defrag`` and ``warnings``), one decision per line. ``scores=False`` leaves out
each scheduled pod's score on every other node (``Decision.node_scores``), which costs
a Fit on every node per pod: a replay asks where pods went, not how every node scored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, TextIO

from vgpu_operator import simulation, simulation_replay
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision
from vgpu_operator.scheduling.status import Diagnosis, NodeFailure
from vgpu_operator.wire import Pod

#: Where a line's ``reasons`` go, spliced in as text (``ReasonsText``).
_HOLE = '"reasons": {}'


class ReasonsText:
    """``reasons`` as JSON text, made from pieces kept across decisions.

    A pod that fits nowhere carries its reasons on every node (1,213 in the FGD replay,
    about 55 kB), and rendering them as a dict and dumping it cost more than deciding.
    The pods of one shape share a verdict whose per-node failures stay the same objects
    while their nodes do not change (``verdicts``), so each node's ``"name": {...}`` text
    is kept per failure object and a diagnosis seen again is the text made last time.
    The text is what ``json.dumps(diagnosis.to_json())`` writes.
    """

    _LIMIT = 1 << 18

    def __init__(self) -> None:
        #: id of a failure -> (the failure, kept so that its id is not reused; its node;
        #: the node's text).
        self._pieces: dict[int, tuple[NodeFailure, str, str]] = {}
        self._last: tuple[Diagnosis | None, str] = (None, "{}")

    def of(self, diagnosis: Diagnosis) -> str:
        if self._last[0] is diagnosis:
            return self._last[1]
        if len(self._pieces) > self._LIMIT:
            self._pieces.clear()
        parts = []
        for node, failure in sorted(diagnosis.node_failures.items()):
            kept = self._pieces.get(id(failure))
            if kept is None or kept[0] is not failure or kept[1] != node:
                counts = {reason.value: n for reason, n in sorted(failure.reasons.items())}
                kept = (failure, node, json.dumps(node) + ": " + json.dumps(counts))
                self._pieces[id(failure)] = kept
            parts.append(kept[2])
        text = "{" + ", ".join(parts) + "}"
        self._last = (diagnosis, text)
        return text


def decisions(
    scenario: Mapping[str, Any],
    state: ClusterState,
    now: float = 0.0,
    scores: bool = True,
) -> Iterator[tuple[Pod, Decision]]:
    """The scenario's pending pods decided in order on ``state`` (``simulation.build_state``)
    by the one path (``simulation_replay.Replay``); each pod with its decision, as it is
    made."""
    for item in simulation_replay.Replay(scenario, state, now, scores):
        yield item.pod, item.decision


def write(
    scenario: Mapping[str, Any],
    out: TextIO,
    now: float = 0.0,
    use_index: bool = True,
    scores: bool = True,
) -> None:
    """Simulate and write the result to ``out`` as it goes: the document
    ``simulation.simulate`` returns, from the same replay. Everything that can refuse the
    scenario is checked before the first line (nothing is written for a bad one)."""
    state = simulation.build_state(scenario, use_index)
    if "defrag" in scenario:
        simulation.defrag_options(scenario)
    out.write('{"decisions": [')
    placed: list[dict[str, Any]] = []
    first = True
    reasons = ReasonsText()
    replay = simulation_replay.Replay(scenario, state, now, scores)
    for item in replay:
        rendered = simulation.rendered(item, reasons=False)
        line = json.dumps(rendered)
        diagnosis = item.decision.diagnosis
        if rendered["reasons"] == {} and diagnosis is not None and not item.decision.victims:
            line = line.replace(_HOLE, '"reasons": ' + reasons.of(diagnosis), 1)
        out.write(("\n" if first else ",\n") + line)
        first = False
        placed.append({"pod": rendered["pod"], "scheduled": rendered["scheduled"]})
    out.write("\n]")
    if replay.groups:
        out.write(',\n"podGroups": ' + json.dumps(replay.groups))
    if "defrag" in scenario:
        plans = simulation.defragment(scenario, state, placed, now)
        out.write(',\n"defrag": ' + json.dumps(plans))
    warnings = state.node_layer_problems()
    if warnings:
        listed = {node: list(problems) for node, problems in sorted(warnings.items())}
        out.write(',\n"warnings": ' + json.dumps(listed))
    out.write("}\n")
