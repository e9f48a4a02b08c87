"""The one path that decides a scenario: its pending pods replayed in order.

``simulate`` gathers the decisions into one document (``simulation.simulate``: ``--check``
and the tests) or writes each as it is made (``simulation_stream.write``: the command);
both take them from ``Replay``, so what a scenario decides does not depend on how it is
written. Each pending pod is decided as the operator carries a decision out:

- a member of a PodGroup (``spec.schedulingGroup``) is decided with its whole group when
  the group's first pending member comes (``simulation_gangs.decide``: all of it, or none
  of it placed); its members' decisions follow one another there, and the group's outcome
  goes to ``Replay.groups``;
- a preemptor's victims leave at once; on the DRA path its claims are allocated once the
  victims' claims are released (``simulation_dra.release_victims``), so it is decided again
  then, to show where they go;
- a placement is confirmed (its Binding), and on the DRA path its claims are written as
  the operator writes them, so that later pods see them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from vgpu_operator import simulation_dra, simulation_gangs
from vgpu_operator.scheduling.cycle.cluster import ClusterState, Decision
from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.wire import Pod


@dataclass(frozen=True, slots=True)
class Replayed:
    """One pending pod of the scenario (as decided: its template claims named) and its
    decision."""

    pod: Pod
    decision: Decision
    #: The PodGroup it was decided with, or None.
    group: str | None = None


class Replay:
    """The scenario's pending pods decided in order on ``state`` (iterate once). ``scores``:
    each placed pod's score on every node too (``Decision.node_scores``: a Fit on every node
    per pod, which a replay of a large trace may leave out)."""

    def __init__(
        self,
        scenario: Mapping[str, Any],
        state: ClusterState,
        now: float = 0.0,
        scores: bool = True,
    ) -> None:
        self.scenario = scenario
        self.state = state
        self.now = now
        self.scores = scores
        #: Each PodGroup's outcome (``simulation_gangs.render``), in the order the groups'
        #: first members came; complete once the iteration ends.
        self.groups: list[Any] = []

    def __iter__(self) -> Iterator[Replayed]:
        decided_groups: set[str] = set()
        for pod in self.scenario.get("pods") or []:
            if (pod.get("spec") or {}).get("nodeName"):
                continue
            group = gangs.group_of(pod)
            if group is None:
                pod = simulation_dra.with_template_claims(self.scenario, pod, self.state)
                yield Replayed(pod, decide(self.state, pod, self.now, self.scores))
                continue
            if group in decided_groups:
                continue  # decided with the group's first pending member
            decided_groups.add(group)
            outcome, members = simulation_gangs.decide(self.scenario, self.state, group, self.now)
            self.groups.append(simulation_gangs.render(outcome, members))
            for member, decision in members:
                yield Replayed(member, decision, group)


def decide(state: ClusterState, pod: Pod, now: float, explain: bool) -> Decision:
    """One pod decided and carried out (see the module docstring)."""
    decision = state.schedule(pod, now, explain=explain)
    for victim in decision.victims:
        state.remove_pod(victim)  # in a simulation, victims leave at once
    if decision.victims and simulation_dra.release_victims(decision, state):
        # On the DRA path the preemptor's claims are allocated once the victims' claims
        # are released: decided again, it shows where they go.
        after = state.schedule(pod, now, explain=explain)
        if after.scheduled:
            decision = dataclasses.replace(
                after, victims=decision.victims, victim_uids=decision.victim_uids
            )
    if decision.scheduled:
        simulation_dra.write_claims(decision, state)
    if decision.scheduled or decision.victims:
        state.confirm(decision.pod)
    return decision
