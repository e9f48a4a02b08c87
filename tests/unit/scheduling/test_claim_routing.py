"""Pods whose claims ask for this driver's DeviceClasses go to this scheduler
(``claim_routing``, issue 33 item 3): kube-scheduler must not allocate them past the
namespace quota."""

from __future__ import annotations

from typing import Any

from vgpu_operator.devices import dra
from vgpu_operator.scheduling.dialects.claims import claim_routing as routing
from vgpu_operator.scheduling.dialects.claims.claim_routing import CLAIM, TEMPLATE, Action, ClaimRef

OURS = "vgpu-scheduler"


def pod(entries: list[dict[str, str]], scheduler: str | None = None, **spec: Any) -> Any:
    body: dict[str, Any] = {"resourceClaims": entries, "containers": [{"name": "main"}], **spec}
    if scheduler is not None:
        body["schedulerName"] = scheduler
    return {"metadata": {"name": "p", "namespace": "ml"}, "spec": body}


def claim(*classes: str, alternatives: tuple[str, ...] = ()) -> dict[str, Any]:
    requests: list[dict[str, Any]] = [
        {"name": f"r{i}", "exactly": {"deviceClassName": c}} for i, c in enumerate(classes)
    ]
    if alternatives:
        requests.append(
            {
                "name": "alt",
                "firstAvailable": [{"name": a, "deviceClassName": a} for a in alternatives],
            }
        )
    return {"spec": {"devices": {"requests": requests}}}


def template(*classes: str) -> dict[str, Any]:
    return {"spec": claim(*classes)}


def test_refs_are_read_from_the_pod_each_once() -> None:
    entries = [
        {"name": "a", "resourceClaimName": "shared"},
        {"name": "b", "resourceClaimTemplateName": "t"},
        {"name": "c", "resourceClaimName": "shared"},
        {"name": "d"},
    ]
    assert routing.claim_refs(pod(entries)) == [ClaimRef(CLAIM, "shared"), ClaimRef(TEMPLATE, "t")]


def test_classes_are_read_from_requests_and_alternatives() -> None:
    assert routing.device_classes(claim("a", alternatives=("b", "c")), CLAIM) == {"a", "b", "c"}
    assert routing.device_classes(template(dra.SHARED_CLASS), TEMPLATE) == {dra.SHARED_CLASS}
    assert routing.asks_our_classes(claim("other", alternatives=(dra.EXCLUSIVE_CLASS,)), CLAIM)


def test_a_pod_on_the_default_scheduler_with_our_claims_is_routed_to_ours() -> None:
    entries = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    found = [(ClaimRef(TEMPLATE, "t"), template(dra.SHARED_CLASS))]
    for named in (None, "default-scheduler"):
        assert routing.route(pod(entries, named), found, OURS).action is Action.ROUTE
    assert routing.route(pod(entries, OURS), found, OURS).action is Action.PASS


def test_a_pod_naming_another_scheduler_with_our_claims_is_refused() -> None:
    entries = [{"name": "gpu", "resourceClaimName": "c"}]
    found = [(ClaimRef(CLAIM, "c"), claim("other.example.com", alternatives=(dra.SHARED_CLASS,)))]
    answer = routing.route(pod(entries, "volcano"), found, OURS)
    assert answer.action is Action.REFUSE
    assert "volcano" in answer.message
    assert dra.SHARED_CLASS in answer.message
    assert f"set it to {OURS}" in answer.message


def test_other_drivers_claims_are_none_of_our_business() -> None:
    entries = [{"name": "x", "resourceClaimName": "c"}]
    found = [(ClaimRef(CLAIM, "c"), claim("other.example.com"))]
    for named in (None, "volcano"):
        assert routing.route(pod(entries, named), found, OURS).action is Action.PASS


def test_a_claim_that_does_not_exist_yet_lets_the_pod_through_unchanged() -> None:
    # Refusing would break other drivers' users who create pods before claims; the
    # allocation policy keeps our devices from kube-scheduler if the claim is ours.
    entries = [{"name": "x", "resourceClaimName": "later"}]
    answer = routing.route(pod(entries), [(ClaimRef(CLAIM, "later"), None)], OURS)
    assert answer.action is Action.PASS
    # ... but one of ours found beside it decides: routed (it waits for the other).
    both = [(ClaimRef(CLAIM, "later"), None), (ClaimRef(TEMPLATE, "t"), template(dra.SHARED_CLASS))]
    assert routing.route(pod(entries), both, OURS).action is Action.ROUTE


def test_a_pod_bound_by_its_creator_is_left_alone() -> None:
    entries = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    found = [(ClaimRef(TEMPLATE, "t"), template(dra.SHARED_CLASS))]
    assert routing.route(pod(entries, nodeName="n1"), found, OURS).action is Action.PASS


def test_the_reading_is_bounded() -> None:
    refs = [ClaimRef(CLAIM, f"c{i}") for i in range(routing.MAX_CLAIM_READS)]
    assert routing.too_many(refs) is None
    message = routing.too_many([*refs, ClaimRef(CLAIM, "one-more")])
    assert message is not None
    assert str(routing.MAX_CLAIM_READS) in message


def test_pods_of_ours_or_bound_are_settled_without_reading_their_claims() -> None:
    """A pod the first hook converted reaches the claims hook too, naming templates a dry
    run did not make: it names our scheduler, so nothing is read and it passes."""
    entries = [{"name": "vgpu-gpu-0", "resourceClaimTemplateName": "vgpu-0123456789abcdef"}]
    assert routing.settled_without_reading(pod(entries, OURS), OURS)
    assert routing.settled_without_reading(pod(entries, nodeName="n1"), OURS)
    assert not routing.settled_without_reading(pod(entries), OURS)
    assert not routing.settled_without_reading(pod(entries, "default-scheduler"), OURS)
