"""DRA's CEL selectors (``claim_cel``) and request-policy rounding (``dra_pool``), against
the semantics kube-scheduler applies."""

from __future__ import annotations

from fractions import Fraction

import pytest

from vgpu_operator.devices import dra
from vgpu_operator.scheduling.cel import claim_cel
from vgpu_operator.scheduling.dialects.claims import dra_pool

D = dra.DRIVER
DEVICE = claim_cel.DeviceView(
    D,
    True,
    {
        f"{D}/productName": ("string", "NVIDIA L40S"),
        f"{D}/index": ("int", 1),
        f"{D}/driverVersion": ("version", "550.54.15"),
        "resource.kubernetes.io/numaNode": ("int", 0),
    },
    {f"{D}/memory": "46068Mi", f"{D}/cores": "100"},
)


@pytest.mark.parametrize(
    ("expression", "selected"),
    [
        (f'device.driver == "{D}"', True),
        (f'device.attributes["{D}"].productName.lowerAscii().contains("l40")', True),
        (f'device.attributes["{D}"].index == 0', False),
        ('device.attributes["resource.kubernetes.io"].numaNode == 0', True),
        (f'device.capacity["{D}"].memory.compareTo(quantity("40Gi")) >= 0', True),
        (f'device.capacity["{D}"].memory.isGreaterThan(quantity("45Gi"))', False),
        (f'device.attributes["{D}"].driverVersion.isGreaterThan(semver("535.0.0"))', True),
        # An unknown domain is an empty map: a guarded lookup is false, not an error.
        ('"model" in device.attributes["example.com"]', False),
        ("device.allowMultipleAllocations", True),
    ],
)
def test_selectors_read_the_device_as_upstream_does(expression: str, selected: bool) -> None:
    assert claim_cel.compile_selector(expression).matches(DEVICE) is selected


def test_a_missing_attribute_is_a_runtime_error() -> None:
    selector = claim_cel.compile_selector(f'device.attributes["{D}"].serial == "x"')
    with pytest.raises(claim_cel.CelRuntimeError, match="serial"):
        selector.matches(DEVICE)


def test_a_non_bool_result_is_an_error() -> None:
    with pytest.raises(claim_cel.CelRuntimeError, match="not a bool"):
        claim_cel.compile_selector(f'device.attributes["{D}"].index').matches(DEVICE)


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        (f'device.attributes["{D}"].?index.orValue(0) == 1', "does not parse"),
        ("strings.quote(device.driver) != ''", "does not"),
        ("myFunction(1)", "calls myFunction"),
    ],
)
def test_expressions_outside_the_supported_language_are_refused(expression: str, why: str) -> None:
    with pytest.raises(claim_cel.CelRefused, match=why):
        claim_cel.compile_selector(expression)


def test_verdicts_are_cached_per_device_as_published() -> None:
    cache = claim_cel.SelectorCache()
    selector = cache.compile(f'device.attributes["{D}"].index == 1')
    assert cache.matches(selector, ("pool", "gpu-1", 1), DEVICE)
    other = claim_cel.DeviceView(D, True, {f"{D}/index": ("int", 2)}, {})
    # Same key: the cached verdict stands (the key must change with the device).
    assert cache.matches(selector, ("pool", "gpu-1", 1), other)
    assert not cache.matches(selector, ("pool", "gpu-1", 2), other)


GI = Fraction(2**30)


@pytest.mark.parametrize(
    ("requested", "consumed"),
    [
        (None, 4 * GI),  # the default
        (Fraction(1500 * 2**20), 2 * GI),  # up to the next step from the minimum
        (Fraction(1), 1 * GI),  # below the minimum: the minimum
        (16 * GI, 16 * GI),
        (17 * GI, None),  # above the maximum
    ],
)
def test_memory_rounds_up_to_the_range_step(
    requested: Fraction | None, consumed: Fraction | None
) -> None:
    policy = dra_pool.CapacityPolicy(
        16 * GI, default=4 * GI, minimum=GI, maximum=16 * GI, step=GI, has_policy=True
    )
    assert policy.consumed(requested) == consumed


def test_valid_values_round_up_to_the_next_one() -> None:
    values = (Fraction(10), Fraction(50), Fraction(100))
    policy = dra_pool.CapacityPolicy(
        Fraction(100), default=Fraction(10), valid_values=values, has_policy=True
    )
    assert policy.consumed(Fraction(20)) == 50
    assert policy.consumed(None) == 10
    assert policy.consumed(Fraction(101)) is None


def test_without_a_policy_a_request_consumes_what_it_asks_and_silence_the_whole() -> None:
    policy = dra_pool.CapacityPolicy(Fraction(100))
    assert policy.consumed(Fraction(30)) == 30
    assert policy.consumed(None) == 100


def test_a_pool_is_read_from_its_newest_generation_only() -> None:
    card = dra.CardShape("GPU-A", 0, "L40S", "NVIDIA-L40S", 46068, 100, 4, "hami-core")
    old = dra.slice_wire("n", [card], 1, None)
    newer_card = dra.CardShape("GPU-B", 0, "L40S", "NVIDIA-L40S", 46068, 100, 4, "hami-core")
    new = dra.slice_wire("n", [newer_card], 2, None)
    new["metadata"]["name"] = "other"
    pool = dra_pool.read_pool("n", [old, new])
    assert list(pool.devices) == ["gpu-b"]
    [info] = pool.cards
    assert (info.id, info.memory_mib, info.count, info.cores) == ("gpu-b", 46068, 4, 100)


def test_taints_need_a_toleration() -> None:
    taints = (dra_pool.Taint(dra.UNHEALTHY_TAINT_KEY, "xid-79", "NoSchedule"),)
    assert not dra_pool.tolerated(taints, [])
    assert dra_pool.tolerated(taints, [{"key": dra.UNHEALTHY_TAINT_KEY, "operator": "Exists"}])
    assert not dra_pool.tolerated(taints, [{"key": "other", "operator": "Exists"}])
