"""Preemption's trial is the walk's own fit, in both dialects (issue 45).

The defect it guards against: the annotation dialect's trial fitted the pod without the
node's configuration layer, so a card the node withholds (``nvidia.com/nouse-gpuuuid``)
looked free, the low-priority pod in the way was reprieved, and the urgent pod was
nominated for the withheld card with no victims (``preempt-24``). The same cluster on the
claims dialect is ``dra-17``. Here the trial with nobody removed must refuse the node for
the walk's reasons, and with the low pod removed take the card the node offers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vgpu_operator import simulation, simulation_dra
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.cycle.plugin import Unread
from vgpu_operator.scheduling.cycle.preempting import Trial
from vgpu_operator.scheduling.status import Reason

DATA = Path(__file__).resolve().parents[2] / "scenarios" / "data"


def _cluster(name: str) -> tuple[ClusterState, dict[str, Any], dict[str, Any]]:
    scenario = simulation.read_scenario(DATA / name)
    state = simulation.build_state(scenario)
    urgent = next(p for p in scenario["pods"] if p["metadata"]["name"] == "urgent")
    return state, scenario, simulation_dra.with_template_claims(scenario, urgent, state)


@pytest.mark.parametrize(
    ("scenario", "dialect"),
    [
        pytest.param("preempt-24-withheld-card-is-no-room.json", "annotations", id="annotations"),
        pytest.param("dra-17-preemption-withheld-card.json", "claims", id="claims"),
    ],
)
def test_the_trial_refuses_a_withheld_card_as_the_walk_does(scenario: str, dialect: str) -> None:
    state, _scenario, urgent = _cluster(scenario)
    cycle = state.cycle
    plugin: Any = cycle.claims if dialect == "claims" else cycle.annotations
    read = cycle.parse("default/urgent", urgent)
    request = plugin.request(read)
    assert not isinstance(request, Unread)
    node = state.books.nodes["n1"]

    walked = plugin.fit(node, request, 0.0)
    trial = Trial(state.books, plugin, node, request, 0.0)
    kept = trial.outcome(frozenset())
    freed = trial.outcome(frozenset({"default/low"}))

    assert not walked.ok
    assert Reason.CARD_UUID_MISMATCH in walked.reasons
    assert kept is not None
    assert (kept.ok, dict(kept.reasons)) == (False, dict(walked.reasons))
    assert freed is not None
    assert freed.ok
    taken = (
        [p.device.name for picks in freed.picks.values() for p in picks]
        if dialect == "claims"
        else [d.uuid for single in freed.devices.values() for c in single for d in c]
    )
    assert [t.upper() for t in taken] == ["GPU-A"]


@pytest.mark.parametrize(
    "scenario",
    ["preempt-24-withheld-card-is-no-room.json", "dra-17-preemption-withheld-card.json"],
)
def test_a_withheld_card_is_never_nominated(scenario: str) -> None:
    """The decision evicts the pod in the way, and nothing holds the withheld card."""
    state, _scenario, urgent = _cluster(scenario)

    decision = state.schedule(urgent, 0.0)

    assert (decision.nominated_node, decision.victims) == ("n1", ("default/low",))
    assert "GPU-B" not in str(decision.annotations)
