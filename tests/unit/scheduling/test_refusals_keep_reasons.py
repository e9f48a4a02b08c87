"""Admission refusals of bounded length that keep their reason: a refusal quotes the value
first and says why after it, so the bound cuts the middle (cutting the end left a
1,000-character quote and no reason), and a 400-digit scoring weight is refused with the
allowed range (admitted, it failed every decision with an OverflowError)."""

from __future__ import annotations

from builders import cluster, make_node, make_pod

from vgpu_operator import names
from vgpu_operator.scheduling.dialects.annotation.admission import MESSAGE_LIMIT


def _admit_weights(weights: str) -> tuple[bool, str]:
    state = cluster(make_node("a").gpu("GPU-a0"))
    pod = make_pod("p").container(gpu=1).annotate(names.DEVICE_SCORING_WEIGHTS, weights).obj()
    result = state.admit(pod)
    return result.allowed, result.message


def test_a_refusal_quoting_a_huge_value_keeps_its_reason() -> None:
    allowed, message = _admit_weights("slot=1," * 30_000)
    assert not allowed
    assert len(message) < MESSAGE_LIMIT + 100
    assert message.startswith(f"annotation {names.DEVICE_SCORING_WEIGHTS}=")
    assert "more characters" in message
    assert message.endswith("expected three entries slot=N,core=N,memory=N")


def test_a_400_digit_scoring_weight_is_refused_with_the_range() -> None:
    allowed, message = _admit_weights("slot=" + "9" * 400 + ",core=1,memory=1")
    assert not allowed
    assert "weight of slot is too large" in message
    assert "each weight must be an integer from 0 to 1000000" in message
