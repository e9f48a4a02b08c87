"""The capacity model (tests/bench/e2e/capacity.py) and the ladder's section: lines fitted on
some sizes, checked on held-out ones, extrapolated, and what runs out first."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if _BENCH not in sys.path:
    sys.path.append(_BENCH)

from e2e import capacity, ladder  # noqa: E402  (needs the path above)
from e2e.report import Cluster  # noqa: E402
from e2e.runs import Result  # noqa: E402


def _cluster(nodes: int, noise: float = 1.0, bound: bool = True) -> Cluster:
    """A cluster whose figures lie on known lines: the API server 0.05 cores at rest per
    1,000 nodes, 1 ms per pod; the operator 0.01 cores per 1,000 nodes, 2 ms per pod; 50
    MiB of API server per 1,000 nodes, 0.01 MiB per bound pod."""
    k = nodes / 1000
    measures = {
        "rest_cores.kube-apiserver": 0.05 * k * noise,
        "rest_cores.etcd": 0.01 * k,
        "rest_cores.kwok": 0.02 * k,
        "rest_cores.operator": 0.01 * k,
        "rss_mib.kube-apiserver": 300 + 50 * k,
        "rss_mib.etcd": 100 + 5 * k,
        "rss_mib_with_pods.kube-apiserver": 300 + 50 * k + 2000 * 0.01,
        "bound_pods": 2000,
        "operator_rss.empty_mib": 100,
        "operator_rss.with_nodes_mib": 100 + 40 * k,
        "operator_rss.with_pods_mib": 100 + 40 * k + 2000 * 0.003,
        "operator_rss.pods": 2000,
    }
    cpu_ms = {"kube-apiserver": 1.0 * noise, "etcd": 0.3, "kwok": 0.2, "scheduler": 2.0}
    results = [
        Result(
            "whole",
            "vgpu-operator",
            "burst",
            "whole-GPU pods",
            pods=2000,
            placed=2000 if bound else 1500,
            pods_per_s=100.0,
            completed=bound,
            extra={"cpu_ms": cpu_ms, "watch_bytes": {"pods": 9000.0}, "repeat": repeat},
        )
        for repeat in range(3)
    ]
    return Cluster(nodes, 8 * nodes, {}, 60.0, results, measures=measures)


def test_lines_fitted_on_some_sizes_predict_the_held_out_ones() -> None:
    clusters = [_cluster(n) for n in (1000, 2000, 4000, 8000)]
    model = capacity.build(clusters, held_out=[1000, 8000], cores=2.0)
    assert model.fitted == [2000, 4000]
    apiserver = model.lines["cores at rest: kube-apiserver"]
    assert apiserver.slope * 1000 == pytest.approx(0.05)
    # A bound pod's cost is one figure (the median), not a line.
    per_pod = model.lines["CPU per bound pod: kube-apiserver"]
    assert (per_pod.intercept, per_pod.slope) == (pytest.approx(1.0), 0.0)
    assert model.lines["RSS per bound pod: kube-apiserver"].intercept == pytest.approx(0.01)
    assert model.checks
    assert all(c.within for c in model.checks)
    assert {c.nodes for c in model.checks} == {1000, 8000}
    assert {c.quantity for c in model.checks} >= set(capacity.HEADLINE)


def test_a_held_out_size_off_the_line_is_reported_over() -> None:
    clusters = [_cluster(1000), _cluster(2000), _cluster(4000), _cluster(8000, noise=2.0)]
    model = capacity.build(clusters, held_out=[8000])
    over = {c.quantity: c.error for c in model.checks if not c.within}
    # Twice the API server's cores at rest and CPU per pod: 50 % off; the sum of the cores
    # at rest 0.4 of 0.9 + 0.4 off, the CPU per pod 1 of 4.5 (within 25 %).
    assert over == {
        "cores at rest: kube-apiserver": pytest.approx(0.5),
        "CPU per bound pod: kube-apiserver": pytest.approx(0.5),
        "cores at rest, all": pytest.approx(0.4 / 1.12, rel=1e-2),
    }


def test_what_runs_out_first_is_the_smallest_node_count() -> None:
    model = capacity.build([_cluster(n) for n in (1000, 2000, 4000)], held_out=[])
    limits = model.limits()
    # 0.09 cores at rest per 1,000 nodes reach 2 cores at about 22,222 nodes; the
    # operator's 0.01 reach its one core at 100,000.
    assert limits["the machine's 2 cores, at rest"] == pytest.approx(22_222, rel=1e-3)
    assert limits["the operator's one core, at rest"] == pytest.approx(100_000, rel=1e-3)
    text = "\n".join(capacity.section(model))
    assert "What runs out first: the machine's 2 cores, at rest, at about 22,222 nodes" in text
    assert "| pods/s the cores left can bind |" in text


def test_the_bind_rate_is_the_cores_left_over_the_cost_per_pod() -> None:
    model = capacity.build([_cluster(n) for n in (1000, 2000)], held_out=[])
    # At 10,000 nodes: 2 - 0.9 cores left; 1 + 0.3 + 0.2 + 2.0 ms per pod.
    assert model.bind_rate(10_000) == pytest.approx(1.1 * 1000 / 3.5)
    assert model.bind_rate(30_000) == 0.0


def test_the_ladder_stops_counting_a_size_where_a_burst_left_pods_unbound() -> None:
    good, bad = _cluster(1000), _cluster(2000, bound=False)
    assert ladder.held(good)
    assert not ladder.held(bad)
    facts = {"command": "run_ladder", "operator commit": "abc"}
    lines = ladder.section([good, bad], None, [], facts, held_out=[])
    text = "\n".join(lines)
    assert "**1,000 nodes**" in text
    assert "| 2,000 |" in text
    assert "| NO |" in text
    # One size held: too few to fit a model on.
    assert "## Capacity model" not in text
