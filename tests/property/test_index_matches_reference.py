"""The indexed path decides exactly as the reference path (resolvelib's differential runs).

The indexed path visits nodes best score first, skips nodes whose free-capacity summary
rules them out and stops at the first fit; the reference path fits every node and takes
the best. Both must give the same node, the same devices, the same reasons and leave
the same bookings, on the same sequence of events.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from strategies import Replay, Scenario, comparable, scenarios

from vgpu_operator.scheduling.cycle.cluster import Decision


def _same_decision(decision: Decision | None) -> Any:
    return comparable(decision, lambda d: (d.to_json(), d.message(), d.error))


@given(scenarios())
def test_indexed_and_reference_paths_decide_the_same(scenario: Scenario) -> None:
    indexed = Replay(scenario.cluster.build(use_index=True))
    reference = Replay(scenario.cluster.build(use_index=False))
    for position, step in enumerate(scenario.steps):
        fast = indexed.apply(step)
        slow = reference.apply(step)
        assert _same_decision(fast) == _same_decision(slow), f"step {position}: {step}"
        assert indexed.state.device_usage() == reference.state.device_usage()
        assert indexed.state.quota_usage() == reference.state.quota_usage()
