"""CEL selectors as Kubernetes 1.37 evaluates them (cel-go v0.29's string extensions), and
the bounds the engine puts on them: length, nesting, static cost, evaluation steps, and
which verdicts are computed off the scheduling loop (``SelectorCache.deferring``)."""

from __future__ import annotations

import pytest

from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cel import claim_cel, claim_cel_cost

D = dra.DRIVER
DEVICE = claim_cel.DeviceView(D, True, {f"{D}/productName": ("string", "NVIDIA L40S")}, {})
ERROR = "error"

#: The issue's selector: accepted by the API server (cost under 1,000,000), about 25 s a
#: device in a pure-Python interpreter without bounds.
BIG = "[" + ",".join("0" for _ in range(570)) + "]"
SLOW = f"{BIG}.all(x, {BIG}.all(y, true))"


def verdict(expression: str) -> bool | str:
    try:
        return claim_cel.compile_selector(expression).matches(DEVICE)
    except claim_cel.CelRuntimeError:
        return ERROR


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # charAt: an index past the end (not at it) or negative is an error.
        ('"abc".charAt(-1) == "c"', ERROR),
        ('"abc".charAt(3) == ""', True),
        ('"abc".charAt(4) == ""', ERROR),
        ('"héllo".charAt(1) == "é"', True),
        # Case functions change ASCII letters only.
        ('"ß".upperAscii() == "ß"', True),
        ('"é".upperAscii() == "é"', True),
        ('"\u212a".lowerAscii() == "\u212a"', True),  # the Kelvin sign stays
        ('"AbC".lowerAscii() == "abc"', True),
        ('"AbC".upperAscii() == "ABC"', True),
        # substring: out of range or inverted is an error.
        ('"abc".substring(5) == ""', ERROR),
        ('"abc".substring(-1) == "abc"', ERROR),
        ('"abc".substring(2, 1) == ""', ERROR),
        ('"abc".substring(1, 4) == "bc"', ERROR),
        ('"abc".substring(3) == ""', True),
        ('"abc".substring(1, 3) == "bc"', True),
        # indexOf/lastIndexOf: negative is an error, past the end is -1 (v0.29).
        ('"abc".indexOf("a", -1) == -1', ERROR),
        ('"abc".indexOf("a", 9) == -1', True),
        ('"abc".indexOf("", 9) == 3', True),
        ('"abcabc".indexOf("c", 3) == 5', True),
        ('"abc".lastIndexOf("a", -1) == -1', ERROR),
        ('"aba".lastIndexOf("a") == 2', True),
        ('"aba".lastIndexOf("a", 1) == 0', True),
        ('"aba".lastIndexOf("") == 3', True),
        ('"".lastIndexOf("a") == -1', True),
        # trim strips Go's spaces, not Python's (\x1c is no space to Go).
        ('" \\t x \\n".trim() == "x"', True),
        ('"\\x1cx".trim() == "\\x1cx"', True),
        # split and join as Go's strings.SplitN and Join.
        ('"a,b,c".split(",", 2) == ["a", "b,c"]', True),
        ('"a,b".split(",", 0) == []', True),
        ('"abc".split("") == ["a", "b", "c"]', True),
        ('"abc".split("", 2) == ["a", "bc"]', True),
        ('["a", "b"].join("-") == "a-b"', True),
        ('"aaa".replace("a", "b", 2) == "bba"', True),
        # Kubernetes' lists library.
        ("[1, 2, 2].indexOf(2) == 1", True),
        ("[1, 2, 2].lastIndexOf(2) == 2", True),
        # An error on one side of || is absorbed when the other side is true (as cel-go).
        ('"abc".charAt(-1) == "c" || true', True),
    ],
)
def test_string_extensions_as_kubernetes(expression: str, expected: bool | str) -> None:
    assert verdict(expression) == expected


def test_an_expression_longer_than_the_api_servers_limit_is_refused() -> None:
    long = "true && " * 1300 + "true"
    assert len(long) > claim_cel.MAX_LENGTH
    with pytest.raises(claim_cel.CelRefused, match="longer than 10240"):
        claim_cel.compile_selector(long)


@pytest.mark.parametrize(
    "expression",
    [
        "(" * 240 + "true" + ")" * 240,  # the issue's
        "(" * 5000 + "true" + ")" * 5000,
        " || ".join(["false"] * 600) + " || true",
        " + ".join(["1"] * 1000) + " > 0",
    ],
)
def test_deep_nesting_is_refused_with_a_sentence_never_a_recursion_error(expression: str) -> None:
    with pytest.raises(claim_cel.CelRefused, match=r"nests too deeply.*split it"):
        claim_cel.compile_selector(expression)


def test_nesting_within_the_bound_evaluates() -> None:
    assert verdict("(" * 25 + "true" + ")" * 25) is True
    assert verdict(" || ".join(["false"] * 200) + " || true") is True


def test_the_static_cost_lands_where_the_api_servers_does() -> None:
    # The API server accepts the selector: under 1,000,000.
    cost = claim_cel.compile_selector(SLOW).cost
    assert 900_000 < cost <= claim_cel_cost.MAX_COST
    cheap = claim_cel.compile_selector(f'device.attributes["{D}"].productName == "x"')
    assert cheap.cost < 100
    assert not cheap.off_loop


def test_an_expression_over_the_cost_limit_is_refused() -> None:
    with pytest.raises(claim_cel.CelRefused, match=r"estimated cost .* exceeds the limit 1000000"):
        claim_cel.compile_selector(f"{BIG}.all(x, {BIG}.all(y, {BIG}.all(z, true)))")


def test_the_slow_selector_runs_out_of_steps_with_a_sentence() -> None:
    selector = claim_cel.compile_selector(SLOW)
    assert selector.off_loop
    with pytest.raises(claim_cel.CelTooCostly, match="make the selector cheaper"):
        selector.matches(DEVICE)


def test_a_string_blown_up_by_replace_is_stopped() -> None:
    x = "x" * 200
    # Refused as the API server refuses it: the third replace would walk 8,000,000
    # characters (a cost of 1,600,000).
    expression = f'"{x}".replace("x", "{x}").replace("x", "{x}").replace("x", "{x}").size() > 0'
    with pytest.raises(claim_cel.CelRefused, match="estimated cost"):
        claim_cel.compile_selector(expression)
    # Two replaces are accepted, and stopped by the budget before building 8,000,000.
    expression = f'"{x}".replace("x", "{x}").replace("x", "{x}").size() > 0'
    with pytest.raises(claim_cel.CelTooCostly, match="replace"):
        claim_cel.compile_selector(expression).matches(DEVICE)


# --- verdicts off the loop ----------------------------------------------------------------


def deferring() -> claim_cel.SelectorCache:
    cache = claim_cel.SelectorCache()
    cache.deferring = True
    return cache


def test_a_cheap_selector_is_evaluated_on_the_loop() -> None:
    cache = deferring()
    selector = cache.compile(f'device.attributes["{D}"].productName.contains("L40")')
    assert cache.matches(selector, "dev-1", DEVICE)
    assert not cache.pending_seen()
    assert cache.take_pending() == []


def test_a_costly_selector_waits_for_the_evaluator_and_is_queued_for_every_device() -> None:
    cache = deferring()
    cheap = cache.compile(f'device.driver == "{D}"')
    for key in ("dev-1", "dev-2"):
        assert cache.matches(cheap, key, DEVICE)  # both devices are known now
    slow = cache.compile(SLOW)
    with pytest.raises(claim_cel.CelPending):
        cache.matches(slow, "dev-1", DEVICE)
    assert cache.pending_seen()
    assert not cache.pending_seen()  # asked once
    pending = cache.take_pending()
    assert sorted((e == SLOW, k) for e, k, _ in pending) == [(True, "dev-1"), (True, "dev-2")]
    # In flight: asked again, it is not queued twice.
    with pytest.raises(claim_cel.CelPending):
        cache.matches(slow, "dev-2", DEVICE)
    assert cache.take_pending() == []
    cache.record(SLOW, "dev-1", True)
    cache.record(SLOW, "dev-2", claim_cel.CelTooCostly("too costly"))
    assert cache.matches(slow, "dev-1", DEVICE)
    with pytest.raises(claim_cel.CelTooCostly):
        cache.matches(slow, "dev-2", DEVICE)


def test_a_selector_over_the_inline_step_bound_goes_off_the_loop() -> None:
    # Of an inline shape (``claim_cel_shapes``) and cheap by its static cost, yet its
    # body of 15 conditions is about 150 steps, for each of the 32 elements.
    expression = "[" + ",".join("0" for _ in range(32)) + "].all(x, "
    expression += "&&".join("x==0" for _ in range(15)) + ")"
    assert len(expression) <= claim_cel.INLINE_LENGTH
    selector = claim_cel.compile_selector(expression)
    assert not selector.off_loop
    cache = deferring()
    compiled = cache.compile(expression)
    with pytest.raises(claim_cel.CelPending):
        cache.matches(compiled, "dev-1", DEVICE)
    with pytest.raises(claim_cel.CelPending):  # marked costly: not tried on the loop again
        cache.matches(compiled, "dev-2", DEVICE)
    assert {k for _, k, _ in cache.take_pending()} == {"dev-1", "dev-2"}


def test_a_long_expression_is_not_even_parsed_on_the_loop() -> None:
    expression = " || ".join([f'device.driver == "{i}"' for i in range(40)])
    assert len(expression) > claim_cel.INLINE_LENGTH
    cache = deferring()
    selector = cache.compile(expression)
    assert selector.program is None
    with pytest.raises(claim_cel.CelPending):
        cache.matches(selector, "dev-1", DEVICE)


def test_without_deferring_every_verdict_is_computed_at_once_with_the_same_bounds() -> None:
    cache = claim_cel.SelectorCache()
    selector = cache.compile(SLOW)
    with pytest.raises(claim_cel.CelTooCostly):
        cache.matches(selector, "dev-1", DEVICE)


def test_the_cache_forgets_the_least_recently_used_expressions_and_their_verdicts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Tenants write the expressions: a cache that kept each one (and its verdict on every
    # device) would grow without bound.
    monkeypatch.setattr(claim_cel.SelectorCache, "MAX_EXPRESSIONS", 8)
    cache = claim_cel.SelectorCache()
    kept = f'device.driver == "{D}"'
    for n in range(40):
        selector = cache.compile(f'device.driver == "other-{n}"')
        assert cache.matches(selector, ("pool", "dev"), DEVICE) is False
        assert cache.matches(cache.compile(kept), ("pool", "dev"), DEVICE) is True
    assert len(cache._recent) <= 8
    assert len(cache._compiled) <= 8
    assert len(cache._verdicts) <= 8
    assert (kept, ("pool", "dev")) in cache._verdicts  # in use: never the oldest
    # A forgotten expression is compiled and evaluated again when asked.
    again = cache.compile('device.driver == "other-0"')
    assert cache.matches(again, ("pool", "dev"), DEVICE) is False
