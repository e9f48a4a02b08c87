"""Scale-down of nodes whose pods hold their GPUs through ResourceClaims (issue 49 item 5):
a pod whose claims were made from templates for it moves when its replacement, with its
claims made again from the templates, fits elsewhere by the claims dialect's fit; a pod
that uses a standalone (shared) claim keeps its node, and the reason says so."""

from __future__ import annotations

import copy
from typing import Any

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import dra
from vgpu_operator.scheduling.autoscale import shrink, shrink_claims
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.scheduling.dialects.claims import claim_templates
from vgpu_operator.scheduling.pod_key import PodKey, pod_key

Json = dict[str, Any]
NODES = ("dra-a", "dra-b")
OWNER = {
    "apiVersion": "apps/v1",
    "kind": "ReplicaSet",
    "name": "rs",
    "uid": "rs",
    "controller": True,
}


def _state() -> ClusterState:
    """Two DRA nodes of one 10 GiB card each (4 shares a card)."""
    state = ClusterState(DeviceConfig())
    for device_class in dra.device_classes():
        state.set_device_class(device_class)
    for i, node in enumerate(NODES):
        state.set_node({"metadata": {"name": node, "labels": {dra.NODE_PATH_LABEL: dra.PATH_DRA}}})
        card = dra.CardShape(f"GPU-{i}", 0, "L40S", "NVIDIA-L40S", 10240, 100, 4, "hami-core")
        state.set_slice(dra.slice_wire(node, [card], 1, None))
    return state


def _spec(memory: str) -> Json:
    return {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": dra.SHARED_CLASS,
                        "capacity": {"requests": {"memory": memory}},
                    },
                }
            ]
        }
    }


def _template(memory: str) -> Json:
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"namespace": "ns", "name": "share"},
        "spec": {"spec": _spec(memory)},
    }


TEMPLATES = {"ns/share": _template("4Gi")}


def _pod(name: str, entry: Json) -> Json:
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"app": "rs"},
            "ownerReferences": [dict(OWNER)],
        },
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", **entry}],
        },
    }


def _run(state: ClusterState, pod: Json, claim: Json, running: dict[PodKey, Json]) -> None:
    """Decide ``pod`` with ``claim`` and write back what the operator would: the claim
    allocated and reserved for it, the pod bound."""
    state.set_claim(claim)
    decision = state.schedule(pod, now=0)
    assert decision.scheduled, decision
    [write] = decision.claim_writes
    allocated = copy.deepcopy(claim)
    allocated["metadata"]["resourceVersion"] = "2"
    status = allocated.setdefault("status", {})
    if write.allocation is not None:
        status["allocation"] = dict(write.allocation)
    status["reservedFor"] = [*status.get("reservedFor", ()), dict(write.consumer)]
    state.set_claim(allocated)
    bound = {**pod, "spec": {**pod["spec"], "nodeName": decision.node}}
    bound["status"] = {**pod.get("status", {}), "phase": "Running"}
    state.set_pod(bound)
    state.confirm(pod_key(bound))
    running[pod_key(bound)] = bound


def _template_pod(state: ClusterState, name: str, running: dict[PodKey, Json]) -> None:
    """A pod whose claim the claim controller made from template ``share`` for it."""
    pod = _pod(name, {"resourceClaimTemplateName": "share"})
    claim = claim_templates.claim_from_template(pod, "gpu", TEMPLATES["ns/share"], f"{name}-gpu")
    claim["metadata"]["uid"] = f"uid-{name}-gpu"
    claim["metadata"]["resourceVersion"] = "1"
    claim["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": f"uid-{name}", "controller": True}
    ]
    pod["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]}
    _run(state, pod, claim, running)


def _node(running: dict[PodKey, Json], name: str) -> str:
    return str(running[PodKey(f"ns/{name}")]["spec"]["nodeName"])


def _spread() -> tuple[ClusterState, dict[PodKey, Json], str, str]:
    """Three 4 GiB pods: two fill one card (the policy binpacks), the third goes to the
    other node; the full node's full card then has no room for it. Returns the state, the
    running pods, the full node and the lone pod's node."""
    state = _state()
    running: dict[PodKey, Json] = {}
    for name in ("p", "q", "r"):
        _template_pod(state, name, running)
    full = _node(running, "p")
    assert _node(running, "q") == full
    lone = _node(running, "r")
    assert lone != full
    return state, running, full, lone


def _leave(state: ClusterState, running: dict[PodKey, Json], name: str) -> None:
    """The pod is deleted; the claim controller deletes the claim it made for it."""
    state.remove_pod(PodKey(f"ns/{name}"))
    state.remove_claim(f"ns/{name}-gpu")
    del running[PodKey(f"ns/{name}")]


def test_a_node_of_template_claim_pods_whose_shares_fit_elsewhere_can_be_emptied() -> None:
    state, running, full, lone = _spread()
    # While the other card is full (8 of 10 GiB), the lone pod's 4 GiB fits nowhere else.
    kept = shrink.empty_node(state, lone, running, 0.0, templates=TEMPLATES)
    assert kept == "pod ns/r fits on no other node"
    _leave(state, running, "q")
    before = (dict(state.books.pods), dict(state.books.claims.claim_holds()))
    out = shrink.empty_node(state, lone, running, 0.0, templates=TEMPLATES)
    assert isinstance(out, shrink.Emptying), out
    assert out.moves == {PodKey("ns/r"): full}
    # A what-if: the live books, their claims and holds are as they were.
    assert (dict(state.books.pods), dict(state.books.claims.claim_holds())) == before
    assert "ns/r~replacement#gpu" not in state.books.claims.objects


def test_the_replacements_claims_are_made_from_the_template_as_it_is_now() -> None:
    state, running, _full, lone = _spread()
    _leave(state, running, "q")
    # The template now asks 8 GiB: the remade claim no longer fits beside the 4 GiB left.
    bigger = {"ns/share": _template("8Gi")}
    out = shrink.empty_node(state, lone, running, 0.0, templates=bigger)
    assert out == "pod ns/r fits on no other node"
    gone = shrink.empty_node(state, lone, running, 0.0, templates={})
    assert gone == (
        "pod ns/r: ResourceClaimTemplate ns/share not found; its claims cannot be made again"
    )


def test_a_node_with_a_pod_on_a_shared_standalone_claim_is_kept_and_says_why() -> None:
    state = _state()
    running: dict[PodKey, Json] = {}
    for name in ("p", "q"):
        _template_pod(state, name, running)
    # r and t share one standalone claim, made apart from them (``resourceClaimName``).
    shared: Json = {
        "metadata": {"namespace": "ns", "name": "shared", "uid": "uid-shared"},
        "spec": _spec("4Gi"),
    }
    shared["metadata"]["resourceVersion"] = "1"
    _run(state, _pod("r", {"resourceClaimName": "shared"}), shared, running)
    now_shared = state.claim_object("ns/shared")
    assert now_shared is not None
    _run(state, _pod("t", {"resourceClaimName": "shared"}), dict(now_shared), running)
    lone = _node(running, "r")
    assert _node(running, "t") == lone != _node(running, "p")
    _leave(state, running, "q")
    out = shrink.empty_node(state, lone, running, 0.0, templates=TEMPLATES)
    assert out == (
        "pod ns/r uses ResourceClaim ns/shared, made apart from the pod: its allocation "
        "would have to move with it (a standalone claim is not made again for a replacement)"
    )


def test_the_templates_read_are_those_the_nodes_pods_claims_come_from() -> None:
    pods = [
        _pod("p", {"resourceClaimTemplateName": "share"}),
        _pod("q", {"resourceClaimTemplateName": "share"}),
        _pod("r", {"resourceClaimName": "shared"}),
        {**_pod("s", {"resourceClaimTemplateName": "big"}), "metadata": {"namespace": "other"}},
    ]
    assert shrink_claims.template_keys(pods) == ["ns/share", "other/big"]
