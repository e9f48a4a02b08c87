"""Judging nodes by groups of alike nodes gives exactly every node's own Fit.

``card_groups`` judges one node of a group (the same coarse card classes and node layer)
in a regime (every card short of the request's memory; or every card with the memory,
and every card short of the cores or every card with them) and gives its failure to the
group's other nodes in that regime. The nodes here are made to fall into few groups:
each cluster has 3-10 nodes built from one or two card templates (the same models,
slots and health, cards named per node) with the same node layers, loaded by random
pods, so that many nodes share a group with different free memory and cores. For each
probe (a simple pod: one request, no NUMA binding, no quota), one judge visits the nodes
in a random order, and its answer for every node must be that node's own Fit: the same
reasons, counts and refusing annotations, or a fit where Fit fits.
"""

from __future__ import annotations

import dataclasses
import random

from builders import make_pod
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import (
    FREE_NAMESPACE,
    MIG_CONFIG,
    ClusterSpec,
    NodeSpec,
    cards,
    node_layers,
    pods,
    simple_pods,
)

from vgpu_operator import names
from vgpu_operator.config import load_config
from vgpu_operator.scheduling.cycle import verdicts
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.dialects.annotation import card_classes, card_groups, placement


@st.composite
def alike_clusters(draw: st.DrawFn) -> ClusterSpec:
    templates = [draw(cards("t", mig=False)) for _ in range(draw(st.integers(1, 2)))]
    layers = [draw(node_layers()) for _ in range(draw(st.integers(1, 2)))]
    nodes = []
    for n in range(draw(st.integers(3, 10))):
        name = f"n{n}"
        template = draw(st.sampled_from(templates))
        own = tuple(
            dataclasses.replace(card, id=f"GPU-{name}-{i}") for i, card in enumerate(template)
        )
        nodes.append(NodeSpec(name, own, annotations=draw(st.sampled_from(layers))))
    # Spread: the load lands on every node, so nodes of one group differ in free room.
    gpu_policy = draw(st.sampled_from(("spread", "binpack")))
    scheduler = {"nodeSchedulerPolicy": "spread", "gpuSchedulerPolicy": gpu_policy}
    return ClusterSpec(tuple(nodes), config=load_config({**MIG_CONFIG, "scheduler": scheduler}))


@st.composite
def loaded(draw: st.DrawFn) -> tuple[ClusterSpec, list[dict[str, object]], list[dict[str, object]]]:
    spec = draw(alike_clusters())
    uuids = sorted(spec.cards())
    load = [draw(pods(f"load{i}", uuids)) for i in range(draw(st.integers(0, 40)))]
    probes = [draw(simple_pods(f"probe{i}", uuids)) for i in range(draw(st.integers(1, 3)))]
    return spec, load, probes


def _edge_probes(data: st.DataObject, state: ClusterState) -> list[dict[str, object]]:
    """Pods asking, per card, just the free memory or cores some card has, or one more:
    the requests whose regime differs between nodes of one group."""
    free_memory: set[int] = set()
    free_cores: set[int] = set()
    for name in state.node_names():
        profile = state.cycle.judged.node_profile(name, False)
        assert profile is not None
        for card_class in profile.classes:
            card = card_class.card
            free_memory.add(card.total_memory_mib - card.used_memory_mib)
            free_cores.add(card.total_cores - card.used_cores)
    memories = sorted({max(1, m + d) for m in free_memory for d in (0, 1)})
    cores = sorted({min(100, max(0, c + d)) for c in free_cores for d in (0, 1)})
    out = []
    for i in range(data.draw(st.integers(1, 4))):
        builder = make_pod(f"edge{i}", FREE_NAMESPACE)
        gpu = data.draw(st.integers(1, 3))
        gpumem = data.draw(st.sampled_from(memories))
        builder.container(gpu, gpumem, data.draw(st.sampled_from(cores)))
        if data.draw(st.booleans()):
            builder.annotate(names.GPU_SCHEDULER_POLICY, "mutex")
        out.append(builder.obj())
    return out


@settings(max_examples=300, deadline=None)
@given(loaded(), st.data())
def test_groups_judge_as_fit(
    case: tuple[ClusterSpec, list[dict[str, object]], list[dict[str, object]]],
    data: st.DataObject,
) -> None:
    spec, load, probes = case
    state = spec.build()
    for pod in load:
        decision = state.schedule(pod, 0.0)
        if decision.scheduled:
            state.confirm(decision.pod)
    for pod in [*probes, *_edge_probes(data, state)]:
        _judge_every_node(state, pod, data.draw(st.randoms(use_true_random=False)))


def _judge_every_node(state: ClusterState, pod: dict[str, object], rng: random.Random) -> None:
    """One group judge visits every node in a random order; each answer is Fit's."""
    judged = state.cycle.judged
    admitted = state.admit(pod)
    if not admitted.allowed:
        return
    job = placement.Job.from_pod(admitted.pod, state.config, state.vendors, state.quota)
    simple = card_classes.Simple.of(job)
    assert simple is not None
    groups = card_groups.GroupJudge(simple)
    order = state.node_names()
    rng.shuffle(order)
    for name in order:
        if judged.node_gate(name, job, 0.0) is not None:
            continue
        if simple.wants_ids(judged.node_layer(name)):
            continue  # judged card by card, never by groups
        group = judged.node_group(name)
        profile = judged.node_profile(name, False)
        assert group is not None
        assert profile is not None
        assert not groups.by_ids(group)
        answer = groups.known(group)
        if answer is card_classes.UNJUDGED:
            answer = groups.learn(group, profile)
        outcome = judged.node_fit(name, job, 0.0)
        expected = None if outcome.ok else verdicts.failure_of(outcome)
        assert answer == expected, name
