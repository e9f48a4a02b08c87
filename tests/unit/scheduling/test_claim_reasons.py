"""A pod told why its claim does not fit is told the real cause (issue 44): a request
larger than any card is short of the card's memory or cores (as the annotation path says),
not "not selected"; a MIG claim the namespace's quota refuses is told the quota first."""

from __future__ import annotations

from dra_cluster import CARD_MIB, DraCluster


def reasons(exactly: dict[str, object]) -> str:
    decision = DraCluster().decide("big", "team", exactly)
    assert not decision.scheduled
    assert decision.diagnosis is not None
    return decision.diagnosis.message()


def test_a_request_larger_than_any_card_is_short_of_memory() -> None:
    message = reasons({"capacity": {"requests": {"memory": f"{CARD_MIB + 1024}Mi"}}})
    assert "CardInsufficientMemory" in message, message
    assert "DeviceNotSelected" not in message, message


def test_a_request_for_more_cores_than_a_card_has_is_short_of_cores() -> None:
    message = reasons({"capacity": {"requests": {"cores": "150"}}})
    assert "CardInsufficientCore" in message, message


def test_a_selector_that_rules_the_card_out_still_says_not_selected() -> None:
    selectors = [{"cel": {"expression": 'device.attributes["gpu.vgpu-operator.io"].index == 7'}}]
    message = reasons({"selectors": selectors})
    assert "DeviceNotSelected" in message, message
