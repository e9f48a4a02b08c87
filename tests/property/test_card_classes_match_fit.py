"""Judging a node by classes of identical cards gives exactly the full Fit's answer.

For pods whose reasons cannot depend on card order (one device request, no NUMA binding,
no quota in their namespace), ``card_classes.Simple`` judges each class of alike cards
once, with memos shared across nodes and usage states. On random nodes (card models,
health, slots, node-layer policies and restrictions, cordons) loaded by random pods, its
answer for every node must be the full Fit's: the same reasons, counts and refusing
annotations, or a fit where Fit fits.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import ClusterSpec, clusters, pods, simple_pods

from vgpu_operator.scheduling.cycle import verdicts
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.dialects.annotation import card_classes, placement


@st.composite
def loaded(draw: st.DrawFn) -> tuple[ClusterSpec, list[dict[str, object]], list[dict[str, object]]]:
    spec = draw(clusters(mig=False))
    uuids = sorted(spec.cards())
    load = [draw(pods(f"load{i}", uuids)) for i in range(draw(st.integers(0, 12)))]
    probes = [draw(simple_pods(f"probe{i}", uuids)) for i in range(draw(st.integers(1, 4)))]
    return spec, load, probes


@settings(max_examples=400, deadline=None)
@given(loaded())
def test_classes_judge_as_fit(
    case: tuple[ClusterSpec, list[dict[str, object]], list[dict[str, object]]],
) -> None:
    spec, load, probes = case
    state = spec.build()
    for pod in load:
        decision = state.schedule(pod, 0.0)
        if decision.scheduled:
            state.confirm(decision.pod)
    for pod in probes:
        admitted = state.admit(pod)
        if not admitted.allowed:
            continue
        job = placement.Job.from_pod(admitted.pod, state.config, state.vendors, state.quota)
        simple = card_classes.Simple.of(job)
        assert simple is not None, "a one-request pod in a free namespace is judged by classes"
        _compare_every_node(state, job, simple)


def _compare_every_node(
    state: ClusterState, job: placement.Job, simple: card_classes.Simple
) -> None:
    for name in state.node_names():
        if state.cycle.judged.node_gate(name, job, 0.0) is not None:
            continue
        profile = state.cycle.judged.node_profile(
            name, simple.wants_ids(state.cycle.judged.node_layer(name))
        )
        assert profile is not None
        judged = simple.judge(profile)
        outcome = state.cycle.judged.node_fit(name, job, 0.0)
        expected = None if outcome.ok else verdicts.failure_of(outcome)
        assert judged == expected, name
        if expected is None:
            assert simple.could_ever(profile), name
