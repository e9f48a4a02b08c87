"""Issue 44: a selector that grows a string (``replace`` chained on a literal, then
``split("")``) was rated at a static cost of 35, evaluated on the scheduling loop and took
1.6 s a device there. Its cost is now the API server's (``replace`` yields what it may
produce), it is never evaluated on the loop (only the shapes of ``claim_cel_shapes`` are),
and its evaluation is charged by the characters each string function produces, so it
runs out of budget before building the million-element list."""

from __future__ import annotations

import time

import pytest
from dra_cluster import DraCluster

from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cel import claim_cel, claim_cel_cost

D = dra.DRIVER
DEVICE = claim_cel.DeviceView(
    D,
    True,
    {f"{D}/type": ("string", "NVIDIA L40S"), f"{D}/index": ("int", 0)},
    {f"{D}/memory": "46068Mi"},
)
A100 = "a" * 100
#: The issue's selector (357 characters): a literal of 100 ``a`` grown twice a hundredfold
#: to a million characters, then split into a million one-character strings.
GROW = f'"{A100}".replace("a", "{A100}").replace("a", "{A100}").split("").size() > 5'


def test_the_issues_selector_is_what_the_issue_says() -> None:
    assert len(GROW) == 357


def test_its_static_cost_is_the_api_servers_not_35() -> None:
    # The API server: the first replace may yield 100 x 100 characters (cost 2 x 0.1 x
    # 100), the second 10,000 x 100 (cost 2 x 0.1 x 10,000), split walks a million
    # (cost 2 x 0.1 x 1,000,000): about 202,000, under the limit, so it is accepted.
    cost = claim_cel.compile_selector(GROW).cost
    assert 200_000 <= cost <= claim_cel_cost.MAX_COST


@pytest.mark.parametrize(
    ("expression", "at_least"),
    [
        # join yields its list's strings and separators (64 entries of 64 characters).
        (f'device.attributes["{D}"].type.split(",").join("{A100}") == ""', 600),
        # + yields both operands; the macro repeats it per element.
        ('["a","b","c"].all(x, (x + "' + A100 + '").size() > 0)', 30),
        # lowerAscii keeps its operand's size: a grown string stays grown.
        (f'"{A100}".replace("a", "{A100}").lowerAscii() == ""', 1000),
    ],
)
def test_string_functions_are_costed_by_what_they_produce(expression: str, at_least: int) -> None:
    assert claim_cel.compile_selector(expression).cost >= at_least


def test_it_is_never_evaluated_on_the_scheduling_loop() -> None:
    cache = claim_cel.SelectorCache()
    cache.deferring = True
    selector = cache.compile(GROW)
    assert selector.off_loop
    with pytest.raises(claim_cel.CelPending):
        cache.matches(selector, "dev-1", DEVICE)


def test_its_evaluation_runs_out_of_budget_before_building_the_list() -> None:
    selector = claim_cel.compile_selector(GROW)
    started = time.process_time()
    words = r"(replace|split), which would .* characters"
    with pytest.raises(claim_cel.CelTooCostly, match=words) as refusal:
        selector.matches(DEVICE)
    # The sentence says what to change (no timing asserted: the budget is what stops it;
    # the CPU is printed for whoever reads a failure).
    assert "make the selector cheaper" in str(refusal.value), time.process_time() - started


def test_growing_in_a_macro_runs_out_of_budget() -> None:
    grow = f'["{A100}"].map(s, s.replace("a", "{A100}")).map(s, s.replace("a", "{A100}"))'
    with pytest.raises(claim_cel.CelTooCostly, match="characters"):
        claim_cel.compile_selector(f"{grow}[0].size() > 0").matches(DEVICE)
    joined = "[" + ",".join([f'"{A100}"'] * 30) + "]"
    concatenated = f"{joined}.map(x, {joined}.map(y, x + y + x + y)).size() > 0"
    with pytest.raises(claim_cel.CelTooCostly):
        claim_cel.compile_selector(concatenated).matches(DEVICE, 20_000)


def test_cheap_string_work_stays_within_the_inline_budget() -> None:
    expression = f'device.attributes["{D}"].type.lowerAscii().contains("l40s")'
    assert claim_cel.compile_selector(expression).matches(DEVICE, claim_cel.INLINE_STEPS)


# --- the refusal, on the pod --------------------------------------------------------------


def _decide_with_selectors(expressions: list[str]) -> str:
    """The pod's message when its claim's one request has ``expressions`` as selectors,
    on a DRA node of one card (the real feeds and engine, every verdict at once)."""
    selectors = [{"cel": {"expression": e}} for e in expressions]
    decision = DraCluster().decide("c", "ns", {"selectors": selectors})
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert decision.diagnosis.error is not None
    return decision.diagnosis.error


def test_the_refusal_names_the_request_the_selector_and_what_to_change() -> None:
    message = _decide_with_selectors([f'device.driver == "{D}"', GROW])
    assert "ResourceClaim ns/c, request 'gpu'" in message
    assert "selectors[1]" in message
    assert repr(GROW[: claim_cel.SHOWN_LENGTH] + "...") in message  # a short excerpt
    assert "build shorter strings and lists" in message
    assert len(message) < 600
