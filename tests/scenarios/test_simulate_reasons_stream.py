"""`simulate`'s streamed reasons and the preemption search of a pod nobody can yield to.

``simulation_stream.ReasonsText`` writes a pod's ``reasons`` from text kept per node
failure (the FGD replay's pods that fit nowhere carry reasons on 1,213 nodes); the text
must read back as ``Diagnosis.to_json`` whatever changed between two pods. And a pod
that fits nowhere in a cluster whose placed pods all have its priority or more tries
no removal trial on any node (there is nobody to evict).
"""

from __future__ import annotations

import io
import itertools
import json
from typing import Any

import pytest

from vgpu_operator import simulation, simulation_stream
from vgpu_operator.scheduling.cycle import preempting

Scenario = dict[str, Any]


def _node(name: str, cards: int, memory: int) -> dict[str, Any]:
    devices = [
        {
            "id": f"GPU-{name}-{i}",
            "index": i,
            "count": 10,
            "devmem": memory,
            "devcore": 100,
            "type": "NVIDIA A100",
            "numa": 0,
            "health": True,
            "mode": "hami-core",
        }
        for i in range(cards)
    ]
    return {"metadata": {"name": name, "annotations": {}}, "devices": devices}


def _pod(name: str, memory: int, cards: int = 1, priority: int = 0) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": cards, "nvidia.com/gpumem": memory}
    return {
        "metadata": {"namespace": "default", "name": name, "annotations": {}},
        "spec": {
            "priority": priority,
            "containers": [{"name": "main", "resources": {"limits": limits}}],
        },
    }


def _scenario() -> Scenario:
    """Nodes of different sizes; pods too big for any node between pods that fill some
    cards, so that the same shape fails again after nodes changed, and unchanged."""
    nodes = [_node(f"node-{i}", 1 + i % 3, 8000 + 1000 * i) for i in range(8)]
    pods: list[dict[str, Any]] = []
    for round_ in range(4):
        pods.append(_pod(f"big-{round_}-a", 40000))
        pods.append(_pod(f"big-{round_}-b", 40000))  # the same diagnosis again
        pods.append(_pod(f"pair-{round_}", 9000, cards=2))
        pods.append(_pod(f"fill-{round_}", 7000))
    return {
        "name": "streamed reasons",
        "config": {"nvidia": {"memoryFactor": 1}, "scheduler": {"nodeSchedulerPolicy": "binpack"}},
        "nodes": nodes,
        "pods": pods,
    }


def test_streamed_reasons_read_back_as_the_diagnosis() -> None:
    scenario = _scenario()
    out = io.StringIO()
    simulation_stream.write(scenario, out, 0.0)
    streamed = json.loads(out.getvalue())["decisions"]
    gathered = json.loads(json.dumps(simulation.simulate(scenario, now=0.0)["decisions"]))
    assert streamed == gathered
    failed = [d for d in streamed if not d["scheduled"]]
    assert len(failed) >= 8
    assert all(len(d["reasons"]) == 8 for d in failed)
    assert {r for d in failed for node in d["reasons"].values() for r in node} >= {
        "CardInsufficientMemory"
    }


def test_reasons_text_reuses_a_diagnosis_and_follows_a_new_one() -> None:
    scenario = _scenario()
    state = simulation.build_state(scenario)
    text = simulation_stream.ReasonsText()
    seen: list[tuple[object, str]] = []
    for _pod, made in simulation_stream.decisions(scenario, state, 0.0, scores=False):
        if made.diagnosis is None:
            continue
        written = text.of(made.diagnosis)
        assert json.loads(written) == made.diagnosis.to_json()
        seen.append((made.diagnosis, written))
    again = [b for (a, _), (b, _t) in itertools.pairwise(seen) if a is b]
    assert again, "pods of one shape with no change between them share a diagnosis"


@pytest.mark.parametrize(("placed", "trials_expected"), [(0, False), (-1, True)])
def test_preemption_tries_no_node_when_nobody_is_lower(
    monkeypatch: pytest.MonkeyPatch, placed: int, trials_expected: bool
) -> None:
    """``placed``: the priority of the pod already on the card (the preemptor has 0)."""
    made: list[object] = []
    real = preempting.Trial

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(preempting, "Trial", counted)
    scenario: Scenario = {
        "name": "nobody lower",
        "config": {"nvidia": {"memoryFactor": 1}},
        "nodes": [_node(f"node-{i}", 1, 10000) for i in range(3)],
        "pods": [_pod(f"first-{i}", 9000, priority=placed) for i in range(3)]
        + [_pod("late", 9000)],
    }
    decisions = simulation.simulate(scenario, now=0.0)["decisions"]
    assert [d["scheduled"] for d in decisions[:3]] == [True] * 3
    assert bool(made) is trials_expected


@pytest.mark.parametrize("policy", ["binpack", "spread", "fragmentation"])
def test_pods_that_want_no_device_go_where_the_reference_walk_puts_them(policy: str) -> None:
    """A pod that asks no GPU is fitted in the reference's key order up to the first fit
    (``reference_walk.in_key_order``): the same node as fitting every node."""
    nodes = []
    for i in range(7):
        node = _node(f"node-{i}", i % 3, 10000)
        node["status"] = {"allocatable": {"cpu": f"{2 + i % 4}", "memory": f"{4 + i}Gi"}}
        nodes.append(node)
    pods: list[dict[str, Any]] = []
    for i in range(24):
        if i % 3 == 0:
            pods.append(_pod(f"gpu-{i}", 2000 + 500 * (i % 5)))
            pods[-1]["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "500m"}
        else:
            requests = {"cpu": f"{250 * (1 + i % 5)}m", "memory": f"{1 + i % 3}Gi"}
            pods.append(
                {
                    "metadata": {"namespace": "default", "name": f"cpu-{i}", "annotations": {}},
                    "spec": {"containers": [{"name": "main", "resources": {"requests": requests}}]},
                }
            )
    too_big = {"cpu": "64", "memory": "1Gi"}
    pods.append(
        {
            "metadata": {"namespace": "default", "name": "cpu-too-big", "annotations": {}},
            "spec": {"containers": [{"name": "main", "resources": {"requests": too_big}}]},
        }
    )
    scenario: Scenario = {
        "name": "no device",
        "config": {"scheduler": {"nodeSchedulerPolicy": policy, "gpuSchedulerPolicy": policy}},
        "nodes": nodes,
        "pods": pods,
    }
    indexed = simulation.simulate(scenario, now=0.0)["decisions"]
    reference = simulation.simulate(scenario, now=0.0, use_index=False)["decisions"]
    assert [(d["pod"], d["node"], d["reasons"]) for d in indexed] == [
        (d["pod"], d["node"], d["reasons"]) for d in reference
    ]
    placed = {d["node"] for d in indexed if d["pod"].startswith("default/cpu-") and d["node"]}
    assert len(placed) >= 2
    assert any(not d["scheduled"] for d in indexed)


@pytest.mark.parametrize(
    ("value", "read"),
    [("1e3", "1e3"), ("1.5e3", "1.5e3"), ("1.5e+3", 1500.0), ("NaN", "NaN"), ("-0.25", -0.25)],
)
def test_a_json_scenario_reads_as_yaml_would_read_it(value: str, read: object) -> None:
    """JSON is read by the JSON parser (PyYAML took 20 s over the FGD replay's scenario),
    with the values YAML 1.1 gives: its floats need a dot and a signed exponent."""
    text = '{"name": %s, "nodes": [], "expect": [{"pod": "default/p", "scheduled": true}]}'
    scenario = simulation.parse_scenario(text % value)
    assert scenario["name"] == read
    assert scenario["expect"] == [{"pod": "default/p", "scheduled": True}]
