"""The claims dialect's judgement by node classes equals the full fit (issue 45).

``claim_classes`` answers a simple claim's failure on a node from the failure of an earlier
node of the same profile. On generated clusters built from a few node templates (so that
profiles repeat), with cards used unevenly, unhealthy, cordoned, withheld by the node layer
(``nouse-gpuuuid``, ``use-gputype``) or tainted, and requests with selectors (on the card's
index, UUID or model), tolerations, memory, cores and whole cards, every node's fit with
classes (twice: the second pass answers from what the first learnt) equals a fit without.
"""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from builders import claim_status

from vgpu_operator import simulation
from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cycle.claims_plugin import ClaimsPlugin
from vgpu_operator.scheduling.cycle.claims_request import ClaimsRequest

CLUSTERS = 40
Json = dict[str, Any]


#: Node templates: (product, card MiB, shares, per card (GiB used, cores used)). Pairs
#: differ in one field only (used memory, the model, used cores, the card's memory or
#: shares), so that a profile that left it out would answer one node with another's.
TEMPLATES = (
    ("NVIDIA L40S", 46068, 4, ((8, 25), (8, 25))),
    ("NVIDIA L40S", 46068, 4, ((40, 25), (40, 25))),
    ("NVIDIA A100", 46068, 4, ((8, 25), (8, 25))),
    ("NVIDIA L40S", 46068, 4, ((8, 75), (8, 75))),
    ("NVIDIA L40S", 81920, 4, ((8, 25), (8, 25))),
    ("NVIDIA L40S", 46068, 1, ((8, 25), (8, 25))),
    ("NVIDIA L40S", 46068, 4, ((20, 50),)),
)


def _cards(
    rng: random.Random, node: str, product: str, memory: int, shares: int, count: int
) -> list[Json]:
    cards = []
    for index in range(count):
        card: Json = {
            "uuid": f"GPU-{node}-{index}",
            "index": index,
            "product": product,
            "memoryMiB": memory,
            "splitCount": shares,
        }
        if rng.random() < 0.1:
            card["unhealthy"] = "XidError"
        cards.append(card)
    return cards


def _held(node: str, card: str, memory_gib: int, cores: int, number: int) -> tuple[Json, Json]:
    name = f"held-{number}"
    consumed = {"memory": f"{memory_gib}Gi", "cores": str(cores), "shares": "1"}
    status = claim_status(node, card.lower(), consumed=consumed, pinned=True)
    status["reservedFor"] = [{"resource": "pods", "name": name, "uid": f"uid-p-{name}"}]
    exactly = {"deviceClassName": dra.SHARED_CLASS, "capacity": {"requests": {"memory": "1Gi"}}}
    claim = {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        "status": status,
    }
    pod = {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-p-{name}"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
        "status": {"phase": "Running"},
    }
    return claim, pod


def _scenario(rng: random.Random) -> Json:
    """Nodes made from a few templates (equal cards and usage), some of them changed."""
    nodes, claims, pods, rules = [], [], [], []
    for n in range(rng.randint(4, 12)):
        name = f"dra-{n}"
        product, memory_mib, shares, usage = rng.choice(TEMPLATES)
        annotations: Json = {}
        if rng.random() < 0.15:
            annotations["nvidia.com/nouse-gpuuuid"] = f"GPU-{name}-0"
        if rng.random() < 0.3:
            annotations["nvidia.com/use-gputype"] = "A100"
        if rng.random() < 0.1:
            annotations["hami.io/device-cordon"] = f"GPU-{name}-0"
        labels = {dra.NODE_PATH_LABEL: dra.PATH_DRA}
        cards = _cards(rng, name, product, memory_mib, shares, len(usage))
        nodes.append(
            {
                "metadata": {"name": name, "labels": labels, "annotations": annotations},
                "draCards": cards,
            }
        )
        for card, (memory, cores) in zip(cards, usage, strict=True):
            if memory:
                claim, pod = _held(name, card["uuid"], memory, cores, len(claims))
                claims.append(claim)
                pods.append(pod)
        if rng.random() < 0.1:
            rules.append(
                {
                    "metadata": {"name": f"drain-{name}"},
                    "spec": {
                        "deviceSelector": {
                            "driver": dra.DRIVER,
                            "pool": name,
                            "device": cards[0]["uuid"].lower(),
                        },
                        "taint": {"key": "example.com/drain", "value": "x", "effect": "NoSchedule"},
                    },
                }
            )
    return {"nodes": nodes, "resourceClaims": claims, "pods": pods, "deviceTaintRules": rules}


def _request(rng: random.Random, number: int) -> tuple[Json, Json]:
    exactly: Json = {
        "deviceClassName": rng.choice([dra.SHARED_CLASS, dra.EXCLUSIVE_CLASS]),
        "capacity": {"requests": {"memory": f"{rng.choice([4, 10, 20, 30, 44])}Gi"}},
    }
    if rng.random() < 0.5:
        exactly["capacity"]["requests"]["cores"] = str(rng.choice([10, 30, 50, 100]))
    selector = rng.choice(
        [
            None,
            f'device.attributes["{dra.DRIVER}"].index == 0',
            f'device.attributes["{dra.DRIVER}"].index >= 1',
            f'device.attributes["{dra.DRIVER}"].productName == "NVIDIA L40S"',
        ]
    )
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if rng.random() < 0.3:
        exactly["tolerations"] = [{"key": "example.com/drain", "operator": "Exists"}]
    name = f"want-{number}"
    claim = {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }
    if rng.random() < 0.2:
        off = {"opaque": {"driver": dra.DRIVER, "parameters": {"hamiCore": False}}}
        claim["spec"]["devices"]["config"] = [off]
    pod = {
        "metadata": {"namespace": "ns", "name": f"pod-{number}", "uid": f"uid-pod-{number}"},
        "spec": {
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }
    return pod, claim


def _outcome(fit: Any) -> tuple[object, ...]:
    refused = {r.value: frozenset(k) for r, k in fit.refused_by.items()}
    picks = {
        c: [(p.request, p.device.name, p.consumption) for p in ps] for c, ps in fit.picks.items()
    }
    reasons = {r.value: n for r, n in fit.reasons.items()}
    return fit.ok, reasons, refused, fit.error, picks, fit.card_scores


@pytest.mark.parametrize("seed", range(CLUSTERS))
def test_judged_by_classes_as_by_the_full_fit(seed: int) -> None:
    rng = random.Random(seed)
    scenario = _scenario(rng)
    state = simulation.build_state(scenario)
    cycle = state.cycle
    full = ClaimsPlugin(state.books, cycle.placer, classes=False)
    for number in range(6):
        pod, claim = _request(rng, number)
        state.set_claim(claim)
        request = cycle.claims.request(cycle.parse(f"ns/pod-{number}", copy.deepcopy(pod)))
        assert isinstance(request, ClaimsRequest)
        for _pass in range(2):
            for node in state.books.nodes.values():
                classed = cycle.claims.fit(node, request, 0.0)
                expected = full.fit(node, request, 0.0)
                assert _outcome(classed) == _outcome(expected), node.name
                # A trial's room on one card, as the victim search fits it.
                freeing = cycle.claims.freeing(node, request, 0.0)
                on_node = sorted(node.pods)
                removed = frozenset(k for k in on_node if rng.random() < 0.5)
                for card in node.cards:
                    room = freeing.room(removed, only=card.id)
                    if room is None:
                        continue
                    classed = cycle.claims.fit(node, request, 0.0, room)
                    expected = full.fit(node, request, 0.0, room)
                    assert _outcome(classed) == _outcome(expected), (node.name, card.id)
