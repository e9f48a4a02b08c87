"""The DRA part's report: throughput over repeats, steady arrivals, the preemption slot."""

from __future__ import annotations

import sys
from pathlib import Path

_BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if _BENCH not in sys.path:
    sys.path.append(_BENCH)

from e2e import dra, dra_load  # noqa: E402  (needs the path above)


def _tp(rate: float) -> dict[str, object]:
    return {"pods": 200, "placed": 200, "pods_per_s": rate, "writes_per_pod": {}}


def test_the_throughput_ratio_is_the_median_of_runs_paired_by_repeat() -> None:
    results = {
        "kube_scheduler_gates": dra.KS_GATES,
        "nodes": {"throughput": 500},
        "throughput": {
            "engine": [_tp(200.0), _tp(300.0), _tp(210.0)],
            "kube-scheduler": [_tp(100.0), _tp(100.0), _tp(70.0)],
        },
    }
    text = "\n".join(dra.section(results))
    # Pairs 2.0, 3.0, 3.0: median 3.0 (the medians' ratio would be 210 / 100 = 2.1).
    assert "median of the runs paired by repeat: 3.00 (2.00-3.00, 33 %, 3 runs)" in text
    assert "| engine | 200 | 200.0, 300.0, 210.0 | 210.0 (200.0-300.0, 48 %, 3 runs) |" in text
    assert "SchedulerPreQueueingHints=true" in text
    assert "on 500 nodes" in text


def test_steady_and_preemption_lines() -> None:
    waited = {
        "low": 32, "high": 8, "bound": 0, "complete": False, "timeout_s": 30.0,
        "create_to_bound_p50_s": None, "create_to_bound_p99_s": None,
        "decision_p50_s": None, "decision_p99_s": None,
    }  # fmt: skip
    steady = {"engine": {"rate": 50.0, "arrived_per_s": 49.8, "pods": 1500, "placed": 1500,
                         "p50_s": 0.2, "p99_s": 0.9}}  # fmt: skip
    text = "\n".join(dra.section({"steady": steady, "preemption": waited}))
    assert "| engine | 50 | 49.8 | 1500 | 1500 | 0.2 | 0.9 |" in text
    assert "0 of 8 bound within 30 s: the DRA path does not preempt" in text
    done = waited | {"bound": 8, "complete": True, "create_to_bound_p50_s": 1.5,
                     "create_to_bound_p99_s": 2.5, "decision_p50_s": 0.01,
                     "decision_p99_s": 0.025}  # fmt: skip
    text = "\n".join(dra.section({"preemption": done}))
    assert "create to bound p50/p99 1.5 / 2.5 s; decision p50/p99 0.01 / 0.025 s" in text


def test_the_pair_claim_constrains_both_shares_to_one_nvlink_island() -> None:
    spec = dra_load.pair_spec()
    assert spec["devices"]["requests"][0]["exactly"]["count"] == 2
    assert spec["devices"]["constraints"] == [
        {"requests": ["gpu"], "matchAttribute": "gpu.vgpu-operator.io/nvlinkIsland"}
    ]


def test_claims_on_one_link_count_only_two_card_claims_within_one_island() -> None:
    def claim(*devices: str) -> dict[str, object]:
        results = [{"pool": "n1", "device": d} for d in devices]
        return {"status": {"allocation": {"devices": {"results": results}}}}

    claims = [
        claim("gpu-n1-0002", "gpu-n1-0003"),  # island 2+3
        claim("gpu-n1-0001", "gpu-n1-0002"),  # two islands
        claim("gpu-n1-0004"),  # one card: not a pair
        {"status": {}},  # not allocated
    ]
    assert dra_load.on_one_link(claims) == (1, 2)
