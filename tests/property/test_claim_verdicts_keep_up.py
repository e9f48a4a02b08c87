"""The DRA path's verdict reuse decides exactly as fitting every node afresh.

A pod on the DRA path that fits nowhere keeps a verdict; at its next attempt only the
nodes changed since are fitted again, the others keep their failure (the pod's verdict).
Two engines run the same steps on generated DRA clusters (``dra_preemption_cases``):
one keeps verdicts, the other fits every node every time. Steps: the preemptor tried
again (its preemption then cancelled, or its hold rolled back), running pods ending and
their claims released, new claims taking room on a card, the preemptor's claim asking
another amount (another verdict), a card tainted and healed. Every decision must be the
same: the node or the nominated node, the victims, and each node's reasons.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from dra_preemption_cases import (
    MEMORY_MIB,
    Case,
    ModelClaim,
    ModelPod,
    bound_pod,
    claim_object,
    generate,
)

from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cycle.cluster import Decision

CLUSTERS = 60
STEPS = 14


def _seen(decision: Decision) -> tuple[Any, ...]:
    diagnosis = decision.diagnosis
    failures = None
    message = None
    if diagnosis is not None:
        failures = {
            n: (dict(f.reasons), dict(f.refused_by)) for n, f in diagnosis.node_failures.items()
        }
        message = diagnosis.message()
    return (
        decision.scheduled,
        decision.node,
        decision.nominated_node,
        tuple(sorted(decision.victims)),
        decision.preemption_blocked,
        failures,
        message,
    )


class Twins:
    """The same steps on an engine that keeps verdicts and on one that does not."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.kept = case.engine()
        self.fresh = case.engine()
        self.fresh.settings.verdicts = False
        self.both = (self.kept, self.fresh)
        self.claims: dict[str, ModelClaim] = dict(case.claims)
        self.pods: dict[str, ModelPod] = dict(case.pods)
        self.pod, self.claim = case.preemptor()
        for state in self.both:
            state.set_claim(self.claim)
        self.version = 1
        self.serial = 0
        self.decisions = 0
        self.reused = 0
        self.last: Any = None

    def retry(self, rng: random.Random, now: float) -> None:
        kept = self.kept.schedule(self.pod, now)
        fresh = self.fresh.schedule(self.pod, now)
        assert _seen(kept) == _seen(fresh)
        self.decisions += 1
        # The same verdict object as last time: its failures were kept, not refitted.
        self.reused += kept.verdict is not None and kept.verdict is self.last
        self.last = kept.verdict
        key = kept.pod
        cancel = rng.random() < 0.8  # else the nomination stands: the pod waits for it
        for state in self.both:
            if kept.scheduled:
                state.rollback(key)
            elif kept.nominated_node is not None and cancel:
                state.cancel_preemption(key)

    def end(self, rng: random.Random) -> None:
        if not self.pods:
            return
        name = rng.choice(sorted(self.pods))
        del self.pods[name]
        claim = next(c for c in self.claims.values() if name in c.holders)
        claim.holders = [h for h in claim.holders if h != name]
        for state in self.both:
            state.remove_pod(f"ns/{name}")
            if claim.holders:
                state.set_claim(claim_object(claim))
            else:
                state.remove_claim(f"ns/{claim.name}")
        if not claim.holders:
            del self.claims[claim.name]

    def grow(self, rng: random.Random) -> None:
        node = rng.choice(sorted(self.case.nodes))
        card = rng.choice(self.case.nodes[node])
        self.serial += 1
        claim = ModelClaim(
            f"extra{self.serial}", node, card, rng.choice((4096, 8192, 16384)), 10,
            [f"extra-pod{self.serial}"],
        )  # fmt: skip
        pod = ModelPod(claim.holders[0], node, rng.randint(0, 3), rng.randint(0, 59), False)
        self.claims[claim.name] = claim
        self.pods[pod.name] = pod
        for state in self.both:
            state.set_claim(claim_object(claim))
            state.set_pod(bound_pod(pod, claim.name))

    def ask_other(self, rng: random.Random) -> None:
        self.version += 1
        claim = copy.deepcopy(self.claim)
        claim["metadata"]["resourceVersion"] = str(self.version)
        request = claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]
        request["memory"] = f"{rng.choice((MEMORY_MIB // 4, MEMORY_MIB // 2, MEMORY_MIB))}Mi"
        self.claim = claim
        for state in self.both:
            state.set_claim(claim)

    def taint(self, rng: random.Random) -> None:
        """A card of a node tainted NoSchedule, or the node's slice published clean."""
        node = rng.choice(sorted(self.case.nodes))
        pool = self.kept.pool_of(node)
        assert pool is not None
        shapes = [
            dra.CardShape(name.upper(), i, "L40S", "NVIDIA-L40S", MEMORY_MIB, 100, 4, "hami-core")
            for i, name in enumerate(self.case.nodes[node])
        ]
        wire = dra.slice_wire(node, shapes, 1, None)
        if rng.random() < 0.6:
            device = rng.choice(wire["spec"]["devices"])
            device["taints"] = [{"key": "gpu.health", "value": "xid", "effect": "NoSchedule"}]
        for state in self.both:
            state.set_slice(copy.deepcopy(wire))


def test_kept_verdicts_decide_as_fresh_fits() -> None:
    rng = random.Random(3535)
    decisions = reused = 0
    for _ in range(CLUSTERS):
        twins = Twins(generate(rng, max_nodes=6))
        now = 0.0
        twins.retry(rng, now)
        for _step in range(STEPS):
            now += 1
            step = rng.choice(("retry", "retry", "retry", "end", "grow", "ask", "taint"))
            if step == "retry":
                twins.retry(rng, now)
            elif step == "end":
                twins.end(rng)
            elif step == "grow":
                twins.grow(rng)
            elif step == "ask":
                twins.ask_other(rng)
            else:
                twins.taint(rng)
        twins.retry(rng, now + 1)
        decisions += twins.decisions
        reused += twins.reused
    print(f"{decisions} decisions, {reused} of them with a kept verdict")
    # The comparison means something only if verdicts were in fact reused.
    assert reused > decisions // 4
