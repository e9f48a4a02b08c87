"""The DRA churn trace (``e2e/dra.py``) played through the engine alone, per node policy.

``python tests/bench/bench_dra_churn_engine.py [--policies binpack,fragmentation]``
(a policy names both, or ``NODE/GPU`` the node and the GPU policy apart): the
bench's churn trace (seed 26, 1100 steps, 12 nodes of eight 40 GiB cards split 8) with
the same measures at the first refusal (stranded memory for the refused claim, slivers,
free memory), but decided by ``ClusterState`` directly, with no control plane: each
arrival's claim made, the pod decided and its claim allocated at once, each departure's
pod and claim removed at once. The end-to-end bench measures the same trace against
kube-scheduler's first-fit allocator (``docs/benchmarks.md``, "DRA"); this shows what
the node and GPU policy change on the engine's side, in seconds instead of minutes.

First it prints the trace's lower bound (``dra_churn_bound``): no policy strands less
than that at its first refusal, and none places more claims before it; each policy's
row says how far above the bound it strands.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

import dra_churn_bound  # noqa: E402
from e2e.dra import (  # noqa: E402
    CARDS_PER_NODE,
    CHURN_NODES,
    CHURN_STEPS,
    Card,
    Shape,
    churn_cards,
    claim_spec,
    free_cards,
    stranded_for,
    stranded_gib,
    trace,
)

from vgpu_operator import simulation_dra  # noqa: E402
from vgpu_operator.config import load_config  # noqa: E402
from vgpu_operator.devices import dra  # noqa: E402
from vgpu_operator.scheduling.cycle.cluster import ClusterState  # noqa: E402

NAMESPACE = "churn"


def engine(policy: str) -> tuple[ClusterState, list[dict[str, Any]]]:
    """``policy``: one name for both, or ``NODE/GPU`` (``binpack/fragmentation``)."""
    node_policy, _, gpu_policy = policy.partition("/")
    config = load_config(
        {
            "scheduler": {
                "nodeSchedulerPolicy": node_policy,
                "gpuSchedulerPolicy": gpu_policy or node_policy,
            }
        }
    )
    state = ClusterState(config)
    for device_class in dra.device_classes():
        state.set_device_class(device_class)
    slices = []
    for n in range(CHURN_NODES):
        node = f"dra-churn-{n}"
        state.set_node({"metadata": {"name": node, "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA}}})
        wire = dra.slice_wire(node, churn_cards(node), 1, None)
        state.set_slice(wire)
        slices.append(dict(wire))
    return state, slices


def cards_now(slices: list[dict[str, Any]], claims: dict[str, Any]) -> list[Card]:
    return free_cards(slices, list(claims.values()))


def churn(policy: str, seed: int = 26) -> dict[str, Any]:
    state, slices = engine(policy)
    live: list[str] = []
    claims: dict[str, Any] = {}
    placed = 0
    for number, (kind, value) in enumerate(trace(seed, CHURN_STEPS)):
        if kind == "leave":
            if live:
                name = live.pop(value % len(live))
                state.remove_pod(f"{NAMESPACE}/{name}")  # type: ignore[arg-type]
                state.remove_claim(f"{NAMESPACE}/{name}-gpu")
                claims.pop(name, None)
            continue
        shape = value
        assert isinstance(shape, Shape)
        name = f"p{number}-{shape.name}"
        claim = {
            "apiVersion": dra.API_VERSION,
            "kind": "ResourceClaim",
            "metadata": {"namespace": NAMESPACE, "name": f"{name}-gpu", "uid": f"{name}-gpu"},
            "spec": claim_spec(shape),
        }
        state.set_claim(claim)
        pod = {
            "metadata": {"namespace": NAMESPACE, "name": name, "uid": name},
            "spec": {
                "schedulerName": "vgpu-scheduler",
                "containers": [{"name": "main", "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
            },
        }
        decision = state.schedule(pod, 0.0)
        if not decision.scheduled:
            cards = cards_now(slices, claims)
            slivers, free = stranded_gib(cards)
            return {
                "policy": policy,
                "placed_before_refusal": placed,
                "refused": shape.name,
                "stranded_gib": round(stranded_for(cards, shape), 1),
                "slivers_gib": round(slivers, 1),
                "free_gib": round(free, 1),
            }
        simulation_dra.write_claims(decision, state)
        state.confirm(decision.pod)
        claims[name] = state.claim_object(f"{NAMESPACE}/{name}-gpu")
        placed += 1
        live.append(name)
    return {"policy": policy, "placed_before_refusal": placed, "refused": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="binpack,spread,fragmentation")
    args = parser.parse_args()
    found = dra_churn_bound.bound(trace(26, CHURN_STEPS), CHURN_NODES, CARDS_PER_NODE)
    print(json.dumps({"bound": asdict(found)}), flush=True)
    for policy in args.policies.split(","):
        row = churn(policy)
        if row["refused"] is not None:
            row["above_bound_gib"] = round(row["stranded_gib"] - found.stranded_gib_at_least, 1)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
