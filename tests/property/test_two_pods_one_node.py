"""Two GPU pods bound to one node, kubelet's Allocate calls in every order: a container
never receives another pod's allocation (the plugin's lookup and the pure Allocate core).

With the operator's allocation gate only one of them awaits its devices at a time (the
second is bound once the first has its answer); without it both await at once and the
plugin must refuse what it cannot tell apart rather than guess.
"""

from __future__ import annotations

import copy
from typing import Any

from builders import pod_awaiting_devices
from hypothesis import given, settings
from hypothesis import strategies as st

from vgpu_operator.agent.deviceplugin import allocation, lookup
from vgpu_operator.agent.deviceplugin.allocation import AllocationError, NodeSettings

GPU = "nvidia.com/gpu"
NODE = "n"

cards = st.sampled_from(["GPU-a", "GPU-b", "GPU-c"])
entry = st.lists(
    st.tuples(cards, st.sampled_from([1000, 2000]), st.sampled_from([10, 20])),
    min_size=1,
    max_size=2,
    unique_by=lambda d: d[0],
)
layouts = st.lists(entry, min_size=1, max_size=3)


def bound_pod(name: str, created: str, layout: list[list[tuple[str, int, int]]]) -> dict[str, Any]:
    return pod_awaiting_devices(name, layout, created, NODE)


def serve(
    pods: list[dict[str, Any]], admitting: str, layout: list[list[tuple[str, int, int]]]
) -> list[str]:
    """kubelet admits ``admitting`` container by container; what each call gave, as
    'own', 'other' (another pod's entry: the failure this test exists for) or 'refused'."""
    outcomes = []
    for i, wanted in enumerate(layout):
        ids = [f"{uuid}-0" for uuid, _, _ in wanted]
        try:
            chosen = lookup.pod_for(pods, NODE, len(ids))
            grant = allocation.allocate(chosen, ids, GPU, NodeSettings())
        except AllocationError:
            outcomes.append("refused")
            return outcomes  # kubelet fails the pod's admission at the first refusal
        got = [(d.uuid, d.memory_mib, d.cores) for d in grant.devices]
        outcomes.append("own" if got == wanted and grant.container == f"c{i}" else "other")
        chosen["metadata"]["annotations"].update(grant.patch)
    return outcomes


@settings(max_examples=400)
@given(layouts, layouts, st.booleans(), st.booleans())
def test_no_container_ever_receives_another_pods_allocation(
    first: list[Any], second: list[Any], second_first: bool, gated: bool
) -> None:
    a = bound_pod("a", "2026-01-01T00:00:01Z", first)
    b = bound_pod("b", "2026-01-01T00:00:02Z", second)
    order = (
        [("b", second, b), ("a", first, a)] if second_first else [("a", first, a), ("b", second, b)]
    )
    if gated:
        # The gate: the second pod is bound (appears) only once the first is answered.
        pods: list[dict[str, Any]] = []
        for _, layout, obj in order:
            pods.append(obj)
            results = serve(pods, obj["metadata"]["name"], layout)
            assert results == ["own"] * len(layout), results
    else:
        pods = [copy.deepcopy(a), copy.deepcopy(b)]
        for name, layout, _ in order:
            results = serve(pods, name, layout)
            assert "other" not in results, results
